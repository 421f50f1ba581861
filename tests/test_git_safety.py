"""One way to run git: outside values never become git options, only allowed transports, checked
URLs (mirror settings and a tree's .gitmodules), and cached tags kept apart per source."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from patcher import gitrun, source
from patcher.config import DEFAULT_MATRIX
from patcher.errors import (
    RemoteURLError,
    SubmodulePathError,
    SubmoduleURLError,
    TagMismatchError,
)
from tests.test_source_fetch import git, make_repo, publish, settings_for, spec_for

REFUSED_URLS = {
    "--upload-pack=touch MARKER": "begins with '-'",
    "-oProxyCommand=touch MARKER": "begins with '-'",
    "ext::sh -c touch% MARKER": "transport helper",
    "fd::17": "transport helper",
    "git://example.invalid/org/app.git": "scheme git://",
    "ftp://example.invalid/org/app.git": "scheme ftp://",
    "https://example.invalid/org/app.git\nurl=x": "control character",
    "https://ex\x7fample.invalid/a/b.git": "control character",
    "host:org/app.git": "not one patcher accepts",
    "https:///org/app.git": "no usable host",
    "ssh://-oProxyCommand=x/org/app.git": "no usable host",
    "file://relative": "no absolute path",
    "": "empty",
}
ACCEPTED_URLS = ["file:///srv/git", "https://git.example.invalid/mirror", "http://10.0.0.1:8080/git",
                 "ssh://git@git.example.invalid/org/app.git", "git@git.example.invalid:org/app.git",
                 "/srv/git/org/app.git", "file:///srv/my git/org/app.git",
                 "site/git", "./site/git"]


@pytest.mark.parametrize("value", sorted(REFUSED_URLS))
def test_validate_remote_url_refuses(value):
    with pytest.raises(RemoteURLError) as err:
        gitrun.validate_remote_url(value)
    assert REFUSED_URLS[value] in str(err.value)
    assert "\n" not in str(err.value) and err.value.exit_code == 25


@pytest.mark.parametrize("value", ACCEPTED_URLS)
def test_validate_remote_url_accepts(value):
    assert gitrun.validate_remote_url(value) == value


def test_operands_are_never_options(tmp_path):
    """run_git puts outside values after --end-of-options: git reads them as a repository."""
    marker = tmp_path / "MARKER"
    done = gitrun.run_git("ls-remote", operands=(f"--upload-pack=touch {marker}",), cwd=tmp_path, check=False)
    assert done.returncode != 0 and not marker.exists()
    # the same value before --end-of-options is the option it looks like: the guard is real
    subprocess.run(["git", "ls-remote", f"--upload-pack=touch {marker}", str(tmp_path)], cwd=tmp_path,
                   capture_output=True)
    assert marker.exists()


def test_transports_outside_the_list_are_refused_by_git(tmp_path, monkeypatch):
    """Even a URL that skipped validation cannot use ext:: (it would run a command), whatever
    the user's environment or a caller says."""
    marker = tmp_path / "MARKER"
    monkeypatch.setenv("GIT_ALLOW_PROTOCOL", "ext:file")
    done = gitrun.run_git("ls-remote", operands=(f"ext::sh -c touch% {marker}",), cwd=tmp_path, check=False,
                          env={"GIT_ALLOW_PROTOCOL": "ext"})
    assert done.returncode != 0 and not marker.exists()
    assert "transport 'ext' not allowed" in done.stderr
    assert gitrun.GIT_ENV["GIT_PROTOCOL_FROM_USER"] == "0"


