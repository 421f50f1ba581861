"""Build stage: a BuildSpec -> a wheel built in a container, with its log and BuildRecord.

``patcher build`` runs the whole pipeline, one stage after another, in a work directory
``<work>/<build-id>/``::

    resolve  fetch  patch  render  image  configure  wheel  probe  certify

* ``record.json``: the build's state, rewritten atomically after every stage.  It is a
  superset of :class:`patcher.record.BuildRecord` (the certify stage reads it as one) plus the
  stages completed so far, so ``--resume`` continues after the last completed stage and
  ``--until STAGE`` stops after it.
* ``build.log``: the full log of every stage (kept when a build fails).
* ``source/``: the fetched and patched tree; ``image/``: the rendered Dockerfile;
  ``dist/``: the wheel (and, after probe/certify, its evidence).

Docker is driven through the docker SDK (``docker.from_env()``, so ``DOCKER_HOST`` and
``--docker-host`` reach remote engines).  The builder image is built with the low-level API
(classic builder, streamed log) and tagged by its Dockerfile's hash, so an unchanged spec reuses
it.  Configure and wheel each run in a fresh container of that image, hermetic: the patched tree
(git-tracked files plus the pinned third-party inputs, nothing else) is copied in with
``put_archive``, the network is off, the wheel leaves through ``get_archive``; only the ccache
volume is shared between builds.  A timeout, SIGINT/SIGTERM or any error removes the container
and keeps the log.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from patcher.config import Settings
from patcher.errors import (
    BuildTimeoutError,
    ChecksumMismatchError,
    DiskFullError,
    DockerPermissionError,
    DockerUnavailableError,
    ImageBuildError,
    InterruptedByUser,
    PatcherError,
    ReproducibilityError,
    UnreachableInputError,
    WheelBuildError,
    WorkDirError,
)
from patcher.record import write_atomic
from patcher.spec import Artifact, BuildSpec, resolve

STAGES = ("resolve", "fetch", "patch", "render", "image", "configure", "wheel", "probe", "certify")
RECORD_NAME = "record.json"
LOG_NAME = "build.log"
SOURCE_DIR = "source"
DIST_DIR = "dist"
REPRO_DIR = "reproducibility"
PROBE_SUFFIX = ".probe.json"  # the name certify and verify expect beside the wheel

# The image contract (patcher/dockerfile.py): user builder, the tree in /src, ccache in /ccache,
# wheels in /out, the interpreter in $PATCHER_PYTHON.
BUILD_USER = "builder"
BUILDER_UID = 1000
CONTAINER_SRC = "/src"
CONTAINER_CCACHE = "/ccache"
CONTAINER_OUT = "/out"
TOOLCHAIN_FILE = "/tmp/patcher-toolchain.txt"
LABEL_BUILD = "org.patcher.build-id"
LABEL_STAGE = "org.patcher.stage"
LABEL_WORK_DIR = "org.patcher.work-dir"  # tells concurrent builds of one spec apart
LABEL_CCACHE = "org.patcher.ccache"

DEFAULT_TIMEOUT = 8 * 3600.0
DISK_FULL_MARKERS = ("No space left on device", "no space left on device")
MIRROR_FILES_HINT = ("stage it in a files mirror as <base>/<sha256>: --mirror, PATCHER_MIRROR, "
                     "or `files_mirror` / `mirror` in the config file")
# A fetch from a host that does not answer must fail in seconds, not hang: git's curl gives up
# when fewer than LIMIT bytes/s arrive for TIME seconds (connecting included).
GIT_STALL_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": "30"}
DOWNLOAD_CONNECT_TIMEOUT = 30.0

# What runs inside the container.  PyTorch's setup.py (and the stand-in's) read the environment
# set by the builder; `build --cmake-only` is PyTorch's configure-only mode.
TOOLCHAIN_SCRIPT = f"""\
{{
  echo "== gcc"; "${{CC:-gcc}}" --version | head -n 1
  echo "== g++"; "${{CXX:-g++}}" --version | head -n 1
  echo "== python"; "${{PATCHER_PYTHON:-python3}}" --version 2>&1
  if command -v cmake >/dev/null; then echo "== cmake"; cmake --version | head -n 1; fi
  if command -v ninja >/dev/null; then echo "== ninja"; ninja --version; fi
  if command -v ccache >/dev/null; then echo "== ccache"; ccache --version | head -n 1; fi
  if command -v nvcc >/dev/null; then echo "== nvcc"; nvcc --version | tail -n 1; fi
}} > {TOOLCHAIN_FILE} 2>&1 || true
"""
STAGE_COMMANDS = {
    "configure": '"${PATCHER_PYTHON:-python3}" setup.py build --cmake-only',
    "wheel": f'"${{PATCHER_PYTHON:-python3}}" setup.py bdist_wheel --dist-dir {CONTAINER_OUT}',
}


# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildOptions:
    torch: str
    cuda: str | None = None
    python: str | None = None
    arch: str | None = None
    gcc: int | None = None
    jobs: int | None = None  # None: the engine's CPU count
    until: str | None = None
    resume: bool = False
    fresh: bool = False
    check_reproducible: bool = False
    timeout: float = DEFAULT_TIMEOUT  # per container stage, seconds
    ccache_volume: str | None = None  # None: patcher-ccache-<torch>-<cuda>
    probe_image: str | None = None  # None: the builder image
    probe_wheelhouse: str | None = None  # wheels of the wheel's dependencies (offline install)


@dataclass
class BuildState:
    """What ``record.json`` holds; the BuildRecord fields appear as soon as they are known."""

    build_id: str
    spec: dict[str, Any]
    started: str
    completed_stages: list[str] = field(default_factory=list)
    stage_durations: dict[str, float] = field(default_factory=dict)
    finished: str | None = None
    source_tree: dict[str, Any] | None = None  # patcher.source.SourceTree
    source_date_epoch: int | None = None
    inputs: list[dict[str, Any]] = field(default_factory=list)  # pinned inputs placed into the tree
    patched_tree: dict[str, Any] | None = None  # patcher.patches.PatchedTree
    patches: list[dict[str, Any]] = field(default_factory=list)  # record.AppliedPatch
    dockerfile_sha256: str | None = None
    image_tag: str | None = None
    image_id: str | None = None
    image_reused: bool | None = None
    build_requirements: list[dict[str, Any]] = field(default_factory=list)
    container_env: dict[str, str] = field(default_factory=dict)
    toolchain: dict[str, str] = field(default_factory=dict)
    wheel: dict[str, Any] | None = None
    reproducibility: dict[str, Any] | None = None
    probe_report: str | None = None
    evidence: dict[str, Any] | None = None
    settings: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildState:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema"] = 1
        data["log_path"] = LOG_NAME
        data["trust_overrides"] = []
        spec = self.spec
        data["base_image_digest"] = spec["image"]["digest"]
        if self.source_tree is not None:
            tree = self.source_tree
            data["source"] = {"repo": tree["repo"], "tag": tree["tag"], "commit": tree["commit"],
                              "tree_hash": tree.get("tree_hash"),
                              "submodules": _flat_submodules(tree.get("submodules", ()))}
        # BuildRecord's required fields exist only once known: certifying an unfinished build
        # then fails naming what is missing.
        for key in ("dockerfile_sha256", "image_id", "wheel", "finished"):
            if data[key] is None:
                del data[key]
        if not self.toolchain:
            del data["toolchain"]
        return data


def _flat_submodules(subs: Any, prefix: str = "") -> list[dict[str, str]]:
    out = []
    for sub in subs:
        out.append({"path": sub["path"], "url": sub["url"], "commit": sub["commit"]})
        out += _flat_submodules(sub.get("submodules", ()))
    return out


@dataclass(frozen=True)
class BuildResult:
    build_id: str
    work_dir: Path
    record: Path
    log: Path
    completed_stages: tuple[str, ...]
    wheel: Path | None = None
    wheel_sha256: str | None = None
    image_reused: bool | None = None
    stage_durations: dict[str, float] = field(default_factory=dict)

    @property
    def last_stage(self) -> str | None:
        return self.completed_stages[-1] if self.completed_stages else None


# ------------------------------------------------------------------------------------------------
def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _evidence_available() -> bool:
    try:
        from patcher import evidence
    except ImportError:
        return False
    return callable(getattr(evidence, "certify", None))


def ccache_volume_name(spec: BuildSpec) -> str:
    return f"patcher-ccache-{spec.torch}-{spec.cuda}"


def prefix_map_flag(gcc: int) -> str:
    """Strip the build path from objects: -ffile-prefix-map from gcc 8 on, debug info only before."""
    return "-ffile-prefix-map=/src=." if gcc >= 8 else "-fdebug-prefix-map=/src=."


def container_environment(spec: BuildSpec, jobs: int, source_date_epoch: int) -> dict[str, str]:
    """The variables PyTorch's setup.py reads, plus what makes the build reproducible."""
    flags = prefix_map_flag(spec.gcc)
    env = {
        "MAX_JOBS": str(jobs),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
        "PYTORCH_BUILD_VERSION": spec.wheel_version,
        "PYTORCH_BUILD_NUMBER": str(spec.build_number),
        "USE_CUDA": "0" if spec.is_cpu else "1",
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "PYTHONHASHSEED": "0",
        "CFLAGS": flags,
        "CXXFLAGS": flags,
        # distutils links extensions with sysconfig's LDSHARED (x86_64-linux-gnu-gcc on Debian's
        # Python 3.9, a compiler the image does not have): CC alone does not change it there.
        "LDSHARED": f"gcc-{spec.gcc} -pthread -shared",
        "CCACHE_DIR": CONTAINER_CCACHE,
        "CCACHE_BASEDIR": CONTAINER_SRC,
        "HOME": f"/home/{BUILD_USER}",
    }
    if not spec.is_cpu:
        env["TORCH_CUDA_ARCH_LIST"] = spec.arch_list or ""
        if spec.nvcc_flags:
            env["TORCH_NVCC_FLAGS"] = spec.nvcc_flags
    env.update(spec.build_env)
    return dict(sorted(env.items()))


