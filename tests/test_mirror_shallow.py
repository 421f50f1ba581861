"""`patcher mirror sync --shallow`: the pinned commits and nothing else; check, bundle and fetch read it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from patcher import mirror
from patcher.config import Settings
from patcher.spec import resolve
from tests.fixtures.common import run_patcher
from tests.fixtures.mirror_env import git

REAL_1_4_0 = "7f73f1d591afba823daa4a99a939217fb54d7688"


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _git_repos(root: Path) -> list[Path]:
    return sorted(p for p in (root / "git").glob("*/*.git"))


def test_shallow_sync_holds_only_the_pinned_commits(mirror_upstream, tmp_path):
    up = mirror_upstream
    sync = ["mirror", "sync", "--torch", "1.4.0", "--cuda", "10.1", "--json"]
    full = run_patcher(*sync, "--to", str(tmp_path / "full"), env=up.env())
    shallow = run_patcher(*sync, "--shallow", "--to", str(tmp_path / "shallow"), env=up.env())
    assert full.exit_code == 0 and shallow.exit_code == 0, full.stderr + shallow.stderr
    for repo in _git_repos(tmp_path / "shallow"):
        pins = git("for-each-ref", "--format=%(objectname)", "refs/patcher/pins", cwd=repo).split()
        # every commit the repository holds is a pinned one: no history
        assert sorted(git("rev-list", "--all", cwd=repo).split()) == sorted(set(pins)), repo
        assert git("rev-parse", "--is-shallow-repository", cwd=repo) == "true"
    big = "git/standin/big.git"  # history in the upstream, which a full sync carries
    count = {kind: int(git("rev-list", "--count", "--all", cwd=tmp_path / kind / big)) for kind in ("full", "shallow")}
    assert count["shallow"] == 1 < count["full"]
    transferred = {json.loads(r.stdout)["transferred"] for r in (full, shallow)}
    assert json.loads(shallow.stdout)["transferred"] == min(transferred)

    check = run_patcher("mirror", "check", "--torch", "1.4.0", "--cuda", "10.1", "--from", str(tmp_path / "shallow"),
                        env=up.env())
    assert check.exit_code == 0, check.stdout + check.stderr

    archive = tmp_path / "shallow.tar"
    assert run_patcher("mirror", "bundle", "--from", str(tmp_path / "shallow"), "-o", str(archive)).exit_code == 0
    site = tmp_path / "site"
    unbundled = run_patcher("mirror", "unbundle", str(archive), "--to", str(site))
    assert unbundled.exit_code == 0, unbundled.stderr
    up.take_away()
    check = run_patcher("mirror", "check", "--torch", "1.4.0", "--cuda", "10.1", "--from", str(site), env=up.env())
    assert check.exit_code == 0, check.stdout + check.stderr
    config = tmp_path / "config.toml"
    config.write_text(f'mirror = "{site}"\n')
    fetched = run_patcher("fetch", "--torch", "1.4.0", "-o", str(tmp_path / "tree"), "--json",
                          env=up.env(PATCHER_CONFIG=str(config), PATCHER_CACHE_DIR=str(tmp_path / "cache")))
    assert fetched.exit_code == 0, fetched.stderr
    assert json.loads(fetched.stdout)["commit"] == up.commits["pytorch"]
    assert (tmp_path / "tree" / "third_party" / "dep" / "nested" / "nested.h").is_file()


@pytest.mark.realtree
def test_shallow_sync_of_the_real_1_4_0_serves_patcher_fetch(upstream_git_mirror, tmp_path):
    """The git part of a sync of real 1.4.0 from the shared shallow mirror, then `patcher fetch` from it."""
    dest = tmp_path / "mirror"
    source = Settings(git_mirror=f"file://{upstream_git_mirror}", cache_dir=tmp_path / "unused")
    spec = resolve(source, "1.4.0")
    pins, items = mirror.sync_git(spec, source, dest, shallow=True)
    assert items[0].action == "fetched" and pins[0].commit == REAL_1_4_0
    assert len({(p.name, p.commit) for p in pins}) == len(items) > 30
    size = _size(dest)
    print(f"shallow 1.4.0 git mirror: {size / 2**20:.1f} MiB in {len(_git_repos(dest))} repositories")
    assert size < _size(upstream_git_mirror)  # 1.4.0 only: a part of the 1.4/1.7/1.8 mirror

    report = mirror.check(spec, Settings(cache_dir=tmp_path / "unused"), dest)
    git_items = [i for i in report.items if i.kind == "git"]
    assert git_items and {i.status for i in git_items} == {"ok"}, [i for i in git_items if i.status != "ok"]

    env = {"PATCHER_CACHE_DIR": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    done = run_patcher("fetch", "--torch", "1.4.0", "--git-mirror", f"file://{dest}/git", "-o", str(tmp_path / "tree"),
                       "--json", env={**os.environ, **env})
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["commit"] == REAL_1_4_0
    assert git("rev-parse", "HEAD", cwd=tmp_path / "tree") == REAL_1_4_0
