"""Build the issue-17 harness extension (det_ext.cu for PT-0201/0202/0222, det_ext17.cu for the
kernels of det_kernels17.cuh, det_ops17.cpp for the bindings and the dispatcher registration).

A second copy of det_ext17.cu is generated into the build directory with the gather kernels'
float accumulation of the earlier version (det_accumulate.cuh without the double specialisation
of det_gather_acc), in namespace detbw17f: the harness measures both, one process, same inputs.
"""
import os
import re

from extension import HERE, build_directory, load_extension, report

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
    build_dir = build_directory("DETBW17_BUILD_DIR", "/tmp/detbw17_build")
    return load_extension("detbw17_ext", ["det_ops17.cpp", "det_ext.cu", "det_ext17.cu",
                                          float_accumulation_variant(build_dir)], build_dir, verbose,
                          extra_cuda_cflags=["-Xptxas=-v"] if verbose else [], extra_include_paths=[build_dir])


if __name__ == "__main__":
    report(build)
