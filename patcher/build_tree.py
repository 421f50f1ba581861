"""A build tree kept between builds of one spec, so a rebuild after a patch changes only
recompiles what that patch touches (``patcher build --keep-build-tree``).

PyTorch's build is incremental on its own (CMake's cache and ninja's state in ``build/``), but
only when the tree it finds is the one it built last time.  A fresh container gets a fresh
tree, so every build replays all units (from ccache at best).  With a kept tree, ``/src`` is a
Docker volume named after the spec and the builder image, and each stage writes into it only
the files whose content changed since the last build (with the current time, so ninja sees
them as newer than its outputs), removes files the tree no longer tracks, and leaves every
other file — and its modification time — as it was.  What changed is read from the manifest
the last sync left in the volume (git's object id of every file, the pinned inputs' sha256),
not from modification times.

A sync that did not finish marks the volume ``dirty`` first; the next sync then rewrites every
file (ninja rebuilds what they feed; ccache still answers for the units that did not change).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from patcher.buildenv import CONTAINER_SRC
from patcher.spec import BuildSpec

MANIFEST_NAME = ".patcher-tree.json"
REMOVE_LIST_NAME = ".patcher-tree-remove"
MANIFEST_FORMAT = 1
LABEL_BUILD_TREE = "org.patcher.build-tree"
# A mark the volume carries while files are being written into it: a later sync trusts nothing.
DIRTY_MANIFEST = json.dumps({"format": MANIFEST_FORMAT, "dirty": True}).encode()

# Run in the container before the stage's command: drop what the tree no longer tracks, then
# make the new manifest the volume's (the files themselves are already in place).
PREPARE_SCRIPT = f"""\
if [ -f {REMOVE_LIST_NAME} ]; then
  tr '\\n' '\\0' < {REMOVE_LIST_NAME} | xargs -0 -r rm -f --
  rm -f {REMOVE_LIST_NAME}
fi
if [ -f {MANIFEST_NAME}.next ]; then mv -f {MANIFEST_NAME}.next {MANIFEST_NAME}; fi
"""


def volume_name(spec: BuildSpec, image_id: str, source_date_epoch: int) -> str:
    """One volume per spec and builder image: objects from another compiler never mix in."""
    key = hashlib.sha256(json.dumps([spec.build_id, spec.to_json(), image_id, source_date_epoch],
                                    sort_keys=True).encode()).hexdigest()[:12]
    return f"patcher-tree-{spec.build_id.replace('+', '_')}-{key}"


def volume_labels(spec: BuildSpec) -> dict[str, str]:
    return {LABEL_BUILD_TREE: "1", "org.patcher.build-id": spec.build_id}


def source_manifest(tracked: list[tuple[int, str, str]], inputs: list[tuple[str, bytes]]) -> dict[str, str]:
    """path -> what its content is: ``<mode> <git object id>`` for tracked files (submodule
    commits left out, their files are listed themselves), ``input <sha256>`` for pinned inputs."""
    extra = dict(inputs)
    files = {path: f"{mode:o} {oid}" for mode, oid, path in tracked if mode != 0o160000 and path not in extra}
    files.update({path: "input " + hashlib.sha256(data).hexdigest() for path, data in extra.items()})
    return files


@dataclass(frozen=True)
class TreeSync:
    """What one sync writes into the kept tree."""

    reused: bool                # the volume held a tree from an earlier build of this spec
    write: tuple[str, ...]      # files to (re)write, every one when not reused
    remove: tuple[str, ...]     # files the tree had and no longer tracks
    reason: str                 # why everything is written, when it is

    @property
    def everything(self) -> bool:
        return not self.reused


def plan_sync(previous: bytes | None, current: dict[str, str]) -> TreeSync:
    """Compare the manifest found in the volume (None: a new volume) with the tree's."""
    if previous is None:
        return TreeSync(False, tuple(sorted(current)), (), "new build tree")
    try:
        data = json.loads(previous)
        files = data.get("files") if isinstance(data, dict) else None
    except ValueError:
        files = None
    if not isinstance(files, dict) or data.get("format") != MANIFEST_FORMAT:
        return TreeSync(False, tuple(sorted(current)), (), "build tree manifest unreadable")
    if data.get("dirty"):
        return TreeSync(False, tuple(sorted(current)), (), "an earlier sync did not finish")
    write = tuple(sorted(p for p, content in current.items() if files.get(p) != content))
    remove = tuple(sorted(p for p in files if p not in current))
    return TreeSync(True, write, remove, "")


def manifest_bytes(current: dict[str, str]) -> bytes:
    return (json.dumps({"format": MANIFEST_FORMAT, "files": current}, sort_keys=True) + "\n").encode()


def remove_list_bytes(remove: tuple[str, ...]) -> bytes:
    return "".join(p + "\n" for p in remove).encode("utf-8", "surrogateescape")


def manifest_path() -> str:
    return f"{CONTAINER_SRC}/{MANIFEST_NAME}"


def describe(sync: TreeSync) -> str:
    if sync.everything:
        return f"build tree: {sync.reason}, {len(sync.write)} files written"
    return f"build tree reused: {len(sync.write)} files changed, {len(sync.remove)} removed"


def tree_files(tree: Path) -> list[tuple[int, str, str]]:
    from patcher.source import tracked_files

    return tracked_files(tree)
