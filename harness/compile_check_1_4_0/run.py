"""Compile every translation unit the 1.4.0 series touches, on the patched real v1.4.0 tree, with
Debian bullseye's nvcc 11.2 and g++ 10 (the closest toolchain to CUDA 10.1 + gcc 7 that can be
had here), and record the result as evidence JSON.

Why not `patcher check --compile --torch 1.4.0`: that check configures the tree in the release's
builder image (ubuntu:18.04 + CUDA 10.1 for 1.4.0) and takes each unit's command from CMake's
compile_commands.json.  Neither the ubuntu:18.04 image nor the CUDA 10.1 runfile can be had here,
and a CMake configure of 1.4.0 in a bullseye builder (Python 3.9, CMake 3.18, gcc 10) is not
supported by 1.4.0.  So the commands here are written from 1.4.0's CMake (cmake/public/cuda.cmake,
cmake/Dependencies.cmake: the CUDA half guards, --expt-relaxed-constexpr, --expt-extended-lambda,
-std=c++14; the official arch list 3.7+PTX;5.0;6.0;6.1;7.0;7.5), and the headers CMake would
generate (ATen's Functions.h, NativeFunctions.h, the CUDA config headers, ...) are the ones
PyPI's torch 1.4.0 wheel ships (built from the same tag commit, the cu101 build).  Each unit
compiles to object code (-c), not -fsyntax-only.

Usage (on a host with Docker; the image is made from Debian bullseye with nvidia-cuda-toolkit):
    python3 harness/compile_check_1_4_0/run.py --tree PATCHED_V140_TREE \
        --wheel-include SITE_PACKAGES/torch/include --image IMAGE --out evidence/compile-check-1.4.0.json
"""

import argparse
import json
import subprocess
import sys
import time

CUDA_UNITS = ["aten/src/ATen/native/cuda/DilatedMaxPool2d.cu", "aten/src/ATen/native/cuda/LossCTC.cu"]
CPU_UNITS = [
    "aten/src/ATen/native/LossCTC.cpp",
    "aten/src/ATen/native/mkldnn/Utils.cpp",
    "torch/csrc/jit/vararg_functions.cpp",
    "torch/csrc/jit/mobile/function.cpp",
    "torch/csrc/jit/mobile/interpreter.cpp",
    "aten/src/ATen/native/PackedSequence.cpp",
    "aten/src/ATen/native/RNN.cpp",
]
NOT_UNITS = {"torch/jit/annotations.py": "Python (PT-0101)", "torch/csrc/jit/vararg_functions.h":
             "header: compiled through vararg_functions.cpp, mobile/function.cpp"}
ARCHS = [("37", True), ("50", False), ("60", False), ("61", False), ("70", False), ("75", False)]
# The patched tree first (its headers, vararg_functions.h of PT-0104 among them, are the ones the
# build uses), then the wheel's include directory for what CMake would generate (a first run with
# the wheel first compiled mobile/function.cpp against the wheel's unpatched vararg_functions.h).
INCLUDES = ["-I/src", "-I/src/aten/src", "-I/inc", "-I/inc/TH", "-I/inc/THC", "-I/inc/torch/csrc/api/include",
            "-I/src/third_party/ideep/include", "-I/src/third_party/ideep/mkl-dnn/include"]
DEFINES = ["-DCAFFE2_BUILD_MAIN_LIB", "-DTORCH_BUILD_MAIN_LIB", "-DAT_PARALLEL_OPENMP=1", "-DUSE_CUDA",
           "-DONNX_NAMESPACE=onnx_torch", "-D_GLIBCXX_USE_CXX11_ABI=0"]
CXX = "g++-10"


def gencode():
    out = []
    for cc, ptx in ARCHS:
        out += ["-gencode", "arch=compute_%s,code=sm_%s" % (cc, cc)]
        if ptx:
            out += ["-gencode", "arch=compute_%s,code=compute_%s" % (cc, cc)]
    return out


