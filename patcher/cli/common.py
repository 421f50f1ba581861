"""Helpers shared by the command modules."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from patcher import setting_rules as rules
from patcher.config import Settings
from patcher.setting_rules import Origin


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


class Checked(click.ParamType):
    """A flag whose value must meet one of patcher's setting rules (patcher/setting_rules.py);
    a bad value is refused in one line (exit 19) before any stage runs."""

    def __init__(self, rule: Callable[..., Any], setting: str | None = None, name: str = "text"):
        self.rule, self.setting, self.name = rule, setting, name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        flag = max(param.opts, key=len) if param is not None and param.opts else "option"
        return self.rule(self.setting or flag.lstrip("-").replace("-", "_"), Origin("flag", flag), value)


def _mirror_location(kind: str, relative_ok: bool = False) -> Callable[[str, Origin, object], str]:
    return lambda _name, origin, value: rules.location(kind, origin, value, relative_ok=relative_ok)


GIT_LOCATION = Checked(_mirror_location("git_mirror"), name="url")
# `mirror sync/plan --from DIR`: a folder on this host may be named relative to the current one
GIT_SOURCE = Checked(_mirror_location("git_mirror", relative_ok=True), name="dir-or-url")
MIRROR_LOCATION = Checked(_mirror_location("mirror"), name="url")
DEBIAN_LOCATION = Checked(_mirror_location("debian_mirror"), name="url")
REGISTRY = Checked(rules.registry, setting="registry", name="registry")
IMAGE_REF = Checked(rules.image_ref, name="image")
VOLUME_NAME = Checked(rules.volume_name, name="volume")
WORD_LIST = Checked(rules.word_list, name="list")
REVISION_RANGE = Checked(rules.revision_range, name="range")
UPLOAD_URL = Checked(rules.url, name="url")
ENV_NAME = Checked(rules.env_name, name="name")
SUITE = Checked(rules.suite_name, name="suite")
DOCKER_HOST = Checked(rules.docker_host, name="url")
