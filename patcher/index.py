"""Publish stage: wheels + evidence -> a static package index, or an upload to an index server.

Static index layout (one directory, served as is by any static web server)::

    simple -> .generations/g000007           the only thing a publish switches (os.replace)
    files/<wheel>                            distribution files, immutable once published
    files/<wheel>.metadata                   the wheel's METADATA (PEP 658 / 714)
    files/<wheel>.intoto.jsonl .cdx.json .probe.json .vex.json    evidence, beside each wheel
    .generations/gN/index.html, index.json   root pages (PEP 503 HTML, PEP 691 JSON)
    .generations/gN/<project> -> ../../.projects/<project>/gM    one link per project
    .generations/gN/.manifest.json           the generation's record: its predecessor and the
                                             projects whose link it changed (small)
    .projects/<project>/gM/index.html, index.json                a project's pages

Atomicity: files are staged in ``.incoming/`` and renamed into ``files/`` before any page
names them; the new pages go into a generation directory that no reader can reach; a single
``os.replace`` of the ``simple`` symlink makes the new index visible.  A reader resolves
``simple`` once per request and always sees one complete generation; a publish killed
anywhere leaves ``simple`` on the old, complete generation (the next publish clears what the
killed one left).  KEEP_GENERATIONS generations stay readable (the current one and the ones
before it), so a reader in the middle of a walk is not cut off.

Cost: a publish writes the pages of the projects it touches, and makes its generation by
recycling the oldest kept one, which is then no longer needed: that directory is renamed out
of the readers' way, and only the links that differ from the new generation are changed.
Those are the projects that the generations in between and this publish changed (their
records say which), so a publish costs the same in an index of a thousand wheels as in one of
a hundred thousand.  The root pages are rewritten only when the set of projects changes (they
list every project, so that write is the one part that grows with the index); otherwise the
recycled directory keeps its own root pages or takes the current generation's (hard links:
page files are never written in place).  Where there is nothing to recycle (a new index, an
index written by an older patcher, the first publish after a killed one) and for a full
rewrite (``regenerate``, ``write_index``) the generation is built whole, one link per project.

PEP 691 JSON lives in ``index.json`` beside each ``index.html``.  pip reads the HTML (the
server's default for a directory).  To serve JSON by content negotiation, map the Accept
header to the file, e.g. nginx::

    map $http_accept $simple_index {
        default                                      index.html;
        "~application/vnd\\.pypi\\.simple\\.v1\\+json"  index.json;
    }
    location /simple/ { index $simple_index; types { application/vnd.pypi.simple.v1+json json; } }

Uploads use the legacy ``file_upload`` API that twine speaks (pypiserver, devpi, Artifactory,
Nexus, warehouse); that API carries the wheel only, not its evidence.
"""

from __future__ import annotations

import contextlib
import email.parser
import errno
import fcntl
import functools
import hashlib
import html
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from patcher.errors import AlreadyPublishedError, IndexLockedError, PublishError, UploadError
from patcher.evidence import EVIDENCE_SUFFIXES
from patcher.report import REPORT_SUFFIX

API_VERSION = "1.1"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
KEEP_GENERATIONS = 3          # the current one and two before it stay readable
PAUSE_ENV = "PATCHER_TEST_PAUSE_PUBLISH"
RECORD_NAME = ".manifest.json"
RECORD_FORMAT = 2             # format 1 (older patcher): project -> page version, every project
ROOT_PAGES = ("index.html", "index.json")
_GEN_RE = re.compile(r"^g(\d{6,})$")
_CHUNK = 1 << 20


# --------------------------------------------------------------------------------------------
# versions and file names (cached: an index repeats the same versions and tags many times)
@functools.lru_cache(maxsize=65536)
def _version(text: str) -> Version:
    return Version(text)


@functools.lru_cache(maxsize=65536)
def _normalized_version(text: str) -> str | None:
    try:
        return str(_version(text))
    except InvalidVersion:
        return None


@functools.lru_cache(maxsize=65536)
def _wheel_name_part_ok(name_part: str) -> bool:
    try:
        parse_wheel_filename(f"{name_part}-0-py3-none-any.whl")
    except InvalidWheelFilename:
        return False
    return True


@functools.lru_cache(maxsize=65536)
def _canonical_name(name_part: str) -> str:
    return canonicalize_name(name_part)


@functools.lru_cache(maxsize=4096)
def _wheel_tail_ok(tail: str) -> bool:
    try:
        parse_wheel_filename(f"x-0-{tail}.whl")
    except InvalidWheelFilename:
        return False
    return True


def wheel_project_version(filename: str) -> tuple[str, str]:
    """(normalized project, normalized version) of a wheel file name.

    Accepts and refuses exactly what ``packaging.utils.parse_wheel_filename`` does (it checks
    the name, the version and the build/tag tail with it, each once per distinct value), and
    raises its InvalidWheelFilename."""
    parts = filename[:-4].split("-", 2) if filename.endswith(".whl") else ()
    if len(parts) == 3 and _wheel_name_part_ok(parts[0]) and _wheel_tail_ok(parts[2]):
        version = _normalized_version(parts[1])
        if version is not None:
            return _canonical_name(parts[0]), version
    name, version, _, _ = parse_wheel_filename(filename)  # raises, with packaging's message
    return str(name), str(version)


