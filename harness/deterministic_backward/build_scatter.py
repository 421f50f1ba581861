"""Build the issue-18 scatter_reduce / scatter(reduce=) / index_reduce harness extension:
det_ext_scatter.cu (det_kernels_scatter.cuh, sorted with cub) and det_ops_scatter.cpp
(aten-schema wrappers, pybind functions, register_aten_cuda())."""
from extension import build_directory, load_extension, report


def build(verbose=False):
    return load_extension("detbw18c_ext", ["det_ops_scatter.cpp", "det_ext_scatter.cu"],
                          build_directory("DETBW18C_BUILD_DIR", "/tmp/detbw18c_build"), verbose)


if __name__ == "__main__":
    report(build)
