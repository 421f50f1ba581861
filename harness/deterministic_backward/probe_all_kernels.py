"""The goal of issues 17 and 18 together, shown on the GPU: with every deterministic kernel of
the determinism series registered into the running torch through the dispatcher (the
harness extensions' ``register_aten_cuda()``, what the patches compile into torch 1.13.1),
the probe, told that the wheel carries the whole series, runs its ``determinism.*`` checks
and none finds an op that raises (or differs) under ``torch.use_deterministic_algorithms(True)``.

Usage (device machine, from the repository root):
    python harness/deterministic_backward/probe_all_kernels.py --out $OUT/probe-all-kernels.json

The probe runs in this process (``PATCHER_PROBE_ISOLATION=spawn``: no fork server, whose
processes would not have the registrations), with ``--only 'determinism.*'`` and
``--patched-ids`` = every determinism patch of patches/1.13.1/series.  Writes the probe's JSON
report and, beside it, ``<out>.registration.json`` (what each extension registered, build times).
"""
import argparse
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXTENSIONS = ("build17", "build_losses", "build_reductions", "build_scatter", "build_aa")


def determinism_patch_ids():
    ids = []
    series = os.path.join(REPO, "patches", "1.13.1", "series")
    for line in open(series):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        text = open(os.path.join(REPO, "patches", "1.13.1", name)).read()
        match = re.search(r"^Patch-Id:\s*(PT-\d+)", text, re.M)
        category = re.search(r"^Category:\s*(\S+)", text, re.M | re.I)
        if match and category and category.group(1).lower() == "determinism":
            ids.append(match.group(1))
    return ids


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    sys.path.insert(0, REPO)
    import importlib

    registration = {"extensions": {}}
    for name in EXTENSIONS:
        try:  # one extension that fails to build must not hide what the others register
            module = importlib.import_module(name)
            ext, seconds = module.build()
            registered = ext.register_aten_cuda()
        except Exception as exc:  # reported in the JSON; the run goes on
            registration["extensions"][name] = {"error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
            print(f"{name}: FAILED {exc}", flush=True)
            continue
        registration["extensions"][name] = {"build_s": round(seconds, 1), "registered": registered}  # registered: the errors (none: all)
        print(f"{name}: built in {seconds:.1f} s, registered {registered}", flush=True)
    ids = determinism_patch_ids()
    registration["patched_ids"] = ids
    os.environ["PATCHER_PROBE_ISOLATION"] = "spawn"
    from patcher.probe.__main__ import main as probe_main

    started = time.time()
    rc = probe_main(["--only", "determinism.*", "--patched-ids", ",".join(ids), "--json", args.out])
    registration["probe_wall_s"] = round(time.time() - started, 2)
    registration["probe_exit"] = rc
    report = json.load(open(args.out))
    registration["summary"] = report.get("summary")
    registration["not_passing"] = [{"id": c["id"], "status": c["status"], "message": c.get("message")}
                                   for c in report["checks"] if c["status"] != "pass"]
    with open(args.out + ".registration.json", "w") as fh:
        json.dump(registration, fh, indent=2, sort_keys=True, default=str)
    print(json.dumps(registration["summary"]), "exit", rc, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
