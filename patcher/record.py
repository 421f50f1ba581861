"""BuildRecord: what one build did, written by the build stage into ``work/<build-id>/record.json``.

The record is the single input of the certify stage (together with the probe report), so it
holds everything the provenance and the SBOM state: the resolved spec, the source manifest
(commit and submodules), the applied patch series with hashes, the image the build ran in,
toolchain versions, the wheel, the log and the timings.  Paths in a record may be relative:
they are relative to the directory that holds ``record.json``.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from patcher.errors import EvidenceFormatError
from patcher.util import write_atomic

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
class PinnedInput:
    """A pinned third-party file placed into the tree before the build (matrix ``inputs``)."""

    name: str
    sha256: str          # of the downloaded artifact
    member: str | None   # the archive member taken, None for the file itself
    dest: str | None     # where it goes in the tree
    content_sha256: str  # of the bytes placed there


@dataclass(frozen=True)
class PatchedState:
    """The tree after the patch stage (patcher.patches.PatchedTree without the local path)."""

    base: str | None
    head: str
    tree_hash: str


@dataclass(frozen=True)
class Reproducibility:
    builds: int
    sha256: tuple[str, ...]
    reproducible: bool


@dataclass(frozen=True)
class BuildTreeUse:
    """How the wheel stage used a kept build tree (``--keep-build-tree``): the volume, whether it
    held an earlier build of the spec, and how many files the sync wrote and removed."""

    volume: str
    reused: bool
    written: int
    removed: int
    reason: str = ""  # why every file was written, when the tree was not reused


@dataclass(frozen=True)
class UnprovenPatch:
    """A patch of the series whose probe checks did not run on this build, and why."""

    id: str
    checks: tuple[str, ...]
    reason: str

    def line(self) -> str:
        return f"{self.id}: not proven on this build: {self.reason}"


@dataclass(frozen=True)
class EvidenceFiles:
    provenance: str
    sbom: str
    keyid: str


# The fields certify needs; a record of an unfinished build lacks some of them.
CERTIFY_FIELDS = ("source", "dockerfile_sha256", "image_id", "toolchain", "wheel", "finished")


@dataclass(frozen=True)
class BuildRecord:
    """One build's record, complete or not: the build stage adds each stage's outcome as it
    completes (``completed_stages``), and certify reads the finished one."""

    build_id: str
    spec: dict[str, Any]              # BuildSpec.to_json()
    base_image_digest: str
    started: str                      # ISO 8601, UTC
    log_path: str = "build.log"
    finished: str | None = None       # when the last completed stage ended
    completed_stages: tuple[str, ...] = ()
    stage_durations: dict[str, float] = field(default_factory=dict)
    # settings that shaped the build beyond the spec (mirror locations, docker host ...)
    settings: dict[str, str] = field(default_factory=dict)
    # fetch
    source: SourceManifest | None = None
    source_date_epoch: int | None = None
    inputs: tuple[PinnedInput, ...] = ()
    # patch
    patches: tuple[AppliedPatch, ...] = ()
    patched_tree: PatchedState | None = None
    # render
    dockerfile_sha256: str | None = None
    image_tag: str | None = None
    build_requirements: tuple[PipRequirement, ...] = ()
    # image
    image_id: str | None = None
    image_reused: bool | None = None
    # configure, wheel
    container_env: dict[str, str] = field(default_factory=dict)
    toolchain: dict[str, str] = field(default_factory=dict)
    wheel: WheelFile | None = None
    reproducibility: Reproducibility | None = None
    build_tree: BuildTreeUse | None = None
    # probe, certify
    probe_report: str | None = None
    unproven_patches: tuple[UnprovenPatch, ...] = ()
    evidence: EvidenceFiles | None = None
    log_sha256: str | None = None
    # explicit trust decisions beyond those the spec marks (commit/image/artifact overrides)
    trust_overrides: tuple[dict[str, str], ...] = ()
    schema: int = RECORD_SCHEMA

    def to_json(self) -> dict[str, Any]:
        """The JSON form; fields not known yet are left out, so a reader of an unfinished
        build's record is told what is missing."""
        data = asdict(self)
        return {k: v for k, v in data.items() if v is not None and not (k == "toolchain" and not v)}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    def with_stage(self, stage: str, seconds: float, finished: str) -> BuildRecord:
        return replace(self, completed_stages=(*self.completed_stages, stage),
                       stage_durations={**self.stage_durations, stage: seconds}, finished=finished)

    def missing_for_certify(self) -> list[str]:
        return [name for name in CERTIFY_FIELDS if not getattr(self, name)]

    @classmethod
    def from_json(cls, data: dict[str, Any], partial: bool = False) -> BuildRecord:
        """Parse a record; raises EvidenceFormatError naming the first missing or bad field.
        ``partial``: an unfinished build's record (the builder resuming) is accepted too."""
        if not isinstance(data, dict):
            raise EvidenceFormatError("build record is not a JSON object")
        if data.get("schema", RECORD_SCHEMA) != RECORD_SCHEMA:
            raise EvidenceFormatError(f"build record schema {data.get('schema')!r} is not supported "
                                      f"(this patcher reads schema {RECORD_SCHEMA})")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in (required if partial else [*required, *CERTIFY_FIELDS]) if name not in data]
        if missing:
            raise EvidenceFormatError(f"build record lacks field(s): {', '.join(missing)}")
        try:
            # A record may be a superset (written by a newer patcher, or with keys of its own):
            # unknown keys are ignored at every level.
            values = _known(cls, data)
            if values.get("source") is not None:
                src = _known(SourceManifest, values["source"])
                src["submodules"] = tuple(Submodule(**_known(Submodule, s)) for s in src.get("submodules", ()))
                values["source"] = SourceManifest(**src)
            for name, kind in (("wheel", WheelFile), ("patched_tree", PatchedState), ("evidence", EvidenceFiles),
                               ("build_tree", BuildTreeUse)):
                if values.get(name) is not None:
                    values[name] = kind(**_known(kind, values[name]))
            if values.get("reproducibility") is not None:
                repro = _known(Reproducibility, values["reproducibility"])
                values["reproducibility"] = Reproducibility(**{**repro, "sha256": tuple(repro.get("sha256", ()))})
            for name, kind in (("patches", AppliedPatch), ("inputs", PinnedInput),
                               ("build_requirements", PipRequirement)):
                values[name] = tuple(kind(**_known(kind, item)) for item in values.get(name, ()))
            values["unproven_patches"] = tuple(
                UnprovenPatch(**{**_known(UnprovenPatch, u), "checks": tuple(u.get("checks", ()))})
                for u in values.get("unproven_patches", ()))
            values["completed_stages"] = tuple(values.get("completed_stages", ()))
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


def save_record(record: BuildRecord, path: Path) -> None:
    write_atomic(path, record.dumps())
