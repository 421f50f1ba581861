"""Build the antialiased interpolation backward harness extension (PT-0232):
det_ext_aa.cu (det_accumulate.cuh, det_kernels_aa.cuh) and det_ops_aa.cpp
(aten-schema wrappers, pybind functions, register_aten_cuda())."""
import os
import time

from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))


def build(verbose=False):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("MAX_JOBS", "16")
    build_dir = os.environ.get("DETBWAA_BUILD_DIR", "/tmp/detbwaa_build")
    os.makedirs(build_dir, exist_ok=True)
    t0 = time.time()
    mod = load(
        name="detbwaa_ext",
        sources=[os.path.join(HERE, "det_ops_aa.cpp"), os.path.join(HERE, "det_ext_aa.cu")],
        build_directory=build_dir,
        extra_cflags=["-O2"],
        extra_cuda_cflags=["-O3"],
        extra_include_paths=[HERE],
        verbose=verbose,
    )
    return mod, time.time() - t0


def register_aten_cuda(mod=None):
    """Register the kernels into aten for the CUDA key; returns the list of errors (empty)."""
    if mod is None:
        mod, _ = build()
    return mod.register_aten_cuda()


if __name__ == "__main__":
    m, secs = build(verbose=False)
    print("built in %.1f s" % secs, [n for n in dir(m) if not n.startswith("_")])
    print("register:", register_aten_cuda(m))