def parse_toolchain(text: str) -> dict[str, str]:
    """'== gcc\\ngcc-10 (Debian 10.2.1-6) 10.2.1\\n== python\\n...' -> {'gcc': '...', ...}."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^== (\S+)$", line)
        if m:
            name = m.group(1)
        elif name and line.strip() and name not in out:
            out[name] = line.strip()
    return out


def log_mentions_disk_full(line: str) -> bool:
    return any(marker in line for marker in DISK_FULL_MARKERS)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ERROR_LINE = re.compile(r"(\berror\b|\bError\b|FAILED:|fatal:|No space left)")


def last_meaningful(lines: list[str]) -> str:
    """The line that says why a build failed: CMake's error with its reason, else the last
    compiler/ninja error, else the last line of output."""
    text = [t for t in (_ANSI.sub("", ln).strip() for ln in lines) if t]
    for i in range(len(text) - 1, -1, -1):
        if text[i].startswith("CMake Error"):
            reason = text[i + 1] if i + 1 < len(text) else ""
            return f"{text[i]} {reason}".strip()[:300]
    for line in reversed(text[-60:]):
        if _ERROR_LINE.search(line):
            return line[:300]
    return text[-1][:300] if text else "(no output)"


# --- progress and log ------------------------------------------------------------------------------
class Progress:
    """One live display (a rewritten line on a TTY, plain lines otherwise) and the full log."""

    PLAIN_INTERVAL = 30.0
    TTY_INTERVAL = 0.2

    def __init__(self, log_path: Path, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_file = open(log_path, "a", encoding="utf-8", errors="replace")
        self.lock = threading.Lock()
        self.stage: str | None = None
        self.stage_start = time.monotonic()
        self.last_line = ""
        self.last_shown = 0.0
        self.partial = ""

    # -- the log
    def log(self, text: str) -> None:
        """Append output (any number of lines, possibly partial) to the log and the display."""
        with self.lock:
            self.log_file.write(text)
            self.log_file.flush()
            chunk = self.partial + text
            parts = re.split(r"[\r\n]", chunk)
            self.partial = parts.pop()
            for line in parts:
                if line.strip():
                    self.last_line = line.strip()
            self._show(force=False)

    def note(self, message: str) -> None:
        """A line that matters: into the log and onto the display as a line of its own."""
        with self.lock:
            self.log_file.write(f"patcher: {message}\n")
            self.log_file.flush()
            self._clear()
            self.stream.write(f"patcher: {message}\n")
            self.stream.flush()

    def log_only(self, message: str) -> None:
        """A line for the log alone (the CLI prints errors itself)."""
        with self.lock:
            self.log_file.write(f"patcher: {message}\n")
            self.log_file.flush()
            self._clear()

    # -- stages
    def start(self, stage: str) -> None:
        with self.lock:
            self.stage, self.stage_start, self.last_line = stage, time.monotonic(), ""
            self.log_file.write(f"==> {stage} ({utc_now()})\n")
            self.log_file.flush()
            if not self.tty:
                self.stream.write(f"patcher: [{stage}] started\n")
                self.stream.flush()
            self._show(force=True)

    def done(self, stage: str, seconds: float, detail: str = "") -> None:
        with self.lock:
            suffix = f": {detail}" if detail else ""
            self.log_file.write(f"==> {stage} done in {seconds:.1f} s{suffix}\n")
            self.log_file.flush()
            self._clear()
            self.stream.write(f"patcher: [{stage}] done in {seconds:.1f} s{suffix}\n")
            self.stream.flush()
            self.stage = None

    def close(self) -> None:
        with self.lock:
            self._clear()
            if self.partial:
                self.log_file.write("\n")
            self.log_file.close()

    # -- display
    def _status(self) -> str:
        elapsed = int(time.monotonic() - self.stage_start)
        return f"[{self.stage} {elapsed // 60:02d}:{elapsed % 60:02d}] {self.last_line}"

    def _show(self, force: bool) -> None:
        if self.stage is None:
            return
        now = time.monotonic()
        interval = self.TTY_INTERVAL if self.tty else self.PLAIN_INTERVAL
        if not force and now - self.last_shown < interval:
            return
        self.last_shown = now
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\x1b[K" + self._status()[:width])
        elif not force:
            self.stream.write("patcher: " + self._status()[:200] + "\n")
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")


# --- docker ------------------------------------------------------------------------------------------
def docker_client(docker_host: str | None = None):
    """``docker.from_env()`` (``--docker-host`` sets DOCKER_HOST); a bad engine is one clear error."""
    import docker

    env = dict(os.environ)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    where = env.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(environment=env, timeout=600)
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        if _is_permission_error(exc):
            raise DockerPermissionError(
                f"no permission to use the Docker engine at {where}",
                hint="run as a member of the docker group, or point --docker-host / DOCKER_HOST "
                     "at an engine this user may use") from None
        raise DockerUnavailableError(
            f"the Docker engine at {where} is not reachable: {_short(exc)}",
            hint="start the engine, or point --docker-host / DOCKER_HOST at one") from None


def _is_permission_error(exc: BaseException) -> bool:
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, PermissionError) or "Permission denied" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return False


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "explanation", None) or exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def ensure_ccache_volume(client, name: str, spec: BuildSpec) -> None:
    import docker

    try:
        client.volumes.get(name)
    except docker.errors.NotFound:
        client.volumes.create(name=name, labels={LABEL_CCACHE: "1", "org.patcher.torch": spec.torch,
                                                 "org.patcher.cuda": spec.cuda})


def remove_volume(client, name: str) -> None:
    import docker

    try:
        client.volumes.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass


# --- the source archive ----------------------------------------------------------------------------
def source_archive(tree: Path, inputs: list[tuple[str, bytes]], mtime: int, dest: Path) -> None:
    """A tar of the tree for put_archive into /src: git-tracked files only (no .git, no build
    outputs), plus the pinned inputs at their places; sorted, fixed mtime, owned by the builder."""
    from patcher.source import tracked_files

    entries = sorted(tracked_files(tree), key=lambda e: e[2].encode("utf-8", "surrogateescape"))
    extra = dict(inputs)
    dirs: set[str] = set()

    def info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.size, ti.mtime = kind, mode, size, mtime
        ti.uid = ti.gid = BUILDER_UID
        ti.uname = ti.gname = BUILD_USER
        return ti

    def add_parents(tar: tarfile.TarFile, path: str) -> None:
        # Every directory explicitly, so the unprivileged builder owns it (not root).
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                tar.addfile(info(d, tarfile.DIRTYPE, 0o755))

    with open(dest, "wb") as fh, tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for mode, _oid, path in entries:
            if mode == 0o160000 or path in extra:
                continue
            full = tree / path
            add_parents(tar, path)
            if mode == 0o120000:
                ti = info(path, tarfile.SYMTYPE, 0o777)
                ti.linkname = os.readlink(full)
                tar.addfile(ti)
            elif full.is_file():
                ti = info(path, tarfile.REGTYPE, 0o755 if mode == 0o100755 else 0o644, full.stat().st_size)
                with open(full, "rb") as data:
                    tar.addfile(ti, data)
        for path, data in sorted(extra.items()):
            add_parents(tar, path)
            tar.addfile(info(path, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))


# --- pinned inputs -----------------------------------------------------------------------------------
def input_url(art: Artifact, settings: Settings) -> str:
    base = settings.files_base()
    return f"{base}/{art.sha256}" if base else art.url


def fetch_input(art: Artifact, settings: Settings) -> Path:
    """The input in the cache (``<cache>/files/<sha256>``), downloaded and checked when absent."""
    import requests

    cache = Path(settings.cache_dir) / "files"
    path = cache / art.sha256
    if path.is_file() and sha256_file(path) == art.sha256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    url = input_url(art, settings)
    fd, tmp = tempfile.mkstemp(prefix=f".{art.sha256[:16]}.", suffix=".part", dir=cache)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            if url.startswith("file://") or "://" not in url:
                local = Path(url[len("file://"):] if url.startswith("file://") else url)
                try:
                    with open(local, "rb") as src:
                        for chunk in iter(lambda: src.read(1 << 20), b""):
                            digest.update(chunk)
                            out.write(chunk)
                except OSError as exc:
                    raise UnreachableInputError(f"cannot read input {art.name} from {url}: {exc.strerror}",
                                                hint=MIRROR_FILES_HINT) from None
            else:
                try:
                    with requests.get(url, stream=True, timeout=(DOWNLOAD_CONNECT_TIMEOUT, 120)) as resp:
                        resp.raise_for_status()
                        for chunk in resp.iter_content(1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                except requests.RequestException as exc:
                    raise UnreachableInputError(f"cannot download input {art.name} from {url}: {_short(exc)}",
                                                hint=MIRROR_FILES_HINT) from None
        if digest.hexdigest() != art.sha256:
            raise ChecksumMismatchError(
                f"input {art.name} from {url} has sha256 {digest.hexdigest()}, pinned is {art.sha256}",
                hint="the download is not the pinned file: check the mirror's copy")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def input_content(art: Artifact, path: Path) -> bytes:
    """The bytes that go into the tree: the archive member, or the file itself."""
    if not art.member:
        return path.read_bytes()
    try:
        with tarfile.open(path) as tar:
            member = tar.extractfile(art.member)
            if member is None:
                raise KeyError(art.member)
            return member.read()
    except (KeyError, tarfile.TarError) as exc:
        raise ChecksumMismatchError(f"input {art.name} has no file {art.member}: {exc}",
                                    hint="check `member` of the input in the matrix") from None


# --- the build ---------------------------------------------------------------------------------------
class _Interrupted(BaseException):
    """SIGTERM, raised in the main thread so every cleanup (finally) runs."""


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ARG001
        raise _Interrupted()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _env_overlay(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Builder:
    """One build in one work directory; :meth:`run` goes through the stages."""

    def __init__(self, settings: Settings, options: BuildOptions, stream: TextIO | None = None,
                 tty: bool | None = None):
        self.settings = settings
        self.options = options
        self.stream = stream
        self.tty = tty
        self.spec: BuildSpec | None = None
        self.state: BuildState | None = None
        self.dir: Path | None = None
        self.progress: Progress | None = None
        self._client = None
        self._lock_fh = None

    # -- paths
    @property
    def record_path(self) -> Path:
        return self.dir / RECORD_NAME

    @property
    def log_path(self) -> Path:
        return self.dir / LOG_NAME

    @property
    def tree(self) -> Path:
        return self.dir / SOURCE_DIR

    @property
    def client(self):
        if self._client is None:
            self._client = docker_client(self.settings.docker_host)
        return self._client

    # -- the pipeline
    def run(self) -> BuildResult:
        opts = self.options
        if opts.until is not None and opts.until not in STAGES:
            raise WorkDirError(f"--until {opts.until}: no such stage", hint="stages: " + ", ".join(STAGES))
        spec = resolve(self.settings, opts.torch, cuda=opts.cuda, python=opts.python, arch=opts.arch,
                       gcc=opts.gcc)
        spec.require_pinned()
        self.spec = spec
        self._open_work_dir(spec)
        try:
            with _terminate_as_interrupt():
                try:
                    if self._needs_docker():
                        _ = self.client  # a bad engine fails now, before minutes of fetching
                        self._check_leftover_containers()
                        self._forget_missing_image()
                    self._run_stages()
                except (KeyboardInterrupt, _Interrupted):
                    self.progress.note(f"interrupted; log kept in {self.log_path}")
                    raise InterruptedByUser("build interrupted; containers removed, log kept in "
                                            f"{self.log_path}", hint="continue it with --resume") from None
                except PatcherError as exc:
                    self.progress.log_only(f"error: {exc}")
                    self._save()  # what the failed stage learnt (toolchain ...) stays in the record
                    raise
        finally:
            self.progress.close()
            if self._client is not None:
                self._client.close()
            self._unlock()
        return self._result()

    def _needs_docker(self) -> bool:
        last = STAGES.index(self.options.until) if self.options.until else len(STAGES) - 1
        pending = [s for s in STAGES[:last + 1] if s not in self.state.completed_stages]
        return any(STAGES.index(s) >= STAGES.index("image") for s in pending)

    def _run_stages(self) -> None:
        state = self.state
        for stage in STAGES:
            if stage in state.completed_stages:
                if stage == self.options.until:  # already there: --until never runs past its stage
                    self.progress.note(f"{stage} was already done; stopped there as asked (--until)")
                    break
                continue
            if stage == "certify" and not _evidence_available():
                break
            self.progress.start(stage)
            t0 = time.monotonic()
            detail = getattr(self, f"_stage_{stage}")() or ""
            seconds = round(time.monotonic() - t0, 3)
            state.completed_stages.append(stage)
            state.stage_durations[stage] = seconds
            state.finished = utc_now()
            self._save()
            self.progress.done(stage, seconds, detail)
            if stage == self.options.until:
                self.progress.note(f"stopped after {stage} as asked (--until); "
                                   f"continue with --resume; record: {self.record_path}")
                break

    def _result(self) -> BuildResult:
        st = self.state
        wheel = self.dir / st.wheel["path"] if st.wheel else None
        return BuildResult(build_id=st.build_id, work_dir=self.dir, record=self.record_path, log=self.log_path,
                           completed_stages=tuple(st.completed_stages), wheel=wheel,
                           wheel_sha256=st.wheel["sha256"] if st.wheel else None,
                           image_reused=st.image_reused, stage_durations=dict(st.stage_durations))

    # -- work directory
    def _open_work_dir(self, spec: BuildSpec) -> None:
        root = Path(self.settings.work_dir)
        self.dir = (root / spec.build_id).absolute()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock_fh = open(self.dir / ".lock", "w")
        except OSError as exc:
            raise WorkDirError(f"cannot use work directory {self.dir}: {exc.strerror}",
                               hint="pass a writable --work") from None
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_fh.close()
            self._lock_fh = None
            raise WorkDirError(f"another patcher build is using {self.dir}",
                               hint="wait for it, or pass another --work") from None
        try:
            self.state = self._load_or_start(spec)
            self.progress = Progress(self.log_path, stream=self.stream, tty=self.tty)
        except BaseException:
            self._unlock()
            raise
        self.progress.note(f"build {spec.build_id} in {self.dir}"
                           + (f" (resuming after {self.state.completed_stages[-1]})"
                              if self.state.completed_stages else ""))

    def _load_or_start(self, spec: BuildSpec) -> BuildState:
        opts = self.options
        record = self.record_path
        if opts.fresh:
            for child in self.dir.iterdir():
                if child.name == ".lock":
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif record.exists():
            try:
                state = BuildState.from_json(json.loads(record.read_text(encoding="utf-8")))
            except (ValueError, TypeError) as exc:
                raise WorkDirError(f"{record} is not a build record: {exc}",
                                   hint="pass --fresh to start over") from None
            if not opts.resume:
                raise WorkDirError(f"{self.dir} already holds a build of {spec.build_id} "
                                   f"(done: {', '.join(state.completed_stages) or 'nothing'})",
                                   hint="pass --resume to continue it, or --fresh to start over")
            if state.spec != json.loads(json.dumps(spec.to_json())):
                raise WorkDirError(f"{record} holds another build's record (its spec differs from "
                                   f"the one resolved now)", hint="pass --fresh to start over, or another --work")
            return state
        elif opts.resume:
            raise WorkDirError(f"nothing to resume: {record} does not exist", hint="start without --resume")
        for stale in (self.log_path, self.tree):
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
        state = BuildState(build_id=spec.build_id, spec=spec.to_json(), started=utc_now(),
                           settings=self._settings_record())
        self.state = state
        self._save()
        return state

    def _settings_record(self) -> dict[str, str]:
        s = self.settings
        out = {name: str(getattr(s, name)) for name in
               ("mirror", "git_mirror", "files_mirror", "pypi_index", "debian_mirror", "registry", "docker_host")
               if getattr(s, name)}
        if self.options.check_reproducible:
            out["check_reproducible"] = "true"
        return out

    def _save(self) -> None:
        write_atomic(self.record_path, json.dumps(self.state.to_json(), indent=2, sort_keys=True) + "\n")

    def _unlock(self) -> None:
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    # -- stages ---------------------------------------------------------------------------------
    def _stage_resolve(self) -> str:
        spec = self.spec
        return f"torch {spec.wheel_version}, Python {spec.python}, gcc {spec.gcc}, base {spec.image.pinned}"

    def _stage_fetch(self) -> str:
        from patcher import source

        spec, state = self.spec, self.state
        if self.tree.exists():  # left by a fetch that did not complete: start it again
            shutil.rmtree(self.tree)
        self.progress.log(f"fetching {spec.tag} ({spec.commit}) from "
                          f"{source.mirror_url(spec.repo, self.settings.git_base())}\n")
        with _env_overlay(GIT_STALL_ENV):
            tree = source.fetch(spec, self.settings, self.tree)
        state.source_tree = tree.to_json()
        epoch = source.run_git("log", "-1", "--format=%ct", spec.commit, cwd=self.tree).stdout.strip()
        state.source_date_epoch = int(epoch)
        state.inputs = []
        for art in spec.inputs:
            self.progress.log(f"input {art.name} ({art.sha256}) from {input_url(art, self.settings)}\n")
            path = fetch_input(art, self.settings)
            content = input_content(art, path)
            state.inputs.append({"name": art.name, "sha256": art.sha256, "member": art.member, "dest": art.dest,
                                 "content_sha256": hashlib.sha256(content).hexdigest()})
        return f"{tree.commit[:12]}, {len(tree.submodules)} submodule(s), {len(spec.inputs)} pinned input(s)"

    def _stage_patch(self) -> str:
        from patcher import patches

        series = patches.load_series(self.settings.patches_dir, self.spec.torch)
        self.progress.log(f"series of torch {self.spec.torch}: {', '.join(series.ids) or '(empty)'}\n")
        patched = patches.apply_series(series, self.tree)
        files = {p.id: p.file for p in series.patches}
        self.state.patched_tree = patched.to_json()
        self.state.patches = [{"id": p.id, "file": files[p.id], "sha256": p.sha256, "commit": p.commit or ""}
                              for p in patched.patches]
        return f"{len(patched.patches)} patch(es), head {patched.head[:12]}"

    def _stage_render(self) -> str:
        from patcher import dockerfile

        rendered = dockerfile.render(self.spec, self.settings)
        out = self.dir / "image"
        if out.exists():
            shutil.rmtree(out)
        rendered.write(out)
        packages = dockerfile.build_packages(self.spec, self.settings)
        reqs = []
        for p in packages.pip:
            name, _, version = p.requirement.partition("==")
            reqs.append({"name": name, "version": version, "sha256": p.sha256})
        self.state.build_requirements = reqs
        self.state.dockerfile_sha256 = rendered.sha256
        self.state.image_tag = rendered.image_tag
        return f"{rendered.image_tag} (Dockerfile sha256 {rendered.sha256[:16]})"

    def _stage_image(self) -> str:
        import docker

        from patcher import dockerfile

        rendered = dockerfile.render(self.spec, self.settings)
        if rendered.sha256 != self.state.dockerfile_sha256:
            raise WorkDirError("the rendered Dockerfile changed since the render stage",
                               hint="pass --fresh to start over")
        api = self.client.api
        try:
            image_id = api.inspect_image(rendered.image_tag)["Id"]
            self.state.image_reused = True
            self.progress.log(f"image {rendered.image_tag} exists ({image_id}); not building it again\n")
        except docker.errors.ImageNotFound:
            self.state.image_reused = False
            lines: list[str] = []

            def on_log(text: str) -> None:
                self.progress.log(text)
                lines.extend(ln for ln in text.splitlines() if ln.strip())
                del lines[:-200]

            try:
                image_id = dockerfile.build_image(api, rendered, on_log=on_log)
            except ImageBuildError as exc:
                # The step's own error line (apt's "E: ...", a compiler's) says more than the
                # last line docker printed ("Removing intermediate container ...").
                reason = last_meaningful([ln for ln in lines if not ln.lstrip().startswith(
                    ("Removing intermediate container", "---> "))])
                message = exc.message.split(" (last output:", 1)[0] + (f"; {reason}" if lines else "")
                if log_mentions_disk_full(exc.message) or any(log_mentions_disk_full(ln) for ln in lines):
                    raise DiskFullError(f"the image build of {self.spec.build_id} ran out of disk space: "
                                        f"{message}", hint="free space on the engine's disk "
                                        "(docker system df)") from None
                raise ImageBuildError(message, hint=f"full log: {self.log_path}") from None
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"cannot inspect image {rendered.image_tag}: {_short(exc)}") from None
        self.state.image_id = image_id
        return f"{rendered.image_tag} {'reused' if self.state.image_reused else 'built'}"

    def _stage_configure(self) -> str:
        self._container_stage("configure", self.ccache_volume)
        return ", ".join(f"{k} {v}" for k, v in self.state.toolchain.items() if k in ("gcc", "python", "cmake"))

    def _stage_wheel(self) -> str:
        if not self.options.check_reproducible:
            wheel = self._container_stage("wheel", self.ccache_volume, collect_to=self.dir / DIST_DIR)
            return f"{wheel.name} sha256 {self.state.wheel['sha256'][:16]}"
        return self._reproducible_wheel()

    def _stage_probe(self) -> str:
        from patcher import probing

        wheel = self.dir / self.state.wheel["path"]
        image = self.options.probe_image or self.state.image_id
        ids = tuple(p["id"] for p in self.state.patches)
        self.progress.log(f"probing {wheel.name} in {image}\n")
        report = probing.probe_wheel_in_image(wheel, image, probing.ProbeOptions(patched_ids=ids),
                                              wheelhouse=self.options.probe_wheelhouse, client=self.client)
        path = wheel.with_name(wheel.name + PROBE_SUFFIX)
        write_atomic(path, json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
        self.state.probe_report = str(path.relative_to(self.dir))
        if not report.passed:
            from patcher.errors import ProbeFailedError

            failed = [c.id for c in report.checks if c.required and c.failed]
            raise ProbeFailedError(f"the probe of {wheel.name} failed: {', '.join(failed)}",
                                   hint=f"report: {path}")
        return f"{report.summary}"

    def _stage_certify(self) -> str:
        from patcher import evidence

        result = evidence.certify(self.record_path, self.dir / self.state.probe_report, self.settings.key_path,
                                  out_dir=self.dir / DIST_DIR)
        self.state.evidence = {"provenance": str(Path(result.provenance).relative_to(self.dir)),
                               "sbom": str(Path(result.sbom).relative_to(self.dir)), "keyid": result.keyid}
        return f"signed with key {result.keyid[:16]}"

    # -- containers -------------------------------------------------------------------------------
    @property
    def ccache_volume(self) -> str:
        return self.options.ccache_volume or ccache_volume_name(self.spec)

    def _check_leftover_containers(self) -> None:
        """Containers labelled with this work directory can only be left by a patcher process that
        died without cleanup (SIGKILL): this one holds the directory's lock.  A stopped one is
        removed; a running one is still building into the ccache volume, so starting a second
        build beside it is refused."""
        import docker

        try:
            found = self.client.containers.list(all=True, filters={"label": f"{LABEL_WORK_DIR}={self.dir}"})
        except docker.errors.APIError:
            return
        for container in found:
            if container.status in ("running", "paused", "restarting"):
                raise WorkDirError(
                    f"container {container.name} of an earlier build in {self.dir} is still {container.status} "
                    f"(its patcher process is gone)",
                    hint=f"wait for it (docker wait {container.name}) or remove it "
                         f"(docker rm -f {container.name}), then --resume")
            self.progress.note(f"removing container {container.name} left {container.status} by an earlier "
                               f"build in {self.dir}")
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass

    def _forget_missing_image(self) -> None:
        """A resumed build whose builder image was removed meanwhile builds it again (from the same
        pinned Dockerfile) instead of failing when its next container cannot be created."""
        import docker

        state = self.state
        if "image" not in state.completed_stages or not state.image_id:
            return
        try:
            self.client.images.get(state.image_id)
            return
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError:
            return
        self.progress.note(f"the builder image {state.image_tag} ({state.image_id[:19]}) is gone; "
                           f"building it again")
        state.completed_stages.remove("image")
        state.image_id = None
        state.image_reused = None

    def _jobs(self) -> int:
        if self.options.jobs:
            return self.options.jobs
        try:
            return int(self.client.info().get("NCPU") or os.cpu_count() or 1)
        except Exception:  # noqa: BLE001 - only a default
            return os.cpu_count() or 1

    def _input_files(self) -> list[tuple[str, bytes]]:
        files = []
        for art in self.spec.inputs:
            if art.dest:
                files.append((art.dest, input_content(art, fetch_input(art, self.settings))))
        return files

    def _container_stage(self, stage: str, volume: str, collect_to: Path | None = None) -> Path | None:
        """Run one stage's command in a fresh container; returns the wheel when ``collect_to``."""
        import docker
        import requests

        spec, state = self.spec, self.state
        client = self.client
        jobs = self._jobs()
        env = container_environment(spec, jobs, state.source_date_epoch)
        state.container_env = env
        ensure_ccache_volume(client, volume, spec)
        archive = self.dir / f".source-{stage}.tar"
        container = None
        lines: list[str] = []
        disk_full = threading.Event()
        try:
            source_archive(self.tree, self._input_files(), state.source_date_epoch, archive)
            ncpu = int(client.info().get("NCPU") or jobs)
            script = TOOLCHAIN_SCRIPT + f"set -e\ncd {CONTAINER_SRC}\n" + STAGE_COMMANDS[stage] + "\n"
            try:
                container = client.containers.create(
                    state.image_id, command=["bash", "-c", script], user=BUILD_USER, environment=env,
                    working_dir=CONTAINER_SRC, network_mode="none", nano_cpus=int(min(jobs, ncpu) * 1e9),
                    volumes={volume: {"bind": CONTAINER_CCACHE, "mode": "rw"}}, init=True,
                    labels={LABEL_BUILD: spec.build_id, LABEL_STAGE: stage, LABEL_WORK_DIR: str(self.dir)},
                    name=f"patcher-{spec.build_id.replace('+', '_')}-{stage}-{uuid.uuid4().hex[:8]}")
                with open(archive, "rb") as fh:
                    container.put_archive(CONTAINER_SRC, fh)
                archive.unlink()
                container.start()
            except docker.errors.APIError as exc:
                if log_mentions_disk_full(str(exc)):
                    raise DiskFullError(f"{stage}: the engine ran out of disk space: {_short(exc)}",
                                        hint="free space on the engine's disk (docker system df)") from None
                raise WheelBuildError(f"{stage}: cannot start the build container: {_short(exc)}") from None
            reader = threading.Thread(target=self._follow_logs, args=(container, lines, disk_full), daemon=True)
            reader.start()
            try:
                status = container.wait(timeout=self.options.timeout)["StatusCode"]
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                raise BuildTimeoutError(f"{stage} ran past {self.options.timeout:g} s and was stopped",
                                        hint=f"raise --timeout; log: {self.log_path}") from None
            reader.join(timeout=30)
            state.toolchain = self._toolchain(container) or state.toolchain
            if status != 0:
                if disk_full.is_set():
                    raise DiskFullError(f"{stage} ran out of disk space in the container: {last_meaningful(lines)}",
                                        hint=f"free space on the engine's disk or the ccache volume {volume}; "
                                             f"log: {self.log_path}")
                raise WheelBuildError(f"{stage} failed in the container (exit {status}): {last_meaningful(lines)}",
                                      hint=f"full log: {self.log_path}")
            if collect_to is None:
                return None
            wheel = self._collect_wheel(container, collect_to)
            state.wheel = {"name": wheel.name, "sha256": sha256_file(wheel),
                           "path": str(wheel.relative_to(self.dir))}
            return wheel
        finally:
            archive.unlink(missing_ok=True)
            if container is not None:
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as exc:
                    self.progress.note(f"could not remove container {container.name}: {_short(exc)}")

    def _follow_logs(self, container, lines: list[str], disk_full: threading.Event) -> None:
        partial = ""
        try:
            for chunk in container.logs(stream=True, follow=True):
                text = chunk.decode("utf-8", "replace")
                self.progress.log(text)
                parts = re.split(r"[\r\n]", partial + text)
                partial = parts.pop()
                for line in parts:
                    if line.strip():
                        lines.append(line)
                        if log_mentions_disk_full(line):
                            disk_full.set()
                del lines[:-200]
        except Exception:  # noqa: BLE001 - the container went away (removed on error or interrupt)
            pass
        if partial.strip():
            lines.append(partial)
            if log_mentions_disk_full(partial):
                disk_full.set()

    def _toolchain(self, container) -> dict[str, str]:
        import docker

        try:
            stream, _ = container.get_archive(TOOLCHAIN_FILE)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.extractfile(Path(TOOLCHAIN_FILE).name)
                return parse_toolchain(member.read().decode("utf-8", "replace")) if member else {}
        except (docker.errors.NotFound, docker.errors.APIError, tarfile.TarError):
            return {}

    def _collect_wheel(self, container, dest_dir: Path) -> Path:
        """The one wheel in /out, through the archive API, into dest_dir (temp file + rename)."""
        import docker

        try:
            stream, _ = container.get_archive(CONTAINER_OUT)
        except docker.errors.APIError as exc:
            raise WheelBuildError(f"cannot read {CONTAINER_OUT} from the build container: {_short(exc)}") from None
        dest_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.dir) as buf:
            for chunk in stream:
                buf.write(chunk)
            buf.seek(0)
            with tarfile.open(fileobj=buf) as tar:
                wheels = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".whl")]
                if len(wheels) != 1:
                    raise WheelBuildError(f"the build left {len(wheels)} wheels in {CONTAINER_OUT}, expected one: "
                                          + ", ".join(Path(m.name).name for m in wheels))
                name = Path(wheels[0].name).name
                data = tar.extractfile(wheels[0]).read()
        target = dest_dir / name
        write_atomic(target, data)
        return target

    # -- reproducibility --------------------------------------------------------------------------
    def _reproducible_wheel(self) -> str:
        """Build twice in fresh containers with fresh ccache volumes; the wheels must be equal."""
        repro = self.dir / REPRO_DIR
        if repro.exists():
            shutil.rmtree(repro)
        repro.mkdir()
        token = uuid.uuid4().hex[:8]
        volumes = [f"{ccache_volume_name(self.spec)}-repro-{token}-{n}" for n in (1, 2)]
        wheels: list[Path] = []
        try:
            for n, volume in enumerate(volumes, 1):
                self.progress.log(f"reproducibility build {n} of 2 (fresh container, fresh ccache volume {volume})\n")
                wheels.append(self._container_stage("wheel", volume, collect_to=repro / f"build{n}"))
        finally:
            for volume in volumes:
                remove_volume(self.client, volume)
        first, second = wheels
        sha1, sha2 = sha256_file(first), sha256_file(second)
        self.state.reproducibility = {"builds": 2, "sha256": [sha1, sha2], "reproducible": sha1 == sha2}
        if sha1 != sha2:
            report = self._diffoscope(first, second, repro / "diffoscope.txt")
            self.state.wheel = None
            self._save()
            raise ReproducibilityError(
                f"two builds of {first.name} from the same inputs differ: sha256 {sha1} vs {sha2}; "
                f"diffoscope report: {report}", hint="make the build deterministic (timestamps, paths, ordering)")
        dist = self.dir / DIST_DIR
        dist.mkdir(exist_ok=True)
        target = dist / first.name
        os.replace(first, target)
        shutil.rmtree(repro / "build2", ignore_errors=True)
        self.state.wheel = {"name": target.name, "sha256": sha1, "path": str(target.relative_to(self.dir))}
        return f"reproducible: two builds gave sha256 {sha1[:16]}"

    def _diffoscope(self, first: Path, second: Path, report: Path) -> Path:
        exe = shutil.which("diffoscope") or str(Path(sys.executable).with_name("diffoscope"))
        if not Path(exe).is_file():
            raise ReproducibilityError(
                f"two builds of {first.name} differ ({sha256_file(first)} vs {sha256_file(second)}) and "
                "diffoscope is not installed, so no report was written",
                hint="pip install diffoscope (it is in patcher's test extras) and build again")
        tmp = report.with_name(report.name + ".part")
        self.progress.log(f"running diffoscope on the two wheels -> {report}\n")
        try:
            proc = subprocess.run([exe, "--no-progress", "--text", str(tmp), str(first), str(second)],
                                  capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired:
            tmp.unlink(missing_ok=True)
            raise ReproducibilityError(f"two builds of {first.name} differ, and diffoscope ran past 30 minutes") from None
        if proc.returncode not in (0, 1) or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            raise ReproducibilityError(f"two builds of {first.name} differ, and diffoscope failed "
                                       f"(exit {proc.returncode}): {last_meaningful(proc.stderr.splitlines())}")
        os.replace(tmp, report)
        return report


def build(settings: Settings, options: BuildOptions, stream: TextIO | None = None,
          tty: bool | None = None) -> BuildResult:
    """Run ``patcher build``: every stage from resolve to certify (or ``options.until``)."""
    return Builder(settings, options, stream=stream, tty=tty).run()


def load_state(record: Path) -> BuildState:
    return BuildState.from_json(json.loads(Path(record).read_text(encoding="utf-8")))


__all__ = ["STAGES", "BuildOptions", "BuildResult", "BuildState", "Builder", "Progress", "build",
           "container_environment", "docker_client", "load_state", "parse_toolchain", "source_archive"]
