"""Build the issue-17 harness extension (det_ext.cu for PT-0201/0202/0222, det_ext17.cu for the
kernels of det_kernels17.cuh, det_ops17.cpp for the bindings and the dispatcher registration).

A second copy of det_ext17.cu is generated into the build directory with the gather kernels'
float accumulation of the earlier version (det_accumulate.cuh without the double specialisation
of det_gather_acc), in namespace detbw17f: the harness measures both, one process, same inputs.
"""
import os
import re
import time

from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))
DOUBLE_SPECIALISATION = "template <>\nstruct det_gather_acc<float> {\n  using type = double;\n};\n"


def write_if_changed(path, text):
    if os.path.exists(path) and open(path).read() == text:
        return  # keep the mtime: no rebuild
    with open(path, "w") as f:
        f.write(text)


def float_accumulation_variant(build_dir):
    """det_ext17.cu and its headers with fp32 gathers accumulating in float, as a new unit."""
    acc = open(os.path.join(HERE, "det_accumulate.cuh")).read()
    if acc.count(DOUBLE_SPECIALISATION) != 1:
        raise SystemExit("det_accumulate.cuh: the det_gather_acc<float> specialisation is not where build17 expects it")
    write_if_changed(os.path.join(build_dir, "det_accumulate_floatacc.cuh"), acc.replace(DOUBLE_SPECIALISATION, ""))
    unit = open(os.path.join(HERE, "det_ext17.cu")).read()
    unit = unit.replace('#include "det_accumulate.cuh"', '#include "det_accumulate_floatacc.cuh"')
    unit = re.sub(r"\bdetbw17(?=[_:\s])", "detbw17f", unit)
    path = os.path.join(build_dir, "det_ext17_floatacc.cu")
    write_if_changed(path, unit)
    return path


def build(verbose=False):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("MAX_JOBS", "16")
    build_dir = os.environ.get("DETBW17_BUILD_DIR", "/tmp/detbw17_build")
    os.makedirs(build_dir, exist_ok=True)
    t0 = time.time()
    mod = load(
        name="detbw17_ext",
        sources=[os.path.join(HERE, "det_ops17.cpp"), os.path.join(HERE, "det_ext.cu"),
                 os.path.join(HERE, "det_ext17.cu"), float_accumulation_variant(build_dir)],
        build_directory=build_dir,
        extra_cflags=["-O2"],
        extra_cuda_cflags=["-O3", "-Xptxas=-v"] if verbose else ["-O3"],
        extra_include_paths=[HERE, build_dir],
        verbose=verbose,
    )
    return mod, time.time() - t0


if __name__ == "__main__":
    m, secs = build(verbose=False)
    print("built in %.1f s" % secs, [n for n in dir(m) if not n.startswith("_")])
    print("register:", m.register_aten_cuda())