# --------------------------------------------------------------------------------------------
# what the index knows about one file
@dataclass(frozen=True)
class IndexFile:
    filename: str
    project: str                      # normalized name (PEP 503)
    version: str
    sha256: str
    size: int
    metadata_sha256: str | None = None
    requires_python: str | None = None
    yanked: bool = False
    yanked_reason: str = ""
    upload_time: str = ""
    evidence: tuple[str, ...] = ()    # suffixes present beside the file, e.g. ".intoto.jsonl"

    @property
    def sort_key(self) -> tuple[Version, str]:
        return (_version(self.version), self.filename)


@dataclass(frozen=True)
class ScannedWheel:
    entry: IndexFile
    path: Path
    metadata: bytes


def _file_url(filename: str) -> str:
    # from /simple/<project>/ to /files/<filename>
    return f"../../files/{filename}"


def scan_wheel(path: Path, upload_time: str = "") -> ScannedWheel:
    """Name, version, hashes and METADATA of a wheel; a bad wheel is a PublishError."""
    path = Path(path)
    try:
        name, version, _build, _tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise PublishError(f"{path.name} is not a wheel file name: {exc}") from None
    if not path.is_file():
        raise PublishError(f"no wheel at {path}")
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    try:
        with zipfile.ZipFile(path) as zf:
            candidates = [n for n in zf.namelist()
                          if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(candidates) != 1:
                raise PublishError(f"{path.name} has {len(candidates)} .dist-info/METADATA files, not one")
            metadata = zf.read(candidates[0])
    except (zipfile.BadZipFile, OSError) as exc:
        raise PublishError(f"{path.name} is not a readable wheel: {exc}") from None
    headers = email.parser.BytesHeaderParser().parsebytes(metadata)
    meta_name, meta_version = headers.get("Name"), headers.get("Version")
    if meta_name is None or canonicalize_name(meta_name) != name or meta_version is None \
            or Version(meta_version) != version:
        raise PublishError(f"{path.name}: its METADATA says {meta_name} {meta_version}, its file name {name} {version}")
    requires_python = headers.get("Requires-Python")
    evidence = tuple(s for s in (*EVIDENCE_SUFFIXES, REPORT_SUFFIX) if path.with_name(path.name + s).is_file())
    entry = IndexFile(filename=path.name, project=str(name), version=str(version), sha256=digest.hexdigest(),
                      size=path.stat().st_size, metadata_sha256=hashlib.sha256(metadata).hexdigest(),
                      requires_python=requires_python.strip() if requires_python else None,
                      upload_time=upload_time, evidence=evidence)
    return ScannedWheel(entry=entry, path=path, metadata=metadata)


def read_package_list(path: Path) -> list[IndexFile]:
    """Entries from a package list in dumb-pypi's JSON-lines format (one object a line:
    ``filename``, ``hash`` ("sha256=HEX"), optional ``requires_python``, ``core_metadata``
    ("sha256=HEX"), ``upload_timestamp`` (Unix seconds), ``yanked_reason``), for
    :func:`write_index`: the pages of files whose metadata is already known, no wheel read."""
    entries = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                filename = item["filename"]
                project, version = wheel_project_version(filename)
                algorithm, _, digest = item["hash"].partition("=")
                if algorithm != "sha256" or not digest:
                    raise ValueError(f"hash {item['hash']!r} is not sha256=HEX")
                meta = item.get("core_metadata")
                meta_sha = meta.partition("=")[2] if isinstance(meta, str) and meta.startswith("sha256=") else None
                stamp = item.get("upload_timestamp")
                reason = item.get("yanked_reason")
            except (ValueError, KeyError, TypeError, AttributeError, InvalidWheelFilename) as exc:
                raise PublishError(f"{path}:{number}: not a package list entry: {exc}") from None
            entries.append(IndexFile(
                filename=filename, project=project, version=version, sha256=digest, size=int(item.get("size") or 0),
                metadata_sha256=meta_sha, requires_python=item.get("requires_python") or None,
                yanked=reason is not None, yanked_reason=reason or "",
                upload_time=(datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                             if stamp is not None else "")))
    return entries


# --------------------------------------------------------------------------------------------
# rendering (pure)
def render_project_html(project: str, files: Iterable[IndexFile]) -> str:
    escape = html.escape
    lines = ["<!DOCTYPE html>", "<html>", "<head>",
             f'<meta name="pypi:repository-version" content="{API_VERSION}">',
             f"<title>Links for {escape(project)}</title>", "</head>", "<body>",
             f"<h1>Links for {escape(project)}</h1>"]
    for f in files:
        attrs = f'href="{escape(_file_url(f.filename))}#sha256={f.sha256}"'
        if f.requires_python:
            attrs += f' data-requires-python="{escape(f.requires_python)}"'
        if f.metadata_sha256:
            # PEP 714 name, and the PEP 658 name older pips read
            attrs += (f' data-core-metadata="sha256={f.metadata_sha256}"'
                      f' data-dist-info-metadata="sha256={f.metadata_sha256}"')
        if f.yanked:
            attrs += f' data-yanked="{escape(f.yanked_reason)}"'
        report = (f' <a href="{escape(_file_url(f.filename + REPORT_SUFFIX))}">evidence report</a>'
                  if REPORT_SUFFIX in f.evidence else "")  # `patcher report`'s page, published beside the wheel
        lines.append(f"<a {attrs}>{escape(f.filename)}</a>{report}<br>")
    lines += ["</body>", "</html>", ""]
    return "\n".join(lines)


def _file_json(f: IndexFile) -> dict[str, Any]:
    out: dict[str, Any] = {"filename": f.filename, "url": _file_url(f.filename), "hashes": {"sha256": f.sha256},
                           "size": f.size, "yanked": (f.yanked_reason or True) if f.yanked else False}
    if f.requires_python:
        out["requires-python"] = f.requires_python
    if f.metadata_sha256:
        out["core-metadata"] = {"sha256": f.metadata_sha256}
        out["dist-info-metadata"] = {"sha256": f.metadata_sha256}
    if f.upload_time:
        out["upload-time"] = f.upload_time
    if f.evidence:
        # PEP 691 lets clients ignore unknown keys; "_" marks a private one.
        out["_patcher_evidence"] = {s.lstrip("."): _file_url(f.filename + s) for s in f.evidence}
    return out


def render_project_json(project: str, files: list[IndexFile]) -> str:
    versions = sorted({f.version for f in files}, key=_version)
    doc = {"meta": {"api-version": API_VERSION}, "name": project, "versions": versions,
           "files": [_file_json(f) for f in files]}
    return _dumps(doc)


def render_root_html(projects: Iterable[str]) -> str:
    lines = ["<!DOCTYPE html>", "<html>", "<head>",
             f'<meta name="pypi:repository-version" content="{API_VERSION}">',
             "<title>Simple index</title>", "</head>", "<body>"]
    lines += [f'<a href="{html.escape(p)}/">{html.escape(p)}</a><br>' for p in projects]
    lines += ["</body>", "</html>", ""]
    return "\n".join(lines)


def render_root_json(projects: Iterable[str]) -> str:
    doc = {"meta": {"api-version": API_VERSION}, "projects": [{"name": p} for p in projects]}
    return _dumps(doc)


def _dumps(doc: Any) -> str:
    # compact: json's C encoder only runs without indent (5x faster on a large index)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"


def parse_project_json(text: str) -> list[IndexFile]:
    """The entries of a project page this module wrote (the page is the index's own state)."""
    doc = json.loads(text)
    out = []
    for f in doc["files"]:
        yanked = f.get("yanked", False)
        evidence = tuple("." + k for k in f.get("_patcher_evidence", {}))
        _name, version = wheel_project_version(f["filename"])
        out.append(IndexFile(filename=f["filename"], project=doc["name"], version=version,
                             sha256=f["hashes"]["sha256"], size=f.get("size", 0),
                             metadata_sha256=(f.get("core-metadata") or {}).get("sha256"),
                             requires_python=f.get("requires-python"), yanked=bool(yanked),
                             yanked_reason=yanked if isinstance(yanked, str) else "",
                             upload_time=f.get("upload-time", ""), evidence=evidence))
    return out


# --------------------------------------------------------------------------------------------
# the on-disk index
def _generation_number(name: str) -> int:
    return int(name[1:])


@dataclass
class IndexLayout:
    root: Path

    @property
    def simple(self) -> Path:
        return self.root / "simple"

    @property
    def files(self) -> Path:
        return self.root / "files"

    @property
    def generations(self) -> Path:
        return self.root / ".generations"

    @property
    def projects(self) -> Path:
        return self.root / ".projects"

    @property
    def incoming(self) -> Path:
        return self.root / ".incoming"

    @property
    def pending(self) -> Path:
        return self.root / ".pending.json"

    def generation_dir(self, generation: str) -> str:
        return os.path.join(self.root, ".generations", generation)

    def current_generation(self) -> str | None:
        try:
            target = os.readlink(self.simple)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise PublishError(f"{self.simple} is not a link made by patcher publish",
                                   hint="publish into an empty directory or a patcher index") from None
            raise
        name = Path(target).name
        if not _GEN_RE.match(name):
            raise PublishError(f"{self.simple} points at {target}, not at a patcher index generation")
        return name

    def live_generations(self, newest: str | None) -> list[str]:
        """The complete generations up to ``newest``, oldest first."""
        if newest is None:
            return []
        limit = _generation_number(newest)
        return sorted((n for n in os.listdir(self.generations) if _GEN_RE.match(n) and _generation_number(n) <= limit),
                      key=_generation_number)

    def record(self, generation: str) -> dict[str, Any]:
        """The generation's record (``.manifest.json``): ``{"_format": 2, "generation", "base"
        (the generation it followed, or null), "changed" (projects whose link differs from
        base's)}``; a format-1 record (a project -> page map) reads as ``{"_format": 1}``."""
        path = os.path.join(self.generation_dir(generation), RECORD_NAME)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise PublishError(f"index generation {generation} is damaged: {exc}") from None
        if isinstance(data, dict) and data.get("_format") == RECORD_FORMAT \
                and isinstance(data.get("changed"), list) and all(isinstance(p, str) for p in data["changed"]):
            return data
        if isinstance(data, dict) and "_format" not in data and all(isinstance(v, str) for v in data.values()):
            return {"_format": 1}
        raise PublishError(f"index generation {generation} is damaged: {RECORD_NAME} is not a generation record")

    def page_version(self, generation: str, project: str) -> str | None:
        """The page version a generation links for ``project`` (None: not in it)."""
        if not project or project.startswith(".") or "/" in project:
            return None
        try:
            target = os.readlink(os.path.join(self.generation_dir(generation), project))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise PublishError(f"index generation {generation} is damaged: {project} is not a link") from None
            raise
        return _page_of_link(target, generation, project)

    def links(self, generation: str) -> dict[str, str]:
        """project -> page version of every project in a generation (lists its directory)."""
        out = {}
        with os.scandir(self.generation_dir(generation)) as entries:
            for entry in entries:
                if entry.is_symlink():
                    out[entry.name] = _page_of_link(os.readlink(entry.path), generation, entry.name)
        return dict(sorted(out.items()))

    def manifest(self, generation: str | None) -> dict[str, str]:
        """project -> page version of every project in a generation (its record checked)."""
        if generation is None:
            return {}
        self.record(generation)
        return self.links(generation)

    def read_project(self, project: str, version: str) -> list[IndexFile]:
        path = self.projects / project / version / "index.json"
        try:
            return parse_project_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, InvalidWheelFilename) as exc:
            raise PublishError(f"index page {path} is damaged: {exc}") from None


