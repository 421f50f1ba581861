"""patcher fetch of the real 1.13.1 tree: first fetch (empty cache) vs second fetch (warm cache).

The mirror is tests/fixtures/realtree.py's (Debian's PyTorch 1.13.1 tree + fmt as a submodule,
served over file://).  Each round, side by side in one run:

- cold: an empty cache dir, ``source.fetch`` into a new -o;
- warm: the same cache, ``source.fetch`` into another new -o.

Reported: the transfer phase (``source.update_cache``: the tag, verified, and every submodule
commit into the caches; this is what the cache saves, target ratio >= 10x) and the whole fetch
(transfer + checkout of ~11,000 files, 135 MB + tree hash; the checkout is local work that no
cache can skip, so this ratio is small by nature).  To show how small: the same round also
copies the checked-out files (``cp -a``, no git at all) and hashes the tree alone; a fetch that
writes a tree of its own cannot be quicker than that copy, so first fetch / copy is the
ceiling of the whole-fetch ratio on this disk.  Also: objects in the cache after each step, to
show that the second fetch transfers none.  Medians of ROUNDS rounds.
"""

from __future__ import annotations

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


def run() -> dict:
    sys.path.insert(0, str(REPO_ROOT))
    from patcher import source
    from patcher.config import Settings
    from patcher.spec import resolve
    from tests.fixtures.realtree import ensure_realtree_mirror

    work = Path(tempfile.mkdtemp(prefix="bench-fetch-"))
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
                start = time.perf_counter()
                source.fetch(spec, settings, work / f"tree-{round_no}-{kind}")
                whole[kind].append(time.perf_counter() - start)
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
            "tree_hash_alone_s": round(statistics.median(hashing), 3),
            "copy_checked_out_files_s": round(statistics.median(copying), 3),
            "fetch_ratio_ceiling_first_over_copy": round(f_cold / statistics.median(copying), 2),
            "cache_objects_after_first": objects["after_cold_transfer"],
            "cache_objects_after_second": objects["after_warm_transfer"],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
