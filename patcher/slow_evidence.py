"""Evidence of checks too long for CI (``make test-slow``), stamped with the catalog they checked.

A check that cannot run in CI's time (the compile check of a whole series) runs with
``make test-slow`` and commits its report under ``evidence/``.  The report carries a stamp: the
sha256 of the series it checked, over the ``series`` file's order and every listed patch's bytes.
CI recomputes the stamp from today's catalog and fails when they differ, so a changed patch cannot
ride on evidence made for its earlier bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

STAMP_KEY = "catalog"
STAMP_FORMAT = "patcher-series-sha256-v1"


def series_digest(patches_dir: Path, torch: str) -> tuple[str, list[str]]:
    """(sha256, patch file names in series order) of ``patches/<torch>/``."""
    release = Path(patches_dir) / torch
    names = [line.split("#", 1)[0].strip() for line in (release / "series").read_text(encoding="utf-8").splitlines()]
    names = [name for name in names if name]
    digest = hashlib.sha256(STAMP_FORMAT.encode() + b"\n")
    for name in names:
        digest.update(name.encode() + b"\0" + hashlib.sha256((release / name).read_bytes()).hexdigest().encode()
                      + b"\n")
    return digest.hexdigest(), names


def stamp(report: dict[str, Any], patches_dir: Path, torch: str) -> dict[str, Any]:
    """``report`` with the stamp of the series it was made from."""
    sha256, names = series_digest(patches_dir, torch)
    return {**report, STAMP_KEY: {"format": STAMP_FORMAT, "torch": torch, "series_sha256": sha256,
                                  "patches": names}}


def stale_reason(report: dict[str, Any], patches_dir: Path) -> str | None:
    """Why ``report`` does not speak for today's catalog, or None when it does."""
    recorded = report.get(STAMP_KEY)
    if not isinstance(recorded, dict) or recorded.get("format") != STAMP_FORMAT:
        return "it carries no catalog stamp"
    sha256, names = series_digest(patches_dir, recorded["torch"])
    if sha256 == recorded.get("series_sha256"):
        return None
    before, now = recorded.get("patches", []), names
    changed = sorted(set(before) ^ set(now)) or ["the bytes of a patch (same file names)"]
    return (f"patches/{recorded['torch']} changed since it was recorded ({', '.join(changed)}): "
            f"stamp {recorded.get('series_sha256', '?')[:12]}, today {sha256[:12]}")
