"""Mirror stage: stage every input of a build for an air-gapped site, prove it complete, carry it over.

A mirror is a directory in exactly the layout ``Settings.mirror`` implies, so the other stages
read it directly once ``mirror = DIR`` (or an HTTP server in front of DIR) is set:

    git/ORG/REPO.git                  bare repositories: the pinned commits (refs/patcher/pins/<sha>)
                                      and the tags pointing at them, nothing else (no --mirror);
                                      with ``sync --shallow`` not even their history (depth 1)
    files/<sha256>                    CUDA runfiles, cuDNN archives, third-party inputs
    wheelhouse/<project>/<file>.whl   pinned pip wheels + a PEP 503 index.html with #sha256= links
    images/<name>@sha256_<hex>.tar    the pinned OS image as an OCI image layout (also `docker load`-able)
    mirror-manifest.json              what was synced, with pins and byte counts

Four operations:

* :func:`plan` lists the closure of one build spec: the repository at the tag's commit and every
  submodule recursively (gitlinks + .gitmodules read from the fetched trees), the image digest,
  CUDA/cuDNN/other files by sha256, pip wheels by hash (from the rendered requirements file),
  and the apt packages the Dockerfile installs (by name: the Debian archive is mirrored by
  Debian's own tools).
* :func:`sync` fetches that closure into a mirror, from upstream (the configured locations) or
  from another mirror.  Git fetches only pinned refs, so a second version that shares most
  submodules transfers only the new objects.  Files arrive as ``.part``, are checked, then
  renamed; an interrupted sync resumes (HTTP ``Range``) and never leaves a complete-looking file.
* :func:`check` verifies a mirror holds the closure: each pinned commit present with every
  object it needs (``git rev-list --objects``) and the repository ``git fsck``-clean, every file
  and wheel by sha256, the image archive blob by blob.  Missing -> MirrorIncompleteError (80),
  wrong content -> MirrorCorruptError (81); the report names each item.
* :func:`bundle` / :func:`unbundle`: one tar with a manifest of every member's sha256, verified
  on unbundle before anything lands in place (BundleError, 82).

Images go to the engine through a registry (a directory cannot serve ``FROM ref@digest``):
``sync --registry HOST`` pushes the archived image there, byte for byte, so its digest stays
the pin, and the ``registry`` setting points render at it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import html.parser
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Callable

from patcher.config import Settings
from patcher.dockerfile import REQUIREMENTS_NAME, build_packages, image_from, pip_artifact_name, render
from patcher.errors import (
    BundleError,
    ChecksumMismatchError,
    FetchError,
    MirrorCorruptError,
    MirrorIncompleteError,
    RegistryError,
    SubmoduleError,
    TagMismatchError,
    UnpinnedInputError,
    UnreachableInputError,
)
from patcher.gitrun import (
    GitCommandFailed,
    check_gitmodules,
    gitlinks,
    gitmodules,
    has_commit,
    last_line,
    mirror_url,
    org_repo,
    resolve_relative,
    run_git,
)
from patcher.source import cache_repo, cached_tag_ref
from patcher.spec import BuildSpec, is_known
from patcher.util import sha256_file, write_atomic

MANIFEST_NAME = "mirror-manifest.json"
BUNDLE_MANIFEST_NAME = "BUNDLE-MANIFEST.json"
LOCK_NAME = ".patcher-mirror.lock"
PART_SUFFIX = ".part"
PIN_REF_PREFIX = "refs/patcher/pins/"
DEFAULT_PYPI = "https://pypi.org/simple"
CHUNK = 1 << 20
TIMEOUT = 60.0
SCHEMA = 1
MIRROR_HINT = "point it at a copy that has it: --from, or the mirror / git_mirror / files_mirror / pypi_index settings"

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = {OCI_INDEX, DOCKER_LIST}
MANIFEST_TYPES = {OCI_MANIFEST, DOCKER_MANIFEST}
ACCEPT = ", ".join([OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST])
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


# ----------------------------------------------------------------------------------------------
# the closure of one build
@dataclass(frozen=True)
class GitPin:
    """One repository at one commit; ``path`` is where it sits in the tree ("" = the top)."""

    upstream: str
    org: str
    repo: str
    commit: str
    path: str
    tag: str | None = None

    @property
    def name(self) -> str:
        return f"{self.org}/{self.repo}"

    @property
    def mirror_path(self) -> str:
        return f"git/{self.org}/{self.repo}.git"


@dataclass(frozen=True)
class FilePin:
    name: str
    url: str
    sha256: str
    role: str  # cuda-runfile | cudnn-archive | input

    @property
    def mirror_path(self) -> str:
        return f"files/{self.sha256}"


@dataclass(frozen=True)
class WheelPin:
    requirement: str  # "numpy==1.17.5"
    sha256: str

    @property
    def project(self) -> str:
        return normalize_project(re.split(r"[=<>!~ ;\[]", self.requirement, maxsplit=1)[0])

    @property
    def mirror_dir(self) -> str:
        return f"wheelhouse/{self.project}"


@dataclass(frozen=True)
class ImagePin:
    name: str  # matrix image name, e.g. "debian-bullseye"
    ref: str  # the reference the build pulls (registry-rewritten), without digest
    digest: str

    @property
    def mirror_path(self) -> str:
        return f"images/{self.name}@{self.digest.replace(':', '_')}.tar"


@dataclass(frozen=True)
class MirrorPlan:
    build_id: str
    torch: str
    cuda: str
    python: str
    git: tuple[GitPin, ...]
    image: ImagePin
    files: tuple[FilePin, ...]
    wheels: tuple[WheelPin, ...]
    apt_archive: str  # "debian bullseye"
    apt: tuple[str, ...]
    unpinned: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for pin, entry in zip(self.git, data["git"]):
            entry["mirror_path"] = pin.mirror_path
        for pin, entry in zip(self.files, data["files"]):
            entry["mirror_path"] = pin.mirror_path
        for pin, entry in zip(self.wheels, data["wheels"]):
            entry["mirror_path"] = pin.mirror_dir
        data["image"]["mirror_path"] = self.image.mirror_path
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MirrorPlan:
        def strip(d: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in d.items() if k != "mirror_path"}

        return cls(build_id=data["build_id"], torch=data["torch"], cuda=data["cuda"], python=data["python"],
                   git=tuple(GitPin(**strip(g)) for g in data["git"]), image=ImagePin(**strip(data["image"])),
                   files=tuple(FilePin(**strip(f)) for f in data["files"]),
                   wheels=tuple(WheelPin(**strip(w)) for w in data["wheels"]),
                   apt_archive=data["apt_archive"], apt=tuple(data["apt"]), unpinned=tuple(data.get("unpinned", ())))

    def rows(self) -> list[dict[str, Any]]:
        """One row per input, for the readable table."""
        rows = [{"kind": "git", "name": g.name + (f" ({g.path})" if g.path else f" ({g.tag})"),
                 "pin": g.commit, "source": g.upstream} for g in self.git]
        rows.append({"kind": "image", "name": self.image.name, "pin": self.image.digest, "source": self.image.ref})
        rows += [{"kind": f"file:{f.role}", "name": f.name, "pin": f"sha256:{f.sha256}", "source": f.url}
                 for f in self.files]
        rows += [{"kind": "pip", "name": w.requirement, "pin": f"sha256:{w.sha256}", "source": "pip index"}
                 for w in self.wheels]
        rows += [{"kind": "apt", "name": p, "pin": "by name", "source": self.apt_archive} for p in self.apt]
        return rows


def normalize_project(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------------------------
# git: reading pins and fetching them
def gitmodules_urls(repo: Path, commit: str) -> dict[str, str]:
    """path -> url, as written in ``commit``'s .gitmodules (empty when it has none)."""
    return {path: url for path, (_name, url) in gitmodules(repo, commit).items()}


