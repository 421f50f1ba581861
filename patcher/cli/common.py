"""Helpers shared by the command modules."""

from __future__ import annotations

import json
from typing import Any

import click

from patcher.config import Settings


def load_settings(**extra: Any) -> Settings:
    """Settings from the group's flags plus a command's own setting flags (None = not given)."""
    ctx = click.get_current_context()
    flags = dict((ctx.find_root().obj or {}).get("flags", {}))
    flags.update({k: v for k, v in extra.items() if v is not None})
    return Settings.load(**flags)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain fixed-width table (no colour: output is read in CI logs and pasted into audits)."""
    cells = [["-" if r.get(c) is None else str(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)
