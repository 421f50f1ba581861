"""The probe: the whole suite with worker processes vs one check at a time; and the
max_pool2d sweep batched on the device vs a naive per-case loop.

1. Suite: ``python -m patcher.probe --quiet --json FILE`` as a user runs it (interpreter start
   to exit, wall time), alternating rounds of the two ways: with the worker server (the
   default: torch imported once, isolated checks and the other check modules in forked
   workers, concurrently) and ``PATCHER_PROBE_ISOLATION=spawn`` (the way before it: every check
   in the probe's process, one after the other, each isolated check in a fresh interpreter
   that imports torch and starts CUDA).  Both reports must agree check by check (status,
   message, required, finding); ratio = spawn / workers (medians).  Runs with any torch (CPU
   here, the GPU machine for the issue's figure).
2. Sweep: both variants run the same 150 cases (5 sizes x 5 batches x 3 layouts x 2 dtypes)
   in one process on one GPU, alternating, and agree on the mismatch counts; the ratio is
   naive / batched wall time (medians).  Needs CUDA; without a GPU it says so.

``run()`` uses this interpreter's torch when it has one, else re-runs this file under
``$PATCHER_TORCH_PYTHON`` (default /usr/bin/python3).

    python3 benchmarks/bench_probe.py --json probe-bench.json [--suite-only] [--rounds N] [--reports DIR]
"""

import json
import os
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = 3
SUITE_ROUNDS = 2
MODES = ("spawn", "workers")


