"""patcher fetch: tag at a verified commit, submodules from the mirror, a cache, a manifest."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from patcher import gitrun, source
from patcher.config import DEFAULT_MATRIX, Settings
from patcher.errors import (
    FetchError,
    SubmoduleError,
    TagMismatchError,
    UnpinnedInputError,
    UnreachableInputError,
)
from patcher.spec import resolve


def git(cwd, *args) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@patcher.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@patcher.invalid",
               GIT_AUTHOR_DATE="2025-01-01T00:00:00+00:00", GIT_COMMITTER_DATE="2025-01-01T00:00:00+00:00")
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"git {args}: {proc.stderr}"
    return proc.stdout.strip()


def make_repo(work: Path, name: str, files: dict[str, str], submodules: dict[str, tuple[str, str]] = ()) -> Path:
    """A repo with files and gitlinks {path: (url, sha)}; returns its work dir."""
    repo = work / name
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    if submodules:
        (repo / ".gitmodules").write_text("".join(
            f'[submodule "{p}"]\n\tpath = {p}\n\turl = {u}\n' for p, (u, _) in submodules.items()))
    git(repo, "add", "-A")
    for path, (_, sha) in dict(submodules).items():
        git(repo, "update-index", "--add", "--cacheinfo", f"160000,{sha},{path}")
        (repo / path).mkdir(parents=True)  # an unpopulated submodule, not a deleted one, for `add -A`
    git(repo, "commit", "-q", "-m", f"{name} initial")
    return repo


def publish(repo: Path, mirror: Path, org: str) -> Path:
    bare = mirror / org / f"{repo.name}.git"
    bare.parent.mkdir(parents=True, exist_ok=True)
    if bare.exists():
        shutil.rmtree(bare)
    git(mirror, "clone", "-q", "--bare", str(repo), str(bare))
    return bare


@pytest.fixture
def small_mirror(tmp_path):
    """org/app.git (tags v1.0, v1.1) -> libs/dep (https://github.com/org/dep.git) -> vendor/leaf (../leaf.git)."""
    work, mirror = tmp_path / "work", tmp_path / "mirror"
    leaf = make_repo(work, "leaf", {"leaf.txt": "leaf\n"})
    leaf_sha = git(leaf, "rev-parse", "HEAD")
    dep = make_repo(work, "dep", {"dep.txt": "dep\n"}, {"vendor/leaf": ("../leaf.git", leaf_sha)})
    dep_sha = git(dep, "rev-parse", "HEAD")
    app = make_repo(work, "app", {"main.txt": "v1.0\n", "bin/tool.sh": "#!/bin/sh\n"},
                    {"libs/dep": ("https://github.com/org/dep.git", dep_sha)})
    os.chmod(app / "bin" / "tool.sh", 0o755)
    git(app, "add", "-A")
    git(app, "commit", "-q", "-m", "executable tool")
    git(app, "tag", "-a", "v1.0", "-m", "v1.0")
    v10 = git(app, "rev-parse", "HEAD")
    (app / "main.txt").write_text("v1.1\n")
    git(app, "commit", "-q", "-am", "v1.1")
    git(app, "tag", "-a", "v1.1", "-m", "v1.1")
    v11 = git(app, "rev-parse", "HEAD")
    for repo in (leaf, dep, app):
        publish(repo, mirror, "org")

    class M:
        root = mirror
        url = f"file://{mirror}"
        commits = {"v1.0": v10, "v1.1": v11}
        shas = {"dep": dep_sha, "leaf": leaf_sha}
        app_repo = app
        workdir = work

    return M


def settings_for(tmp_path: Path, git_mirror: str) -> Settings:
    return Settings(git_mirror=git_mirror, cache_dir=tmp_path / "cache")


def spec_for(settings: Settings, tag: str, commit: str):
    return replace(resolve(settings, "1.13.1"), repo="https://github.com/org/app.git", tag=tag, commit=commit,
                   commit_overridden=False)


def leftovers(directory: Path, expected: set[str]) -> set[str]:
    return {p.name for p in directory.iterdir()} - expected


# --- URLs ------------------------------------------------------------------------------------
def test_url_rewriting():
    assert gitrun.org_repo("https://github.com/pytorch/pytorch.git") == ("pytorch", "pytorch")
    assert gitrun.org_repo("https://gitlab.com/libeigen/eigen") == ("libeigen", "eigen")
    assert gitrun.org_repo("git@github.com:fmtlib/fmt.git") == ("fmtlib", "fmt")
    assert gitrun.resolve_relative("../fmt.git", "https://github.com/pytorch/pytorch.git") == \
        "https://github.com/pytorch/fmt.git"
    assert gitrun.resolve_relative("../../google/benchmark.git", "https://github.com/pytorch/pytorch.git") == \
        "https://github.com/google/benchmark.git"
    assert gitrun.mirror_url("https://github.com/fmtlib/fmt.git", "file:///srv/git/") == \
        "file:///srv/git/fmtlib/fmt.git"
    assert gitrun.mirror_url("https://github.com/fmtlib/fmt.git", None) == "https://github.com/fmtlib/fmt.git"
    assert Settings(mirror="/srv/mirror").git_base() == "/srv/mirror/git"
    with pytest.raises(FetchError, match="cannot tell organisation"):
        gitrun.org_repo("https://example.invalid/")


# --- small real repositories -----------------------------------------------------------------
def test_fetch_with_nested_submodules_and_manifest(small_mirror, tmp_path):
    settings = settings_for(tmp_path, small_mirror.url)
    dest = tmp_path / "out" / "app"
    result = source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, dest)
    assert result.commit == git(dest, "rev-parse", "HEAD") == small_mirror.commits["v1.0"]
    assert result.fetched_from == f"{small_mirror.url}/org/app.git"
    (dep,) = result.submodules
    assert (dep.path, dep.url, dep.commit) == ("libs/dep", "https://github.com/org/dep.git",
                                               small_mirror.shas["dep"])
    assert dep.fetched_from == f"{small_mirror.url}/org/dep.git"
    (leaf,) = dep.submodules
    assert (leaf.path, leaf.url, leaf.fetched_from, leaf.commit) == (
        "libs/dep/vendor/leaf", "../leaf.git", f"{small_mirror.url}/org/leaf.git", small_mirror.shas["leaf"])
    assert (dest / "libs" / "dep" / "vendor" / "leaf" / "leaf.txt").read_text() == "leaf\n"
    # the tree is clean (the manifest is excluded), points at the mirror, and knows its tag
    assert git(dest, "status", "--porcelain", "--ignore-submodules=none") == ""
    assert git(dest, "remote", "get-url", "origin") == result.fetched_from
    assert git(dest, "config", "submodule.libs/dep.url") == dep.fetched_from
    assert git(dest, "rev-parse", "v1.0^{commit}") == result.commit
    status = git(dest, "submodule", "status", "--recursive")
    assert len(status.splitlines()) == 2 and not re.search(r"^[-+U]", status, re.M)
    manifest = json.loads((dest / "source-manifest.json").read_text())
    assert manifest == json.loads(json.dumps(result.to_json()))
    assert manifest["commit_overridden"] is False
    assert result.tree_hash == source.tree_hash(dest)
    assert source.read_manifest(dest) == result
    assert leftovers(dest.parent, {"app"}) == set()