def _pack_bytes(repo: Path) -> dict[str, int]:
    pack_dir = repo / "objects" / "pack"
    return {p.name: p.stat().st_size for p in pack_dir.glob("*.pack")} if pack_dir.is_dir() else {}


def _fetch(repo: Path, url: str, refspecs: list[str], what: str, shallow: bool = False) -> int:
    """``git fetch`` into ``repo``; returns the bytes received (the new pack's size).

    Received objects are always kept as a pack (unpackLimit=1), so its size is what came over
    the wire, and nothing is auto-gc'd or pruned in a mirror.  ``shallow``: each commit without
    its history (``--depth=1``); from a shallow source the shallow roots are taken either way
    (``--update-shallow``: without it git drops the refs and exits 0).
    """
    before = _pack_bytes(repo)
    depth = ("--depth=1",) if shallow else ()
    try:
        run_git("-c", "fetch.unpackLimit=1", "-c", "transfer.unpackLimit=1", "-c", "gc.auto=0",
             "-c", "maintenance.auto=false", "fetch", "-q", "--no-tags", "--no-write-fetch-head",
             "--update-shallow", *depth, operands=(url, *refspecs), cwd=repo)
    except GitCommandFailed as exc:
        stderr = exc.stderr
        if "couldn't find remote ref" in stderr or "not our ref" in stderr or "no such remote ref" in stderr:
            raise SubmoduleError(f"{what} is not in {url} ({last_line(stderr)})", hint=MIRROR_HINT) from None
        raise UnreachableInputError(f"cannot fetch {what} from {url}: {last_line(stderr)}",
                                    hint=MIRROR_HINT) from None
    after = _pack_bytes(repo)
    return sum(size for name, size in after.items() if name not in before)


def init_bare(path: Path) -> Path:
    """A bare repository at ``path`` (created in a temp dir and renamed, so never half-made)."""
    if (path / "HEAD").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.init-", dir=path.parent))
    try:
        # No template: no sample hooks; gc off and pinned SHAs servable to any client.
        run_git("init", "-q", "--bare", "--template=", str(tmp))
        for key, value in (("gc.auto", "0"), ("uploadpack.allowReachableSHA1InWant", "true"),
                           ("core.logAllRefUpdates", "false")):
            run_git("config", key, value, cwd=tmp)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (path / "HEAD").is_file():
            raise
    return path


@dataclass
class _GitWalk:
    """Walks a build's repositories, fetching each pinned commit into ``repo_for(pin)``.

    Used by plan (into the fetch cache), sync (into the mirror) and, with ``fetch_from=None``,
    by check (read only: what is missing is reported, not fetched).
    """

    repo_for: Callable[[str], Path]  # upstream URL -> local bare repository
    fetch_from: Callable[[str], str] | None  # upstream URL -> where to fetch it from
    tag_ref: Callable[[str], str] = lambda tag: f"refs/tags/{tag}"
    with_tags: bool = False  # also fetch the source's tags that point at pinned commits
    shallow: bool = False  # each pinned commit without its history
    transferred: dict[str, int] = field(default_factory=dict)
    # (repository name, commit) -> [(missing | corrupt, detail)]
    problems: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)

    def _problem(self, pin: GitPin, status: str, detail: str) -> None:
        self.problems.setdefault((pin.name, pin.commit), []).append((status, detail))

    def top(self, spec: BuildSpec) -> list[GitPin]:
        org, repo = org_repo(spec.repo)
        pin = GitPin(upstream=spec.repo, org=org, repo=repo, commit=spec.commit, path="", tag=spec.tag)
        pins = [pin]
        local = self._top_commit(pin)
        if local is not None:
            self._submodules(local, pin, pins)
        return pins

    # -- the tagged repository ---------------------------------------------------------------
    def _top_commit(self, pin: GitPin) -> Path | None:
        repo = self.repo_for(pin.upstream)
        ref = self.tag_ref(pin.tag)
        if self.fetch_from is None:
            if not (repo / "HEAD").is_file():
                self._problem(pin, "missing", f"repository {pin.mirror_path} is missing")
                return None
            found = run_git("rev-parse", "-q", "--verify", f"{ref}^{{commit}}", cwd=repo, check=False).stdout.strip()
            if not found:
                self._problem(pin, "missing", f"tag {pin.tag} is missing in {pin.mirror_path}")
            elif found != pin.commit:
                self._problem(pin, "corrupt", f"tag {pin.tag} points at {found}, the pin is {pin.commit}")
            return self._verify(repo, pin)
        source = self.fetch_from(pin.upstream)
        init_bare(repo)
        current = run_git("rev-parse", "-q", "--verify", f"{ref}^{{commit}}", cwd=repo, check=False).stdout.strip()
        if current == pin.commit and has_commit(repo, pin.commit):
            self.transferred.setdefault(pin.name, 0)
            return repo
        # Into a staging ref first: a moved tag must not land in the mirror.
        staging = f"refs/patcher/incoming/{pin.tag}"
        got = _fetch(repo, source, [f"+refs/tags/{pin.tag}:{staging}"], f"tag {pin.tag}", self.shallow)
        self.transferred[pin.name] = self.transferred.get(pin.name, 0) + got
        found = run_git("rev-parse", f"{staging}^{{commit}}", cwd=repo).stdout.strip()
        tag_object = run_git("rev-parse", staging, cwd=repo).stdout.strip()
        run_git("update-ref", "-d", staging, cwd=repo)
        if found != pin.commit:
            raise TagMismatchError(
                f"tag {pin.tag} in {source} points at {found}, but the pin is {pin.commit}: "
                f"a moved tag is a supply-chain event, refusing it",
                hint="investigate the source; only if the new commit is trusted, pin it in [overrides.tag_commits]")
        run_git("update-ref", ref, tag_object, cwd=repo)
        run_git("update-ref", PIN_REF_PREFIX + pin.commit, pin.commit, cwd=repo)
        return repo

    # -- submodules, recursively -------------------------------------------------------------
    def _submodules(self, repo: Path, parent: GitPin, out: list[GitPin]) -> None:
        links = gitlinks(repo, parent.commit)
        if not links:
            return
        check_gitmodules(repo, parent.commit, parent.upstream, f"{parent.path}/" if parent.path else "")
        urls = gitmodules_urls(repo, parent.commit)
        prefix = f"{parent.path}/" if parent.path else ""
        for path, sha in sorted(links.items()):
            shown = prefix + path
            url = urls.get(path)
            if not url:
                raise SubmoduleError(f"submodule {shown} (commit {sha}) has no URL in .gitmodules of {parent.name}",
                                     hint="the tag's .gitmodules is incomplete; fix the source's copy")
            upstream = resolve_relative(url, parent.upstream)
            org, name = org_repo(upstream)
            pin = GitPin(upstream=upstream, org=org, repo=name, commit=sha, path=shown)
            out.append(pin)
            sub = self._commit(pin)
            if sub is not None:
                self._submodules(sub, pin, out)

    def _commit(self, pin: GitPin) -> Path | None:
        repo = self.repo_for(pin.upstream)
        if self.fetch_from is None:
            if not (repo / "HEAD").is_file():
                self._problem(pin, "missing", f"repository {pin.mirror_path} is missing")
                return None
            if not has_commit(repo, pin.commit):
                self._problem(pin, "missing", f"commit {pin.commit} is missing in {pin.mirror_path}")
                return None
            return self._verify(repo, pin)
        init_bare(repo)
        pin_ref = PIN_REF_PREFIX + pin.commit
        if has_commit(repo, pin.commit):  # mirrored before (another version, another path)
            run_git("update-ref", pin_ref, pin.commit, cwd=repo)
            self.transferred.setdefault(pin.name, 0)
            return repo
        source = self.fetch_from(pin.upstream)
        got = _fetch(repo, source, [f"+{pin.commit}:{pin_ref}"], f"commit {pin.commit} of submodule {pin.path}",
                     self.shallow)
        if self.with_tags:
            got += self._tags_at(repo, source, pin)
        self.transferred[pin.name] = self.transferred.get(pin.name, 0) + got
        return repo

    def _tags_at(self, repo: Path, source: str, pin: GitPin) -> int:
        """The source's tags that name this commit (cheap: their objects are already here)."""
        listing = run_git("ls-remote", "--tags", operands=(source,), cwd=repo, check=False)
        if listing.returncode != 0:
            return 0
        tags = set()
        for line in listing.stdout.splitlines():
            sha, _, ref = line.partition("\t")
            if sha == pin.commit and ref.startswith("refs/tags/"):
                tags.add(ref[:-3] if ref.endswith("^{}") else ref)
        if not tags:
            return 0
        return _fetch(repo, source, [f"+{t}:{t}" for t in sorted(tags)], f"tags of {pin.name}", self.shallow)

    def _verify(self, repo: Path, pin: GitPin) -> Path | None:
        """Every object the commit needs is present (check mode only)."""
        if not has_commit(repo, pin.commit):
            self._problem(pin, "missing", f"commit {pin.commit} is missing in {pin.mirror_path}")
            return None
        proc = run_git("rev-list", "--objects", pin.commit, cwd=repo, check=False)
        if proc.returncode != 0:
            where = f"submodule {pin.path}" if pin.path else f"tag {pin.tag}"
            self._problem(pin, "corrupt", f"{pin.mirror_path} lacks objects of {pin.commit} "
                                          f"({where}): {last_line(proc.stderr)}")
            return None
        return repo


