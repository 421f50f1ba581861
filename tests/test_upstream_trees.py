"""The real v1.4.0 / v1.7.1 / v1.8.1 trees, fetched through `patcher fetch` from the shallow git mirror."""

from __future__ import annotations

import subprocess

import pytest

from patcher.source import tree_hash

pytestmark = pytest.mark.realtree


def git(cwd, *args) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


def flatten(records):
    for record in records:
        yield record
        yield from flatten(record.submodules)


def test_1_4_0_is_the_upstream_tag_commit_with_every_submodule(real_tree_1_4_0):
    tree = real_tree_1_4_0
    assert tree.commit == "7f73f1d591afba823daa4a99a939217fb54d7688"
    assert git(tree.path, "rev-parse", "HEAD").strip() == tree.commit
    assert git(tree.path, "rev-parse", "v1.4.0^{commit}").strip() == tree.commit
    assert tree.manifest.tag == "v1.4.0" and not tree.manifest.commit_overridden
    assert tree.manifest.fetched_from == f"{tree.git_mirror}/pytorch/pytorch.git"
    # every gitlink, nested ones too, is checked out at the commit the manifest records
    status = git(tree.path, "submodule", "status", "--recursive").splitlines()
    records = {r.path: r.commit for r in flatten(tree.manifest.submodules)}
    assert len(records) == len(status) > 30
    for line in status:
        assert line[0] == " ", f"not checked out at its pinned commit: {line}"
        sha, path = line[1:].split()[:2]
        assert records[path] == sha
    assert any("/" in path and path.count("third_party") > 1 for path in records)  # a nested one
    assert (tree.path / "third_party" / "pybind11" / "CMakeLists.txt").is_file()
    assert git(tree.path, "status", "--porcelain", "--ignore-submodules=none").strip() == ""
    assert tree_hash(tree.path) == tree.manifest.tree_hash


@pytest.mark.parametrize("version", ["1.7.1", "1.8.1"])
def test_other_mirror_releases_fetch_at_their_tag_commit(fetch_real_tree, version):
    from tests.fixtures.upstream_trees import MIRROR_TAG_COMMITS

    tree = fetch_real_tree(version)
    assert tree.commit == MIRROR_TAG_COMMITS[version]
    assert git(tree.path, "rev-parse", "HEAD").strip() == tree.commit
    assert git(tree.path, "log", "-1", "--format=%H").strip() == tree.commit  # a shallow history reads
    assert all(line[0] == " " for line in git(tree.path, "submodule", "status", "--recursive").splitlines())
