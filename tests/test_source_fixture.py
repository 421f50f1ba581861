"""The shared real-tree fixture holds what colleagues rely on (tests/fixtures/realtree.py)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.realtree


def _git(cwd, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t.invalid")
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def test_mirror_has_tag_commit_and_fmt_submodule(realtree_mirror):
    assert realtree_mirror.git_mirror == f"file://{realtree_mirror.root}"
    tagged = _git(realtree_mirror.pytorch_repo, "rev-parse", f"{realtree_mirror.tag}^{{commit}}")
    assert tagged == realtree_mirror.commit
    # git add --force kept the files PyTorch's .gitignore would drop
    assert _git(realtree_mirror.pytorch_repo, "ls-tree", "--name-only", realtree_mirror.commit,
                "build_variables.bzl") == "build_variables.bzl"
    gitlink = _git(realtree_mirror.pytorch_repo, "ls-tree", realtree_mirror.commit, "third_party/fmt")
    assert gitlink.split()[:3] == ["160000", "commit", realtree_mirror.fmt_commit]
    modules = _git(realtree_mirror.pytorch_repo, "show", f"{realtree_mirror.commit}:.gitmodules")
    assert "url = https://github.com/fmtlib/fmt.git" in modules
    assert _git(realtree_mirror.fmt_repo, "cat-file", "-t", realtree_mirror.fmt_commit) == "commit"
    config = realtree_mirror.config_file.read_text()
    assert realtree_mirror.git_mirror in config and realtree_mirror.commit in config


def test_checkout_is_clean_tag_with_submodule(realtree_checkout, realtree_mirror):
    assert _git(realtree_checkout, "rev-parse", "HEAD") == realtree_mirror.commit
    assert (realtree_checkout / "build_variables.bzl").is_file()
    assert (realtree_checkout / "third_party" / "fmt" / "include" / "fmt" / "format.h").is_file()
    assert _git(realtree_checkout, "status", "--porcelain") == ""


def test_copy_to_leaves_shared_mirror_intact(realtree_mirror, tmp_path):
    copy = realtree_mirror.copy_to(tmp_path / "mirror")
    moved = _git(copy.pytorch_repo, "commit-tree", "-m", "moved", f"{copy.commit}^{{tree}}")
    _git(copy.pytorch_repo, "tag", "-f", "-a", copy.tag, "-m", "moved", moved)
    shutil.rmtree(copy.fmt_repo)
    assert realtree_mirror.fmt_repo.is_dir()
    assert _git(realtree_mirror.pytorch_repo, "rev-parse", f"{copy.tag}^{{commit}}") == realtree_mirror.commit
    assert copy.config_file.read_text().count(str(copy.root)) == 1
