"""Publish stage: wheels + evidence -> a static package index, or an upload to an index server.

Static index layout (one directory, served as is by any static web server)::

    simple -> .generations/g000007           the only thing a publish switches (os.replace)
    files/<wheel>                            distribution files, immutable once published
    files/<wheel>.metadata                   the wheel's METADATA (PEP 658 / 714)
    files/<wheel>.intoto.jsonl .cdx.json .probe.json    evidence, beside each wheel
    .generations/gN/index.html, index.json   root pages (PEP 503 HTML, PEP 691 JSON)
    .generations/gN/<project> -> ../../.projects/<project>/gM    one link per project
    .generations/gN/.manifest.json           project -> page version, read by the next publish
    .projects/<project>/gM/index.html, index.json                a project's pages

Atomicity: files are staged in ``.incoming/`` and renamed into ``files/`` before any page
names them; the new pages go into a new generation directory; a single ``os.replace`` of the
``simple`` symlink makes the new index visible.  A reader resolves ``simple`` once per request
and always sees one complete generation; a publish killed anywhere leaves ``simple`` on the
old, complete generation (the next publish clears what the killed one left).  The previous
generations are kept for a while, so a reader in the middle of a walk is not cut off.

Incremental: a publish renders only the pages of the projects it touches and the root pages;
the other projects' pages are shared between generations through the links.

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
import hashlib
import html
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from patcher.errors import AlreadyPublishedError, IndexLockedError, PublishError, UploadError
from patcher.evidence import EVIDENCE_SUFFIXES

API_VERSION = "1.1"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
KEEP_GENERATIONS = 3          # the current one and two before it stay readable
PAUSE_ENV = "PATCHER_TEST_PAUSE_PUBLISH"
_GEN_RE = re.compile(r"^g(\d{6,})$")
_CHUNK = 1 << 20


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
        return (Version(self.version), self.filename)


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
    evidence = tuple(s for s in EVIDENCE_SUFFIXES if path.with_name(path.name + s).is_file())
    entry = IndexFile(filename=path.name, project=str(name), version=str(version), sha256=digest.hexdigest(),
                      size=path.stat().st_size, metadata_sha256=hashlib.sha256(metadata).hexdigest(),
                      requires_python=requires_python.strip() if requires_python else None,
                      upload_time=upload_time, evidence=evidence)
    return ScannedWheel(entry=entry, path=path, metadata=metadata)


# --------------------------------------------------------------------------------------------
# rendering (pure)
def render_project_html(project: str, files: Iterable[IndexFile]) -> str:
    lines = ["<!DOCTYPE html>", "<html>", "<head>",
             f'<meta name="pypi:repository-version" content="{API_VERSION}">',
             f"<title>Links for {html.escape(project)}</title>", "</head>", "<body>",
             f"<h1>Links for {html.escape(project)}</h1>"]
    for f in files:
        attrs = [f'href="{html.escape(_file_url(f.filename))}#sha256={f.sha256}"']
        if f.requires_python:
            attrs.append(f'data-requires-python="{html.escape(f.requires_python)}"')
        if f.metadata_sha256:
            # PEP 714 name, and the PEP 658 name older pips read
            attrs.append(f'data-core-metadata="sha256={f.metadata_sha256}"')
            attrs.append(f'data-dist-info-metadata="sha256={f.metadata_sha256}"')
        if f.yanked:
            attrs.append(f'data-yanked="{html.escape(f.yanked_reason)}"')
        lines.append(f'<a {" ".join(attrs)}>{html.escape(f.filename)}</a><br>')
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
    versions = sorted({f.version for f in files}, key=Version)
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
        name, version, _, _ = parse_wheel_filename(f["filename"])
        out.append(IndexFile(filename=f["filename"], project=doc["name"], version=str(version),
                             sha256=f["hashes"]["sha256"], size=f.get("size", 0),
                             metadata_sha256=(f.get("core-metadata") or {}).get("sha256"),
                             requires_python=f.get("requires-python"), yanked=bool(yanked),
                             yanked_reason=yanked if isinstance(yanked, str) else "",
                             upload_time=f.get("upload-time", ""), evidence=evidence))
    return out


# --------------------------------------------------------------------------------------------
# the on-disk index
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

    def manifest(self, generation: str | None) -> dict[str, str]:
        if generation is None:
            return {}
        try:
            return json.loads((self.generations / generation / ".manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise PublishError(f"index generation {generation} is damaged: {exc}") from None

    def read_project(self, project: str, version: str) -> list[IndexFile]:
        path = self.projects / project / version / "index.json"
        try:
            return parse_project_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, InvalidWheelFilename) as exc:
            raise PublishError(f"index page {path} is damaged: {exc}") from None


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


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _next_generation(layout: IndexLayout, current: str | None) -> str:
    numbers = [int(m.group(1)) for n in os.listdir(layout.generations) if (m := _GEN_RE.match(n))]
    if current:
        numbers.append(int(current[1:]))
    return f"g{max(numbers, default=0) + 1:06d}"


def _pause_for_tests() -> None:
    """Test hook: stop inside a publish until a file appears, so a test can kill it there."""
    release = os.environ.get(PAUSE_ENV)
    if not release:
        return
    Path(release + ".waiting").touch()
    while not os.path.exists(release):
        time.sleep(0.02)


def _clear_leftovers(layout: IndexLayout) -> None:
    """What a killed publish left: staged files, an unfinished generation, unlinked pages."""
    shutil.rmtree(layout.incoming, ignore_errors=True)
    for name in os.listdir(layout.generations):
        if name.startswith(".tmp-"):
            shutil.rmtree(layout.generations / name, ignore_errors=True)
    try:
        pending = json.loads(layout.pending.read_text())
    except (OSError, ValueError):
        return
    gen = str(pending.get("generation", ""))
    _collect_garbage(layout, {project: {gen} for project in pending.get("projects", [])} if gen else {})
    layout.pending.unlink(missing_ok=True)


def _collect_garbage(layout: IndexLayout, candidates: dict[str, set[str]] | None = None) -> None:
    """Drop generations beyond KEEP_GENERATIONS, and the project pages only they used.

    The dropped generations' manifests say which page versions may have become unused, so no
    project directory is listed; ``candidates`` adds versions a killed publish left behind."""
    gens = sorted((n for n in os.listdir(layout.generations) if _GEN_RE.match(n)), reverse=True)
    current = layout.current_generation()
    keep = [g for g in gens if current is None or g <= current][:KEEP_GENERATIONS]
    maybe_unused: dict[str, set[str]] = {p: set(v) for p, v in (candidates or {}).items()}
    for g in gens:
        if g in keep:
            continue
        try:
            dropped = layout.manifest(g)
        except PublishError:  # a damaged old generation: nothing to learn from it
            dropped = {}
        for project, version in dropped.items():
            maybe_unused.setdefault(project, set()).add(version)
        shutil.rmtree(layout.generations / g, ignore_errors=True)
    if not maybe_unused:
        return
    kept = [layout.manifest(g) for g in keep]
    for project, versions in maybe_unused.items():
        used = {m.get(project) for m in kept}
        for version in versions - used:
            shutil.rmtree(layout.projects / project / version, ignore_errors=True)
        if not any(project in m for m in kept):
            with contextlib.suppress(OSError):
                (layout.projects / project).rmdir()  # only when empty


def _commit_generation(layout: IndexLayout, current: str | None, changed: dict[str, list[IndexFile]],
                       removed: Iterable[str] = ()) -> str:
    """Write the changed projects' pages and a new generation, then switch ``simple`` to it."""
    manifest = dict(layout.manifest(current))
    removed = [p for p in removed if p in manifest]
    for project in removed:
        del manifest[project]
    gen = _next_generation(layout, current)
    touched = sorted({*changed, *removed})
    layout.pending.write_text(json.dumps({"generation": gen, "projects": touched}))
    for project, files in changed.items():
        # No staging name needed: nothing links to pdir/gen until the generation switches, and
        # the pending note lets the next publish remove it if this one dies.
        pdir = layout.projects / project
        target = pdir / gen
        with contextlib.suppress(FileExistsError):
            os.mkdir(pdir)
        try:
            os.mkdir(target)
        except FileExistsError:  # left by a publish that died before its generation existed
            shutil.rmtree(target)
            os.mkdir(target)
        ordered = sorted(files, key=lambda f: f.sort_key)
        _write(target / "index.html", render_project_html(project, ordered))
        _write(target / "index.json", render_project_json(project, ordered))
        manifest[project] = gen
    _pause_for_tests()
    staging = layout.generations / f".tmp-{gen}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    projects = sorted(manifest)
    _write(staging / "index.html", render_root_html(projects))
    _write(staging / "index.json", render_root_json(projects))
    _write(staging / ".manifest.json", json.dumps(manifest, sort_keys=True, separators=(",", ":")))
    where = str(staging)
    for project in projects:  # plain strings: this loop runs once per project in the index
        os.symlink(f"../../.projects/{project}/{manifest[project]}", f"{where}/{project}")
    os.replace(staging, layout.generations / gen)
    link = layout.root / f".simple-{gen}"
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    os.symlink(f".generations/{gen}", link)
    os.replace(link, layout.simple)   # the switch: atomic on POSIX
    _fsync_dir(layout.root)
    _collect_garbage(layout)
    layout.pending.unlink(missing_ok=True)
    return gen


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
    _clear_leftovers(layout)
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
                manifest = layout.manifest(current)
                pages: dict[str, list[IndexFile]] = {}
                new: list[ScannedWheel] = []
                unchanged: list[str] = []
                # decide everything before writing anything
                for s in scanned:
                    project = s.entry.project
                    if project not in pages:
                        pages[project] = layout.read_project(project, manifest[project]) if project in manifest else []
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
            manifest = layout.manifest(current)
            files = layout.read_project(project, manifest[project]) if project in manifest else []
            if filename not in {f.filename for f in files}:
                raise PublishError(f"{filename} is not in the index at {index_dir}")
            files = [replace(f, yanked=not undo, yanked_reason="" if undo else reason)
                     if f.filename == filename else f for f in files]
            try:
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
            try:
                gen = _commit_generation(layout, current, pages, removed=[p for p in manifest if p not in pages])
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
            manifest = layout.manifest(current)
            try:
                gen = _commit_generation(layout, current, pages, removed=[p for p in manifest if p not in pages])
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
