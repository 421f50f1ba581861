"""Build the issue-18 (histograms, order statistics, scans) harness extension:
det_ext_reductions.cu (det_accumulate.cuh + det_kernels_reductions.cuh) and
det_ops_reductions.cpp (aten-schema wrappers, pybind functions, register_aten_cuda())."""
from extension import build_directory, load_extension, report


def build(verbose=False):
    return load_extension("detbw18b_ext", ["det_ops_reductions.cpp", "det_ext_reductions.cu"],
                          build_directory("DETBW18B_BUILD_DIR", "/tmp/detbw18b_build"), verbose)


if __name__ == "__main__":
    report(build)