def _safe_project(name: Any) -> bool:
    """A name that can only mean an entry inside its directory (records and notes are read
    back from disk: a damaged one must not make a publish touch anything outside)."""
    return isinstance(name, str) and bool(name) and not name.startswith(".") and "/" not in name and "\0" not in name


def _link_target(project: str, version: str) -> str:
    return f"../../.projects/{project}/{version}"


def _page_of_link(target: str, generation: str, project: str) -> str:
    version = target.rsplit("/", 1)[-1]
    if target != _link_target(project, version) or not _GEN_RE.match(version):
        raise PublishError(f"index generation {generation} is damaged: {project} links to {target}")
    return version


@contextlib.contextmanager
def _locked(layout: IndexLayout) -> Iterator[None]:
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        fh = open(layout.root / ".lock", "a+")
    except OSError as exc:
        raise PublishError(f"cannot use index directory {layout.root}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexLockedError(f"index {layout.root} is being updated by another publish",
                                   hint="wait for it to finish; the lock goes with the process") from None
        yield
    finally:
        fh.close()


def _write(path: str | Path, text: str, dir_fd: int | None = None) -> None:
    """Write a new file (a page file is never rewritten in place: generations share them)."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _replace_file(path: str, text: str) -> None:
    """Put a new file at ``path`` (write beside it, rename over it)."""
    temp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    _write(temp, text)
    os.replace(temp, path)


def _replace_with_link(source: str, path: str) -> None:
    """Put a hard link to the (immutable) file ``source`` at ``path``."""
    temp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    try:
        os.link(source, temp)
    except OSError:  # a file system without hard links: a copy does as well
        shutil.copyfile(source, temp)
    os.replace(temp, path)


def _read_link(path: str) -> str | None:
    try:
        return os.readlink(path).rsplit("/", 1)[-1]
    except FileNotFoundError:
        return None


_BATCH = 32          # projects per batch of file-system work
_FILE_THREADS = 2    # threads for that work: the calls let go of the interpreter lock, and a
                     # busy disk's latency overlaps; the work of one batch stays in order


class _FileWork:
    """Batches of file-system work on a few threads; leaving the block waits for all of
    them and raises the first error (nothing is still being written after it)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(_FILE_THREADS, thread_name_prefix="index-write")
        self.futures: list[Future[None]] = []

    def submit(self, fn: Any, *args: Any) -> None:
        self.futures.append(self.pool.submit(fn, *args))

    def __enter__(self) -> _FileWork:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.pool.shutdown(wait=True)
        errors = [f.exception() for f in self.futures if f.exception() is not None]
        if errors and exc_info[0] is None:
            raise errors[0]


