"""Air gap end to end: sync from an upstream, take the upstream away, check, then fetch and build
from the mirror alone (the real 1.13.1 tree; the stand-in project built into a wheel)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.fixtures.common import run_patcher

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w


@pytest.mark.realtree
def test_real_1_13_1_tree_synced_checked_and_fetched_from_the_mirror(realtree_mirror, mirror_upstream, tmp_path):
    """Debian's real 1.13.1 tree (third_party/fmt a real submodule) through sync, check and fetch."""
    up = mirror_upstream
    matrix = tomllib.loads(up.matrix.read_text())
    # The image and the third-party input come from the loopback upstream (Docker Hub and PyPI
    # are not part of this test); git is the real tree.
    matrix["images"]["mirror-tiny-py39"] = dict(matrix["images"]["mirror-tiny"], system_python="3.9")
    name, sha = up.files["input"]
    matrix["torch"]["1.13.1"].update(image="mirror-tiny-py39", inputs=[
        {"name": name, "url": f"{up.http_url}/files/{name}", "sha256": sha}])
    (tmp_path / "matrix.toml").write_text(tomli_w.dumps(matrix))
    env = {"PATCHER_MATRIX": str(tmp_path / "matrix.toml"), "PATCHER_CONFIG": str(realtree_mirror.config_file),
           "PATCHER_CACHE_DIR": str(tmp_path / "cache")}
    mirror = tmp_path / "mirror"
    args = ("--torch", "1.13.1", "--cuda", "none")

    synced = run_patcher("mirror", "sync", *args, "--to", str(mirror), "--json", env=env)
    assert synced.exit_code == 0, synced.stderr
    items = {i["name"]: i for i in json.loads(synced.stdout)["items"]}
    assert items["fmtlib/fmt (third_party/fmt)"]["pin"] == realtree_mirror.fmt_commit
    assert items["pytorch/pytorch (v1.13.1)"]["pin"] == realtree_mirror.commit
    up.take_away()

    checked = run_patcher("mirror", "check", *args, "--from", str(mirror), env=env)
    assert checked.exit_code == 0, checked.stdout + checked.stderr

    # The mirror alone serves the fetch: one setting, the upstream's git_mirror not used.
    config = tmp_path / "site.toml"
    config.write_text(f'mirror = "{mirror}"\n[overrides.tag_commits]\n"1.13.1" = "{realtree_mirror.commit}"\n')
    fetched = run_patcher("fetch", "--torch", "1.13.1", "-o", str(tmp_path / "tree"), "--json",
                          env={**env, "PATCHER_CONFIG": str(config)})
    assert fetched.exit_code == 0, fetched.stderr
    assert json.loads(fetched.stdout)["fetched_from"] == f"{mirror}/git/pytorch/pytorch.git"
    assert (tmp_path / "tree" / "third_party" / "fmt" / "include" / "fmt" / "format.h").is_file()
    assert (tmp_path / "tree" / "build_variables.bzl").is_file()

    shutil.rmtree(mirror / "git" / "fmtlib" / "fmt.git")
    broken = run_patcher("mirror", "check", *args, "--from", str(mirror), env=env)
    assert broken.exit_code == 80
    assert "fmtlib/fmt (third_party/fmt): repository git/fmtlib/fmt.git is missing" in broken.stderr


# ----------------------------------------------------------------------------------------------
def _standin_upstream_with_nested_submodule(standin_root: Path, git_root: Path) -> tuple[str, str]:
    """The stand-in's repositories, with ``dep`` given a nested submodule (``../nested.git``) and
    ``v1.4.0`` re-tagged onto a commit that pins it.  Returns (tag commit, nested commit)."""
    from tests.fixtures.mirror_env import git

    shutil.copytree(standin_root / "mirror", git_root)
    work = standin_root / "nested-work"
    nested = work / "nested"
    git("init", "-q", "-b", "main", str(nested))
    (nested / "nested.h").write_text("#define STANDIN_NESTED 1\n")
    git("add", "nested.h", cwd=nested)
    git("commit", "-q", "-m", "nested 1", cwd=nested)
    nested_commit = git("rev-parse", "HEAD", cwd=nested)
    git("clone", "-q", "--bare", "--no-local", str(nested), str(git_root / "standin" / "nested.git"))

    dep = work / "dep"
    git("clone", "-q", str(git_root / "standin" / "dep.git"), str(dep))
    (dep / ".gitmodules").write_text('[submodule "nested"]\n\tpath = nested\n\turl = ../nested.git\n')
    git("add", ".gitmodules", cwd=dep)
    git("update-index", "--add", "--cacheinfo", f"160000,{nested_commit},nested", cwd=dep)
    git("commit", "-q", "-m", "dep: a nested submodule", cwd=dep)
    git("push", "-q", "origin", "HEAD:main", cwd=dep)
    dep_commit = git("rev-parse", "HEAD", cwd=dep)

    top = work / "pytorch"
    git("clone", "-q", "--no-checkout", str(git_root / "pytorch" / "pytorch.git"), str(top))
    git("checkout", "-q", "v1.4.0", cwd=top)
    git("update-index", "--cacheinfo", f"160000,{dep_commit},third_party/dep", cwd=top)
    git("commit", "-q", "-m", "stand-in 1.4.0 with a nested submodule", cwd=top)
    git("tag", "-f", "-a", "v1.4.0", "-m", "stand-in v1.4.0", cwd=top)
    git("push", "-q", "-f", "origin", "refs/tags/v1.4.0", cwd=top)
    shutil.rmtree(work)
    return git("rev-parse", "v1.4.0^{commit}", cwd=git_root / "pytorch" / "pytorch.git"), nested_commit


