"""The probe's max_pool2d sweep: batched on the device vs a naive per-case loop.

Both variants run the same 150 cases (5 sizes x 5 batches x 3 layouts x 2 dtypes) in one
process on one GPU, alternating, and agree on the mismatch counts; the ratio is
naive / batched wall time (medians).  Needs a torch with CUDA: ``run()`` uses this
interpreter's torch when it has one, else re-runs this file under ``$PATCHER_TORCH_PYTHON``
(default /usr/bin/python3); without a GPU it says so instead of measuring.

    python3 benchmarks/bench_probe.py --json probe-bench.json      # on the GPU machine
"""

import json
import os
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = 3


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


def run():
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        return measure(torch)
    python = os.environ.get("PATCHER_TORCH_PYTHON", "/usr/bin/python3")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    proc = subprocess.run([python, os.path.abspath(__file__), "--json", "-"], capture_output=True, text=True,
                          env=env, timeout=900)
    if proc.returncode != 0:
        return {"error": f"{python} exited with {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    result = json.loads(proc.stdout)
    result["python"] = python
    return result


def main(argv):
    sys.path.insert(0, REPO_ROOT)
    import torch

    result = measure(torch)
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    if len(argv) == 2 and argv[0] == "--json" and argv[1] != "-":
        with open(argv[1], "w") as handle:
            handle.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