def test_tree_hash_is_content_mode_and_path(small_mirror, tmp_path):
    settings = settings_for(tmp_path, small_mirror.url)
    one = source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, tmp_path / "one")
    two = source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, tmp_path / "two")
    assert one.tree_hash == two.tree_hash
    (tmp_path / "two" / "untracked.o").write_text("build output")
    assert source.tree_hash(tmp_path / "two") == one.tree_hash  # untracked files are not part of it
    os.chmod(tmp_path / "two" / "bin" / "tool.sh", 0o644)
    git(tmp_path / "two", "update-index", "--chmod=-x", "bin/tool.sh")
    assert source.tree_hash(tmp_path / "two") != one.tree_hash
    (tmp_path / "one" / "libs" / "dep" / "vendor" / "leaf" / "leaf.txt").write_text("changed\n")
    assert source.tree_hash(tmp_path / "one") != two.tree_hash


def _object_total(repo: Path) -> int:
    stats = dict(line.split(": ") for line in git(repo, "count-objects", "-v").splitlines())
    return int(stats["count"]) + int(stats["in-pack"])


def test_second_fetch_transfers_no_object_twice(small_mirror, tmp_path):
    settings = settings_for(tmp_path, small_mirror.url)
    source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, tmp_path / "a")
    cache = tmp_path / "cache" / "git" / "org" / "app.git"
    after_first = _object_total(cache)
    source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, tmp_path / "b")
    assert _object_total(cache) == after_first  # duplicates would be counted again
    source.fetch(spec_for(settings, "v1.1", small_mirror.commits["v1.1"]), settings, tmp_path / "c")
    new_objects = git(small_mirror.root / "org" / "app.git", "rev-list", "--objects", "v1.0..v1.1").splitlines()
    # v1.1 brought its tag object, commit, tree and blob, nothing of v1.0 again
    assert len(new_objects) == 4
    assert _object_total(cache) == after_first + len(new_objects)
    assert (tmp_path / "c" / "main.txt").read_text() == "v1.1\n"