@pytest.mark.docker
@pytest.mark.slow
def test_standin_builds_to_a_wheel_from_the_mirror_alone(tmp_path, docker_client, docker_engine, bullseye_base_image, no_leaks,
                                                         ccache_volume_name):
    """Sync from a loopback upstream (git, an HTTP file server, a registry), take it all away,
    check the mirror, and `patcher build` the stand-in to a wheel from the mirror alone."""
    from patcher.baseimage import push_image
    from patcher.hostapt import host_debian_mirror
    from tests.fixtures.index_env import serve_directory
    from tests.fixtures.mirror_env import git, start_registry
    from tests.fixtures.standin import make_standin

    standin = make_standin(tmp_path / "standin")
    git_root = tmp_path / "upstream" / "git"
    commit, nested_commit = _standin_upstream_with_nested_submodule(standin.root, git_root)
    assert git("rev-parse", "v1.4.0^{commit}", cwd=git_root / "pytorch" / "pytorch.git") == commit
    files = tmp_path / "upstream" / "http" / "files"
    files.mkdir(parents=True)
    (files / "standin_extra.h").write_text("#define STANDIN_EXTRA 1\n")
    extra_sha = hashlib.sha256((files / "standin_extra.h").read_bytes()).hexdigest()

    upstream_registry = start_registry(tmp_path / "upstream" / "registry")
    site_registry = start_registry(tmp_path / "site-registry")
    mirror, work, moved = tmp_path / "mirror", tmp_path / "work", tmp_path / "upstream-gone"
    image_tag = digest = None
    try:
        pinned = push_image(docker_engine, bullseye_base_image.tag, upstream_registry.url)
        ref, digest = pinned.split("@")
        matrix = tomllib.loads(standin.matrix.read_text())
        matrix["images"]["debian-bullseye"].update(ref=ref, digest=digest)
        with serve_directory(tmp_path / "upstream" / "http") as http_url:
            matrix["torch"]["1.4.0"]["inputs"] = [{"name": "standin_extra.h", "url": f"{http_url}/files/standin_extra.h",
                                                   "sha256": extra_sha, "dest": "third_party/extra/standin_extra.h"}]
            (tmp_path / "matrix.toml").write_text(tomli_w.dumps(matrix))
            (tmp_path / "upstream.toml").write_text(
                f'git_mirror = "file://{git_root}"\n[overrides.tag_commits]\n"1.4.0" = "{commit}"\n')
            env = {"PATCHER_MATRIX": str(tmp_path / "matrix.toml"), "PATCHER_CATALOG": str(standin.catalog),
                   "PATCHER_CONFIG": str(tmp_path / "upstream.toml"), "PATCHER_CACHE_DIR": str(tmp_path / "cache0")}
            synced = run_patcher("mirror", "sync", "--torch", "1.4.0", "--cuda", "none", "--to", str(mirror),
                                 "--registry", site_registry.url, "--json", env=env)
            assert synced.exit_code == 0, synced.stderr
        # The upstream is taken away: file server stopped (above), registry stopped, repositories moved.
        upstream_registry.stop()
        shutil.move(str(tmp_path / "upstream"), moved)
        names = {i["name"] for i in json.loads(synced.stdout)["items"]}
        assert "standin/nested (third_party/dep/nested)" in names

        checked = run_patcher("mirror", "check", "--torch", "1.4.0", "--cuda", "none", "--from", str(mirror), env=env)
        assert checked.exit_code == 0, checked.stdout + checked.stderr

        # One setting points fetch, inputs and render at the mirror; images come from the site
        # registry the sync pushed to, apt from the site's Debian archive.
        (tmp_path / "site.toml").write_text(
            f'mirror = "{mirror}"\nregistry = "{site_registry.url}"\ndebian_mirror = "{host_debian_mirror()}"\n'
            f'[overrides.tag_commits]\n"1.4.0" = "{commit}"\n')
        env = {**env, "PATCHER_CONFIG": str(tmp_path / "site.toml"), "PATCHER_CACHE_DIR": str(tmp_path / "cache")}
        built = run_patcher(*standin.build_args(work, "--until", "wheel", "--ccache-volume", ccache_volume_name),
                            env=env)
        record_path = work / standin.build_id / "record.json"
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        image_tag = record.get("image_tag")
        assert built.exit_code == 0, built.stderr[-3000:]
        wheel = work / standin.build_id / record["wheel"]["path"]
        assert wheel.name == "torch-1.4.0+cpu.pt1-cp39-cp39-linux_x86_64.whl" and wheel.is_file()
        assert record["source"]["commit"] == commit
        assert record["source"]["submodules"][1] == {"path": "third_party/dep/nested", "url": "../nested.git",
                                                     "commit": nested_commit}
        assert record["inputs"][0]["sha256"] == extra_sha
        log = (work / standin.build_id / "build.log").read_text()
        assert f"from {mirror}/git/pytorch/pytorch.git" in log and f"from {mirror}/files/{extra_sha}" in log
        dockerfile = (work / standin.build_id / "image" / "Dockerfile").read_text()
        assert f"FROM {site_registry.url}/patcher-test/debian:bullseye-minbase@{digest}" in dockerfile
    finally:
        site_registry.stop()
        upstream_registry.stop()
        import docker

        # The builder image this test made, and the reference the pull from the site registry added.
        for leftover in (image_tag, f"{site_registry.url}/patcher-test/debian@{digest}" if digest else None):
            if leftover:
                try:
                    docker_client.images.remove(leftover, noprune=False)
                except docker.errors.APIError:
                    pass
