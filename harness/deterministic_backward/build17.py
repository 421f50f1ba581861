"""Build the issue-17 harness extension (det_ext.cu for PT-0201/0202, det_ext17.cu for the
kernels of det_kernels17.cuh, det_ops17.cpp for the bindings and the dispatcher registration)."""
import os
import time

from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))


def build(verbose=False):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("MAX_JOBS", "8")
    build_dir = os.environ.get("DETBW17_BUILD_DIR", "/tmp/detbw17_build")
    os.makedirs(build_dir, exist_ok=True)
    t0 = time.time()
    mod = load(
        name="detbw17_ext",
        sources=[os.path.join(HERE, "det_ops17.cpp"), os.path.join(HERE, "det_ext.cu"),
                 os.path.join(HERE, "det_ext17.cu")],
        build_directory=build_dir,
        extra_cflags=["-O2"],
        extra_cuda_cflags=["-O3", "-Xptxas=-v"] if verbose else ["-O3"],
        extra_include_paths=[HERE],
        verbose=verbose,
    )
    return mod, time.time() - t0


if __name__ == "__main__":
    m, secs = build(verbose=False)
    print("built in %.1f s" % secs, [n for n in dir(m) if not n.startswith("_")])
    print("register:", m.register_aten_cuda())
