"""`patcher mirror sync` of a second version that shares most inputs with one already mirrored.

Two scenarios, each measured side by side in this run:

1. The stand-in upstream of the mirror tests (tests/fixtures/mirror_env.py): v1.4.0 and v1.5.0
   share the ~1 MiB ``big`` submodule, the nested submodule and every file; v1.5.0 moves the top
   tree and ``dep``.
2. Debian's real PyTorch 1.13.1 tree (the realtree mirror in $PATCHER_CI_CACHE, made by the
   realtree tests) and a "1.13.2" made here from it: one more commit on top of v1.13.1 (a changed
   version.txt and one source file), the fmt submodule shared.  Skipped, and said so, when the
   realtree mirror has not been built on this machine.

For each: bytes transferred by ``sync`` of the second version into the mirror that already holds
the first ("incremental"), vs into an empty mirror ("cold"); ratio = incremental / cold (the
fraction of the cold transfer an incremental sync needs), and the wall times.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REALTREE = Path(os.environ.get("PATCHER_CI_CACHE", "/var/cache/patcher-ci")) / "realtree-mirror-v1"


def _sync(settings, torch: str, dest: Path) -> tuple[int, float, dict[str, int]]:
    from patcher import mirror, spec

    s = spec.resolve(settings, torch, cuda="none")
    start = time.perf_counter()
    result = mirror.sync(s, settings, dest)
    seconds = time.perf_counter() - start
    by_kind: dict[str, int] = {}
    for item in result.items:
        by_kind[item.kind] = by_kind.get(item.kind, 0) + item.transferred
    return result.transferred, seconds, by_kind


def _compare(settings, first: str, second: str, work: Path) -> dict:
    warm = work / "warm"
    first_bytes, first_s, _ = _sync(settings, first, warm)
    inc_bytes, inc_s, inc_kinds = _sync(settings, second, warm)
    cold_bytes, cold_s, cold_kinds = _sync(settings, second, work / "cold")
    return {
        "first_version": first, "second_version": second,
        "first_sync_bytes": first_bytes, "first_sync_s": round(first_s, 2),
        "incremental_bytes": inc_bytes, "incremental_s": round(inc_s, 2), "incremental_by_kind": inc_kinds,
        "cold_bytes": cold_bytes, "cold_s": round(cold_s, 2), "cold_by_kind": cold_kinds,
        "ratio_bytes_incremental_over_cold": round(inc_bytes / cold_bytes, 5) if cold_bytes else None,
    }


def _git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@patcher.invalid",
               GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@patcher.invalid",
               GIT_AUTHOR_DATE="2023-01-01T00:00:00+00:00", GIT_COMMITTER_DATE="2023-01-01T00:00:00+00:00")
    return subprocess.run(["git", "-c", "protocol.file.allow=always", *args], cwd=cwd, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def _realtree_settings(up, work: Path):
    """A copy of the realtree mirror with a v1.13.2 one commit ahead, and a matrix for both."""
    import tomli_w

    from patcher.config import Settings

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    git_root = work / "realtree-git"
    subprocess.run(["cp", "-al", str(REALTREE), str(git_root)], check=True)
    commit = (REALTREE / "commits.txt").read_text().split()[1]
    clone = work / "clone"
    _git("clone", "-q", "--no-checkout", str(git_root / "pytorch" / "pytorch.git"), str(clone), cwd=work)
    _git("checkout", "-q", "--detach", commit, cwd=clone)
    (clone / "version.txt").write_text("1.13.2a0\n")
    path = clone / "aten" / "src" / "ATen" / "native" / "LossCTC.cpp"
    path.write_text(path.read_text() + "\n// 1.13.2: a one-line change\n")
    _git("commit", "-q", "-a", "-m", "1.13.2", cwd=clone)
    _git("tag", "-a", "v1.13.2", "-m", "v1.13.2", cwd=clone)
    # Replaces the hard links git would otherwise share with the cache: push writes new files only.
    _git("push", "-q", str(git_root / "pytorch" / "pytorch.git"), "v1.13.2", cwd=clone)
    second = _git("rev-parse", "v1.13.2^{commit}", cwd=clone)

    matrix = tomllib.loads(up.matrix.read_text())
    matrix["images"]["mirror-tiny-py39"] = dict(matrix["images"]["mirror-tiny"], system_python="3.9")
    base = dict(matrix["torch"]["1.13.1"], image="mirror-tiny-py39", inputs=[])
    matrix["torch"]["1.13.1"] = dict(base, commit=commit)
    matrix["torch"]["1.13.2"] = dict(base, tag="v1.13.2", commit=second)
    (work / "matrix.toml").write_text(tomli_w.dumps(matrix))
    return Settings(matrix=work / "matrix.toml", git_mirror=f"file://{git_root}", cache_dir=work / "cache")


def run() -> dict:
    sys.path.insert(0, str(REPO_ROOT))
    from patcher.config import Settings
    from tests.fixtures.mirror_env import make_upstream

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-mirror-") as tmp:
        work = Path(tmp)
        up = make_upstream(work / "upstream").serve()
        try:
            standin = Settings(matrix=up.matrix, git_mirror=f"file://{up.git_root}",
                               pypi_index=f"{up.http_url}/simple", cache_dir=work / "cache")
            results["standin"] = _compare(standin, "1.4.0", "1.5.0", work / "standin")
            if (REALTREE / "commits.txt").is_file():
                (work / "realtree").mkdir()
                settings = _realtree_settings(up, work / "realtree")
                results["realtree_1_13"] = _compare(settings, "1.13.1", "1.13.2", work / "realtree")
            else:
                results["realtree_1_13"] = {"skipped": f"{REALTREE} not built (run the realtree tests first)"}
        finally:
            up.stop()
            shutil.rmtree(work, ignore_errors=True)
    return results
