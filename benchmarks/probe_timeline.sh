#!/bin/bash
# Where the probe's wall time goes on a GPU machine (issue 22): interpreter + torch import, the
# CUDA start in a fresh process (lazy and eager module loading), the GPU's persistence mode, and
# the whole suite's timeline with workers (PATCHER_PROBE_TRACE), twice, then once more with
# every determinism kernel registered.  Writes under $OUT.  Run from the repository root.
set -u
OUT=${OUT:-/tmp/probe-timeline}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,persistence_mode,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
start_cost() {  # start_cost LABEL [ENV=...]
  env "${@:2}" "$PY" - "$1" <<'PYEOF' >> "$OUT/cuda-start.jsonl"
import json, sys, time
t0 = time.time()
import torch
t1 = time.time()
torch.cuda.init()
t2 = time.time()
x = torch.ones(1024, device="cuda")
torch.cuda.synchronize()
t3 = time.time()
(x * 2).sum().item()
torch.nn.functional.max_pool2d(torch.ones(1, 1, 8, 8, device="cuda"), 2).sum().item()
t4 = time.time()
print(json.dumps({"label": sys.argv[1], "import_torch_s": round(t1 - t0, 3), "cuda_init_s": round(t2 - t1, 3),
                  "first_tensor_s": round(t3 - t2, 3), "first_ops_s": round(t4 - t3, 3)}))
PYEOF
}
"$PY" benchmarks/probe_first_error.py > "$OUT/first-error.json" 2>&1
for round in $(seq "${START_ROUNDS:-2}"); do
  start_cost "lazy-$round"
  start_cost "eager-$round" CUDA_MODULE_LOADING=EAGER
done
# the suite with its timeline, alternating: as it runs by default (whole modules) and with the
# determinism module cut into runs of 12 checks per worker; and a note of how this machine's
# Python treats bytecode (the H200 machine sets PYTHONDONTWRITEBYTECODE and its torch has no
# __pycache__: every process compiles the torch sources it imports)
probe_run() {  # probe_run NAME ROUND [ENV=...]
  env PATCHER_PROBE_TRACE="$OUT/trace-$1-$2.json" PYTHONPATH=. "${@:3}" /usr/bin/time -f "%e" -o "$OUT/wall-$1-$2.txt" \
    "$PY" -m patcher.probe --quiet --json "$OUT/probe-$1-$2.json" > /dev/null 2>&1
}
"$PY" -c 'import sys, os, torch; print({"dont_write_bytecode": sys.flags.dont_write_bytecode, "torch_pycache": os.path.isdir(os.path.join(os.path.dirname(torch.__file__), "__pycache__")), "PYTHON_env": {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}})' > "$OUT/bytecode.txt" 2>&1
for round in $(seq "${SUITE_ROUNDS:-2}"); do
  probe_run default "$round"
  probe_run group12 "$round" PATCHER_PROBE_GROUP_SIZE=12
done
# the parts of the long checks, in one process each
"$PY" - > "$OUT/parts.json" <<'PYEOF'
import json, sys, time
sys.path.insert(0, ".")
parts = {}
t = time.time(); import torch; parts["import_torch"] = time.time() - t
t = time.time(); torch.zeros(1, device="cuda"); torch.cuda.synchronize(); parts["cuda_start"] = time.time() - t
from patcher.probe.checks import determinism as d, maxpool as m
t = time.time(); x = d._randn(torch, (32, 256, 33, 33), 1, "cpu", True); parts["randn_cpu_adaptive_input"] = time.time() - t
for name in ("first", "second"):
    t = time.time(); d.measure(torch, d.op_adaptive_max_pool2d); torch.cuda.synchronize()
    parts["measure_adaptive_max_pool2d_" + name] = time.time() - t
t = time.time(); m.large_channel_results(torch); parts["large_channel_results"] = time.time() - t
t = time.time(); import torch.fx.experimental.proxy_tensor; parts["import_proxy_tensor"] = time.time() - t
from torch.fx.experimental.proxy_tensor import make_fx
t = time.time()
try:
    make_fx(lambda x: x.random_(3, 7))(torch.zeros(4))
except SyntaxError:  # stock torch: CVE-2025-55553's defect
    pass
parts["make_fx_random"] = time.time() - t
print(json.dumps(dict((k, round(v, 3)) for k, v in parts.items()), indent=1))
PYEOF