def _next_generation(layout: IndexLayout, current: str | None) -> str:
    numbers = [_generation_number(n) for n in os.listdir(layout.generations) if _GEN_RE.match(n)]
    if current:
        numbers.append(_generation_number(current))
    return f"g{max(numbers, default=0) + 1:06d}"


def _pause_for_tests() -> None:
    """Test hook: stop inside a publish until a file appears, so a test can kill it there."""
    release = os.environ.get(PAUSE_ENV)
    if not release:
        return
    Path(release + ".waiting").touch()
    while not os.path.exists(release):
        time.sleep(0.02)


def _write_pending(layout: IndexLayout, note: dict[str, Any]) -> None:
    temp = str(layout.pending) + ".tmp"
    with open(temp, "w", encoding="utf-8") as fh:
        json.dump(note, fh, sort_keys=True)
    os.replace(temp, layout.pending)


def _clear_leftovers(layout: IndexLayout, current: str | None) -> None:
    """What a killed publish left: staged files, an unfinished or unswitched generation, and
    the pages that only those used.  (The one costly case: a generation directory that was
    being built or recycled is removed whole, and the next generation is built whole.)"""
    shutil.rmtree(layout.incoming, ignore_errors=True)
    candidates: dict[str, set[str]] = {}
    try:
        pending = json.loads(layout.pending.read_text())
    except (OSError, ValueError):
        pending = None
    leftovers = [n for n in os.listdir(layout.generations) if n.startswith(".tmp-")]
    if isinstance(pending, dict):
        gen = str(pending.get("generation", ""))
        if _GEN_RE.match(gen):
            for project in pending.get("projects", []):
                candidates.setdefault(str(project), set()).add(gen)
            if gen != current and os.path.isdir(layout.generation_dir(gen)):
                leftovers.append(gen)  # complete but never switched to: no reader has seen it
        for project, version in (pending.get("dropped") or {}).items():
            candidates.setdefault(str(project), set()).add(str(version))
    for name in leftovers:
        # a recycled generation still links pages that only it used
        with contextlib.suppress(OSError, PublishError):
            for project, version in layout.links(name).items():
                candidates.setdefault(project, set()).add(version)
        shutil.rmtree(layout.generations / name, ignore_errors=True)
    if pending is not None or leftovers:
        _collect_garbage(layout, current, candidates)
    layout.pending.unlink(missing_ok=True)


