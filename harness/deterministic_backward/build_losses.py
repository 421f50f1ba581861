"""Build issue 18's first-half harness extension (det_ext_losses.cu: det_accumulate.cuh and
det_kernels_losses.cuh unchanged; det_ops_losses.cpp: the aten-schema wrappers and the
dispatcher registration). Another extension (build17.py's) can be loaded in the same process:
each has its own register_aten_cuda(), so one run can register them all into aten together."""
from extension import build_directory, load_extension, report


def build(verbose=False):
    return load_extension("detbw18_losses_ext", ["det_ops_losses.cpp", "det_ext_losses.cu"],
                          build_directory("DETBW18_BUILD_DIR", "/tmp/detbw18_losses_build"), verbose)


if __name__ == "__main__":
    report(build)
