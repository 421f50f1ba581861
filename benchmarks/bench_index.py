"""Static index: generation vs dumb-pypi, one-wheel publish vs full regeneration, and the cost of
one publish as the index grows.

1. Generation, like with like: both tools get the same package list (dumb-pypi's JSON-lines
   format: file name, sha256, Requires-Python, core-metadata hash; 2,000 projects x 5 versions),
   read it and write the pages; neither reads a wheel.  patcher (``index.read_package_list`` +
   ``index.write_index``) writes PEP 503 HTML and PEP 691 JSON per project, with the PEP 658/714
   core-metadata hashes in both, and the root pages, as one generation; dumb-pypi writes PEP
   503 HTML + its legacy JSON per project, a root page, changelog pages and packages.json
   (``--no-per-release-json``, ``--no-generate-timestamp``).  Both run in this process,
   alternating; ratio = dumb-pypi / patcher.  Measured twice: with the pages on this disk, and
   on a RAM file system (/dev/shm), which takes the disk's cost per file and directory (the
   same for both: each writes about five file-system entries a project) out of the figure.
   Beside them, the file-system work alone of each tool's layout (directories, page files,
   links or renames; nothing rendered): dumb-pypi's time over that floor for patcher's layout
   is the most any writer of that layout could reach against it on this disk in this run.
2. Publishing one wheel into a real 10,000-wheel index (the wheels are small zip files made
   here): ``index.publish`` (one project's pages; the oldest kept generation recycled) vs
   ``index.regenerate`` (every wheel re-read, every page rendered, a generation built whole),
   alternating.  Ratio = full / incremental.  The first KEEP_GENERATIONS - 1 publishes after
   the index is made build their generation whole (there is no older one to recycle yet); they
   run first, untimed, and are reported apart.
3. Flatness: indexes of 1,000, 10,000 and 100,000 wheels (5 versions a project), written from
   entries, with a placeholder beside each wheel's name in files/ (wheel and .metadata, so the
   directory is as large as a real one's); then rounds of one publish into an existing project
   of each, the sizes taking turns.  A publish that adds a new project rewrites the root pages,
   which list every project: that case is reported on its own.

Medians of ROUNDS; wall and CPU seconds of this process (CPU is steadier on a shared disk).
"""

from __future__ import annotations

import hashlib
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
ROUNDS = 5
SIZES = (1000, 10_000, 100_000)
RAM_FS = "/dev/shm"

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
    from tests.fixtures.index_env import write_minimal_wheel

    dest.mkdir(parents=True)
    return [write_minimal_wheel(dest, f"proj-{p:04d}", f"1.{v}.0", requires_python=">=3.6")
            for p in range(PROJECTS) for v in range(VERSIONS)]