def _collect_garbage(layout: IndexLayout, newest: str | None, candidates: dict[str, set[str]] | None = None) -> None:
    """Drop generations beyond KEEP_GENERATIONS, and the project pages no kept one links.

    ``candidates`` are the page versions that may have become unused (those a recycled
    generation stopped linking, those a killed publish left); a dropped generation adds all of
    its own.  Only those are looked at, each against the kept generations' links."""
    live = layout.live_generations(newest)
    keep = live[-KEEP_GENERATIONS:]
    maybe_unused: dict[str, set[str]] = {p: set(v) for p, v in (candidates or {}).items()}
    for g in live[:-KEEP_GENERATIONS]:
        with contextlib.suppress(OSError, PublishError):  # a damaged old generation: nothing to learn
            for project, version in layout.links(g).items():
                maybe_unused.setdefault(project, set()).add(version)
        shutil.rmtree(layout.generations / g, ignore_errors=True)
    projects_dir = str(layout.projects)
    for project, versions in maybe_unused.items():
        if not _safe_project(project):
            continue
        versions = {v for v in versions if _GEN_RE.match(v)}
        used = set()
        for g in keep:
            try:
                used.add(layout.page_version(g, project))
            except PublishError:  # cannot tell what a damaged link meant: keep every version
                used.update(versions)
        for version in versions - used:
            shutil.rmtree(os.path.join(projects_dir, project, version), ignore_errors=True)
        if used <= {None}:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(projects_dir, project))  # only when empty


def _pages_unchanged(layout: IndexLayout, project: str, version: str | None, html_text: str, json_text: str) -> bool:
    if version is None:
        return False
    base = os.path.join(layout.projects, project, version)
    try:
        with open(os.path.join(base, "index.json"), encoding="utf-8") as fh:
            if fh.read() != json_text:
                return False
        with open(os.path.join(base, "index.html"), encoding="utf-8") as fh:
            return fh.read() == html_text
    except OSError:
        return False


