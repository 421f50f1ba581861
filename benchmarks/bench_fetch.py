"""patcher fetch of the real 1.13.1 tree: first fetch (empty cache) vs second fetch (warm cache).

The mirror is tests/fixtures/realtree.py's (Debian's PyTorch 1.13.1 tree + fmt as a submodule,
served over file://).  Each round, side by side in one run:

- cold: an empty cache dir, ``source.fetch`` into a new -o (transfer, a git checkout of ~11,000
  files, 135 MB, submodules, tree hash; it keeps its checkout in the cache);
- warm: the same cache, ``source.fetch`` into another new -o (the kept checkout's files are
  hard-linked, git compares each with the commit, the tree hash is computed from the files and
  compared with the recorded one).

Reported: the transfer phase (``source.update_cache``: the tag, verified, and every submodule
commit into the caches; target ratio >= 10x), the whole fetch (target >= 5x), and where the
time of each goes (git commands by name, the tree hash, the rest: linking, Python).  Beside
them, what a second fetch that writes the files would cost at least: a plain copy of the
checked-out files (``cp -a``, no git).  Also: objects in the cache after each step, to show
that the second fetch transfers none.  Medians of ROUNDS rounds.
"""

from __future__ import annotations

import collections
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 3


def _objects(repo: Path) -> int:
    out = subprocess.run(["git", "count-objects", "-v"], cwd=repo, capture_output=True, text=True,
                         check=True).stdout
    stats = dict(line.split(": ") for line in out.splitlines())
    return int(stats["count"]) + int(stats["in-pack"])


def _phase_medians(phases: dict[str, list[float]]) -> dict[str, float]:
    medians = {label: round(statistics.median(times), 3) for label, times in phases.items()}
    return dict(sorted(((k, v) for k, v in medians.items() if v >= 0.01), key=lambda kv: -kv[1]))


def run() -> dict:
    sys.path.insert(0, str(REPO_ROOT))
    from patcher import source
    from patcher.config import Settings
    from patcher.spec import resolve
    from tests.fixtures.realtree import ensure_realtree_mirror

    phases: dict[str, dict[str, list[float]]] = {"cold": collections.defaultdict(list),
                                                 "warm": collections.defaultdict(list)}
    current: dict[str, float] = collections.defaultdict(float)
    run_git, tree_hash = source.run_git, source.tree_hash

    def timed(label, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                current[label(args)] += time.perf_counter() - start
        return wrapper

    work = Path(tempfile.mkdtemp(prefix="bench-fetch-"))
    source.run_git = timed(lambda args: f"git {args[0]}", run_git)
    source.tree_hash = timed(lambda args: "tree_hash", tree_hash)
    try:
        mirror = ensure_realtree_mirror(work)
        transfer = {"cold": [], "warm": []}
        whole = {"cold": [], "warm": []}
        objects = {}
        hashing, copying = [], []
        for round_no in range(ROUNDS):
            cache = work / f"cache-{round_no}"
            settings = Settings.load(config_file=str(mirror.config_file), cache_dir=str(cache))
            spec = resolve(settings, mirror.torch)
            repo_cache = source.cache_repo(settings, spec.repo)
            for kind in ("cold", "warm"):
                start = time.perf_counter()
                source.update_cache(spec, settings)
                transfer[kind].append(time.perf_counter() - start)
                objects[f"after_{kind}_transfer"] = _objects(repo_cache)
            shutil.rmtree(cache)
            for kind in ("cold", "warm"):
                current.clear()
                start = time.perf_counter()
                source.fetch(spec, settings, work / f"tree-{round_no}-{kind}")
                whole[kind].append(time.perf_counter() - start)
                current["other (links, python)"] = whole[kind][-1] - sum(current.values())
                for label in set(current) | set(phases[kind]):
                    phases[kind][label].append(current.get(label, 0.0))
            tree = work / f"tree-{round_no}-warm"
            start = time.perf_counter()
            source.tree_hash(tree)
            hashing.append(time.perf_counter() - start)
            copy = work / f"copy-{round_no}"
            copy.mkdir()
            start = time.perf_counter()
            subprocess.run(["cp", "-a", *[str(p) for p in tree.iterdir() if p.name != ".git"], str(copy)],
                           check=True)
            copying.append(time.perf_counter() - start)
            for path in (copy, tree, work / f"tree-{round_no}-cold", cache):
                shutil.rmtree(path)
        t_cold, t_warm = statistics.median(transfer["cold"]), statistics.median(transfer["warm"])
        f_cold, f_warm = statistics.median(whole["cold"]), statistics.median(whole["warm"])
        return {
            "rounds": ROUNDS,
            "transfer_first_s": round(t_cold, 3),
            "transfer_second_s": round(t_warm, 3),
            "transfer_ratio": round(t_cold / t_warm, 1),
            "transfer_target_ratio": 10,
            "fetch_first_s": round(f_cold, 3),
            "fetch_second_s": round(f_warm, 3),
            "fetch_ratio": round(f_cold / f_warm, 2),
            "fetch_target_ratio": 5,
            "fetch_first_phases_s": _phase_medians(phases["cold"]),
            "fetch_second_phases_s": _phase_medians(phases["warm"]),
            "tree_hash_alone_s": round(statistics.median(hashing), 3),
            "copy_checked_out_files_s": round(statistics.median(copying), 3),
            "fetch_ratio_if_second_copied_files": round(f_cold / statistics.median(copying), 2),
            "cache_objects_after_first": objects["after_cold_transfer"],
            "cache_objects_after_second": objects["after_warm_transfer"],
        }
    finally:
        source.run_git, source.tree_hash = run_git, tree_hash
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