def _synthetic_index(index_mod, path: Path, wheels: int) -> float:
    """An index of ``wheels`` entries written from entries, placeholders in files/; seconds to write it."""
    entries = []
    for p in range(wheels // VERSIONS):
        for v in range(VERSIONS):
            filename = f"proj_{p:06d}-1.{v}.0-py3-none-any.whl"
            digest = hashlib.sha256(filename.encode()).hexdigest()
            entries.append(index_mod.IndexFile(filename=filename, project=f"proj-{p:06d}", version=f"1.{v}.0",
                                               sha256=digest, size=1, metadata_sha256=digest,
                                               requires_python=">=3.6"))
    seconds = _timed(lambda: index_mod.write_index(path, entries))
    files = str(path / "files")
    for e in entries:
        for name in (e.filename, e.filename + ".metadata"):
            os.close(os.open(os.path.join(files, name), os.O_WRONLY | os.O_CREAT, 0o644))
    return seconds


def _write_new(name: str, data: bytes, dir_fd: int | None = None) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _layout_floor(root: Path, layout: str) -> None:
    """Only the file-system work of each tool's page layout, for PROJECTS projects (the same
    entries each tool makes, with pages of the usual size; nothing rendered): the least any
    writer of that layout spends on this disk."""
    html, page_json = b"h" * 1500, b"j" * 2500
    if layout == "patcher":  # .projects/<p>/<gen>/{index.html,index.json}, one link per project
        (root / ".projects").mkdir(parents=True)
        (root / ".generations" / "g000001").mkdir(parents=True)
        pfd = os.open(root / ".projects", os.O_RDONLY)
        gfd = os.open(root / ".generations" / "g000001", os.O_RDONLY)
        try:
            for i in range(PROJECTS):
                p = f"proj-{i:04d}"
                os.mkdir(p, dir_fd=pfd)
                os.mkdir(f"{p}/g000001", dir_fd=pfd)
                _write_new(f"{p}/g000001/index.html", html, pfd)
                _write_new(f"{p}/g000001/index.json", page_json, pfd)
                os.symlink(f"../../.projects/{p}/g000001", p, dir_fd=gfd)
        finally:
            os.close(pfd)
            os.close(gfd)
    else:  # dumb-pypi: simple/<p>/index.html and pypi/<p>/json, each written beside and renamed
        for top in ("simple", "pypi"):
            (root / top).mkdir(parents=True)
        for i in range(PROJECTS):
            p = f"proj-{i:04d}"
            for top, name, data in (("simple", "index.html", html), ("pypi", "json", page_json)):
                d = f"{root}/{top}/{p}"
                os.mkdir(d)
                _write_new(f"{d}/.{name}.tmp", data)
                os.rename(f"{d}/.{name}.tmp", f"{d}/{name}")


def run() -> dict:
    sys.path.insert(0, str(REPO_ROOT))
    from dumb_pypi import main as dumb_pypi

    from patcher import index
    from tests.fixtures.index_env import write_minimal_wheel

    med = statistics.median
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
            index.write_index(out, index.read_package_list(package_list))

        def theirs_from_list(out: Path) -> None:
            dumb_pypi.main(["--package-list-json", str(package_list), "--output-dir", str(out),
                            "--packages-url", "../../files/", "--no-generate-timestamp", "--no-per-release-json"])

        # 1. generation from the same list: on this disk, and on a RAM file system (where the
        # disk's per-file cost, the same for both tools, is out of the way)
        def generate(where: Path) -> tuple[list[float], list[float], list[float], list[float], bool]:
            gen_ours, gen_theirs, cpu_ours, cpu_theirs = [], [], [], []
            for r in range(ROUNDS):
                gen_ours.append(_timed(lambda r=r: ours_from_list(where / f"ours-{r}")))
                cpu_ours.append(_last_cpu[0])
                gen_theirs.append(_timed(lambda r=r: theirs_from_list(where / f"dumb-{r}")))
                cpu_theirs.append(_last_cpu[0])
                wrote_json = (where / f"ours-{r}" / "simple" / "proj-0001" / "index.json").is_file()
                shutil.rmtree(where / f"ours-{r}")
                shutil.rmtree(where / f"dumb-{r}")
            return gen_ours, gen_theirs, cpu_ours, cpu_theirs, wrote_json

        gen_ours, gen_theirs, cpu_ours, cpu_theirs, ours_json = generate(work)
        floor = {"patcher": [], "dumb_pypi": []}
        for r in range(ROUNDS):
            for layout in floor:
                floor[layout].append(_timed(lambda r=r, layout=layout: _layout_floor(work / f"floor-{layout}-{r}", layout)))
                shutil.rmtree(work / f"floor-{layout}-{r}")
        ram = None
        if os.path.isdir(RAM_FS) and os.access(RAM_FS, os.W_OK):
            ram_dir = Path(tempfile.mkdtemp(prefix="bench-index-", dir=RAM_FS))
            try:
                ram = generate(ram_dir)
            finally:
                shutil.rmtree(ram_dir, ignore_errors=True)

        # 2. a real 10,000-wheel index: one publish vs a full regeneration
        idx = work / "index"
        first_publish_s = _timed(lambda: index.publish(idx, wheels, require_evidence=False))
        extra = work / "extra"
        extra.mkdir()
        warmup = []
        for r in range(index.KEEP_GENERATIONS - 1):
            one = write_minimal_wheel(extra, f"proj-{r * 11:04d}", f"3.{r}.0")
            warmup.append(_timed(lambda one=one: index.publish(idx, [one], require_evidence=False)))
        incremental, full, cpu_incremental, cpu_full = [], [], [], []
        for r in range(ROUNDS):
            one = write_minimal_wheel(extra, f"proj-{r * 7:04d}", f"2.{r}.0")
            incremental.append(_timed(lambda one=one: index.publish(idx, [one], require_evidence=False)))
            cpu_incremental.append(_last_cpu[0])
            full.append(_timed(lambda: index.regenerate(idx)))
            cpu_full.append(_last_cpu[0])
        files_in_index = sum(len(v) for v in index.read_index(idx).values())
        shutil.rmtree(idx)

        # 3. one publish at 1k, 10k, 100k wheels
        sized = {n: work / f"sized-{n}" for n in SIZES}
        write_s = {n: _synthetic_index(index, sized[n], n) for n in SIZES}
        for n in SIZES:
            for r in range(index.KEEP_GENERATIONS - 1):
                index.publish(sized[n], [write_minimal_wheel(extra, "proj-000003", f"4.{n}.{r}")],
                              require_evidence=False)
        per_size = {n: [] for n in SIZES}
        per_size_cpu = {n: [] for n in SIZES}
        for r in range(ROUNDS):
            for n in SIZES:
                one = write_minimal_wheel(extra, f"proj-{(r * 37) % (n // VERSIONS):06d}", f"5.{n}.{r}")
                per_size[n].append(_timed(lambda n=n, one=one: index.publish(sized[n], [one], require_evidence=False)))
                per_size_cpu[n].append(_last_cpu[0])
        new_project = {}
        for n in SIZES:
            one = write_minimal_wheel(extra, f"brand-new-{n}", "1.0")
            new_project[n] = _timed(lambda n=n, one=one: index.publish(sized[n], [one], require_evidence=False))

        ms = {n: round(med(per_size[n]) * 1000, 2) for n in SIZES}
        return {
            "benchmark": "static index: generation vs dumb-pypi; one-wheel publish vs full regeneration; "
                         "publish cost vs index size",
            "wheels": len(wheels), "projects": PROJECTS, "rounds": ROUNDS,
            "make_wheels_s": round(make_s, 2),
            "generate_from_list_patcher_s": round(med(gen_ours), 3),
            "generate_from_list_dumb_pypi_s": round(med(gen_theirs), 3),
            "generate_ratio_dumb_pypi_over_patcher": round(med(gen_theirs) / med(gen_ours), 2),
            "generate_cpu_patcher_s": round(med(cpu_ours), 3),
            "generate_cpu_dumb_pypi_s": round(med(cpu_theirs), 3),
            "generate_cpu_ratio_dumb_pypi_over_patcher": round(med(cpu_theirs) / med(cpu_ours), 2),
            "generate_patcher_wrote_pep691_json": ours_json,
            "generate_fs_floor_patcher_layout_s": round(med(floor["patcher"]), 3),
            "generate_fs_floor_dumb_pypi_layout_s": round(med(floor["dumb_pypi"]), 3),
            "generate_ratio_ceiling_on_this_disk": round(med(gen_theirs) / med(floor["patcher"]), 2),
            **({"generate_ram_fs_patcher_s": round(med(ram[0]), 3),
                "generate_ram_fs_dumb_pypi_s": round(med(ram[1]), 3),
                "generate_ram_fs_ratio_dumb_pypi_over_patcher": round(med(ram[1]) / med(ram[0]), 2),
                "generate_ram_fs_cpu_ratio_dumb_pypi_over_patcher": round(med(ram[3]) / med(ram[2]), 2)}
               if ram else {"generate_ram_fs": f"skipped: no writable {RAM_FS}"}),
            "first_publish_10000_wheels_s": round(first_publish_s, 3),
            "warmup_publishes_built_whole_s": [round(s, 3) for s in warmup],
            "publish_one_incremental_s": round(med(incremental), 4),
            "regenerate_full_from_wheels_s": round(med(full), 3),
            "publish_ratio_full_over_incremental": round(med(full) / med(incremental), 1),
            "publish_one_incremental_cpu_s": round(med(cpu_incremental), 4),
            "regenerate_full_cpu_s": round(med(cpu_full), 3),
            "publish_cpu_ratio_full_over_incremental": round(med(cpu_full) / med(cpu_incremental), 1),
            "files_in_index_at_end": files_in_index,
            "sizes_wheels": list(SIZES),
            "sized_index_write_s": {str(n): round(write_s[n], 2) for n in SIZES},
            "publish_one_by_size_ms": {str(n): ms[n] for n in SIZES},
            "publish_one_by_size_cpu_ms": {str(n): round(med(per_size_cpu[n]) * 1000, 2) for n in SIZES},
            "publish_one_ratio_largest_over_smallest": round(ms[SIZES[-1]] / ms[SIZES[0]], 2),
            "publish_new_project_by_size_ms": {str(n): round(new_project[n] * 1000, 1) for n in SIZES},
            "note": "generation compares page writing from the same package list (no wheel read by "
                    "either); dumb-pypi also writes changelog pages, patcher also PEP 691 JSON; a new "
                    "project's publish rewrites the root pages (they list every project)",
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