def _commit_generation(layout: IndexLayout, current: str | None, changed: dict[str, list[IndexFile]],
                       removed: Iterable[str] = (), whole: bool = False) -> str:
    """Write the changed projects' pages and a new generation, then switch ``simple`` to it.

    ``whole``: a full rewrite (every project given): pages equal to the current ones are kept
    (so later publishes still recycle cheaply), and the generation is built whole."""
    if current is not None:
        layout.record(current)  # a damaged index is reported, never written over
        removed = [p for p in removed if layout.page_version(current, p) is not None]
    else:
        removed = []
    gen = _next_generation(layout, current)
    # The note names every project that may get a page version of this generation; it lets
    # the next publish remove them if this one dies.
    _write_pending(layout, {"generation": gen, "projects": sorted({*changed, *removed})})
    rendered: set[str] = set()
    projects_dir = str(layout.projects)
    projects_fd = os.open(projects_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with _FileWork() as work:
            batch: list[tuple[str, str, str]] = []
            for project, files in changed.items():
                ordered = sorted(files, key=lambda f: f.sort_key)
                html_text, json_text = render_project_html(project, ordered), render_project_json(project, ordered)
                if whole and current is not None and _pages_unchanged(
                        layout, project, layout.page_version(current, project), html_text, json_text):
                    continue
                rendered.add(project)
                batch.append((project, html_text, json_text))
                if len(batch) >= _BATCH:
                    work.submit(_write_pages, projects_fd, projects_dir, gen, batch)
                    batch = []
            if batch:
                work.submit(_write_pages, projects_fd, projects_dir, gen, batch)
    finally:
        os.close(projects_fd)
    touched = sorted({*rendered, *removed})
    note: dict[str, Any] = {"generation": gen, "projects": touched}
    _pause_for_tests()
    plan = None if whole else _recycle_plan(layout, layout.live_generations(current), touched)
    if plan is None:
        staging = _build_whole(layout, gen, current, rendered, removed)
        dropped: dict[str, str] = {}
    else:
        staging, dropped = _recycle(layout, plan, gen, current, rendered, removed, note)
    _replace_file(os.path.join(staging, RECORD_NAME),
                  json.dumps({"_format": RECORD_FORMAT, "generation": gen, "base": current, "changed": touched},
                             sort_keys=True, separators=(",", ":")))
    os.replace(staging, layout.generations / gen)
    link = layout.root / f".simple-{gen}"
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    os.symlink(f".generations/{gen}", link)
    os.replace(link, layout.simple)   # the switch: atomic on POSIX
    _fsync_dir(layout.root)
    _collect_garbage(layout, gen, {p: {v} for p, v in dropped.items()})
    layout.pending.unlink(missing_ok=True)
    return gen


def _write_pages(projects_fd: int, projects_dir: str, gen: str, batch: list[tuple[str, str, str]]) -> None:
    for project, html_text, json_text in batch:
        # No staging name needed: nothing links to pdir/gen until the generation switches, and
        # the pending note lets the next publish remove it if this one dies.
        with contextlib.suppress(FileExistsError):
            os.mkdir(project, dir_fd=projects_fd)
        target = f"{project}/{gen}"
        try:
            os.mkdir(target, dir_fd=projects_fd)
        except FileExistsError:  # left by a publish that died before its generation existed
            shutil.rmtree(os.path.join(projects_dir, target))
            os.mkdir(target, dir_fd=projects_fd)
        _write(f"{target}/index.html", html_text, dir_fd=projects_fd)
        _write(f"{target}/index.json", json_text, dir_fd=projects_fd)


def _make_links(staging_fd: int, links: list[tuple[str, str]]) -> None:
    for project, version in links:
        os.symlink(f"../../.projects/{project}/{version}", project, dir_fd=staging_fd)


def _recycle_plan(layout: IndexLayout, live: list[str], touched: list[str]) -> tuple[str, set[str]] | None:
    """The generation to recycle (the oldest that this publish would drop) and the projects
    whose links may differ between it and the new one; None when the records between them
    cannot say (fewer generations than kept, a record of an older format, a broken chain)."""
    if KEEP_GENERATIONS < 2 or len(live) < KEEP_GENERATIONS:
        return None
    base = live[-KEEP_GENERATIONS]
    projects = set(touched)
    previous = base
    for g in live[-KEEP_GENERATIONS + 1:]:
        try:
            record = layout.record(g)
        except PublishError:
            return None
        if record.get("_format") != RECORD_FORMAT or record.get("base") != previous \
                or not all(_safe_project(p) for p in record["changed"]):
            return None
        projects.update(record["changed"])
        previous = g
    return base, projects


def _build_whole(layout: IndexLayout, gen: str, current: str | None, rendered: set[str],
                 removed: list[str]) -> str:
    """A new generation directory with one link per project (cost grows with the index)."""
    staging = str(layout.generations / f".tmp-{gen}")
    shutil.rmtree(staging, ignore_errors=True)
    os.mkdir(staging)
    versions = layout.links(current) if current is not None else {}
    for project in removed:
        versions.pop(project, None)
    for project in rendered:
        versions[project] = gen
    projects = sorted(versions)
    _write(os.path.join(staging, "index.html"), render_root_html(projects))
    _write(os.path.join(staging, "index.json"), render_root_json(projects))
    staging_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with _FileWork() as work:
            for start in range(0, len(projects), _BATCH * 4):  # this runs once per project in the index
                work.submit(_make_links, staging_fd, [(p, versions[p]) for p in projects[start:start + _BATCH * 4]])
    finally:
        os.close(staging_fd)
    return staging


def _recycle(layout: IndexLayout, plan: tuple[str, set[str]], gen: str, current: str, rendered: set[str],
             removed: list[str], note: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """Turn the oldest kept generation into the new one: rename it out of the readers' way,
    then change only the links (and root pages) that differ.  Returns the staging directory
    and the page versions it stopped linking (for the garbage collector)."""
    base, projects = plan
    staging = str(layout.generations / f".tmp-{gen}")
    os.replace(layout.generation_dir(base), staging)
    current_dir = layout.generation_dir(current)
    membership_now = bool(removed)
    changes = []
    for project in sorted(projects):
        if project in rendered:
            want = gen
            membership_now = membership_now or layout.page_version(current, project) is None
        elif project in removed:
            want = None
        else:
            want = layout.page_version(current, project)
        have = _read_link(os.path.join(staging, project))
        if have != want:
            changes.append((project, have, want))
    dropped = {project: have for project, have, _ in changes if have is not None}
    # Before changing a link, say which pages it named, so a publish killed from here on
    # still lets the next one collect them.
    note["dropped"] = dropped
    _write_pending(layout, note)
    membership_base = False
    for project, have, want in changes:
        link = os.path.join(staging, project)
        if have is not None:
            os.unlink(link)
        if want is not None:
            os.symlink(_link_target(project, want), link)
        membership_base = membership_base or (have is None) != (want is None)
    if membership_now:
        # the set of projects changes: the root pages must list it (a write that grows with it)
        with os.scandir(staging) as entries:
            names = sorted(e.name for e in entries if e.is_symlink())
        _replace_file(os.path.join(staging, "index.html"), render_root_html(names))
        _replace_file(os.path.join(staging, "index.json"), render_root_json(names))
    elif membership_base:
        # the recycled generation lacked or had projects that the current one has not: the
        # current root pages are the right ones
        for name in ROOT_PAGES:
            _replace_with_link(os.path.join(current_dir, name), os.path.join(staging, name))
    return staging, dropped


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prepare(layout: IndexLayout) -> str | None:
    for d in (layout.files, layout.generations, layout.projects):
        d.mkdir(parents=True, exist_ok=True)
    current = layout.current_generation()
    _clear_leftovers(layout, current)
    layout.incoming.mkdir()
    return current


def _stage_copy(layout: IndexLayout, source: Path | bytes, name: str) -> Path:
    target = layout.incoming / name
    if isinstance(source, bytes):
        target.write_bytes(source)
    else:
        shutil.copyfile(source, target)
    return target


@dataclass(frozen=True)
class PublishResult:
    index: Path
    generation: str
    published: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    projects: list[str] = field(default_factory=list)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def publish(index_dir: Path, wheels: Iterable[Path], require_evidence: bool = True) -> PublishResult:
    """Add wheels (and the evidence beside them) to the static index at ``index_dir``."""
    layout = IndexLayout(Path(index_dir))
    upload_time = _now()
    scanned = [scan_wheel(Path(w), upload_time=upload_time) for w in wheels]
    if not scanned:
        raise PublishError("no wheels given")
    names = [s.entry.filename for s in scanned]
    if len(set(names)) != len(names):
        raise PublishError("the same wheel file name is given twice")
    if require_evidence:
        for s in scanned:
            missing = [x for x in EVIDENCE_SUFFIXES if x not in s.entry.evidence]
            if missing:
                raise PublishError(f"{s.entry.filename} has no {', '.join(missing)} beside it",
                                   hint="run `patcher certify` first; the index carries every wheel's evidence")
    try:
        with _locked(layout):
            current = _prepare(layout)
            try:
                if current is not None:
                    layout.record(current)  # a damaged index is reported before anything is written
                pages: dict[str, list[IndexFile]] = {}
                new: list[ScannedWheel] = []
                unchanged: list[str] = []
                # decide everything before writing anything
                for s in scanned:
                    project = s.entry.project
                    if project not in pages:
                        version = layout.page_version(current, project) if current is not None else None
                        pages[project] = layout.read_project(project, version) if version is not None else []
                    old = next((f for f in pages[project] if f.filename == s.entry.filename), None)
                    if old is None:
                        new.append(s)
                    elif old.sha256 == s.entry.sha256:
                        unchanged.append(s.entry.filename)
                    else:
                        raise AlreadyPublishedError(
                            f"{s.entry.filename} is already in the index with sha256 {old.sha256}, "
                            f"this file has {s.entry.sha256}",
                            hint="published files never change; give the build a new build number")
                for s in new:
                    staged = [_stage_copy(layout, s.path.with_name(s.path.name + x), s.entry.filename + x)
                              for x in s.entry.evidence]
                    staged.append(_stage_copy(layout, s.metadata, s.entry.filename + ".metadata"))
                    staged.append(_stage_copy(layout, s.path, s.entry.filename))
                    for path in staged:
                        os.replace(path, layout.files / path.name)
                    pages[s.entry.project].append(s.entry)
                changed = {s.entry.project: pages[s.entry.project] for s in new}
                gen = _commit_generation(layout, current, changed) if changed else (current or "")
            finally:
                shutil.rmtree(layout.incoming, ignore_errors=True)
    except OSError as exc:
        raise PublishError(f"cannot write the index at {index_dir}: {exc.strerror or exc}",
                           hint="the index is unchanged") from None
    return PublishResult(index=layout.root, generation=gen, published=[s.entry.filename for s in new],
                         unchanged=unchanged, projects=sorted(changed))


@dataclass(frozen=True)
class YankResult:
    index: Path
    filename: str
    generation: str
    yanked: bool
    reason: str


def yank(index_dir: Path, filename: str, reason: str = "", undo: bool = False) -> YankResult:
    """Mark a published file yanked (PEP 592), or un-yank it; pip then skips it unless pinned."""
    layout = IndexLayout(Path(index_dir))
    try:
        name, _version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise PublishError(f"{filename} is not a wheel file name: {exc}") from None
    project = str(name)
    if layout.current_generation() is None:  # before locking: create nothing in a wrong directory
        raise PublishError(f"{index_dir} holds no index", hint="publish into it first")
    try:
        with _locked(layout):
            current = _prepare(layout)
            try:
                if current is None:
                    raise PublishError(f"{index_dir} holds no index", hint="publish into it first")
                layout.record(current)
                version = layout.page_version(current, project)
                files = layout.read_project(project, version) if version is not None else []
                if filename not in {f.filename for f in files}:
                    raise PublishError(f"{filename} is not in the index at {index_dir}")
                files = [replace(f, yanked=not undo, yanked_reason="" if undo else reason)
                         if f.filename == filename else f for f in files]
                gen = _commit_generation(layout, current, {project: files})
            finally:
                shutil.rmtree(layout.incoming, ignore_errors=True)
    except OSError as exc:
        raise PublishError(f"cannot write the index at {index_dir}: {exc.strerror or exc}",
                           hint="the index is unchanged") from None
    return YankResult(index=layout.root, filename=filename, generation=gen, yanked=not undo, reason=reason)


def regenerate(index_dir: Path) -> PublishResult:
    """Rebuild every page from the wheels in ``files/`` (a full, non-incremental run).

    Yanks and upload times, which only the pages hold, are carried over.  A wheel whose
    .metadata file is missing gets one written (repair)."""
    layout = IndexLayout(Path(index_dir))
    try:
        with _locked(layout):
            current = _prepare(layout)
            try:
                manifest = layout.manifest(current)
                known: dict[str, IndexFile] = {}
                for project, version in manifest.items():
                    known.update({f.filename: f for f in layout.read_project(project, version)})
                pages: dict[str, list[IndexFile]] = {}
                for path in sorted(layout.files.glob("*.whl")):
                    scanned = scan_wheel(path)
                    entry = scanned.entry
                    metadata_file = layout.files / (entry.filename + ".metadata")
                    if not metadata_file.is_file():
                        os.replace(_stage_copy(layout, scanned.metadata, metadata_file.name), metadata_file)
                    old = known.get(entry.filename)
                    if old is not None:  # keep what only the pages know: yanks and upload times
                        entry = replace(entry, yanked=old.yanked, yanked_reason=old.yanked_reason,
                                        upload_time=old.upload_time)
                    pages.setdefault(entry.project, []).append(entry)
                gen = _commit_generation(layout, current, pages, removed=[p for p in manifest if p not in pages],
                                         whole=True)
            finally:
                shutil.rmtree(layout.incoming, ignore_errors=True)
    except OSError as exc:
        raise PublishError(f"cannot write the index at {index_dir}: {exc.strerror or exc}") from None
    return PublishResult(index=layout.root, generation=gen, published=[], unchanged=[], projects=sorted(pages))


def write_index(index_dir: Path, entries: Iterable[IndexFile]) -> PublishResult:
    """Render every page from known entries (no wheel is read): the page-writing half of a full
    regeneration, for mirrors that already hold the metadata; the files must be in files/."""
    layout = IndexLayout(Path(index_dir))
    pages: dict[str, list[IndexFile]] = {}
    for entry in entries:
        pages.setdefault(entry.project, []).append(entry)
    try:
        with _locked(layout):
            current = _prepare(layout)
            try:
                manifest = layout.manifest(current)
                gen = _commit_generation(layout, current, pages, removed=[p for p in manifest if p not in pages],
                                         whole=True)
            finally:
                shutil.rmtree(layout.incoming, ignore_errors=True)
    except OSError as exc:
        raise PublishError(f"cannot write the index at {index_dir}: {exc.strerror or exc}") from None
    return PublishResult(index=layout.root, generation=gen, published=[], unchanged=[], projects=sorted(pages))


def read_index(index_dir: Path) -> dict[str, list[IndexFile]]:
    """The current index, project by project (what a reader sees now)."""
    layout = IndexLayout(Path(index_dir))
    manifest = layout.manifest(layout.current_generation())
    return {p: layout.read_project(p, v) for p, v in sorted(manifest.items())}


# --------------------------------------------------------------------------------------------
# upload to an index server (legacy API, as twine does it)
@dataclass(frozen=True)
class UploadResult:
    url: str
    uploaded: list[str]


def upload(url: str, wheels: Iterable[Path], user: str, password: str, timeout: float = 120.0) -> UploadResult:
    import requests

    scanned = [scan_wheel(Path(w)) for w in wheels]
    if not scanned:
        raise UploadError("no wheels given")
    uploaded = []
    with requests.Session() as session:
        session.auth = (user, password)
        for s in scanned:
            headers = email.parser.BytesHeaderParser().parsebytes(s.metadata)
            _name, _version, _build, tags = parse_wheel_filename(s.entry.filename)
            fields = [
                (":action", "file_upload"), ("protocol_version", "1"),
                ("metadata_version", headers.get("Metadata-Version", "2.1")),
                ("name", headers["Name"]), ("version", headers["Version"]),
                ("filetype", "bdist_wheel"), ("pyversion", sorted({t.interpreter for t in tags})[0]),
                ("sha256_digest", s.entry.sha256),
                ("summary", headers.get("Summary", "")),
            ]
            if s.entry.requires_python:
                fields.append(("requires_python", s.entry.requires_python))
            try:
                with open(s.path, "rb") as fh:
                    resp = session.post(url, data=fields, timeout=timeout, allow_redirects=False,
                                        files={"content": (s.entry.filename, fh, "application/octet-stream")})
            except requests.RequestException as exc:
                raise UploadError(f"cannot reach index server {url}: {type(exc).__name__}",
                                  hint="check --url and that the server is running") from None
            if resp.status_code in (401, 403):
                raise UploadError(f"{url} refused the credentials of user {user} (HTTP {resp.status_code})",
                                  hint="check --user and the password in --password-env")
            if resp.status_code == 409:
                raise AlreadyPublishedError(f"{url} already has {s.entry.filename} (HTTP 409)",
                                            hint="published files never change; give the build a new build number")
            if resp.status_code in (301, 302, 303, 307, 308):
                raise UploadError(f"{url} redirects to {resp.headers.get('Location')} (HTTP {resp.status_code})",
                                  hint="give the final upload URL")
            if not 200 <= resp.status_code < 300:
                first = (resp.text or "").strip().splitlines()[:1]
                raise UploadError(f"{url} refused {s.entry.filename}: HTTP {resp.status_code}"
                                  + (f" {first[0][:200]}" if first else ""))
            uploaded.append(s.entry.filename)
    return UploadResult(url=url, uploaded=uploaded)


def entry_json(entry: IndexFile) -> dict[str, Any]:
    return asdict(entry)