# ----------------------------------------------------------------------------------------------
# the plan
def _file_pins(spec: BuildSpec) -> tuple[FilePin, ...]:
    pins = []
    if spec.cuda_runfile is not None:
        a = spec.cuda_runfile
        pins.append(FilePin(a.name, a.url, a.sha256, "cuda-runfile"))
    if spec.cudnn_archive is not None:
        a = spec.cudnn_archive
        pins.append(FilePin(a.name, a.url, a.sha256, "cudnn-archive"))
    pins += [FilePin(a.name, a.url, a.sha256, "input") for a in spec.inputs]
    return tuple(pins)


def parse_requirements(text: str) -> tuple[WheelPin, ...]:
    """``name==v --hash=sha256:HEX`` lines (the rendered requirements file) -> wheel pins."""
    pins = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("--") else line.strip()
        if not line:
            continue
        m = re.match(r"^(\S+)\s+--hash=sha256:([0-9a-fA-F]{64}|\S+)", line)
        if not m:
            raise UnpinnedInputError(f"requirement line {line!r} carries no --hash=sha256:",
                                     hint="every pip requirement must be pinned by hash")
        pins.append(WheelPin(m.group(1), m.group(2).lower()))
    return tuple(pins)


def _wheel_pins(spec: BuildSpec, settings: Settings) -> tuple[tuple[WheelPin, ...], tuple[str, ...], tuple[str, ...]]:
    """(wheels, apt packages, unpinned) as the rendered Dockerfile has them.

    The wheels come from the rendered requirements file; when render refuses (an unpinned
    input), from the same package list render reads, with the unpinned ones named.
    """
    # The pins do not depend on where inputs are fetched from; rendering without the site's
    # locations keeps render's checks of those locations out of the way.
    settings = replace(settings, mirror=None, git_mirror=None, files_mirror=None, pypi_index=None,
                       debian_mirror=None, registry=None)
    packages = build_packages(spec, settings)
    unpinned = list(spec.unpinned_inputs())
    try:
        rendered = render(spec, settings)
    except UnpinnedInputError:
        wheels = tuple(WheelPin(p.requirement, p.sha256) for p in packages.pip)
        unpinned += [f"sha256 of pip wheel {w.requirement} for Python {spec.python} "
                     f"([overrides.artifacts] \"{pip_artifact_name(w.requirement, spec.python)}\")"
                     for w in wheels if not is_known(w.sha256)]
        return wheels, packages.apt, tuple(unpinned)
    body = rendered.context_files.get(REQUIREMENTS_NAME, b"").decode()
    return parse_requirements(body), packages.apt, tuple(unpinned)


def _image_pin(spec: BuildSpec, settings: Settings) -> ImagePin:
    ref = image_from(spec, settings).rsplit("@", 1)[0]
    return ImagePin(name=spec.image.name, ref=ref, digest=spec.image.digest)


def _build_plan(spec: BuildSpec, settings: Settings, git: list[GitPin]) -> MirrorPlan:
    wheels, apt, unpinned = _wheel_pins(spec, settings)
    return MirrorPlan(build_id=spec.build_id, torch=spec.torch, cuda=spec.cuda, python=spec.python,
                      git=tuple(git), image=_image_pin(spec, settings), files=_file_pins(spec),
                      wheels=wheels, apt_archive=f"{spec.image.family} {spec.image.codename}", apt=apt,
                      unpinned=unpinned)


def plan(spec: BuildSpec, settings: Settings) -> MirrorPlan:
    """Every external input of ``spec`` with its pin.

    The submodules are read from the tag's tree, fetched from the configured upstream or
    mirror into the fetch cache (the same one `patcher fetch` uses, so nothing is fetched twice).
    """
    if not is_known(spec.commit):
        raise UnpinnedInputError(f"no commit is pinned for torch {spec.torch} (tag {spec.tag}): "
                                 "its submodules cannot be listed",
                                 hint=f'pin it in the matrix or in [overrides.tag_commits] "{spec.torch}"')
    walk = _GitWalk(repo_for=lambda up: cache_repo(settings, up),
                    fetch_from=lambda up: mirror_url(up, settings.git_base()),
                    tag_ref=lambda tag: cached_tag_ref(mirror_url(spec.repo, settings.git_base()), tag))
    return _build_plan(spec, settings, walk.top(spec))


# ----------------------------------------------------------------------------------------------
# reading from a source: http(s), file:// or a local path
def _is_url(location: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*://", location))


def _local_path(location: str) -> Path | None:
    if location.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(location).path))
    return None if _is_url(location) else Path(location)


