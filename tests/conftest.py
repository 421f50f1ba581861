"""Shared test setup. Fixtures of each area live in tests/fixtures/<area>.py."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CI_CACHE = Path(os.environ.get("PATCHER_CI_CACHE", "/var/cache/patcher-ci"))
# switches that make a test write its run into the checkout as committed evidence
RECORDING_SWITCHES = ("PATCHER_RECORD_COMPILE_CHECK", "PATCHER_RECORD_UPSTREAM_TESTS")

pytest_plugins = [
    "tests.fixtures.common",
    "tests.fixtures.realtree",
    "tests.fixtures.upstream_trees",
    "tests.fixtures.docker_env",
    "tests.fixtures.torch_env",
    "tests.fixtures.index_env",
    "tests.fixtures.standin",
    "tests.fixtures.mirror_env",
]


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch, tmp_path):
    """No test reads the developer's own config or writes into ~/.cache."""
    for var in list(os.environ):
        if var.startswith("PATCHER_") and var != "PATCHER_CI_CACHE" and var not in RECORDING_SWITCHES:
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("PATCHER_CACHE_DIR", str(tmp_path / "cache"))


def _worktree_changes() -> set[str]:
    import subprocess

    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    return set(done.stdout.splitlines()) if done.returncode == 0 else set()


@pytest.fixture(scope="session", autouse=True)
def _no_test_writes_into_the_checkout():
    """No test leaves a file changed or added in the repository (a parser once wrote ./Dockerfile
    whenever the tests ran from the root).  The recording switches write evidence on purpose."""
    before = _worktree_changes()
    yield
    if any(os.environ.get(v) for v in (*RECORDING_SWITCHES, "UPDATE_GOLDEN")):
        return
    changed = sorted(_worktree_changes() - before)
    assert not changed, f"the tests changed the checkout: {changed}"