@pytest.mark.parametrize("warm_cache", [False, True])
def test_moved_tag_is_refused(small_mirror, tmp_path, warm_cache):
    settings = settings_for(tmp_path, small_mirror.url)
    pinned = small_mirror.commits["v1.0"]
    (tmp_path / "out").mkdir()
    if warm_cache:
        source.fetch(spec_for(settings, "v1.0", pinned), settings, tmp_path / "out" / "first")
    bare = small_mirror.root / "org" / "app.git"
    git(bare, "tag", "-f", "-a", "v1.0", "-m", "moved", small_mirror.commits["v1.1"])
    dest = tmp_path / "out" / "app"
    with pytest.raises(TagMismatchError) as err:
        source.fetch(spec_for(settings, "v1.0", pinned), settings, dest)
    message = str(err.value)
    assert f"points at {small_mirror.commits['v1.1']}, but the version matrix pins {pinned}" in message
    assert "supply-chain" in message and "[overrides.tag_commits]" in message
    assert not dest.exists()
    assert leftovers(tmp_path / "out", {"first"} if warm_cache else set()) == set()


def test_missing_submodule_repository_is_refused(small_mirror, tmp_path):
    shutil.rmtree(small_mirror.root / "org" / "dep.git")
    settings = settings_for(tmp_path, small_mirror.url)
    (tmp_path / "out").mkdir()
    with pytest.raises(SubmoduleError) as err:
        source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, tmp_path / "out" / "app")
    message = str(err.value)
    assert message.startswith(f"submodule libs/dep: cannot read {small_mirror.url}/org/dep.git")
    assert "--git-mirror, PATCHER_GIT_MIRROR" in message and "\n" not in message
    assert leftovers(tmp_path / "out", set()) == set()


def test_missing_nested_submodule_commit_is_refused(small_mirror, tmp_path):
    other = make_repo(tmp_path / "other", "leaf", {"leaf.txt": "another history\n"})
    publish(other, small_mirror.root, "org")  # leaf.git exists, the pinned commit does not
    settings = settings_for(tmp_path, small_mirror.url)
    (tmp_path / "out").mkdir()
    with pytest.raises(SubmoduleError, match=(f"submodule libs/dep/vendor/leaf: commit {small_mirror.shas['leaf']} "
                                              f"is not in {small_mirror.url}/org/leaf.git")):
        source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, tmp_path / "out" / "app")
    assert leftovers(tmp_path / "out", set()) == set()


def test_unreachable_mirror(tmp_path):
    settings = settings_for(tmp_path, f"file://{tmp_path}/no-such-mirror")
    with pytest.raises(UnreachableInputError) as err:
        source.fetch(spec_for(settings, "v1.0", "a" * 40), settings, tmp_path / "app")
    message = str(err.value)
    assert f"cannot fetch tag v1.0 from file://{tmp_path}/no-such-mirror/org/app.git" in message
    assert "PATCHER_GIT_MIRROR" in message and "`mirror` in the config file" in message
    assert not (tmp_path / "app").exists()


