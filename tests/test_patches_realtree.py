"""The catalog's 1.13.1 series on Debian's real PyTorch 1.13.1 tree."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from patcher import patches
from patcher.config import DEFAULT_CATALOG
from patcher.errors import PatchApplyError
from patcher.source import tree_hash

pytestmark = pytest.mark.realtree


def git(cwd, *args) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@patcher.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@patcher.invalid")
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def test_check_and_apply_the_real_series(realtree_checkout, realtree_mirror, patcher_cli, tmp_path):
    series = patches.load_series(DEFAULT_CATALOG / "patches", "1.13.1")
    assert "PT-0901" in series.ids
    check = patcher_cli("patches", "check", "--torch", "1.13.1", "--source", realtree_checkout)
    assert check.exit_code == 0, check.stderr
    assert f"ok: all {len(series.patches)} patches of torch 1.13.1 apply exactly" in check.stdout

    before = tree_hash(realtree_checkout)
    dry = patcher_cli("patches", "apply", "--torch", "1.13.1", "--source", realtree_checkout, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert git(realtree_checkout, "rev-parse", "HEAD") == realtree_mirror.commit
    assert tree_hash(realtree_checkout) == before

    applied = patcher_cli("patches", "apply", "--torch", "1.13.1", "--source", realtree_checkout, "--json")
    assert applied.exit_code == 0, applied.stderr
    result = patches.PatchedTree.from_json(json.loads(applied.stdout))
    assert result.base == realtree_mirror.commit and not result.already_applied
    assert [p.id for p in result.patches] == series.ids
    assert [p.sha256 for p in result.patches] == [p.sha256 for p in series.patches]
    # git log shows the series, one commit per patch, oldest first
    log = git(realtree_checkout, "log", "--reverse", "--format=%H %(trailers:key=Patch-Id,valueonly,separator=)",
              f"{realtree_mirror.commit}..HEAD").splitlines()
    assert [line.split() for line in log] == [[p.commit, p.id] for p in result.patches]
    dependencies = (realtree_checkout / "cmake" / "Dependencies.cmake").read_text()
    assert "third_party/foxi EXCLUDE_FROM_ALL" not in dependencies and "foxi_loader" not in dependencies
    assert result.tree_hash == tree_hash(realtree_checkout)

    again = patcher_cli("patches", "apply", "--torch", "1.13.1", "--source", realtree_checkout)
    assert again.exit_code == 0 and "already applied" in again.stdout
    assert git(realtree_checkout, "rev-parse", "HEAD") == result.head

    # An independent path to the same place: `patcher fetch` from the mirror, then apply there.
    fetched = tmp_path / "fetched"
    fetch = patcher_cli("--config", realtree_mirror.config_file, "fetch", "--torch", "1.13.1", "-o", fetched)
    assert fetch.exit_code == 0, fetch.stderr
    other = patches.apply_series(series, fetched)
    assert (other.head, other.tree_hash) == (result.head, result.tree_hash)


def test_a_real_patch_that_no_longer_applies(realtree_checkout, patcher_cli):
    cmake = realtree_checkout / "cmake" / "Dependencies.cmake"
    text = cmake.read_text()
    line = "  add_subdirectory(${CMAKE_CURRENT_LIST_DIR}/../third_party/foxi EXCLUDE_FROM_ALL)\n"
    assert text.count(line) == 1
    number = text[:text.index(line)].count("\n") + 1
    cmake.write_text(text.replace(line, line.replace("EXCLUDE_FROM_ALL", "")))
    git(realtree_checkout, "commit", "-q", "-am", "someone else's change")
    head = git(realtree_checkout, "rev-parse", "HEAD")
    result = patcher_cli("patches", "check", "--torch", "1.13.1", "--source", realtree_checkout)
    assert result.exit_code == PatchApplyError.exit_code
    message = result.stderr
    assert "PT-0901 (0901-cmake-build-without-foxi.patch) does not apply: cmake/Dependencies.cmake, hunk @@ -1557,7" in message
    assert (f"line {number} expected '  add_subdirectory(${{CMAKE_CURRENT_LIST_DIR}}/../third_party/foxi "
            f"EXCLUDE_FROM_ALL)', found '  add_subdirectory(${{CMAKE_CURRENT_LIST_DIR}}/../third_party/foxi )'") \
        in message
    assert git(realtree_checkout, "rev-parse", "HEAD") == head
    assert git(realtree_checkout, "status", "--porcelain") == ""
