"""Build issue 18's first-half harness extension (det_ext_losses.cu: det_accumulate.cuh and
det_kernels_losses.cuh unchanged; det_ops_losses.cpp: the aten-schema wrappers and the
dispatcher registration). Another extension (build17.py's) can be loaded in the same process:
each has its own register_aten_cuda(), so one run can register them all into aten together."""
import os
import time

from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))


def build(verbose=False):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("MAX_JOBS", "16")
    build_dir = os.environ.get("DETBW18_BUILD_DIR", "/tmp/detbw18_losses_build")
    os.makedirs(build_dir, exist_ok=True)
    t0 = time.time()
    mod = load(
        name="detbw18_losses_ext",
        sources=[os.path.join(HERE, "det_ops_losses.cpp"), os.path.join(HERE, "det_ext_losses.cu")],
        build_directory=build_dir,
        extra_cflags=["-O2"],
        extra_cuda_cflags=["-O3"],
        extra_include_paths=[HERE],
        verbose=verbose,
    )
    return mod, time.time() - t0


def register_aten_cuda(mod):
    """Register this extension's kernels for aten's CUDA key; returns the errors (empty: all)."""
    return mod.register_aten_cuda()


if __name__ == "__main__":
    m, secs = build(verbose=False)
    print("built in %.1f s" % secs, [n for n in dir(m) if not n.startswith("_")])
    print("register:", register_aten_cuda(m))