def test_refusals_before_any_work(small_mirror, tmp_path):
    settings = settings_for(tmp_path, small_mirror.url)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").write_text("x")
    with pytest.raises(FetchError, match="already exists and is not empty"):
        source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, busy)
    with pytest.raises(UnpinnedInputError, match="no commit is pinned"):
        source.fetch(spec_for(settings, "v1.0", "unknown"), settings, tmp_path / "x")
    dry = source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, tmp_path / "dry",
                       dry_run=True)
    assert dry.fetched_from == f"{small_mirror.url}/org/app.git"
    assert not (tmp_path / "dry").exists() and not (tmp_path / "cache").exists()
    with pytest.raises(FetchError, match="tag v9.9 does not exist"):
        source.fetch(spec_for(settings, "v9.9", "a" * 40), settings, tmp_path / "x")
    with pytest.raises(FetchError, match=f"fetch failed: .* {busy / 'file'}"):
        source.fetch(spec_for(settings, "v1.0", small_mirror.commits["v1.0"]), settings, busy / "file" / "app")
    assert not (tmp_path / "x").exists()


def test_fetch_command_exit_codes(small_mirror, tmp_path, patcher_cli):
    """The CLI with a matrix whose 1.13.1 entry points at the small repo."""
    matrix = DEFAULT_MATRIX.read_text()
    entry = re.search(r'\[torch\."1\.13\.1"\]\ntag = "v1\.13\.1"\ncommit = "[0-9a-f]{40}"\nrepo = "[^"]+"', matrix)
    commit = small_mirror.commits["v1.0"]
    matrix = matrix.replace(entry.group(0), f'[torch."1.13.1"]\ntag = "v1.0"\ncommit = "{commit}"\n'
                            'repo = "https://github.com/org/app.git"')
    (tmp_path / "matrix.toml").write_text(matrix)
    common = ["--matrix", tmp_path / "matrix.toml", "fetch", "--torch", "1.13.1", "--git-mirror", small_mirror.url,
              "--cache", tmp_path / "cache"]
    ok = patcher_cli(*common, "-o", tmp_path / "ok")
    assert ok.exit_code == 0, ok.stderr
    assert f"fetched v1.0 at {small_mirror.commits['v1.0']} from {small_mirror.url}/org/app.git" in ok.stdout
    assert "submodule libs/dep/vendor/leaf" in ok.stdout
    git(small_mirror.root / "org" / "app.git", "tag", "-f", "-a", "v1.0", "-m", "moved", small_mirror.commits["v1.1"])
    moved = patcher_cli(*common, "-o", tmp_path / "moved")
    assert moved.exit_code == TagMismatchError.exit_code
    assert moved.stderr.startswith("patcher: error: tag v1.0 in ") and moved.stderr.count("\n") == 1
    assert not (tmp_path / "moved").exists()


# --- a second fetch links the kept checkout ---------------------------------------------------
def _fetch_twice(small_mirror, tmp_path, damage=None):
    """Fetch v1.0 into a, apply ``damage(kept files dir)``, fetch it into b; (a, b, kept, notices)."""
    settings = settings_for(tmp_path, small_mirror.url)
    spec = spec_for(settings, "v1.0", small_mirror.commits["v1.0"])
    first = source.fetch(spec, settings, tmp_path / "a")
    kept = source.kept_checkout_dir(settings, spec.repo, spec.commit)
    if damage:
        damage(kept)
    notices = []
    second = source.fetch(spec, settings, tmp_path / "b", notify=notices.append)
    return first, second, kept, notices


def _same_file(one: Path, two: Path) -> bool:
    return os.stat(one).st_ino == os.stat(two).st_ino