def _timed(torch, fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, result


def measure(torch):
    from patcher.probe.checks import maxpool

    info = {"benchmark": "probe maxpool2d.sweep: batched vs naive per-case loop",
            "torch": torch.__version__, "cases": len(maxpool.sweep_cases())}
    if not torch.cuda.is_available():
        info["skipped"] = "needs a CUDA GPU: torch.cuda.is_available() is False here"
        return info
    info["gpu"] = torch.cuda.get_device_name(0)
    # warm-up: CUDA context, kernels, allocator
    maxpool.sweep_batched(torch, sizes=(224,), batches=(1, 2))
    maxpool.sweep_naive(torch, sizes=(224,), batches=(1, 2))
    batched, naive = [], []
    for _ in range(ROUNDS):
        seconds, (cases_b, totals_b, _) = _timed(torch, lambda: maxpool.sweep_batched(torch))
        batched.append(seconds)
        seconds, (cases_n, totals_n, _) = _timed(torch, lambda: maxpool.sweep_naive(torch))
        naive.append(seconds)
    agree = sorted(zip(cases_b, map(tuple, totals_b))) == sorted(zip(cases_n, map(tuple, totals_n)))
    info.update({
        "rounds": ROUNDS,
        "batched_s": [round(s, 4) for s in batched],
        "naive_s": [round(s, 4) for s in naive],
        "batched_median_s": round(statistics.median(batched), 4),
        "naive_median_s": round(statistics.median(naive), 4),
        "ratio_naive_over_batched": round(statistics.median(naive) / statistics.median(batched), 2),
        "results_agree": agree,
        "wrong_cases": sum(1 for t in totals_b if any(t)),
    })
    return info


def _suite_once(python, mode, report_path, group_size=None):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    env.pop("PATCHER_PROBE_ISOLATION", None)
    if mode == "spawn":
        env["PATCHER_PROBE_ISOLATION"] = "spawn"
    if group_size is not None:
        env["PATCHER_PROBE_GROUP_SIZE"] = str(group_size)
    start = time.perf_counter()
    proc = subprocess.run([python, "-m", "patcher.probe", "--quiet", "--json", report_path], cwd=REPO_ROOT,
                          env=env, capture_output=True, timeout=900)
    seconds = time.perf_counter() - start
    with open(report_path) as handle:
        report = json.load(handle)
    return seconds, proc.returncode, report


def suite(python=None, rounds=SUITE_ROUNDS, reports_dir=None, progress=None):
    """The whole probe, workers vs one at a time, alternating; ``progress(result)`` after each run."""
    import tempfile

    python = python or sys.executable
    work = tempfile.mkdtemp(prefix="bench-probe-")
    walls = dict((m, []) for m in MODES)
    inside = dict((m, []) for m in MODES)
    last = {}
    result = {"benchmark": "probe suite: worker processes vs one check at a time (spawn)",
              "python": python, "rounds": rounds}
    try:
        for _ in range(rounds):
            for mode in MODES:
                path = os.path.join(reports_dir or work, f"probe-{mode}.json")
                seconds, code, report = _suite_once(python, mode, path)
                walls[mode].append(round(seconds, 3))
                inside[mode].append(report["duration_s"])
                last[mode] = (code, report)
                result.update(_suite_summary(walls, inside, last))
                if progress is not None:
                    progress(result)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return result


def group_sizes(sizes, rounds=SUITE_ROUNDS, python=None, progress=None):
    """The suite with workers, a module's checks cut into runs of N per worker (0: whole
    modules), the sizes alternating round by round; every report must agree with the first."""
    import tempfile

    python = python or sys.executable
    work = tempfile.mkdtemp(prefix="bench-probe-groups-")
    walls = dict((n, []) for n in sizes)
    reports = {}
    result = {"benchmark": "probe suite with workers: checks per worker (PATCHER_PROBE_GROUP_SIZE)",
              "python": python, "rounds": rounds, "sizes": list(sizes)}
    try:
        for _ in range(rounds):
            for n in sizes:
                seconds, code, report = _suite_once(python, "workers", os.path.join(work, f"g{n}.json"), n)
                walls[n].append(round(seconds, 3))
                reports[n] = (code, report)
                result["wall_s"] = dict((str(k), v) for k, v in walls.items())
                result["wall_median_s"] = dict((str(k), round(statistics.median(v), 3))
                                               for k, v in walls.items() if v)
                first = reports[sizes[0]][1]

                def key(c):
                    return (c["id"], c["status"], c["message"], c["required"])

                result["reports_agree"] = all([key(c) for c in r["checks"]] == [key(c) for c in first["checks"]]
                                              for _, r in reports.values())
                result["exit_codes"] = dict((str(k), v[0]) for k, v in reports.items())
                result["checks"] = len(first["checks"])
                if progress is not None:
                    progress(result)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return result


def _suite_summary(walls, inside, last):
    med = statistics.median
    out = {"wall_s": walls, "report_duration_s": inside}
    for mode in MODES:
        if walls[mode]:
            out[f"{mode}_wall_median_s"] = round(med(walls[mode]), 3)
    if "spawn" in last and "workers" in last:
        out["ratio_spawn_over_workers"] = round(med(walls["spawn"]) / med(walls["workers"]), 2)
        (code_a, a), (code_b, b) = last["spawn"], last["workers"]

        def key(c):
            return (c["status"], c["message"], c["required"], c["finding"])

        differ = [x["id"] for x, y in zip(a["checks"], b["checks"]) if x["id"] != y["id"] or key(x) != key(y)]
        out.update({"checks": len(b["checks"]), "summary": b["summary"], "exit_codes": [code_a, code_b],
                    "reports_agree": not differ and len(a["checks"]) == len(b["checks"]), "differ": differ,
                    "torch": b["environment"]["torch"]["version"],
                    "gpu": [d.get("name") for d in b["environment"].get("cuda", {}).get("devices", [])]})
    return out


def run():
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        return {"suite": suite(), "sweep": measure(torch)}
    python = os.environ.get("PATCHER_TORCH_PYTHON", "/usr/bin/python3")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    proc = subprocess.run([python, os.path.abspath(__file__), "--json", "-"], capture_output=True, text=True,
                          env=env, timeout=1800)
    if proc.returncode != 0:
        return {"error": f"{python} exited with {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    result = json.loads(proc.stdout)
    result["python"] = python
    return result


def main(argv):
    import argparse

    parser = argparse.ArgumentParser(prog="bench_probe.py")
    parser.add_argument("--json", default="-")
    parser.add_argument("--suite-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=SUITE_ROUNDS)
    parser.add_argument("--reports", help="keep each mode's last probe report here")
    parser.add_argument("--group-sizes", help="only compare checks per worker, e.g. 0,4,8 (PATCHER_PROBE_GROUP_SIZE)")
    args = parser.parse_args(argv)
    sys.path.insert(0, REPO_ROOT)

    def write(result):
        text = json.dumps(result, indent=2, sort_keys=True) + "\n"
        if args.json != "-":
            with open(args.json, "w") as handle:
                handle.write(text)
        return text

    result = {}

    def progress(partial):  # written after every run: a run cut short still leaves its figures
        result["suite"] = partial
        write(result)

    if args.group_sizes:
        def grouped_progress(partial):
            result["group_sizes"] = partial
            write(result)

        sizes = [int(n) for n in args.group_sizes.split(",")]
        result["group_sizes"] = group_sizes(sizes, rounds=args.rounds, progress=grouped_progress)
        sys.stdout.write(write(result))
        return 0
    result["suite"] = suite(rounds=args.rounds, reports_dir=args.reports, progress=progress)
    if not args.suite_only:
        import torch

        result["sweep"] = measure(torch)
    sys.stdout.write(write(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