def command(unit):
    obj = "/tmp/" + unit.replace("/", "_") + ".o"
    if unit.endswith(".cu"):
        return ["nvcc", "-ccbin", CXX, "-c", "/src/" + unit, "-o", obj, "-std=c++14", "-O2",
                "-Xcompiler", "-fPIC", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "--expt-extended-lambda",
                "-Xfatbin", "-compress-all", "-Wno-deprecated-gpu-targets"] + gencode() + DEFINES + INCLUDES
    return [CXX, "-c", "/src/" + unit, "-o", obj, "-std=gnu++14", "-O2", "-fPIC", "-fopenmp"] + DEFINES + INCLUDES


def docker(image, tree, inc, argv, timeout=1800):
    full = ["docker", "run", "--rm", "--network", "none", "-v", "%s:/src:ro" % tree, "-v", "%s:/inc:ro" % inc,
            image] + argv
    return subprocess.run(full, capture_output=True, text=True, timeout=timeout)


def first_error(text):
    for line in text.splitlines():
        if " error" in line or line.startswith("error"):
            return line.strip()[:400]
    return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True)
    ap.add_argument("--wheel-include", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", args.tree, "log", "--format=%H %(trailers:key=Patch-Id,valueonly,separator=)",
                           "7f73f1d591afba823daa4a99a939217fb54d7688..HEAD"], capture_output=True, text=True,
                          check=True).stdout.split("\n")
    image_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", args.image],
                              capture_output=True, text=True, check=True).stdout.strip()
    versions = docker(args.image, args.tree, args.wheel_include,
                      ["sh", "-c", "nvcc --version | tail -2; %s --version | head -1" % CXX]).stdout
    units = []
    for unit in CUDA_UNITS + CPU_UNITS:
        argv = command(unit)
        start = time.monotonic()
        done = docker(args.image, args.tree, args.wheel_include, argv)
        seconds = round(time.monotonic() - start, 1)
        output = (done.stdout + done.stderr)
        units.append({"unit": unit, "compiler": argv[0], "status": "pass" if done.returncode == 0 else "fail",
                      "seconds": seconds, "first_error": first_error(output) if done.returncode else "",
                      "output_tail": output[-3000:], "command": " ".join(argv)})
        print("%s %s %.1f s" % (units[-1]["status"], unit, seconds), file=sys.stderr)
    record = {
        "what": "every translation unit the torch 1.4.0 series touches, compiled to object code on the patched "
                "real v1.4.0 tree (harness/compile_check_1_4_0/run.py; not `patcher check --compile`, see its docstring)",
        "command": " ".join(sys.argv),
        "tree": {"tag_commit": "7f73f1d591afba823daa4a99a939217fb54d7688",
                 "patches": [ln.split(" ", 1)[1] for ln in head if ln.strip()][::-1],
                 "head": head[0].split(" ", 1)[0]},
        "generated_headers": "torch/include of PyPI's torch-1.4.0-cp36-cp36m-manylinux1_x86_64.whl (sha256 "
                             "8856f334aa9ecb742c1504bd2563d0ffb8dceb97149c8d72a04afa357f667dbc), built from the "
                             "same tag commit",
        "toolchain": {"image": args.image, "image_id": image_id, "versions": versions.strip().splitlines(),
                      "from": "Debian bullseye: nvidia-cuda-toolkit (non-free) and g++-10"},
        "differs_from_the_release_toolchain": [
            "nvcc 11.2 instead of CUDA 10.1 (10.1.243): newer front end, CUB/Thrust 1.10 headers instead of 1.9; "
            "sm_37 is deprecated in 11.x (still emitted, warning silenced)",
            "g++ 10 as host compiler instead of gcc 7 (devtoolset-7): stricter C++ front end; 1.4.0 does not "
            "build with gcc 9+ as a whole (#32277, c10/util/LeftRight.h), which a unit compile does not reach",
            "flags written from 1.4.0's CMake, not read from a CMake configure of the tree",
            "generated headers from PyPI's cu101 wheel of the same tag, not generated in this tree",
        ],
        "not_compiled": NOT_UNITS,
        "units": units,
        "passed": sum(u["status"] == "pass" for u in units),
        "failed": sum(u["status"] == "fail" for u in units),
    }
    with open(args.out + ".tmp", "w") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
        fh.write("\n")
    import os
    os.replace(args.out + ".tmp", args.out)
    return 0 if record["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