def test_second_fetch_links_the_kept_checkout_and_checks_it(small_mirror, tmp_path):
    first, second, kept, notices = _fetch_twice(small_mirror, tmp_path)
    assert notices == []
    a, b = tmp_path / "a", tmp_path / "b"
    assert json.loads((kept / "checkout.json").read_text())["tree_hash"] == first.tree_hash
    # the top-level repository's files are the kept ones (links), the submodules checked out
    assert _same_file(a / "main.txt", b / "main.txt") and _same_file(kept / "files" / "main.txt", b / "main.txt")
    assert not _same_file(a / "libs" / "dep" / "dep.txt", b / "libs" / "dep" / "dep.txt")
    assert os.access(b / "bin" / "tool.sh", os.X_OK)
    assert second.tree_hash == first.tree_hash == source.tree_hash(b)
    # the tree is what a checkout leaves: detached at the commit, index current, clean, tagged
    assert git(b, "rev-parse", "HEAD") == first.commit
    assert subprocess.run(["git", "symbolic-ref", "-q", "HEAD"], cwd=b).returncode == 1
    assert git(b, "diff-files", "--name-only") == "" and git(b, "diff-index", "--cached", "--name-only", "HEAD") == ""
    assert git(b, "status", "--porcelain", "--ignore-submodules=none") == ""
    assert git(b, "rev-parse", "v1.0^{commit}") == first.commit
    assert git(b, "remote", "get-url", "origin") == first.fetched_from
    # each new link changes the shared files' ctime: trees linked to the cache do not trust it
    assert git(b, "config", "core.trustctime") == git(a, "config", "core.trustctime") == "false"
    assert source.read_manifest(b) == second and second.path == str(b)
    # a file replaced in b (as git, patch and editors do) leaves a and the cache as they were
    (b / "main.txt").unlink()
    (b / "main.txt").write_text("patched\n")
    assert (a / "main.txt").read_text() == (kept / "files" / "main.txt").read_text() == "v1.0\n"


def _write_in_place(kept):
    with open(kept / "files" / "main.txt", "r+") as fh:  # in place: every link to it sees this
        fh.write("XXXX")


def _write_in_place_unseen_by_git(kept):
    """The same write, made invisible to git's stat comparison: only content can find it.

    The file is first dated an hour back and the kept index refreshed with that (so its entry is
    not racily clean, which would make git read the file); the write then keeps size and inode,
    and the hour-old mtime is put back."""
    path = kept / "files" / "main.txt"
    hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))
    subprocess.run(["git", "update-index", "-q", "--refresh"], check=True, env=dict(
        os.environ, GIT_DIR=str(kept.parents[4] / "a" / ".git"), GIT_WORK_TREE=str(kept / "files"),
        GIT_INDEX_FILE=str(kept / "index")))
    _write_in_place(kept)
    os.utime(path, ns=(hour_ago, hour_ago))


# A same-size write in place is usually seen by git's own check of the index's stat data; when
# it lands in the same timestamp tick as the index entry (racy git), stat data match and only
# the tree hash, computed from every file's bytes, finds it.  Either finding is a damaged kept
# checkout; the variant git cannot see always reaches the tree hash.
_IN_PLACE_FINDINGS = ("differs from the commit in 1 file(s), first main.txt", "does not give its recorded tree hash")


@pytest.mark.parametrize("damage, says", [
    (_write_in_place, _IN_PLACE_FINDINGS),
    (_write_in_place_unseen_by_git, "does not give its recorded tree hash"),
    (lambda kept: (kept / "files" / "bin" / "tool.sh").unlink(), "lacks bin/tool.sh"),
    (lambda kept: (kept / "checkout.json").write_text("{}"), "has no usable checkout.json"),
    (lambda kept: (kept / "checkout.json").write_text(json.dumps(
        {**json.loads((kept / "checkout.json").read_text()), "tree_hash": "sha256:" + "0" * 64})),
     "does not give its recorded tree hash sha256:0000"),
    (lambda kept: (kept / "index").unlink(), "has no index"),
    (lambda kept: subprocess.run(["git", "update-index", "--force-remove", "main.txt"], check=True,
                                 cwd=kept.parents[4] / "a", env=dict(os.environ, GIT_INDEX_FILE=str(kept / "index"))),
     "has an index that is not the commit's"),
], ids=["written-in-place", "written-in-place-unseen-by-git", "file-missing", "record-unreadable", "recorded-hash-differs", "index-missing",
        "index-not-the-commits"])
def test_damaged_kept_checkout_is_found_and_checked_out_again(small_mirror, tmp_path, damage, says):
    first, second, kept, notices = _fetch_twice(small_mirror, tmp_path, damage)
    assert len(notices) == 1 and "\n" not in notices[0], notices
    findings = says if isinstance(says, tuple) else (says,)
    assert any(s in notices[0] for s in findings), notices
    assert f"kept checkout of {first.commit[:12]}" in notices[0]
    assert notices[0].endswith("removed it, checking out from git")
    b = tmp_path / "b"
    assert second.tree_hash == source.tree_hash(b)
    assert (b / "main.txt").read_text() == "v1.0\n" and os.access(b / "bin" / "tool.sh", os.X_OK)
    assert git(b, "status", "--porcelain", "--ignore-submodules=none") == ""
    if damage not in (_write_in_place, _write_in_place_unseen_by_git):  # a's files are the damaged ones
        assert second.tree_hash == first.tree_hash
    # the cache keeps b's checkout now, and the fetch after it links that one
    assert json.loads((kept / "checkout.json").read_text())["tree_hash"] == second.tree_hash
    assert _same_file(kept / "files" / "main.txt", b / "main.txt")
    assert leftovers(tmp_path, {"a", "b", "cache", "mirror", "work"}) == set()