@contextlib.contextmanager
def _open(location: str, what: str, offset: int = 0) -> Iterator[tuple[IO[bytes], bool]]:
    """A readable stream of ``location`` (from ``offset`` when the source can resume).

    Yields (stream, resumed): ``resumed`` is False when the source restarted from byte 0.
    """
    local = _local_path(location)
    if local is not None:
        try:
            fh = open(local, "rb")
        except FileNotFoundError:
            raise UnreachableInputError(f"{what}: {local} does not exist", hint=MIRROR_HINT) from None
        except OSError as exc:
            raise UnreachableInputError(f"{what}: cannot read {local}: {exc.strerror}", hint=MIRROR_HINT) from None
        with fh:
            fh.seek(offset)
            yield fh, True
        return
    headers = {"User-Agent": "patcher-mirror"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(location, headers=headers)
    try:
        resp = urllib.request.urlopen(request, timeout=TIMEOUT)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # the part already has every byte
            yield io.BytesIO(b""), True
            return
        raise UnreachableInputError(f"{what}: {location} answered HTTP {exc.code}", hint=MIRROR_HINT) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UnreachableInputError(f"{what}: {location} is unreachable ({reason})", hint=MIRROR_HINT) from None
    with resp:
        yield resp, (resp.status == 206)


def _read_text(location: str, what: str) -> str:
    with _open(location, what) as (fh, _):
        return fh.read().decode("utf-8", "replace")


def download(location: str, dest: Path, sha256: str, what: str) -> int:
    """Download into ``dest`` through ``dest.part``: resumed where a previous run stopped,
    checked against ``sha256``, then renamed.  Returns the bytes transferred by this call."""
    part = dest.with_name(dest.name + PART_SUFFIX)
    dest.parent.mkdir(parents=True, exist_ok=True)
    offset = part.stat().st_size if part.is_file() else 0
    digest = hashlib.sha256()
    moved = 0
    try:
        with _open(location, what, offset) as (stream, resumed):
            if offset and resumed:
                with open(part, "rb") as fh:
                    for chunk in iter(lambda: fh.read(CHUNK), b""):
                        digest.update(chunk)
                mode = "ab"
            else:
                mode = "wb"
            with open(part, mode) as out:
                for chunk in iter(lambda: stream.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    moved += len(chunk)
    except (OSError, TimeoutError) as exc:
        # The part stays: the next run resumes from it.
        raise UnreachableInputError(f"{what}: transfer from {location} broke off ({exc})", hint="run the sync again") from None
    got = digest.hexdigest()
    if got != sha256:
        part.unlink(missing_ok=True)
        raise ChecksumMismatchError(f"{what} from {location} has sha256 {got}, the pin is {sha256}",
                                    hint="the source serves other content than the pin; fix the source or the pin")
    os.replace(part, dest)
    return moved


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


# ----------------------------------------------------------------------------------------------
# pip: a PEP 503 client that selects files by their pinned hash, and a static index
class _LinkParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _index_page(base: str, project: str) -> str:
    """The project page of an index: ``<base>/<project>/`` (``index.html`` in a directory)."""
    local = _local_path(base)
    if local is not None:
        return str(local / project / "index.html")
    return f"{base.rstrip('/')}/{project}/"


def find_wheel(base: str, pin: WheelPin) -> tuple[str, str]:
    """(file name, URL) of the file with ``pin``'s hash on ``base``'s project page."""
    page = _index_page(base, pin.project)
    text = _read_text(page, f"pip index page of {pin.project}")
    parser = _LinkParser()
    parser.feed(text)
    version = pin.requirement.partition("==")[2]
    fallback = None
    for href in parser.links:
        url, _, fragment = href.partition("#")
        filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        absolute = (urllib.parse.urljoin(page, url) if _is_url(page)
                    else str(Path(page).parent / urllib.parse.unquote(url)))
        if fragment == f"sha256={pin.sha256}":
            return filename, absolute
        dist, _, rest = filename.partition("-")
        if (not fragment and fallback is None and filename.endswith(".whl")
                and normalize_project(dist) == pin.project and rest.startswith(f"{version}-")):
            fallback = (filename, absolute)
    if fallback is not None:  # an index without hash fragments: the download is checked anyway
        return fallback
    raise UnreachableInputError(f"pip wheel {pin.requirement} with sha256 {pin.sha256} is not offered by {page}",
                                hint=MIRROR_HINT)


def write_wheel_index(wheelhouse: Path) -> None:
    """A static PEP 503 index over ``wheelhouse``: each file linked with its sha256."""
    projects = sorted(p.name for p in wheelhouse.iterdir() if p.is_dir()) if wheelhouse.is_dir() else []
    for project in projects:
        files = sorted(f for f in (wheelhouse / project).iterdir()
                       if f.is_file() and f.name != "index.html" and not f.name.endswith(PART_SUFFIX)
                       and not f.name.startswith("."))
        links = "".join(f'    <a href="{urllib.parse.quote(f.name)}#sha256={sha256_file(f)}">{f.name}</a><br>\n'
                        for f in files)
        _write_atomic(wheelhouse / project / "index.html",
                      f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode())
    links = "".join(f'    <a href="{p}/">{p}</a><br>\n' for p in projects)
    _write_atomic(wheelhouse / "index.html", f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode())


# ----------------------------------------------------------------------------------------------
# images: a registry client (pull by digest, push byte for byte) and OCI layout archives
def _registry_scheme(host: str) -> str:
    bare = host.split("]")[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
    return "http" if bare in ("localhost", "[::1]") or bare.startswith("127.") else "https"


class RegistryClient:
    """The registry HTTP API v2: anonymous bearer tokens, manifests and blobs by digest."""

    def __init__(self, host: str, path: str):
        import requests

        self.host, self.path = host, path
        self.base = f"{_registry_scheme(host)}://{host}/v2/{path}"
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "patcher-mirror"

    def close(self) -> None:
        self.session.close()

    def _request(self, method: str, url: str, **kwargs):
        import requests

        try:
            resp = self.session.request(method, url, timeout=TIMEOUT, **kwargs)
            if resp.status_code == 401 and "Authorization" not in self.session.headers:
                token = self._token(resp.headers.get("WWW-Authenticate", ""))
                if token:
                    self.session.headers["Authorization"] = f"Bearer {token}"
                    resp = self.session.request(method, url, timeout=TIMEOUT, **kwargs)
        except requests.RequestException as exc:
            raise UnreachableInputError(f"registry {self.host} is unreachable ({type(exc).__name__})",
                                        hint="check the registry setting (--registry / PATCHER_REGISTRY)") from None
        return resp

    def _token(self, challenge: str) -> str | None:
        if not challenge.lower().startswith("bearer "):
            return None
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if not realm:
            return None
        resp = self.session.get(realm, params=params, timeout=TIMEOUT)
        return (resp.json().get("token") or resp.json().get("access_token")) if resp.status_code == 200 else None

    def manifest(self, reference: str) -> tuple[bytes, str]:
        resp = self._request("GET", f"{self.base}/manifests/{reference}", headers={"Accept": ACCEPT})
        if resp.status_code != 200:
            raise UnreachableInputError(f"registry {self.host} has no manifest {self.path}@{reference} "
                                        f"(HTTP {resp.status_code})", hint=MIRROR_HINT)
        media_type = resp.headers.get("Content-Type", "").split(";")[0] or json.loads(resp.content).get("mediaType", "")
        return resp.content, media_type

    def blob(self, digest: str):
        resp = self._request("GET", f"{self.base}/blobs/{digest}", stream=True)
        if resp.status_code != 200:
            resp.close()
            raise UnreachableInputError(f"registry {self.host} has no blob {digest} of {self.path} "
                                        f"(HTTP {resp.status_code})", hint=MIRROR_HINT)
        return resp

    def has_blob(self, digest: str) -> bool:
        return self._request("HEAD", f"{self.base}/blobs/{digest}").status_code == 200

    def put_blob(self, digest: str, data: IO[bytes], size: int) -> None:
        start = self._request("POST", f"{self.base}/blobs/uploads/")
        if start.status_code != 202:
            raise RegistryError(f"registry {self.host} refused an upload to {self.path} (HTTP {start.status_code})")
        location = urllib.parse.urljoin(self.base + "/", start.headers["Location"])
        sep = "&" if "?" in location else "?"
        done = self._request("PUT", f"{location}{sep}digest={digest}", data=data,
                             headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        if done.status_code != 201:
            raise RegistryError(f"registry {self.host} refused blob {digest} (HTTP {done.status_code})")

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        resp = self._request("PUT", f"{self.base}/manifests/{reference}", data=body,
                             headers={"Content-Type": media_type})
        if resp.status_code != 201:
            raise RegistryError(f"registry {self.host} refused manifest {self.path}:{reference} "
                                f"(HTTP {resp.status_code}: {resp.text.strip()[:200]})",
                                hint="a multi-platform index needs every platform's manifest; pin the "
                                     "platform manifest's digest in [overrides.images] instead")
        return resp.headers.get("Docker-Content-Digest", "")


def _split_image_ref(ref: str) -> tuple[str, str, str]:
    from patcher.lock import ImageRef

    parsed = ImageRef.parse(ref)
    return parsed.host, parsed.path, parsed.tag


def _host_platform() -> tuple[str, str]:
    import platform

    machine = platform.machine().lower()
    return "linux", {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


class _HashingReader(io.RawIOBase):
    """Reads from ``source`` and hashes what passes (tar members stream through it)."""

    def __init__(self, source: IO[bytes]):
        self.source, self.digest, self.count = source, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.digest.update(data)
        self.count += len(data)
        return data


def _tar_info(name: str, size: int, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, mode, 0, 0
    return info


def pull_image_archive(pin: ImagePin, source_ref: str, dest: Path) -> int:
    """Pull ``source_ref@pin.digest`` from its registry into an OCI layout tar at ``dest``.

    Every blob is checked against its digest as it streams into ``dest.part``.  A platform
    index keeps the index and this host's platform manifest.  The archive also carries a
    ``manifest.json`` so that `docker load` (engine 20.10) reads it.  Returns bytes received.
    """
    host, path, tag = _split_image_ref(source_ref)
    client = RegistryClient(host, path)
    part = dest.with_name(dest.name + PART_SUFFIX)
    dest.parent.mkdir(parents=True, exist_ok=True)
    moved = 0
    try:
        top, top_type = client.manifest(pin.digest)
        if "sha256:" + hashlib.sha256(top).hexdigest() != pin.digest:
            raise ChecksumMismatchError(f"image {source_ref}: the registry's manifest does not hash to {pin.digest}")
        moved += len(top)
        blobs: list[tuple[str, bytes | None, int]] = [(pin.digest, top, len(top))]
        manifest, manifest_digest = top, pin.digest
        if top_type in INDEX_TYPES or json.loads(top).get("manifests"):
            os_name, arch = _host_platform()
            entries = json.loads(top).get("manifests", [])
            chosen = next((m for m in entries if (m.get("platform") or {}).get("os") == os_name
                           and (m.get("platform") or {}).get("architecture") == arch), None)
            if chosen is None:
                raise UnreachableInputError(f"image {source_ref}@{pin.digest} has no {os_name}/{arch} manifest")
            manifest, _ = client.manifest(chosen["digest"])
            manifest_digest = chosen["digest"]
            if "sha256:" + hashlib.sha256(manifest).hexdigest() != manifest_digest:
                raise ChecksumMismatchError(f"image {source_ref}: manifest {manifest_digest} does not hash to its digest")
            moved += len(manifest)
            blobs.append((manifest_digest, manifest, len(manifest)))
        body = json.loads(manifest)
        config = body["config"]
        layers = body.get("layers", [])
        for item in [config, *layers]:
            blobs.append((item["digest"], None, int(item["size"])))
        docker_manifest = json.dumps([{
            "Config": f"blobs/sha256/{config['digest'].split(':', 1)[1]}",
            "RepoTags": [source_ref if ":" in source_ref.rsplit("/", 1)[-1] else f"{source_ref}:{tag}"],
            "Layers": [f"blobs/sha256/{layer['digest'].split(':', 1)[1]}" for layer in layers],
        }]).encode()
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{
            "mediaType": top_type or OCI_MANIFEST, "digest": pin.digest, "size": len(top),
            "annotations": {"io.containerd.image.name": f"{host}/{path}:{tag}",
                            "org.opencontainers.image.ref.name": tag}}]}, sort_keys=True).encode()
        seen = set()
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            layout = b'{"imageLayoutVersion":"1.0.0"}'
            tar.addfile(_tar_info("oci-layout", len(layout)), io.BytesIO(layout))
            tar.addfile(_tar_info("index.json", len(index)), io.BytesIO(index))
            tar.addfile(_tar_info("manifest.json", len(docker_manifest)), io.BytesIO(docker_manifest))
            for digest, data, size in blobs:
                if digest in seen:
                    continue
                seen.add(digest)
                name = f"blobs/sha256/{digest.split(':', 1)[1]}"
                if data is not None:
                    tar.addfile(_tar_info(name, size), io.BytesIO(data))
                    continue
                with client.blob(digest) as resp:
                    reader = _HashingReader(resp.raw)
                    tar.addfile(_tar_info(name, size), reader)
                    if "sha256:" + reader.digest.hexdigest() != digest or reader.count != size:
                        raise ChecksumMismatchError(f"image {source_ref}: blob {digest} arrived with other content")
                    moved += size
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        client.close()
    return moved


@dataclass(frozen=True)
class ArchiveCheck:
    ok: bool
    detail: str
    manifest: bytes | None = None
    manifest_type: str | None = None


def verify_image_archive(path: Path, digest: str) -> ArchiveCheck:
    """Hash every blob of the archive; the pinned manifest and all it references must be there."""
    try:
        blobs: dict[str, int] = {}
        index = None
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                fh = tar.extractfile(member)
                if member.name == "index.json":
                    index = json.loads(fh.read())
                    continue
                m = re.fullmatch(r"blobs/sha256/([0-9a-f]{64})", member.name)
                if not m:
                    continue
                h = hashlib.sha256()
                for chunk in iter(lambda fh=fh: fh.read(CHUNK), b""):
                    h.update(chunk)
                if h.hexdigest() != m.group(1):
                    return ArchiveCheck(False, f"blob sha256:{m.group(1)} has other content (sha256:{h.hexdigest()})")
                blobs["sha256:" + m.group(1)] = member.size
            if index is None or digest not in {m.get("digest") for m in index.get("manifests", [])}:
                return ArchiveCheck(False, f"index.json does not name the pinned manifest {digest}")
            if digest not in blobs:
                return ArchiveCheck(False, f"the pinned manifest {digest} is not in the archive")
            top = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}").read()
            body = json.loads(top)
            manifests = [body]
            if body.get("manifests"):
                present = [m["digest"] for m in body["manifests"] if m["digest"] in blobs]
                if not present:
                    return ArchiveCheck(False, "no platform manifest of the pinned index is in the archive")
                manifests = [json.loads(tar.extractfile(f"blobs/sha256/{d.split(':', 1)[1]}").read())
                             for d in present]
            for man in manifests:
                for item in [man["config"], *man.get("layers", [])]:
                    if item["digest"] not in blobs:
                        return ArchiveCheck(False, f"blob {item['digest']} is missing")
                    if blobs[item["digest"]] != int(item["size"]):
                        return ArchiveCheck(False, f"blob {item['digest']} has {blobs[item['digest']]} bytes, "
                                                   f"the manifest says {item['size']}")
            return ArchiveCheck(True, "", top, body.get("mediaType"))
    except (tarfile.TarError, OSError, ValueError, KeyError, EOFError) as exc:
        return ArchiveCheck(False, f"not a readable image archive ({type(exc).__name__}: {exc})")


def push_image_archive(archive: Path, digest: str, target_ref: str) -> str:
    """Push the archive's blobs and manifests to ``target_ref``'s registry, byte for byte,
    so the pinned digest names the pushed image.  Returns ``ref@digest``."""
    host, path, tag = _split_image_ref(target_ref)
    client = RegistryClient(host, path)
    try:
        with tarfile.open(archive, "r:") as tar:
            members = {m.name: m for m in tar if m.isfile()}

            def blob_bytes(d: str) -> bytes:
                return tar.extractfile(members[f"blobs/sha256/{d.split(':', 1)[1]}"]).read()

            top = json.loads(blob_bytes(digest))
            children = [m for m in top.get("manifests", []) if f"blobs/sha256/{m['digest'].split(':', 1)[1]}" in members]
            for man_digest, man in ([(c["digest"], json.loads(blob_bytes(c["digest"]))) for c in children]
                                    if top.get("manifests") else [(digest, top)]):
                for item in [man["config"], *man.get("layers", [])]:
                    if not client.has_blob(item["digest"]):
                        member = members[f"blobs/sha256/{item['digest'].split(':', 1)[1]}"]
                        client.put_blob(item["digest"], tar.extractfile(member), member.size)
                if man_digest != digest:
                    client.put_manifest(man_digest, blob_bytes(man_digest), man.get("mediaType", DOCKER_MANIFEST))
            body = blob_bytes(digest)
            got = client.put_manifest(tag, body, top.get("mediaType") or DOCKER_MANIFEST)
            if got and got != digest:
                raise RegistryError(f"registry {host} stored {path}:{tag} as {got}, not the pinned {digest}")
    finally:
        client.close()
    return f"{host}/{path}:{tag}@{digest}"


# ----------------------------------------------------------------------------------------------
# sync
@dataclass(frozen=True)
class SyncedItem:
    kind: str  # git | file | pip | image
    name: str
    pin: str
    path: str  # relative to the mirror
    action: str  # fetched | present | pushed
    transferred: int  # bytes moved by this sync


@dataclass(frozen=True)
class SyncResult:
    build_id: str
    mirror: str
    source: str
    items: tuple[SyncedItem, ...]
    pushed_image: str | None = None

    @property
    def transferred(self) -> int:
        return sum(i.transferred for i in self.items)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "transferred": self.transferred}


def source_settings(settings: Settings, source: str | None) -> Settings:
    """The settings to fetch with: ``--from`` (another mirror) replaces every location."""
    if not source:
        return settings
    if _local_path(source) is not None and not _local_path(source).is_dir():
        raise UnreachableInputError(f"--from {source}: no such mirror directory", hint="give a mirror directory or URL")
    return replace(settings, mirror=source.rstrip("/"), git_mirror=None, files_mirror=None, pypi_index=None)


@contextlib.contextmanager
def _mirror_lock(mirror: Path) -> Iterator[None]:
    mirror.mkdir(parents=True, exist_ok=True)
    with open(mirror / LOCK_NAME, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FetchError(f"another sync is writing {mirror}", hint="wait for it to finish") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _refuse_unpinned(spec: BuildSpec, mirror_plan_unpinned: tuple[str, ...]) -> None:
    if mirror_plan_unpinned:
        raise UnpinnedInputError(f"refusing to mirror {spec.build_id}: unpinned input(s): "
                                 + "; ".join(mirror_plan_unpinned),
                                 hint="pin them in the matrix or in the config file's [overrides]")


def sync_git(spec: BuildSpec, src: Settings, dest: Path, shallow: bool = False) -> tuple[list[GitPin], list[SyncedItem]]:
    """The git part of :func:`sync` (``src``: the settings to fetch with), for a caller that
    holds the mirror's lock: the pinned refs only; objects already mirrored are not
    transferred again."""
    def repo_for(upstream: str) -> Path:
        org, repo = org_repo(upstream)
        return dest / "git" / org / f"{repo}.git"

    walk = _GitWalk(repo_for=repo_for, fetch_from=lambda up: mirror_url(up, src.git_base()), with_tags=True,
                    shallow=shallow)
    git_pins = walk.top(spec)
    items = []
    seen: set[tuple[str, str]] = set()
    for pin in git_pins:
        if (pin.name, pin.commit) in seen:
            continue
        seen.add((pin.name, pin.commit))
        got = walk.transferred.get(pin.name, 0)
        walk.transferred[pin.name] = 0  # counted once per repository
        items.append(SyncedItem("git", pin.name + (f" ({pin.path})" if pin.path else f" ({pin.tag})"),
                                pin.commit, pin.mirror_path, "fetched" if got else "present", got))
    for repo in {dest / p.mirror_path for p in git_pins}:
        run_git("update-server-info", cwd=repo)  # so a plain web server can serve the mirror (dumb HTTP)
    return git_pins, items


def sync(spec: BuildSpec, settings: Settings, dest: Path, source: str | None = None,
         registry: str | None = None, shallow: bool = False) -> SyncResult:
    """Fetch the closure of ``spec`` into the mirror ``dest`` (see the module docstring).

    ``shallow``: the git repositories hold the pinned commits and nothing else (no history:
    depth 1 at each), which is all a build reads; a mirror synced from a shallow source is
    shallow either way."""
    dest = Path(dest).absolute()
    src = source_settings(settings, source)
    wheels, _apt, unpinned = _wheel_pins(spec, settings)
    if not is_known(spec.commit):
        unpinned = (f"commit of tag {spec.tag}", *unpinned)
    _refuse_unpinned(spec, tuple(dict.fromkeys(unpinned)))
    items: list[SyncedItem] = []
    pushed = None
    with _mirror_lock(dest):
        git_pins, git_items = sync_git(spec, src, dest, shallow=shallow)
        items += git_items

        # -- files by sha256
        for pin in _file_pins(spec):
            target = dest / pin.mirror_path
            if target.is_file():
                items.append(SyncedItem("file", pin.name, f"sha256:{pin.sha256}", pin.mirror_path, "present", 0))
                continue
            location = f"{src.files_base()}/{pin.sha256}" if src.files_base() else pin.url
            got = download(location, target, pin.sha256, f"{pin.role} {pin.name}")
            items.append(SyncedItem("file", pin.name, f"sha256:{pin.sha256}", pin.mirror_path, "fetched", got))

        # -- pip wheels by hash, into a static PEP 503 index
        if wheels:
            index = src.pypi_base() or DEFAULT_PYPI
            wheelhouse = dest / "wheelhouse"
            for pin in wheels:
                existing = _wheel_in(wheelhouse / pin.project, pin.sha256)
                if existing is not None:
                    items.append(SyncedItem("pip", pin.requirement, f"sha256:{pin.sha256}",
                                            f"{pin.mirror_dir}/{existing.name}", "present", 0))
                    continue
                filename, url = find_wheel(index, pin)
                if "/" in filename or filename.startswith("."):
                    raise UnreachableInputError(f"pip index {index} offers a bad file name {filename!r}")
                got = download(url, wheelhouse / pin.project / filename, pin.sha256, f"pip wheel {pin.requirement}")
                items.append(SyncedItem("pip", pin.requirement, f"sha256:{pin.sha256}",
                                        f"{pin.mirror_dir}/{filename}", "fetched", got))
            write_wheel_index(wheelhouse)

        # -- the OS image by digest
        image = _image_pin(spec, src)
        archive = dest / image.mirror_path
        if archive.is_file() and verify_image_archive(archive, image.digest).ok:
            items.append(SyncedItem("image", image.name, image.digest, image.mirror_path, "present", 0))
        else:
            got = _fetch_image(image, src, archive)
            items.append(SyncedItem("image", image.name, image.digest, image.mirror_path, "fetched", got))
        if registry:
            target = _image_pin(spec, replace(settings, registry=registry)).ref
            pushed = push_image_archive(archive, image.digest, target)
            items.append(SyncedItem("image", image.name, image.digest, pushed, "pushed", 0))

        mirror_plan = _build_plan(spec, settings, git_pins)
        _record_manifest(dest, mirror_plan, items, source or "upstream")
    return SyncResult(build_id=spec.build_id, mirror=str(dest), source=source or "upstream",
                      items=tuple(items), pushed_image=pushed)


def _wheel_in(project_dir: Path, sha256: str) -> Path | None:
    if not project_dir.is_dir():
        return None
    for f in sorted(project_dir.iterdir()):
        if f.is_file() and f.suffix == ".whl" and sha256_file(f) == sha256:
            return f
    return None


def _fetch_image(image: ImagePin, src: Settings, archive: Path) -> int:
    """From the source mirror's images/ when there is one, else from the registry."""
    if not is_known(image.digest) or not DIGEST_RE.match(image.digest):
        raise UnpinnedInputError(f"image {image.name} has no digest pin", hint="run `patcher lock` or [overrides.images]")
    if src.mirror:
        location = f"{src.mirror.rstrip('/')}/{image.mirror_path}"
        part = archive.with_name(archive.name + PART_SUFFIX)
        archive.parent.mkdir(parents=True, exist_ok=True)
        try:
            with _open(location, f"image archive {image.name}") as (stream, _), open(part, "wb") as out:
                shutil.copyfileobj(stream, out, CHUNK)
            result = verify_image_archive(part, image.digest)
            if not result.ok:
                raise ChecksumMismatchError(f"image archive {location}: {result.detail}",
                                            hint="the source mirror is damaged; run `patcher mirror check` on it")
            size = part.stat().st_size
            os.replace(part, archive)
            return size
        except BaseException:
            part.unlink(missing_ok=True)
            raise
    return pull_image_archive(image, image.ref, archive)


def _dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def read_mirror_manifest(mirror: Path) -> dict[str, Any]:
    path = Path(mirror) / MANIFEST_NAME
    if not path.is_file():
        return {"schema": SCHEMA, "builds": {}, "git": {}, "files": {}, "wheels": {}, "images": {}, "syncs": []}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise MirrorCorruptError(f"{path} is not valid JSON ({exc})", hint="run the sync again to rewrite it") from None


def _record_manifest(dest: Path, mirror_plan: MirrorPlan, items: list[SyncedItem], source: str) -> None:
    data = read_mirror_manifest(dest)
    data["builds"][mirror_plan.build_id] = mirror_plan.to_json()
    for pin in mirror_plan.git:
        entry = data["git"].setdefault(pin.name, {"upstream": pin.upstream, "commits": {}, "tags": {}})
        entry["commits"].setdefault(pin.commit, pin.path or f"tag {pin.tag}")
        if pin.tag:
            entry["tags"][pin.tag] = pin.commit
        entry["bytes"] = _dir_bytes(dest / pin.mirror_path)
    for pin in mirror_plan.files:
        data["files"][pin.sha256] = {"name": pin.name, "url": pin.url, "role": pin.role,
                                     "bytes": _dir_bytes(dest / pin.mirror_path)}
    for item in items:
        if item.kind == "pip":
            data["wheels"][item.pin.split(":", 1)[1]] = {"requirement": item.name, "file": item.path,
                                                         "bytes": _dir_bytes(dest / item.path)}
        if item.kind == "image" and item.action != "pushed":
            data["images"][item.pin] = {"name": item.name, "ref": mirror_plan.image.ref, "file": item.path,
                                        "bytes": _dir_bytes(dest / item.path)}
        if item.kind == "image" and item.action == "pushed":
            data["images"].setdefault(item.pin, {}).setdefault("pushed", [])
            if item.path not in data["images"][item.pin]["pushed"]:
                data["images"][item.pin]["pushed"].append(item.path)
    data["syncs"].append({"build_id": mirror_plan.build_id, "source": source,
                          "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "transferred": sum(i.transferred for i in items),
                          "fetched": sum(1 for i in items if i.action == "fetched")})
    _write_atomic(dest / MANIFEST_NAME, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


# ----------------------------------------------------------------------------------------------
# check
@dataclass(frozen=True)
class CheckedItem:
    kind: str
    name: str
    pin: str
    path: str
    status: str  # ok | missing | corrupt
    detail: str = ""


@dataclass(frozen=True)
class CheckReport:
    build_id: str
    mirror: str
    items: tuple[CheckedItem, ...]

    @property
    def complete(self) -> bool:
        return all(i.status == "ok" for i in self.items)

    @property
    def problems(self) -> list[CheckedItem]:
        return [i for i in self.items if i.status != "ok"]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}

    def raise_for_status(self) -> None:
        """Corrupt content (81) outranks missing content (80); the message names every item."""
        bad = self.problems
        if not bad:
            return
        listing = "; ".join(f"{i.kind} {i.name}: {i.detail}" for i in bad)
        if any(i.status == "corrupt" for i in bad):
            raise MirrorCorruptError(f"mirror {self.mirror} is damaged for {self.build_id}: {listing}",
                                     hint="run `patcher mirror sync` again to re-fetch the damaged inputs")
        raise MirrorIncompleteError(f"mirror {self.mirror} lacks {len(bad)} input(s) of {self.build_id}: {listing}",
                                    hint="run `patcher mirror sync` for this build")


def check(spec: BuildSpec, settings: Settings, mirror: Path) -> CheckReport:
    """Is the whole closure of ``spec`` in ``mirror``, with every checksum right?"""
    mirror = Path(mirror).absolute()
    if not mirror.is_dir():
        raise MirrorIncompleteError(f"mirror {mirror} does not exist", hint="run `patcher mirror sync --to DIR`")
    if not is_known(spec.commit):
        raise UnpinnedInputError(f"no commit is pinned for torch {spec.torch} (tag {spec.tag})",
                                 hint=f'pin it in the matrix or in [overrides.tag_commits] "{spec.torch}"')
    items: list[CheckedItem] = []

    def repo_for(upstream: str) -> Path:
        org, repo = org_repo(upstream)
        return mirror / "git" / org / f"{repo}.git"

    walk = _GitWalk(repo_for=repo_for, fetch_from=None)
    git_pins = walk.top(spec)
    fsck_done: dict[Path, str] = {}
    for pin in git_pins:
        label = pin.name + (f" ({pin.path})" if pin.path else f" ({pin.tag})")
        own = walk.problems.get((pin.name, pin.commit), [])
        if own:
            status = "corrupt" if any(s == "corrupt" for s, _ in own) else "missing"
            items.append(CheckedItem("git", label, pin.commit, pin.mirror_path, status, "; ".join(d for _, d in own)))
            continue
        repo = mirror / pin.mirror_path
        if repo not in fsck_done:
            proc = run_git("fsck", "--no-dangling", "--no-progress", cwd=repo, check=False)
            fsck_done[repo] = "" if proc.returncode == 0 else last_line(proc.stderr or proc.stdout)
        if fsck_done[repo]:
            items.append(CheckedItem("git", label, pin.commit, pin.mirror_path, "corrupt",
                                     f"git fsck of {pin.mirror_path} fails: {fsck_done[repo]}"))
        else:
            items.append(CheckedItem("git", label, pin.commit, pin.mirror_path, "ok"))

    for pin in _file_pins(spec):
        path = mirror / pin.mirror_path
        if not path.is_file():
            items.append(CheckedItem("file", pin.name, f"sha256:{pin.sha256}", pin.mirror_path, "missing",
                                     f"{pin.mirror_path} is missing"))
            continue
        got = sha256_file(path)
        items.append(CheckedItem("file", pin.name, f"sha256:{pin.sha256}", pin.mirror_path,
                                 "ok" if got == pin.sha256 else "corrupt",
                                 "" if got == pin.sha256 else f"{pin.mirror_path} has sha256 {got}"))

    wheels, _apt, _unpinned = _wheel_pins(spec, settings)
    for pin in wheels:
        items.append(_check_wheel(mirror, pin))

    image = _image_pin(spec, settings)
    archive = mirror / image.mirror_path
    if not archive.is_file():
        items.append(CheckedItem("image", image.name, image.digest, image.mirror_path, "missing",
                                 f"{image.mirror_path} is missing"))
    else:
        result = verify_image_archive(archive, image.digest)
        items.append(CheckedItem("image", image.name, image.digest, image.mirror_path,
                                 "ok" if result.ok else "corrupt", result.detail))
    return CheckReport(build_id=spec.build_id, mirror=str(mirror), items=tuple(items))


def _check_wheel(mirror: Path, pin: WheelPin) -> CheckedItem:
    project_dir = mirror / pin.mirror_dir
    pinned = f"sha256:{pin.sha256}"
    found = _wheel_in(project_dir, pin.sha256)
    if found is None:
        expected = read_mirror_manifest(mirror).get("wheels", {}).get(pin.sha256, {}).get("file")
        if expected and (mirror / expected).is_file():
            return CheckedItem("pip", pin.requirement, pinned, expected, "corrupt",
                               f"{expected} has sha256 {sha256_file(mirror / expected)}")
        return CheckedItem("pip", pin.requirement, pinned, pin.mirror_dir, "missing",
                           f"no wheel with this sha256 in {pin.mirror_dir}")
    relative = f"{pin.mirror_dir}/{found.name}"
    page = project_dir / "index.html"
    if not page.is_file() or f"#sha256={pin.sha256}" not in page.read_text(encoding="utf-8", errors="replace"):
        return CheckedItem("pip", pin.requirement, pinned, relative, "missing",
                           f"{pin.mirror_dir}/index.html does not list {found.name}")
    return CheckedItem("pip", pin.requirement, pinned, relative, "ok")


# ----------------------------------------------------------------------------------------------
# bundle / unbundle
@dataclass(frozen=True)
class BundleResult:
    archive: str
    mirror: str
    files: int
    bytes: int
    sha256: str  # of the archive itself

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _bundle_members(mirror: Path) -> list[Path]:
    members = []
    for path in sorted(mirror.rglob("*")):
        rel = path.relative_to(mirror)
        if path.is_symlink():
            raise BundleError(f"{path} is a symbolic link; a mirror holds plain files only")
        # Never carried: the lock, downloads in progress, temp dirs of an interrupted sync
        # (dot names) and the temp packs of an interrupted git fetch.
        if (not path.is_file() or rel.name.endswith(PART_SUFFIX) or any(p.startswith(".") for p in rel.parts)
                or rel.name.startswith(("tmp_pack_", "tmp_idx_"))):
            continue
        members.append(rel)
    return members


def bundle(mirror: Path, out: Path) -> BundleResult:
    """One tar of the mirror with BUNDLE-MANIFEST.json (sha256 and size of every member) first."""
    mirror = Path(mirror).absolute()
    out = Path(out).absolute()
    if not (mirror / MANIFEST_NAME).is_file():
        raise BundleError(f"{mirror} is not a mirror (no {MANIFEST_NAME})", hint="make it with `patcher mirror sync`")
    members = _bundle_members(mirror)
    entries = {str(rel): {"sha256": sha256_file(mirror / rel), "size": (mirror / rel).stat().st_size}
               for rel in members}
    manifest = json.dumps({"schema": SCHEMA, "files": entries}, indent=2, sort_keys=True).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + PART_SUFFIX)
    try:
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(_tar_info(BUNDLE_MANIFEST_NAME, len(manifest)), io.BytesIO(manifest))
            for rel in members:
                entry = entries[str(rel)]
                with open(mirror / rel, "rb") as fh:
                    reader = _HashingReader(fh)
                    tar.addfile(_tar_info(f"mirror/{rel}", entry["size"]), reader)
                if reader.digest.hexdigest() != entry["sha256"]:
                    raise BundleError(f"{mirror / rel} changed while it was bundled", hint="bundle when no sync runs")
        digest = sha256_file(part)
        os.replace(part, out)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return BundleResult(archive=str(out), mirror=str(mirror), files=len(members),
                        bytes=sum(e["size"] for e in entries.values()), sha256=digest)


def _safe_member_path(name: str) -> Path | None:
    if not name.startswith("mirror/"):
        return None
    rel = Path(name[len("mirror/"):])
    if rel.is_absolute() or not rel.parts or any(p in ("..", "") for p in rel.parts):
        return None
    return rel


def unbundle(archive: Path, dest: Path) -> BundleResult:
    """Extract a bundle into ``dest`` (new or empty), checking every member against the manifest.

    Everything lands in a temp directory beside ``dest`` first; only a fully verified bundle is
    renamed into place, so a bad bundle leaves nothing behind.
    """
    archive = Path(archive).absolute()
    dest = Path(dest).absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BundleError(f"{dest} exists and is not empty",
                          hint="unbundle into a new directory, then `patcher mirror sync --from` it into the site's mirror")
    if not archive.is_file():
        raise BundleError(f"bundle {archive} does not exist")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.unbundle-", dir=dest.parent))
    try:
        try:
            tar = tarfile.open(archive, "r:")
        except (tarfile.TarError, OSError) as exc:
            raise BundleError(f"{archive} is not a tar archive ({exc})") from None
        with tar:
            try:
                first = tar.next()
                if first is None or first.name != BUNDLE_MANIFEST_NAME or not first.isfile():
                    raise BundleError(f"{archive} does not start with {BUNDLE_MANIFEST_NAME}: not a patcher bundle")
                manifest = json.loads(tar.extractfile(first).read())
                expected: dict[str, dict[str, Any]] = manifest["files"]
                seen: set[str] = set()
                # tar.next(), not iteration: iterating a TarFile starts again at the first member.
                while (member := tar.next()) is not None:
                    rel = _safe_member_path(member.name)
                    if rel is None or not member.isfile():
                        raise BundleError(f"{archive}: member {member.name!r} is not a plain file inside mirror/")
                    key = str(rel)
                    if key not in expected:
                        raise BundleError(f"{archive}: member {key} is not in the bundle manifest")
                    if key in seen:
                        raise BundleError(f"{archive}: member {key} appears twice")
                    seen.add(key)
                    target = tmp / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    reader = _HashingReader(tar.extractfile(member))
                    with open(target, "wb") as fh:
                        shutil.copyfileobj(reader, fh, CHUNK)
                    if reader.digest.hexdigest() != expected[key]["sha256"] or reader.count != expected[key]["size"]:
                        raise BundleError(f"{archive}: {key} has sha256 {reader.digest.hexdigest()}, "
                                          f"the bundle manifest says {expected[key]['sha256']}",
                                          hint="the bundle was damaged in transit; copy it again")
                missing = sorted(set(expected) - seen)
                if missing:
                    raise BundleError(f"{archive} lacks {len(missing)} member(s) its manifest lists, e.g. {missing[0]}",
                                      hint="the bundle is truncated; copy it again")
            except (tarfile.TarError, EOFError, OSError, ValueError, KeyError) as exc:
                raise BundleError(f"{archive} is damaged or truncated ({type(exc).__name__}: {exc})",
                                  hint="copy the bundle again") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BundleResult(archive=str(archive), mirror=str(dest), files=len(expected),
                        bytes=sum(e["size"] for e in expected.values()), sha256=sha256_file(archive))


__all__ = [
    "BundleResult", "CheckReport", "CheckedItem", "FilePin", "GitPin", "ImagePin", "MirrorPlan",
    "SyncResult", "SyncedItem", "WheelPin", "bundle", "check", "plan", "sync", "unbundle",
]
