"""Fetch stage: a BuildSpec -> a SourceTree (the tag at its verified commit, submodules, tree hash).

How a fetch works:

1. The repository URL (``BuildSpec.repo``, an upstream URL) is redirected to the git mirror when
   one is set (``--git-mirror``, ``PATCHER_GIT_MIRROR``, ``git_mirror`` or ``mirror`` in the
   config): ``https://github.com/ORG/REPO.git`` -> ``<git_mirror>/ORG/REPO.git``.
2. The tag is fetched into a bare cache, ``<cache_dir>/git/ORG/REPO.git``, under
   ``refs/patcher/sources/<key of the source URL>/tags/<tag>`` (forced, so a moved tag is seen,
   not refused by git; one ref per source, so a tag cached from one mirror is never reported
   as what another mirror holds).  Objects
   already in the cache are never transferred again: a second fetch of the same or another
   version only negotiates.  A shallow mirror (each pinned commit without its history) works
   the same: the cache records the shallow roots (``--update-shallow``), and trees are copied
   out of such a cache by fetching the one ref, since git never local-clones a shallow repository.
3. The tag's commit must equal the pinned one (the matrix, or ``[overrides.tag_commits]``, which
   is recorded); otherwise TagMismatchError, since a moved tag is a supply-chain event.
4. The tree is cloned from the cache as a local clone (objects hard-linked: no transfer, and the
   clone keeps working if the cache is pruned) into a temp directory beside ``-o``.
5. Submodules (gitlinks of the commit, recursively) are fetched by their pinned SHA into their own
   caches before anything is checked out (a missing one fails fast), then cloned from there;
   ``.gitmodules`` URLs (absolute or ``../REPO.git`` relative) are rewritten to the mirror the
   same way as in 1.
6. ``source-manifest.json`` is written at the tree's root (listed in ``.git/info/exclude`` so
   the tree stays clean) and the temp directory is renamed to ``-o``.  On any failure the temp
   directory is removed: nothing half-cloned remains.

A second fetch of the same commit writes no file: the first one keeps its checkout's files in
``<cache_dir>/checkouts/ORG/REPO/<commit>/`` (hard links: no copy) with its git index and the
tree hash it computed, and a later fetch hard-links them into the new tree.  Nothing about them
is trusted: the index must match the commit (``diff-index --cached``), git compares each file
with it (``update-index --refresh``: stat data, and the content of any file whose stat differs),
and the tree hash is computed from the files again and must equal the recorded one; a kept
checkout that fails any of these is removed (one line on stderr says so) and the tree is
checked out from git as on a first fetch.  Such trees share their files with the cache, and
each new link changes the files' ctime, so they set ``core.trustctime=false`` (git's advice
when something outside git changes ctime).  Git, patch tools and editors that write a new file
and rename it break the link; a write in place into one tree (``>`` in a shell) shows in the
others, and the next fetch finds it and checks out afresh.  Where links cannot be made
(another file system), every fetch checks out from git.

The tree hash (:func:`tree_hash`) is ``sha256:`` + the sha256 of::

    b"patcher-tree-v1\\n" + for each file git tracks, submodules included, sorted by path:
        b"<mode in octal> <path>\\0<sha256 hex of its content>\\n"

where the content is the checked-out file (so ``.gitattributes`` conversions count; a symlink's
content is its target) and the mode is git's (100644, 100755, 120000); a submodule that is not
checked out counts as ``160000 <path>\0<its pinned commit SHA>``.  ``.git`` and untracked
files (the manifest, build outputs) are not part of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from patcher.config import Settings
from patcher.errors import (
    FetchError,
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
    is_shallow,
    last_line,
    mirror_url,
    org_repo,
    reports_failures_as,
    resolve_relative,
    run_git,
    source_key,
)
from patcher.spec import BuildSpec, is_known

MANIFEST_NAME = "source-manifest.json"
PIN_REF_PREFIX = "refs/patcher/commits/"  # in a cache: one ref per submodule commit fetched by SHA
TREE_HASH_VERSION = b"patcher-tree-v1\n"
MIRROR_HINT = ("point the git mirror at a copy that has it: --git-mirror, PATCHER_GIT_MIRROR, "
               "or `git_mirror` / `mirror` in the config file")



# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubmoduleRecord:
    path: str  # relative to the parent repository
    url: str  # as written in the parent's .gitmodules (upstream)
    fetched_from: str  # after mirror rewriting
    commit: str
    submodules: tuple[SubmoduleRecord, ...] = ()


@dataclass(frozen=True)
class SourceTree:
    path: str
    repo: str
    fetched_from: str
    tag: str
    commit: str
    commit_overridden: bool
    tree_hash: str
    submodules: tuple[SubmoduleRecord, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceTree:
        data = dict(data)
        data["submodules"] = tuple(_submodule_from_json(s) for s in data.get("submodules", ()))
        return cls(**data)


def _submodule_from_json(data: dict[str, Any]) -> SubmoduleRecord:
    data = dict(data)
    data["submodules"] = tuple(_submodule_from_json(s) for s in data.get("submodules", ()))
    return SubmoduleRecord(**data)


# --- the object cache ----------------------------------------------------------------------
def cache_repo(settings: Settings, upstream: str) -> Path:
    """The bare cache of one upstream repository, created on first use."""
    org, repo = org_repo(upstream)
    path = Path(settings.cache_dir) / "git" / org / f"{repo}.git"
    if not (path / "HEAD").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{repo}.git.init-", dir=path.parent))
        try:
            run_git("init", "-q", "--bare", str(tmp))
            os.replace(tmp, path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (path / "HEAD").is_file():  # not a concurrent fetch that won the race
                raise
        except GitCommandFailed as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FetchError(f"cannot create the git cache {path}: {exc}",
                             hint="check --cache / PATCHER_CACHE_DIR") from None
    return path


# --- fetching into the cache -----------------------------------------------------------------
def cached_tag_ref(source: str, tag: str) -> str:
    """Where the cache keeps ``tag`` as fetched from ``source``: a ref per source, so a tag one
    mirror gave is never read back as what another mirror holds."""
    return f"refs/patcher/sources/{source_key(source)}/tags/{tag}"


def _fetch_tag(cache: Path, url: str, tag: str) -> str:
    """Fetch ``tag`` from ``url`` into the cache; return the commit it points at."""
    ref = cached_tag_ref(url, tag)
    try:
        # --update-shallow: from a shallow mirror git would take the objects but silently refuse
        # the ref (its commit is a shallow root); the cache records the roots instead
        run_git("fetch", "-q", "--no-tags", "--no-write-fetch-head", "--update-shallow",
                operands=(url, f"+refs/tags/{tag}:{ref}"), cwd=cache)
    except GitCommandFailed as exc:
        if "couldn't find remote ref" in exc.stderr:
            raise FetchError(f"tag {tag} does not exist in {url}",
                             hint="check --torch, or the mirror's copy of the repository") from None
        raise UnreachableInputError(f"cannot fetch tag {tag} from {url}: {last_line(exc.stderr)}",
                                    hint=MIRROR_HINT) from None
    found = run_git("rev-parse", "-q", "--verify", f"{ref}^{{commit}}", cwd=cache, check=False).stdout.strip()
    if not found:  # git took the objects but not the ref
        raise UnreachableInputError(f"tag {tag} was not received from {url}", hint=MIRROR_HINT)
    return found


def _fetch_commit(cache: Path, url: str, sha: str, what: str) -> None:
    """Make sure ``sha`` is in the cache; a commit already there is not fetched again."""
    if has_commit(cache, sha):
        return
    # under a ref of its own: reachable (gc keeps it, a clone from the cache carries it) and,
    # with --update-shallow, recorded as a shallow root when the mirror is shallow
    first = run_git("fetch", "-q", "--no-tags", "--no-write-fetch-head", "--update-shallow",
                    operands=(url, f"+{sha}:{PIN_REF_PREFIX}{sha}"), cwd=cache, check=False)
    if first.returncode == 0 and has_commit(cache, sha):
        return
    # Servers that refuse a want by SHA: is it reachable at all, and under any branch or tag?
    reach = run_git("ls-remote", "--heads", operands=(url,), cwd=cache, check=False)
    if reach.returncode != 0:
        raise SubmoduleError(f"{what}: cannot read {url}: {last_line(reach.stderr)}", hint=MIRROR_HINT)
    org, repo = org_repo(url)
    run_git("fetch", "-q", "--no-tags", "--no-write-fetch-head", "--update-shallow",
            operands=(url, f"+refs/heads/*:refs/patcher/remotes/{org}/{repo}/heads/*",
                      f"+refs/tags/*:refs/patcher/remotes/{org}/{repo}/tags/*"), cwd=cache, check=False)
    if not has_commit(cache, sha):
        raise SubmoduleError(f"{what}: commit {sha} is not in {url} ({last_line(first.stderr)})",
                             hint=MIRROR_HINT)


# --- submodules ------------------------------------------------------------------------------
def _fetch_submodules(settings: Settings, repo: Path, commit: str, parent_upstream: str,
                      prefix: str = "") -> tuple[SubmoduleRecord, ...]:
    """Fetch every submodule commit (recursively) into its cache, reading only caches.

    Runs before anything is checked out, so a missing submodule fails fast and cheaply.
    """
    links = gitlinks(repo, commit)
    if not links:
        return ()
    check_gitmodules(repo, commit, parent_upstream, prefix)
    modules = gitmodules(repo, commit)
    records = []
    for path, sha in sorted(links.items()):
        shown = prefix + path
        if path not in modules or not modules[path][1]:
            raise SubmoduleError(f"submodule {shown} (commit {sha}) has no URL in .gitmodules",
                                 hint="the tag's .gitmodules is incomplete; fix the mirror's copy")
        url = modules[path][1]
        upstream = resolve_relative(url, parent_upstream)
        source = mirror_url(upstream, settings.git_base())
        cache = cache_repo(settings, upstream)
        _fetch_commit(cache, source, sha, f"submodule {shown}")
        nested = _fetch_submodules(settings, cache, sha, upstream, prefix=f"{shown}/")
        records.append(SubmoduleRecord(path=shown, url=url, fetched_from=source, commit=sha,
                                       submodules=nested))
    return tuple(records)


def _checkout_submodules(settings: Settings, repo_dir: Path, commit: str, parent_upstream: str,
                         records: tuple[SubmoduleRecord, ...], prefix: str = "") -> None:
    """Clone each submodule from its cache (local: hard links, no transfer), then point it at the mirror."""
    modules = gitmodules(repo_dir, commit)
    for record in records:
        path = record.path[len(prefix):]
        name = modules[path][0]
        upstream = resolve_relative(record.url, parent_upstream)
        cache = cache_repo(settings, upstream)
        try:
            if is_shallow(cache):
                # git clones a shallow repository through its transport, asking only for
                # branches (the cache has none): give `submodule update` its module directory
                # ready, holding the pinned commit, and it checks out from there
                gitdir = Path(run_git("rev-parse", "--absolute-git-dir", cwd=repo_dir).stdout.strip())
                _copy_from_shallow_cache(cache, gitdir / "modules" / name, f"{PIN_REF_PREFIX}{record.commit}")
            run_git("config", operands=(f"submodule.{name}.url", str(cache)), cwd=repo_dir)
            run_git("submodule", "update", "-q", "--init", operands=(path,), end_of_options="--", cwd=repo_dir)
            run_git("config", operands=(f"submodule.{name}.url", record.fetched_from), cwd=repo_dir)
            run_git("remote", "set-url", operands=("origin", record.fetched_from), cwd=repo_dir / path)
        except GitCommandFailed as exc:
            raise SubmoduleError(f"submodule {record.path}: checkout of {record.commit} failed: {exc}",
                                 hint=MIRROR_HINT) from None
        _checkout_submodules(settings, repo_dir / path, record.commit, upstream, record.submodules,
                             prefix=f"{record.path}/")


# --- tree hash -------------------------------------------------------------------------------
def tracked_files(tree: Path) -> list[tuple[int, str, str]]:
    """(mode, object id, path) of every entry git tracks in ``tree``, submodules included."""
    out = run_git("ls-files", "-z", "--stage", "--recurse-submodules", cwd=tree).stdout
    files = []
    for entry in out.split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            mode, oid = meta.split()[:2]
            files.append((int(mode, 8), oid, path))
    return files


def tree_hash(tree: Path) -> str:
    """Deterministic hash of the checked-out tree (format in the module docstring).

    Every file's bytes are read and hashed, each time: the hash says what is on disk, not
    what git or an earlier fetch says should be.  The files are read by a few threads (file
    reads and sha256 let go of the interpreter lock), which changes nothing in the result."""
    root = str(tree)
    entries = sorted(tracked_files(Path(root)), key=lambda e: e[2].encode("utf-8", "surrogateescape"))
    ids = _content_ids(root, entries)
    digest = hashlib.sha256(TREE_HASH_VERSION)
    for (mode, _oid, path), content_id in zip(entries, ids):
        digest.update(b"%o %s\0%s\n" % (mode, path.encode("utf-8", "surrogateescape"), content_id.encode()))
    return "sha256:" + digest.hexdigest()


_HASH_THREADS = 4
_READ = 1 << 20


def _content_id(root: str, mode: int, oid: str, path: str) -> str:
    if mode == 0o160000:  # a submodule that is not checked out: only its pinned commit is known
        return oid
    full = os.path.join(root, path)
    try:
        if mode == 0o120000:
            return hashlib.sha256(os.readlink(full).encode("utf-8", "surrogateescape")).hexdigest()
        fd = os.open(full, os.O_RDONLY)
    except FileNotFoundError:
        return hashlib.sha256(b"\0missing").hexdigest()  # deleted in the working tree: the hash differs
    try:
        digest = hashlib.sha256()
        while chunk := os.read(fd, _READ):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def _content_ids(root: str, entries: list[tuple[int, str, str]]) -> list[str]:
    """The content id of each entry, in order (threads take contiguous slices)."""
    ids: list[str] = [""] * len(entries)
    errors: list[BaseException] = []

    def work(start: int, stop: int) -> None:
        try:
            for i in range(start, stop):
                mode, oid, path = entries[i]
                ids[i] = _content_id(root, mode, oid, path)
        except BaseException as exc:  # re-raised by the caller
            errors.append(exc)

    count = max(1, min(_HASH_THREADS, os.cpu_count() or 1, len(entries) // 256))
    step = -(-len(entries) // count) if entries else 0
    threads = [threading.Thread(target=work, args=(k * step, min(len(entries), (k + 1) * step)))
               for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return ids


# --- the stage -------------------------------------------------------------------------------
@reports_failures_as(FetchError, "fetch failed")
def update_cache(spec: BuildSpec, settings: Settings) -> tuple[Path, tuple[SubmoduleRecord, ...]]:
    """The transfer phase of a fetch: the tag (verified) and every submodule commit into the caches.

    Returns the repository's cache and the submodule records.  Objects already cached are not
    transferred again; the tag itself is always asked for, so a moved tag is always seen.
    """
    source = mirror_url(spec.repo, settings.git_base())
    cache = cache_repo(settings, spec.repo)
    found = _fetch_tag(cache, source, spec.tag)
    if found != spec.commit:
        pinned_by = ("[overrides.tag_commits] in " + str(settings.config_file)
                     if spec.commit_overridden else "the version matrix")
        raise TagMismatchError(
            f"tag {spec.tag} in {source} points at {found}, but {pinned_by} pins {spec.commit}: "
            f"a moved tag is a supply-chain event, refusing it",
            hint=f'investigate the mirror; only if the new commit is trusted, pin it in [overrides.tag_commits] "{spec.torch}"')
    return cache, _fetch_submodules(settings, cache, spec.commit, spec.repo)


@reports_failures_as(FetchError, "fetch failed")
def fetch(spec: BuildSpec, settings: Settings, dest: Path, dry_run: bool = False,
          notify: Callable[[str], None] | None = None) -> SourceTree:
    """Fetch ``spec``'s tag at its pinned commit, with submodules, into ``dest``.

    ``notify`` gets one line when a kept checkout in the cache is found damaged (default:
    stderr); the fetch then checks the tree out from git."""
    dest = Path(dest).absolute()
    if not is_known(spec.commit):
        raise UnpinnedInputError(
            f"no commit is pinned for torch {spec.torch} (tag {spec.tag})",
            hint=f'pin it in the matrix or in the config file\'s [overrides.tag_commits] "{spec.torch}"')
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FetchError(f"output directory {dest} already exists and is not empty",
                         hint="remove it or pass another -o")
    source = mirror_url(spec.repo, settings.git_base())
    if dry_run:
        return SourceTree(path=str(dest), repo=spec.repo, fetched_from=source, tag=spec.tag,
                          commit=spec.commit, commit_overridden=spec.commit_overridden, tree_hash="")

    cache, submodules = update_cache(spec, settings)
    kept = kept_checkout_dir(settings, spec.repo, spec.commit)
    dest.parent.mkdir(parents=True, exist_ok=True)
    result = None
    if (kept / KEPT_RECORD).is_file():
        result, damage = _fetch_from_kept(spec, settings, cache, source, submodules, kept, dest)
        if damage:
            shutil.rmtree(kept, ignore_errors=True)
            (notify or _to_stderr)(f"patcher: the kept checkout of {spec.commit[:12]} in {kept} {damage}; "
                                   f"removed it, checking out from git")
    if result is None:
        result = _fetch_into(spec, settings, cache, source, submodules, dest,
                             lambda tmp: _checkout_from_git(spec, cache, source, tmp), keep=kept)
    return result


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _fetch_into(spec: BuildSpec, settings: Settings, cache: Path, source: str,
                submodules: tuple[SubmoduleRecord, ...], dest: Path, populate: Callable[[Path], None],
                keep: Path | None = None, expect_hash: str | None = None) -> SourceTree | None:
    """A tree in a temp directory beside ``dest``: ``populate`` (the top-level repository), then
    the submodules, the tree hash and the manifest, then renamed to ``dest``.  With
    ``expect_hash``, a different tree hash returns None (nothing left behind)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        populate(tmp)
        tag_object = run_git("rev-parse", cached_tag_ref(source, spec.tag), cwd=cache).stdout.strip()
        run_git("update-ref", f"refs/tags/{spec.tag}", tag_object, cwd=tmp)
        run_git("remote", "set-url", operands=("origin", source), cwd=tmp)
        _checkout_submodules(settings, tmp, spec.commit, spec.repo, submodules)
        result = SourceTree(path=str(dest), repo=spec.repo, fetched_from=source, tag=spec.tag,
                            commit=spec.commit, commit_overridden=spec.commit_overridden,
                            tree_hash=tree_hash(tmp), submodules=submodules)
        if expect_hash is not None and result.tree_hash != expect_hash:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        if keep is not None:
            _keep_checkout(tmp, keep, spec.commit, result.tree_hash)
        write_manifest(tmp, result)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp made it 0700; the tree gets ordinary permissions
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _copy_from_shallow_cache(cache: Path, gitdir: Path, ref: str) -> None:
    """A repository at ``gitdir`` (a git directory, no work tree) holding ``ref`` of a shallow cache.

    A local clone hard-links the cache's objects, but git never clones a shallow repository
    that way: it falls back to its transport and asks for branches only.  So the one ref is
    fetched (a pack of that commit's objects, no history to send) with its shallow roots."""
    gitdir.parent.mkdir(parents=True, exist_ok=True)
    run_git("init", "-q", "--bare", str(gitdir))
    run_git("config", "core.bare", "false", cwd=gitdir)
    run_git("fetch", "-q", "--no-tags", "--no-write-fetch-head", "--update-shallow",
            operands=(str(cache), f"+{ref}:{ref}"), cwd=gitdir)
    run_git("remote", "add", operands=("origin", str(cache)), cwd=gitdir)


