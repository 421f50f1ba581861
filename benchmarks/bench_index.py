"""Static index: generation of a 10,000-wheel index vs dumb-pypi, and incremental publish vs full.

1. Generation, like with like: both tools get the same package list (JSON lines: file name,
   sha256, Requires-Python, core-metadata hash; 2,000 projects x 5 versions) and write the
   pages; neither reads a wheel.  patcher writes PEP 503 HTML + PEP 691 JSON per project and
   the root pages (``index.write_index``); dumb-pypi writes PEP 503 HTML + its legacy JSON per
   project, a root page, changelog pages and packages.json (``--no-per-release-json``,
   ``--no-generate-timestamp``).  Both run in this process; ratio = dumb-pypi / patcher.
   Also measured: patcher's full regeneration from the 10,000 wheel files (hashing each,
   reading its METADATA), for scale.
2. Publishing one wheel into that index: ``index.publish`` (incremental: one project's pages,
   the root, one link per project) vs ``index.regenerate`` (every page, every wheel re-read).
   Ratio = full / incremental.

Medians of ROUNDS alternating runs; the wheels are real small zip files made here.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROJECTS = 2000
VERSIONS = 5
ROUNDS = 3


_last_cpu = [0.0]


def _timed(fn) -> float:
    """Wall seconds; the run's CPU seconds (user + system of this process) go to _last_cpu[0].

    CPU time is reported beside wall time because the wall time of file-system work swings
    with other users of a shared disk; both ratios come from the same runs."""
    # Flush the previous run's dirty pages first, so no run pays for another's writeback.
    os.sync()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    _last_cpu[0] = time.process_time() - cpu
    return time.perf_counter() - start


def _make_wheels(dest: Path) -> list[Path]:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.fixtures.index_env import write_minimal_wheel

    dest.mkdir(parents=True)
    return [write_minimal_wheel(dest, f"proj-{p:04d}", f"1.{v}.0", requires_python=">=3.6")
            for p in range(PROJECTS) for v in range(VERSIONS)]


def run() -> dict:
    from dumb_pypi import main as dumb_pypi

    from patcher import index

    work = Path(tempfile.mkdtemp(prefix="bench-index-"))
    try:
        t0 = time.perf_counter()
        wheels = _make_wheels(work / "wheels")
        make_s = time.perf_counter() - t0
        entries = [index.scan_wheel(w).entry for w in wheels]
        package_list = work / "packages.jsonl"
        with open(package_list, "w") as fh:
            for e in entries:
                fh.write(json.dumps({"filename": e.filename, "hash": f"sha256={e.sha256}",
                                     "requires_python": e.requires_python,
                                     "core_metadata": f"sha256={e.metadata_sha256}"}) + "\n")

        def ours_from_list(out: Path) -> None:
            from packaging.utils import canonicalize_name, parse_wheel_filename

            listed = []
            with open(package_list) as fh:
                for line in fh:
                    item = json.loads(line)
                    name, version, _, _ = parse_wheel_filename(item["filename"])
                    listed.append(index.IndexFile(
                        filename=item["filename"], project=canonicalize_name(name), version=str(version),
                        sha256=item["hash"].split("=", 1)[1], size=0,
                        metadata_sha256=item["core_metadata"].split("=", 1)[1],
                        requires_python=item["requires_python"]))
            index.write_index(out, listed)

        def theirs_from_list(out: Path) -> None:
            dumb_pypi.main(["--package-list-json", str(package_list), "--output-dir", str(out),
                            "--packages-url", "../../files/", "--no-generate-timestamp", "--no-per-release-json"])

        gen_ours, gen_theirs, cpu_ours, cpu_theirs = [], [], [], []
        for r in range(ROUNDS):
            gen_ours.append(_timed(lambda r=r: ours_from_list(work / f"ours-{r}")))
            cpu_ours.append(_last_cpu[0])
            gen_theirs.append(_timed(lambda r=r: theirs_from_list(work / f"dumb-{r}")))
            cpu_theirs.append(_last_cpu[0])
            shutil.rmtree(work / f"ours-{r}")
            shutil.rmtree(work / f"dumb-{r}")

        # a real 10,000-wheel index, published once
        idx = work / "index"
        first_publish_s = _timed(lambda: index.publish(idx, wheels, require_evidence=False))
        extra = work / "extra"
        extra.mkdir()
        from tests.fixtures.index_env import write_minimal_wheel

        incremental, full, cpu_incremental, cpu_full = [], [], [], []
        for r in range(ROUNDS):
            one = write_minimal_wheel(extra, f"proj-{r * 7:04d}", f"2.{r}.0")
            incremental.append(_timed(lambda one=one: index.publish(idx, [one], require_evidence=False)))
            cpu_incremental.append(_last_cpu[0])
            full.append(_timed(lambda: index.regenerate(idx)))
            cpu_full.append(_last_cpu[0])
        files_in_index = sum(len(v) for v in index.read_index(idx).values())
        med = statistics.median
        return {
            "benchmark": "static index: generation vs dumb-pypi; one-wheel publish vs full regeneration",
            "wheels": len(wheels), "projects": PROJECTS, "rounds": ROUNDS,
            "make_wheels_s": round(make_s, 2),
            "generate_from_list_patcher_s": round(med(gen_ours), 3),
            "generate_from_list_dumb_pypi_s": round(med(gen_theirs), 3),
            "generate_ratio_dumb_pypi_over_patcher": round(med(gen_theirs) / med(gen_ours), 2),
            "generate_cpu_patcher_s": round(med(cpu_ours), 3),
            "generate_cpu_dumb_pypi_s": round(med(cpu_theirs), 3),
            "generate_cpu_ratio_dumb_pypi_over_patcher": round(med(cpu_theirs) / med(cpu_ours), 2),
            "first_publish_10000_wheels_s": round(first_publish_s, 3),
            "publish_one_incremental_s": round(med(incremental), 3),
            "regenerate_full_from_wheels_s": round(med(full), 3),
            "publish_ratio_full_over_incremental": round(med(full) / med(incremental), 1),
            "publish_one_incremental_cpu_s": round(med(cpu_incremental), 3),
            "regenerate_full_cpu_s": round(med(cpu_full), 3),
            "publish_cpu_ratio_full_over_incremental": round(med(cpu_full) / med(cpu_incremental), 1),
            "files_in_index_at_end": files_in_index,
            "note": "generation compares page writing from the same package list (no wheel read by "
                    "either); dumb-pypi also writes changelog pages, patcher also PEP 691 JSON",
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