def test_fetch_reports_kept_damage_on_stderr_in_one_line(small_mirror, tmp_path, capsys):
    settings = settings_for(tmp_path, small_mirror.url)
    spec = spec_for(settings, "v1.0", small_mirror.commits["v1.0"])
    source.fetch(spec, settings, tmp_path / "a")
    _write_in_place(source.kept_checkout_dir(settings, spec.repo, spec.commit))
    capsys.readouterr()
    source.fetch(spec, settings, tmp_path / "b")
    err = capsys.readouterr().err
    assert err.startswith("patcher: the kept checkout of ") and err.count("\n") == 1


# --- the real tree ---------------------------------------------------------------------------
@pytest.mark.realtree
def test_realtree_fetch(realtree_mirror, realtree_checkout, tmp_path, patcher_cli):
    dest = tmp_path / "out" / "pytorch"
    result = patcher_cli("--config", realtree_mirror.config_file, "fetch", "--torch", "1.13.1",
                         "--git-mirror", realtree_mirror.git_mirror, "-o", dest, "--json")
    assert result.exit_code == 0, result.stderr
    tree = json.loads(result.stdout)
    assert tree["commit"] == realtree_mirror.commit and tree["commit_overridden"] is True
    assert tree["tag"] == "v1.13.1" and tree["repo"] == "https://github.com/pytorch/pytorch.git"
    (fmt,) = tree["submodules"]
    assert fmt["path"] == "third_party/fmt" and fmt["url"] == "https://github.com/fmtlib/fmt.git"
    assert fmt["fetched_from"] == f"{realtree_mirror.git_mirror}/fmtlib/fmt.git"
    assert fmt["commit"] == realtree_mirror.fmt_commit
    assert (dest / "build_variables.bzl").is_file()
    assert (dest / "third_party" / "fmt" / "include" / "fmt" / "format.h").is_file()
    assert json.loads((dest / "source-manifest.json").read_text()) == tree
    # the same hash as an independent clone made by the fixture with plain git
    assert tree["tree_hash"] == source.tree_hash(realtree_checkout)


@pytest.mark.realtree
def test_realtree_upstream_pin_refuses_the_reimported_tree(realtree_mirror, tmp_path, patcher_cli):
    """Without the site override the matrix pins upstream's v1.13.1 commit: Debian's import differs."""
    (tmp_path / "out").mkdir()
    result = patcher_cli("fetch", "--torch", "1.13.1", "--git-mirror", realtree_mirror.git_mirror,
                         "-o", tmp_path / "out" / "pytorch")
    assert result.exit_code == TagMismatchError.exit_code
    assert (f"points at {realtree_mirror.commit}, but the version matrix pins "
            "49444c3e546bf240bed24a101e747422d1f8a0ee") in result.stderr
    assert leftovers(tmp_path / "out", set()) == set()


@pytest.mark.realtree
def test_realtree_missing_fmt_repository(realtree_mirror, tmp_path, patcher_cli):
    mirror = realtree_mirror.copy_to(tmp_path / "mirror")
    shutil.rmtree(mirror.fmt_repo)
    (tmp_path / "out").mkdir()
    result = patcher_cli("--config", mirror.config_file, "fetch", "--torch", "1.13.1",
                         "-o", tmp_path / "out" / "pytorch")
    assert result.exit_code == SubmoduleError.exit_code
    assert f"submodule third_party/fmt: cannot read {mirror.git_mirror}/fmtlib/fmt.git" in result.stderr
    assert "--git-mirror" in result.stderr and "Traceback" not in result.stderr
    assert leftovers(tmp_path / "out", set()) == set()
    assert realtree_mirror.fmt_repo.is_dir()