def _clone_cache(cache: Path, tmp: Path, tag_ref: str) -> None:
    """``tmp`` becomes a repository with the cache's objects (no checkout), remote ``origin``."""
    if not is_shallow(cache):
        run_git("clone", "-q", "--no-checkout", "--no-tags", operands=(str(cache), str(tmp)))
        return
    _copy_from_shallow_cache(cache, tmp / ".git", tag_ref)


def _checkout_from_git(spec: BuildSpec, cache: Path, source: str, tmp: Path) -> None:
    try:
        _clone_cache(cache, tmp, cached_tag_ref(source, spec.tag))
        run_git("checkout", "-q", "--detach", spec.commit, cwd=tmp)
    except GitCommandFailed as exc:
        raise FetchError(f"cannot check out {spec.tag} from the cache {cache}: {exc}",
                         hint=f"remove the cache {cache} and fetch again") from None


# --- kept checkouts: a second fetch of a commit links the first one's files ------------------
KEPT_RECORD = "checkout.json"
KEPT_INDEX = "index"
KEPT_FORMAT = 1


def kept_checkout_dir(settings: Settings, upstream: str, commit: str) -> Path:
    org, repo = org_repo(upstream)
    return Path(settings.cache_dir) / "checkouts" / org / repo / commit


def _top_level_entries(tree: Path) -> list[tuple[int, str, str]]:
    """(mode, object id, path) of the entries in ``tree``'s own index (submodules not recursed)."""
    out = run_git("ls-files", "-z", "--stage", cwd=tree).stdout
    entries = []
    for entry in out.split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            mode, oid = meta.split()[:2]
            entries.append((int(mode, 8), oid, path))
    return entries