# --- the mirror setting -------------------------------------------------------------------------
def _no_temp_left(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        if root.exists():
            found += [str(p) for p in root.rglob(".*") if ".partial-" in p.name or ".init-" in p.name]
    return found


def test_hostile_mirror_setting_through_the_function(tmp_path):
    marker = tmp_path / "MARKER"
    settings = settings_for(tmp_path, f"--upload-pack=touch {marker}")
    spec = spec_for(settings, "v1.0", "0" * 40)
    with pytest.raises(RemoteURLError):
        source.fetch(spec, settings, tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "cache").exists()  # refused before the cache was touched


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_hostile_mirror_setting_through_the_cli(tmp_path, patcher_cli, how):
    marker = tmp_path / "MARKER"
    value = f"--upload-pack=touch {marker}"
    args = ["fetch", "--torch", "1.13.1", "--cache", tmp_path / "cache", "-o", tmp_path / "out"]
    if how == "flag":
        done = patcher_cli(*args, f"--git-mirror={value}")
    else:
        done = patcher_cli(*args, env={"PATCHER_GIT_MIRROR": value})
    assert done.exit_code == RemoteURLError.exit_code, done.stderr
    assert done.stderr.startswith("patcher: error: ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert _no_temp_left(tmp_path) == []


# --- a tree's .gitmodules ------------------------------------------------------------------------
def _hostile_app(tmp_path: Path, url: str, path: str = "libs/dep") -> tuple[Path, str]:
    """A mirror with org/app.git (tag v1.0) whose .gitmodules gives ``path`` the URL ``url``."""
    work, mirror = tmp_path / "work", tmp_path / "mirror"
    dep = make_repo(work, "dep", {"dep.txt": "dep\n"})
    dep_sha = git(dep, "rev-parse", "HEAD")
    app = make_repo(work, "app", {"main.txt": "v1.0\n"}, {"libs/dep": ("https://github.com/org/dep.git", dep_sha)})
    (app / ".gitmodules").write_text(f'[submodule "evil"]\n\tpath = {path}\n\turl = {url}\n')
    git(app, "add", ".gitmodules")
    git(app, "commit", "-q", "-m", "hostile .gitmodules")
    git(app, "tag", "-a", "v1.0", "-m", "v1.0")
    for repo in (dep, app):
        publish(repo, mirror, "org")
    return mirror, git(app, "rev-parse", "HEAD")


def _matrix_pointing_at(tmp_path: Path, repo: str, commit: str) -> Path:
    matrix = DEFAULT_MATRIX.read_text()
    entry = re.search(r'\[torch\."1\.13\.1"\]\ntag = "v1\.13\.1"\ncommit = "[0-9a-f]{40}"\nrepo = "[^"]+"', matrix)
    path = tmp_path / "matrix.toml"
    path.write_text(matrix.replace(entry.group(0), f'[torch."1.13.1"]\ntag = "v1.0"\ncommit = "{commit}"\nrepo = "{repo}"'))
    return path


@pytest.mark.parametrize("with_mirror", [True, False], ids=["mirror", "no-mirror"])
@pytest.mark.parametrize("kind", ["upload-pack", "ext"])
def test_hostile_gitmodules_url_is_refused_before_git_runs(tmp_path, patcher_cli, kind, with_mirror):
    marker = tmp_path / "MARKER"
    url = f"--upload-pack=touch {marker}" if kind == "upload-pack" else f"ext::sh -c touch% {marker}"
    mirror, commit = _hostile_app(tmp_path, url)
    repo = "https://github.com/org/app.git" if with_mirror else f"file://{mirror}/org/app.git"
    args = ["--matrix", _matrix_pointing_at(tmp_path, repo, commit), "fetch", "--torch", "1.13.1",
            "--cache", tmp_path / "cache", "-o", tmp_path / "out" / "app"]
    if with_mirror:
        args += ["--git-mirror", f"file://{mirror}"]
    (tmp_path / "out").mkdir()
    done = patcher_cli(*args)
    assert done.exit_code == SubmoduleURLError.exit_code, done.stderr
    assert done.stderr.startswith("patcher: error: submodule 'evil' (path 'libs/dep') in .gitmodules")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not marker.exists()
    assert list((tmp_path / "out").iterdir()) == []
    assert _no_temp_left(tmp_path / "cache") == []
    assert not (tmp_path / "cache" / "git" / "org" / "dep.git").exists()  # git never ran for it
    assert not list((tmp_path / "cache").glob("checkouts/**/checkout.json"))


@pytest.mark.parametrize("path", ["../outside", "/etc/outside", "libs/../../outside"])
def test_submodule_path_outside_the_tree_is_refused(tmp_path, path):
    mirror, commit = _hostile_app(tmp_path, "https://github.com/org/dep.git", path=path)
    settings = settings_for(tmp_path, f"file://{mirror}")
    (tmp_path / "out").mkdir()
    with pytest.raises(SubmodulePathError) as err:
        source.fetch(spec_for(settings, "v1.0", commit), settings, tmp_path / "out" / "app")
    assert f"submodule 'evil' (path {path!r})" in str(err.value) and err.value.exit_code == 27
    assert list((tmp_path / "out").iterdir()) == [] and _no_temp_left(tmp_path) == []


# --- item 7: a cached tag is attributed to the source it came from ---------------------------
def test_cached_tag_is_kept_per_source(tmp_path):
    """Mirror A has v1.0 at the pinned commit, mirror B has it moved; neither is reported as the other."""
    work = tmp_path / "work"
    app = make_repo(work, "app", {"main.txt": "one\n"})
    git(app, "tag", "-a", "v1.0", "-m", "v1.0")
    pinned = git(app, "rev-parse", "HEAD")
    publish(app, tmp_path / "a", "org")
    (app / "main.txt").write_text("two\n")
    git(app, "commit", "-q", "-am", "two")
    git(app, "tag", "-f", "-a", "v1.0", "-m", "v1.0 moved")
    moved = git(app, "rev-parse", "HEAD")
    publish(app, tmp_path / "b", "org")
    url_a, url_b = f"file://{tmp_path / 'a'}", f"file://{tmp_path / 'b'}"
    (tmp_path / "out").mkdir()

    settings_a = settings_for(tmp_path, url_a)
    source.fetch(spec_for(settings_a, "v1.0", pinned), settings_a, tmp_path / "out" / "from-a")
    settings_b = settings_for(tmp_path, url_b)  # the same cache
    with pytest.raises(TagMismatchError) as err:
        source.fetch(spec_for(settings_b, "v1.0", pinned), settings_b, tmp_path / "out" / "from-b")
    assert f"tag v1.0 in {url_b}/org/app.git points at {moved}" in str(err.value)
    # A's tag is still A's: a fetch from A again needs nothing from B
    source.fetch(spec_for(settings_a, "v1.0", pinned), settings_a, tmp_path / "out" / "from-a-again")
    cache = source.cache_repo(settings_a, "https://github.com/org/app.git")
    for url, commit in ((f"{url_a}/org/app.git", pinned), (f"{url_b}/org/app.git", moved)):
        ref = source.cached_tag_ref(url, "v1.0")
        assert git(cache, "rev-parse", f"{ref}^{{commit}}") == commit


def test_moved_tag_in_a_shallow_source_is_reported_as_that_source_holds_it(tmp_path):
    """Before: the cache held v1.0 from full mirror A; shallow mirror B has v1.0 moved.  Git
    refuses B's ref without --update-shallow and exits 0, so A's commit stayed and was read as
    B's (the pin even matched).  Now B's tag lands under B's own ref and the move is refused."""
    app = make_repo(tmp_path / "work-a", "app", {"main.txt": "one\n"})
    git(app, "tag", "-a", "v1.0", "-m", "v1.0")
    pinned = git(app, "rev-parse", "HEAD")
    publish(app, tmp_path / "a", "org")
    other = make_repo(tmp_path / "work-b", "app", {"main.txt": "other\n"})
    (other / "main.txt").write_text("moved\n")
    git(other, "commit", "-q", "-am", "moved")
    git(other, "tag", "-a", "v1.0", "-m", "v1.0 moved")
    moved = git(other, "rev-parse", "HEAD")
    shallow = tmp_path / "b" / "org" / "app.git"
    git(tmp_path, "clone", "-q", "--bare", "--depth", "1", "--no-single-branch", f"file://{other}", str(shallow))
    git(shallow, "fetch", "-q", "--depth", "1", "origin", "+refs/tags/v1.0:refs/tags/v1.0")
    assert (shallow / "shallow").is_file()

    settings = settings_for(tmp_path, f"file://{tmp_path / 'a'}")
    (tmp_path / "out").mkdir()
    source.fetch(spec_for(settings, "v1.0", pinned), settings, tmp_path / "out" / "from-a")
    cache = source.cache_repo(settings, "https://github.com/org/app.git")
    url_a, url_b = f"file://{tmp_path / 'a'}/org/app.git", f"file://{tmp_path / 'b'}/org/app.git"
    # what the old fetch did with one ref for every source: the ref stays at A's commit, exit 0
    one_ref = source.cached_tag_ref(url_a, "v1.0")
    done = subprocess.run(["git", "-c", "protocol.file.allow=always", "fetch", "-q", "--no-tags", url_b,
                           f"+refs/tags/v1.0:{one_ref}"], cwd=cache, capture_output=True, text=True)
    assert done.returncode == 0 and "shallow roots are not allowed" in done.stderr
    assert git(cache, "rev-parse", f"{one_ref}^{{commit}}") == pinned

    settings_b = settings_for(tmp_path, f"file://{tmp_path / 'b'}")
    with pytest.raises(TagMismatchError) as err:
        source.fetch(spec_for(settings_b, "v1.0", pinned), settings_b, tmp_path / "out" / "from-b")
    assert f"tag v1.0 in {url_b} points at {moved}" in str(err.value)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["from-a"]


def test_mirror_sync_refuses_a_hostile_gitmodules_before_git_runs(tmp_path):
    """`patcher mirror sync` walks the same .gitmodules: the same refusal, nothing fetched for it."""
    from patcher import mirror

    marker = tmp_path / "MARKER"
    upstream, commit = _hostile_app(tmp_path, f"--upload-pack=touch {marker}")
    settings = settings_for(tmp_path, f"file://{upstream}")
    with pytest.raises(SubmoduleURLError) as err:
        mirror.sync_git(spec_for(settings, "v1.0", commit), settings, tmp_path / "site")
    assert "submodule 'evil' (path 'libs/dep')" in str(err.value) and not marker.exists()
    assert not (tmp_path / "site" / "git" / "org" / "dep.git").exists()
