"""BuildRecord: what one build did, written by the build stage into ``work/<build-id>/record.json``.

The record is the single input of the certify stage (together with the probe report), so it
holds everything the provenance and the SBOM state: the resolved spec, the source manifest
(commit and submodules), the applied patch series with hashes, the image the build ran in,
toolchain versions, the wheel, the log and the timings.  Paths in a record may be relative:
they are relative to the directory that holds ``record.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from patcher.errors import EvidenceFormatError

RECORD_SCHEMA = 1


@dataclass(frozen=True)
class Submodule:
    path: str
    url: str
    commit: str


@dataclass(frozen=True)
class SourceManifest:
    repo: str
    tag: str
    commit: str
    tree_hash: str | None = None
    submodules: tuple[Submodule, ...] = ()


@dataclass(frozen=True)
class AppliedPatch:
    id: str        # Patch-Id trailer, e.g. PT-0001
    file: str      # file name in patches/<version>/
    sha256: str    # of the patch file as it sits in the catalog
    commit: str    # the commit `git am` made for it in the build tree


@dataclass(frozen=True)
class WheelFile:
    name: str
    sha256: str
    path: str


@dataclass(frozen=True)
class PipRequirement:
    """A pip package installed into the build image (build requirement), pinned by hash."""

    name: str
    version: str
    sha256: str | None = None


@dataclass(frozen=True)
class BuildRecord:
    build_id: str
    spec: dict[str, Any]              # BuildSpec.to_json()
    source: SourceManifest
    patches: tuple[AppliedPatch, ...]
    dockerfile_sha256: str
    image_id: str
    base_image_digest: str
    toolchain: dict[str, str]
    wheel: WheelFile
    log_path: str
    started: str                      # ISO 8601, UTC
    finished: str
    stage_durations: dict[str, float] = field(default_factory=dict)
    log_sha256: str | None = None
    build_requirements: tuple[PipRequirement, ...] = ()
    # settings that shaped the build beyond the spec (mirror locations, docker host ...)
    settings: dict[str, str] = field(default_factory=dict)
    # explicit trust decisions beyond those the spec marks (commit/image/artifact overrides)
    trust_overrides: tuple[dict[str, str], ...] = ()
    schema: int = RECORD_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildRecord:
        """Parse a record; raises EvidenceFormatError naming the first missing or bad field."""
        if not isinstance(data, dict):
            raise EvidenceFormatError("build record is not a JSON object")
        if data.get("schema", RECORD_SCHEMA) != RECORD_SCHEMA:
            raise EvidenceFormatError(f"build record schema {data.get('schema')!r} is not supported "
                                      f"(this patcher reads schema {RECORD_SCHEMA})")
        missing = [name for name in _required_fields(cls) if name not in data]
        if missing:
            raise EvidenceFormatError(f"build record lacks field(s): {', '.join(missing)}")
        try:
            # A record may be a superset (the builder keeps its stage state in it): unknown keys
            # are ignored at every level.
            values = _known(cls, data)
            src = _known(SourceManifest, values["source"])
            src["submodules"] = tuple(Submodule(**_known(Submodule, s)) for s in src.get("submodules", ()))
            values["source"] = SourceManifest(**src)
            values["patches"] = tuple(AppliedPatch(**_known(AppliedPatch, p)) for p in values["patches"])
            values["wheel"] = WheelFile(**_known(WheelFile, values["wheel"]))
            values["build_requirements"] = tuple(PipRequirement(**_known(PipRequirement, r))
                                                 for r in values.get("build_requirements", ()))
            values["trust_overrides"] = tuple(dict(o) for o in values.get("trust_overrides", ()))
            return cls(**values)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise EvidenceFormatError(f"build record is malformed: {exc}") from None

    def resolve(self, record_dir: Path, path: str) -> Path:
        """A path from the record, relative ones taken from the record's directory."""
        p = Path(path)
        return p if p.is_absolute() else record_dir / p


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be a JSON object, not {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _required_fields(cls: type) -> list[str]:
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


def load_record(path: Path) -> BuildRecord:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EvidenceFormatError(f"build record {path} does not exist",
                                  hint="give the record.json a build wrote into work/<build-id>/") from None
    except OSError as exc:
        raise EvidenceFormatError(f"build record {path} cannot be read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvidenceFormatError(f"build record {path} is not valid JSON: {exc}") from None
    return BuildRecord.from_json(data)


def write_atomic(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Write a file so that readers see either the old content or the new, never half of it."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def save_record(record: BuildRecord, path: Path) -> None:
    write_atomic(path, record.dumps())
