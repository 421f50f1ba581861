"""Build the antialiased interpolation backward harness extension (PT-0232):
det_ext_aa.cu (det_accumulate.cuh, det_kernels_aa.cuh) and det_ops_aa.cpp
(aten-schema wrappers, pybind functions, register_aten_cuda())."""
from extension import build_directory, load_extension, report


def build(verbose=False):
    return load_extension("detbwaa_ext", ["det_ops_aa.cpp", "det_ext_aa.cu"],
                          build_directory("DETBWAA_BUILD_DIR", "/tmp/detbwaa_build"), verbose)


if __name__ == "__main__":
    report(build)