def _link_files(source_root: str, target_root: str, entries: list[tuple[int, str, str]]) -> None:
    """Hard-link each tracked file of ``source_root`` to the same path under ``target_root``
    (symlinks are made anew; a submodule gets its empty directory, as a checkout leaves it)."""
    os.makedirs(target_root, exist_ok=True)
    made = {""}
    for mode, _oid, path in entries:
        parent = os.path.dirname(path)
        if parent not in made:
            os.makedirs(os.path.join(target_root, parent), exist_ok=True)
            made.add(parent)
        target = os.path.join(target_root, path)
        if mode == 0o160000:
            os.makedirs(target, exist_ok=True)
            made.add(path)
        elif mode == 0o120000:
            os.symlink(os.readlink(os.path.join(source_root, path)), target)
        else:
            os.link(os.path.join(source_root, path), target)


def _keep_checkout(tree: Path, kept: Path, commit: str, computed_hash: str) -> None:
    """Keep ``tree``'s files (links) and its tree hash for the next fetch of ``commit``; a cache
    that cannot take them (another file system, no space) only means the next fetch checks out."""
    kept.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}.keep-", dir=kept.parent))
    try:
        _link_files(str(tree), str(staging / "files"), _top_level_entries(tree))
        # the tree's index describes the kept files too (same inodes); ctime aside, which the
        # links just changed: the tree stops trusting it, as every tree linked from here does
        run_git("config", "core.trustctime", "false", cwd=tree)
        shutil.copyfile(tree / ".git" / "index", staging / KEPT_INDEX)
        (staging / KEPT_RECORD).write_text(json.dumps(
            {"format": KEPT_FORMAT, "commit": commit, "tree_hash": computed_hash}, sort_keys=True) + "\n",
            encoding="utf-8")
        shutil.rmtree(kept, ignore_errors=True)
        os.replace(staging, kept)
    except (OSError, GitCommandFailed):
        shutil.rmtree(staging, ignore_errors=True)


