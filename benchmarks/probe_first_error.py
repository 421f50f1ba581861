"""What the first error out of torch's C++ costs in a fresh process (issue 22's probe time).

Each variant runs in a fresh interpreter: import torch, then a C++ error on the CPU (a bad
view), another, then on the GPU a CUDA op that raises under use_deterministic_algorithms, and
another; each timed.  Variants differ only in environment variables that steer how torch
renders the C++ backtrace of an error.  Prints one JSON document.

    python3 benchmarks/probe_first_error.py > first-error.json
"""
import json
import os
import subprocess
import sys

CHILD = r'''
import json, time
t = time.time(); import torch; out = {"import_torch": time.time() - t}
def timed(name, fn):
    t = time.time()
    try:
        fn()
        out[name] = "no error"
    except RuntimeError as exc:
        out[name] = round(time.time() - t, 4)
        out[name + "_message_chars"] = len(str(exc))
timed("cpu_error_1", lambda: torch.ones(2).view(3))
timed("cpu_error_2", lambda: torch.ones(2).view(5))
if torch.cuda.is_available():
    t = time.time(); torch.zeros(1, device="cuda"); torch.cuda.synchronize(); out["cuda_start"] = time.time() - t
    torch.use_deterministic_algorithms(True)
    x = torch.rand(1000, device="cuda")
    timed("cuda_flag_error_1", lambda: torch.histc(x, 10))
    timed("cuda_flag_error_2", lambda: torch.histc(x, 20))
print(json.dumps(dict((k, round(v, 4) if isinstance(v, float) else v) for k, v in out.items())))
'''

VARIANTS = {
    "default": {},
    "TORCH_SHOW_CPP_STACKTRACES=0": {"TORCH_SHOW_CPP_STACKTRACES": "0"},
    "TORCH_SHOW_CPP_STACKTRACES=1": {"TORCH_SHOW_CPP_STACKTRACES": "1"},
    "TORCH_DISABLE_ADDR2LINE=1": {"TORCH_DISABLE_ADDR2LINE": "1"},
    "TORCH_SYMBOLIZE_MODE=fast": {"TORCH_SYMBOLIZE_MODE": "fast"},
}


def main():
    results = {}
    for _ in (1, 2):
        for name, extra in VARIANTS.items():
            env = dict(os.environ)
            for key in ("TORCH_SHOW_CPP_STACKTRACES", "TORCH_DISABLE_ADDR2LINE", "TORCH_SYMBOLIZE_MODE"):
                env.pop(key, None)
            env.update(extra)
            done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, timeout=120)
            line = done.stdout.decode().strip().splitlines()
            results.setdefault(name, []).append(json.loads(line[-1]) if done.returncode == 0 and line
                                                else {"error": done.stderr.decode()[-800:]})
    print(json.dumps({"python": sys.executable, "results": results}, indent=1))


if __name__ == "__main__":
    main()
