#!/bin/bash
# The probe's wall time with and without torch's bytecode (issue 22).  The H200 machine sets
# PYTHONDONTWRITEBYTECODE=1 and its torch has no __pycache__, so every probe process compiles
# the torch sources it imports (2.1 s of the 4.5 s first backward, evidence/gpu/probe-h200-timeline);
# pip compiles a wheel's bytecode when it installs it.  This runs the whole suite alternately as
# the machine is ("source") and with torch's bytecode compiled once into a private prefix
# (PYTHONPYCACHEPREFIX; nothing is written into site-packages), as a pip-installed torch has it
# ("bytecode").  Writes under $OUT.  Run from the repository root.
set -u
OUT=${OUT:-/tmp/probe-bytecode}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
PREFIX="$OUT/pycache"
TORCH_DIR=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
start=$("$PY" -c 'import time; print(time.time())')
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$PREFIX" "$PY" -m compileall -q -j 0 "$TORCH_DIR" \
  "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" patcher > "$OUT/compileall.log" 2>&1
"$PY" -c 'import json, sys, time; print(json.dumps({"compileall_s": round(time.time() - float(sys.argv[1]), 1),
  "pyc_files": int(sys.argv[2])}))' "$start" "$(find "$PREFIX" -name '*.pyc' | wc -l)" > "$OUT/compileall.json"
probe_run() {  # probe_run NAME ROUND [ENV...]
  env "${@:3}" PATCHER_PROBE_TRACE="$OUT/trace-$1-$2.json" PYTHONPATH=. /usr/bin/time -f "%e" -o "$OUT/wall-$1-$2.txt" \
    "$PY" -m patcher.probe --quiet --json "$OUT/probe-$1-$2.json" > "$OUT/stdout-$1-$2.txt" 2>&1
}
for round in $(seq "$ROUNDS"); do
  probe_run source "$round"
  probe_run bytecode "$round" -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$PREFIX"
done
"$PY" - "$OUT" <<'PYEOF' > "$OUT/summary.json"
import glob, json, os, statistics, sys
out = sys.argv[1]
walls = {}
for path in sorted(glob.glob(os.path.join(out, "wall-*.txt"))):
    name = os.path.basename(path)[5:-4].rsplit("-", 1)[0]
    walls.setdefault(name, []).append(float(open(path).read().split()[-1]))
summary = {"wall_s": walls, "median_s": {k: statistics.median(v) for k, v in walls.items()}}
summary["ratio_source_over_bytecode"] = round(summary["median_s"]["source"] / summary["median_s"]["bytecode"], 2)
for path in sorted(glob.glob(os.path.join(out, "probe-*.json"))):
    report = json.load(open(path))
    summary.setdefault("passed", {})[os.path.basename(path)] = [report.get("passed"), report.get("summary")]
summary.update(json.load(open(os.path.join(out, "compileall.json"))))
print(json.dumps(summary, indent=1))
PYEOF
cat "$OUT/summary.json"
