"""A build's work directory, ``<work>/<build-id>/``: its lock, its record, and what a new run
of the same command does with what an earlier one left.

* ``record.json`` — the typed :class:`patcher.record.BuildRecord`, rewritten atomically after
  every stage; ``build.log`` — the full log (kept when a build fails); ``source/`` — the tree;
  ``image/`` — the rendered Dockerfile; ``dist/`` — the wheel and its evidence.
* Running the same build again continues after the last completed stage: what is done stays
  done.  ``fresh`` starts over; a record of another spec in the directory is refused.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from patcher.errors import EvidenceFormatError, WorkDirError
from patcher.record import BuildRecord, save_record
from patcher.spec import BuildSpec
from patcher.util import utc_now

RECORD_NAME = "record.json"
LOG_NAME = "build.log"
SOURCE_DIR = "source"
DIST_DIR = "dist"
IMAGE_DIR = "image"
LOCK_NAME = ".lock"


@dataclass(frozen=True)
class Opened:
    record: BuildRecord
    continued: bool  # an earlier run's record was taken up


class WorkDir:
    """``with WorkDir(root, spec) as wd: record = wd.open(...)``; the directory is locked inside."""

    def __init__(self, root: Path, spec: BuildSpec):
        self.spec = spec
        self.path = (Path(root) / spec.build_id).absolute()
        self._lock: IO[str] | None = None

    @property
    def record_path(self) -> Path:
        return self.path / RECORD_NAME

    @property
    def log_path(self) -> Path:
        return self.path / LOG_NAME

    @property
    def tree(self) -> Path:
        return self.path / SOURCE_DIR

    @property
    def dist(self) -> Path:
        return self.path / DIST_DIR

    # -- the lock
    def __enter__(self) -> WorkDir:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.path / LOCK_NAME, "w")
        except OSError as exc:
            raise WorkDirError(f"cannot use work directory {self.path}: {exc.strerror}",
                               hint="pass a writable --work") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            self._lock = None
            raise WorkDirError(f"another patcher build is using {self.path}",
                               hint="wait for it, or pass another --work") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    # -- the record
    def open(self, fresh: bool, resume: bool, settings: dict[str, str]) -> Opened:
        """The record to go on with: the earlier run's (same spec), or a new one."""
        if fresh:
            self._clear()
        elif self.record_path.exists():
            return Opened(self._load_same_spec(), continued=True)
        elif resume:
            raise WorkDirError(f"nothing to resume: {self.record_path} does not exist", hint="start without --resume")
        for stale in (self.log_path, self.tree):  # left without a record: not ours to continue
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
        spec = self.spec
        record = BuildRecord(build_id=spec.build_id, spec=json.loads(json.dumps(spec.to_json())),
                             base_image_digest=spec.image.digest,
                             started=utc_now(), log_path=LOG_NAME, settings=settings)
        self.save(record)
        return Opened(record, continued=False)

    def save(self, record: BuildRecord) -> None:
        save_record(record, self.record_path)

    def _load_same_spec(self) -> BuildRecord:
        try:
            record = BuildRecord.from_json(json.loads(self.record_path.read_text(encoding="utf-8")), partial=True)
        except (ValueError, EvidenceFormatError) as exc:
            reason = exc.message if isinstance(exc, EvidenceFormatError) else str(exc)
            raise WorkDirError(f"{self.record_path} is not a build record: {reason}",
                               hint="pass --fresh to start over") from None
        if record.spec != json.loads(json.dumps(self.spec.to_json())):
            raise WorkDirError(f"{self.record_path} holds another build's record (its spec differs from "
                               f"the one resolved now)", hint="pass --fresh to start over, or another --work")
        return record

    def _clear(self) -> None:
        for child in self.path.iterdir():
            if child.name == LOCK_NAME:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