def _fetch_from_kept(spec: BuildSpec, settings: Settings, cache: Path, source: str,
                     submodules: tuple[SubmoduleRecord, ...], kept: Path,
                     dest: Path) -> tuple[SourceTree | None, str]:
    """The tree from the kept checkout: (the tree, "") or (None, what is wrong with it)."""
    try:
        record = json.loads((kept / KEPT_RECORD).read_text(encoding="utf-8"))
        recorded_hash = record["tree_hash"]
        if record.get("format") != KEPT_FORMAT or record.get("commit") != spec.commit \
                or not str(recorded_hash).startswith("sha256:"):
            raise ValueError("not a record of this commit")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"has no usable {KEPT_RECORD} ({exc})"
    problem: list[str] = []

    def populate(tmp: Path) -> None:
        try:
            _clone_cache(cache, tmp, cached_tag_ref(source, spec.tag))
            run_git("update-ref", "--no-deref", "-m", f"checkout: moving to {spec.commit}", "HEAD",
                    spec.commit, cwd=tmp)
            run_git("config", "core.trustctime", "false", cwd=tmp)
        except GitCommandFailed as exc:
            raise FetchError(f"cannot check out {spec.tag} from the cache {cache}: {exc}",
                             hint=f"remove the cache {cache} and fetch again") from None
        try:
            shutil.copyfile(kept / KEPT_INDEX, tmp / ".git" / "index")
        except FileNotFoundError:
            problem.append(f"has no {KEPT_INDEX}")
            raise _KeptCheckoutDamaged from None
        if run_git("diff-index", "--cached", "--quiet", "HEAD", cwd=tmp, check=False).returncode != 0:
            problem.append("has an index that is not the commit's")
            raise _KeptCheckoutDamaged
        try:
            _link_files(str(kept / "files"), str(tmp), _top_level_entries(tmp))
        except FileNotFoundError as exc:
            problem.append(f"lacks {os.path.relpath(exc.filename, kept / 'files')}")
            raise _KeptCheckoutDamaged from None
        except OSError as exc:  # e.g. EXDEV, EMLINK: no links from there to here
            problem.append(f"cannot be linked into {dest.parent} ({exc.strerror or exc})")
            raise _KeptCheckoutDamaged from None
        # git checks each file against the index (and so the commit): stat data, and the
        # content of any file whose stat data differs
        run_git("update-index", "-q", "--refresh", cwd=tmp, check=False)
        changed = [p for p in run_git("diff-files", "--name-only", "-z", cwd=tmp).stdout.split("\0") if p]
        if changed:
            problem.append(f"differs from the commit in {len(changed)} file(s), first {changed[0]}")
            raise _KeptCheckoutDamaged

    try:
        result = _fetch_into(spec, settings, cache, source, submodules, dest, populate, expect_hash=recorded_hash)
    except _KeptCheckoutDamaged:
        return None, problem[0]
    if result is None:
        return None, f"does not give its recorded tree hash {recorded_hash}"
    return result, ""


class _KeptCheckoutDamaged(Exception):
    pass


def write_manifest(tree: Path, result: SourceTree) -> Path:
    """source-manifest.json at the tree's root, kept out of git status via .git/info/exclude."""
    path = Path(tree) / MANIFEST_NAME
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    exclude = Path(tree) / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    existing = exclude.read_text(encoding="utf-8") if exclude.is_file() else ""
    if f"/{MANIFEST_NAME}" not in existing.splitlines():
        with exclude.open("a", encoding="utf-8") as fh:
            fh.write(f"/{MANIFEST_NAME}\n")
    return path


def read_manifest(tree: Path) -> SourceTree:
    path = Path(tree) / MANIFEST_NAME
    try:
        return SourceTree.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise FetchError(f"{path} does not exist", hint="make the tree with `patcher fetch`") from None
    except (ValueError, TypeError) as exc:
        raise FetchError(f"{path} is not a source manifest: {exc}") from None
