"""Compile-check stage: compile every translation unit a patch series touches, in the builder
toolchain, with the flags of the real build -- minutes instead of a full build.

How one check runs (``patcher check --compile``):

1. The series of the torch version is parsed; the files it touches that are translation units
   (``.c .cc .cpp .cxx .cu``) are what gets compiled.  Headers and Python files are listed as
   not compiled (a header is compiled through the units that include it).
2. The patched tree: ``--source`` (a tree that holds the whole series), the ``source/`` of a
   build work directory (``patcher build --until configure``), or fetched and patched into the
   check's own work directory.
3. One container of the builder image (the CPU builder of that release; for CUDA, an image
   derived from it with Debian's ``nvidia-cuda-toolkit``, rendered from
   ``dockerfiles/compile-check-cuda.Dockerfile.j2``, built once and reused by its label; one made
   from an older builder of the same build id is removed then) gets the
   tree and the pinned inputs exactly as the build stage copies them, with the build's own
   environment, no network, and ccache off (a cache hit would fake the timing).
4. Configure: PyTorch's ``setup.py build --cmake-only`` (the build's configure stage), with
   ``CMAKE_EXPORT_COMPILE_COMMANDS=ON``: ``build/compile_commands.json`` holds the exact command
   of every compile step of the real build.
5. Code generation: for each object to compile, ninja is asked for its order-only prerequisites
   (``ninja -t query``) and builds those: ATen's torchgen output, the autograd sources, the
   protobuf headers -- what the sources need before they compile, nothing else.
6. C/C++ units compile with their command from compile_commands.json, ``jobs`` at a time.
7. ``.cu`` units: the CPU configure has no CUDA compile steps, so their command is derived (see
   :func:`nvcc_command`): the include paths and definitions of a CPU unit of the same library
   (torch_cpu), plus what 1.13.1's CMake adds for CUDA sources (``cmake/public/cuda.cmake``,
   ``cmake/Dependencies.cmake``): ``-DUSE_CUDA``, the half/bfloat16 guards, ``--expt-relaxed-constexpr``,
   ``--expt-extended-lambda``, ``-Xcudafe --diag_suppress=...``, ``-std=c++14`` (``c++17`` when the
   CPU unit's is gnu++17, as in 2.x), the spec's
   ``TORCH_NVCC_FLAGS`` and one ``-gencode`` per entry of the spec's arch list that the
   installed nvcc can emit (the rest is reported as dropped).  The two headers a CUDA configure
   writes (``ATen/cuda/CUDAConfig.h``, ``c10/cuda/impl/cuda_cmake_macros.h``) are written from
   their ``.in`` templates into the build directory, where a CUDA configure puts them.  Why not a
   CUDA configure: it needs the whole CUDA dependency set of the real build (cuDNN, NCCL,
   NVIDIA's toolkit layout) that Debian's split toolkit does not provide, and the flags that
   decide whether a patched kernel compiles are the ones above.
8. The container is removed whatever happens.  The report lists each unit with pass or fail,
   the compiler's first error line, its output and its time, and an estimate of the full
   build: the mean seconds per unit measured here times the number of compile steps of the
   real build (``build.ninja`` for C/C++, the tree's ``.cu`` files for CUDA), divided by the
   number of units compiled at once.

Exit codes: 0 when every unit compiles; CompileCheckFailedError (90) when one does not;
CompileCheckSetupError (91) when the check itself cannot run (image, configure, codegen, tree).
The stages it calls keep their own codes: an engine that cannot be reached (40/41), a spec the
matrix refuses (1x), a fetch (2x) or a series that does not apply (3x).
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
import shlex
import shutil
import tarfile
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from patcher.config import Settings
from patcher.dockerfile import render_template
from patcher.errors import (
    CompileCheckFailedError,
    CompileCheckSetupError,
    ImageBuildError,
)
from patcher.spec import CPU, BuildSpec, arch_needs_cuda, parse_arch_list, resolve
from patcher.util import Terminated, interrupts_as_exceptions, meaningful_line

TU_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu")
CUDA_SUFFIXES = (".cu",)
CUDA_TEMPLATE = "compile-check-cuda.Dockerfile.j2"
CUDA_IMAGE_REPO = "patcher-compile-check"
LABEL_KEY = "org.patcher.compile-check-key"
LABEL_CHECK = "org.patcher.compile-check"
CONTAINER_SRC = "/src"
BUILD_DIR = "/src/build"
DEFAULT_TIMEOUT = 3600.0

# Debian's CUDA compiler per builder base (suite -> packages, nvcc version, newest compute
# capability it can emit).  bullseye non-free: 11.2.2 (FACTS.md), which accepts gcc <= 10.
DEBIAN_CUDA = {
    "bullseye": {"packages": ("nvidia-cuda-toolkit",), "nvcc": "11.2", "max_compute": "8.6"},
    "bookworm": {"packages": ("nvidia-cuda-toolkit",), "nvcc": "11.8", "max_compute": "9.0"},
    "trixie": {"packages": ("nvidia-cuda-toolkit",), "nvcc": "12.4", "max_compute": "9.0"},
}

# What 1.13.1's CMake adds to CUDA compiles (cmake/public/cuda.cmake, cmake/Dependencies.cmake).
NVCC_DIAG_SUPPRESS = ("cc_clobber_ignored", "integer_sign_change", "useless_using_declaration",
                      "set_but_not_used", "field_without_dll_interface",
                      "base_class_has_different_dll_interface", "dll_interface_conflict_none_assumed",
                      "dll_interface_conflict_dllexport_assumed", "implicit_return_from_non_void_function",
                      "unsigned_compare_with_zero", "declared_but_not_referenced", "bad_friend_decl")
# What every unit of torch_cuda gets in place of CPU_ONLY_DEFINES (.cu and .cpp alike).
CUDA_LIBRARY_DEFINES = ("-DUSE_CUDA", "-DTORCH_CUDA_BUILD_MAIN_LIB", "-Dtorch_cuda_EXPORTS")
NVCC_FIXED_FLAGS = (*CUDA_LIBRARY_DEFINES,
                    "-DCUDA_HAS_FP16=1", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_HALF2_OPERATORS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
                    "-Wno-deprecated-gpu-targets", "--expt-extended-lambda", "--expt-relaxed-constexpr",
                    "-Xcudafe", ",".join(f"--diag_suppress={d}" for d in NVCC_DIAG_SUPPRESS),
                    "-O3", "-DNDEBUG", "-Xcompiler=-fPIC")
# Definitions of the CPU library that must not leak into a CUDA unit of another library.
CPU_ONLY_DEFINES = ("-Dtorch_cpu_EXPORTS", "-DCAFFE2_BUILD_MAIN_LIB")
# The headers a CUDA configure writes from templates (template -> place in the build dir).
CUDA_CONFIGURED_HEADERS = {
    "aten/src/ATen/cuda/CUDAConfig.h.in": "aten/src/ATen/cuda/CUDAConfig.h",
    "c10/cuda/impl/cuda_cmake_macros.h.in": "c10/cuda/impl/cuda_cmake_macros.h",
}
# Directories whose .cu files a CUDA build of torch does not compile (caffe2 is off, tests are off).
CU_EXCLUDED_PREFIXES = ("caffe2/", "test/", "third_party/", "benchmarks/", "modules/", "binaries/",
                        "android/", "ios/", "torch/csrc/deploy/")

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ERROR_LINE_RE = re.compile(r"(\berror\b|fatal error)", re.I)
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)
COMPILE_EDGE_RE = re.compile(r"^build [^:]+\.o: (C|CXX)_COMPILER__", re.M)


# --- the report --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompileCheckOptions:
    torch: str
    cuda: str | None = None  # None: the release's default CUDA (its arch list); "none": C/C++ only
    arch: str | None = None  # overrides the spec's arch list for the .cu units
    source: Path | None = None  # a patched tree
    work: Path | None = None  # a build work dir (source/ reused) or the check's own work dir
    image: str | None = None  # a builder image to use instead of rendering and building one
    patch_ids: tuple[str, ...] = ()  # only the units these patches touch
    jobs: int | None = None  # units compiled at once (None: the engine's CPU count)
    timeout: float = DEFAULT_TIMEOUT  # per container command, seconds


@dataclass(frozen=True)
class UnitResult:
    path: str
    language: str  # "c++" or "cuda"
    patches: tuple[str, ...]
    status: str  # "pass", "fail" or "not-built" (the configuration does not compile it)
    seconds: float
    compiler: str
    flags_from: str  # "compile_commands.json" or "derived from <unit>"
    message: str = ""  # the compiler's first error line (fail), or why not built
    output: str = ""  # the compiler's output (warnings included), trimmed
    command: tuple[str, ...] = ()
    via: str = ""  # the touched header this unit is compiled for (it includes it)


@dataclass(frozen=True)
class BuildEstimate:
    compile_steps_cpp: int
    compile_steps_cuda: int
    mean_seconds_cpp: float | None
    mean_seconds_cuda: float | None
    jobs: int
    estimated_seconds: float | None
    method: str
    estimated_seconds_cpp: float | None = None
    estimated_seconds_cuda: float | None = None


@dataclass(frozen=True)
class CompileCheckReport:
    torch: str
    build_id: str
    cuda: str
    image: str
    cuda_image: str | None
    compilers: dict[str, str]
    gencode: tuple[str, ...]
    arch_dropped: tuple[str, ...]
    tree: str
    head: str
    series: tuple[str, ...]
    units: tuple[UnitResult, ...]
    not_compiled: tuple[dict[str, str], ...]
    durations: dict[str, float]
    estimate: BuildEstimate
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return all(u.status != "fail" for u in self.units)

    @property
    def failed(self) -> list[UnitResult]:
        return [u for u in self.units if u.status == "fail"]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data


@dataclass(frozen=True)
class TranslationUnit:
    path: str
    patches: tuple[str, ...]
    via: str = ""

    @property
    def is_cuda(self) -> bool:
        return self.path.endswith(CUDA_SUFFIXES)

    @property
    def is_cuda_library_cpp(self) -> bool:
        """A C++ file of ATen's CUDA directories (``native/cuda/Sorting.cpp``): torch_cuda compiles
        it with g++ in a CUDA build, and a CPU configure has no compile step for it."""
        parts = self.path.split("/")
        return (not self.is_cuda and self.path.startswith("aten/src/ATen/") and "cuda" in parts[:-1]
                and self.path.endswith(TU_SUFFIXES))

    @property
    def needs_cuda(self) -> bool:
        return self.is_cuda or self.is_cuda_library_cpp


# --- pure logic --------------------------------------------------------------------------------------
def units_of_series(series, patch_ids: tuple[str, ...] = ()) -> tuple[list[TranslationUnit], list[dict[str, str]]]:
    """The translation units a series touches (in series order) and the other files it touches."""
    wanted = set(patch_ids)
    unknown = wanted - set(series.ids)
    if unknown:
        raise CompileCheckSetupError(f"no patch {', '.join(sorted(unknown))} in the series of torch {series.version}",
                                     hint="`patcher patches list --torch " + series.version + "` shows them")
    touched: dict[str, list[str]] = {}
    deleted: set[str] = set()
    for patch in series.patches:
        if wanted and patch.id not in wanted:
            continue
        for change in patch.changes:
            if change.new_path is None:
                deleted.add(change.old_path)
                touched.setdefault(change.old_path, []).append(patch.id)
                continue
            deleted.discard(change.new_path)
            touched.setdefault(change.new_path, []).append(patch.id)
    units, others = [], []
    for path, ids in touched.items():
        ids_t = tuple(dict.fromkeys(ids))
        if path in deleted:
            others.append({"path": path, "patches": ",".join(ids_t), "reason": "deleted by the series"})
        elif path.endswith(TU_SUFFIXES):
            units.append(TranslationUnit(path, ids_t))
        else:
            kind = "header" if path.endswith(HEADER_SUFFIXES) else "not a translation unit"
            others.append({"path": path, "patches": ",".join(ids_t), "reason": kind})
    return units, others


HEADER_SUFFIXES = (".h", ".hpp", ".cuh", ".inl")


def include_spellings(header: str) -> set[str]:
    """How sources may name a header in #include: each tail of its path of two or more parts."""
    parts = header.split("/")
    return {"/".join(parts[i:]) for i in range(len(parts) - 1)}


def direct_includers(header: str, sources: dict[str, str]) -> list[str]:
    """Units (path -> text) that #include ``header`` themselves, sorted by path."""
    spellings = include_spellings(header)
    directory, base = posixpath.split(header)
    found = []
    for path in sorted(sources):
        for m in INCLUDE_RE.finditer(sources[path]):
            name = m.group(1)
            if name in spellings or (name == base and posixpath.dirname(path) == directory):
                found.append(path)
                break
    return found


def compile_entries(data: list[dict[str, Any]], root: str = CONTAINER_SRC) -> dict[str, dict[str, Any]]:
    """compile_commands.json entries keyed by the file's path relative to the tree."""
    out: dict[str, dict[str, Any]] = {}
    prefix = root.rstrip("/") + "/"
    for entry in data:
        file = entry["file"]
        if not posixpath.isabs(file):
            file = posixpath.normpath(posixpath.join(entry["directory"], file))
        if file.startswith(prefix):
            out.setdefault(file[len(prefix):], entry)
    return out


def entry_argv(entry: dict[str, Any]) -> list[str]:
    return list(entry["arguments"]) if entry.get("arguments") else shlex.split(entry["command"])


def entry_output(entry: dict[str, Any]) -> str | None:
    if entry.get("output"):
        return entry["output"]
    argv = entry_argv(entry)
    for i, arg in enumerate(argv[:-1]):
        if arg == "-o":
            return argv[i + 1]
    return None


def count_compile_steps(build_ninja: str) -> int:
    """The C/C++ compile steps of a CMake-generated build.ninja."""
    return len(COMPILE_EDGE_RE.findall(build_ninja))


def order_only_inputs(query_output: str) -> list[str]:
    """The order-only prerequisites in ``ninja -t query TARGET`` output (the ``|| X`` lines)."""
    return [line.strip()[3:].strip() for line in query_output.splitlines() if line.strip().startswith("|| ")]


def gencode_flags(arch_list: str, max_compute: str) -> tuple[list[str], list[str]]:
    """-gencode flags for the arch list entries nvcc can emit, and the entries dropped."""
    def key(cc: str) -> tuple[int, ...]:
        return tuple(int(p) for p in cc.split("."))

    flags, dropped = [], []
    for cc, ptx in parse_arch_list(arch_list):
        if key(cc) > key(max_compute):
            dropped.append(cc + ("+PTX" if ptx else ""))
            continue
        num = cc.replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags, dropped


def host_flags(argv: list[str], directory: str) -> list[str]:
    """Include paths and definitions of a compile command, paths made absolute."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-I", "-isystem", "-D"):
            value = next(args, None)
            if value is None:
                break
            arg = arg + value if arg != "-isystem" else arg
            if arg == "-isystem":
                out += ["-isystem", _absolute(value, directory)]
                continue
        if arg.startswith("-I"):
            out.append("-I" + _absolute(arg[2:], directory))
        elif arg.startswith("-D") and arg not in CPU_ONLY_DEFINES:
            out.append(arg)
    return out


def _absolute(path: str, directory: str) -> str:
    return path if posixpath.isabs(path) else posixpath.normpath(posixpath.join(directory, path))


def nvcc_command(unit: str, reference: dict[str, Any], gencode: list[str], host_compiler: str,
                 nvcc_flags: str | None, output: str) -> list[str]:
    """The nvcc command for a .cu unit, derived from a CPU unit's command (module docstring, 7)."""
    directory = reference["directory"]
    extra = shlex.split(nvcc_flags) if nvcc_flags else []
    argv = entry_argv(reference)
    # The CPU unit's language standard (1.13.1: gnu++14; 2.x: gnu++17) is the CUDA unit's too.
    standard = "-std=c++17" if any(a.startswith("-std=") and a.endswith("++17") for a in argv) else "-std=c++14"
    return ["nvcc", "-ccbin", host_compiler, *host_flags(argv, directory),
            *NVCC_FIXED_FLAGS, standard, *extra, *gencode, "-x", "cu", "-c", f"{CONTAINER_SRC}/{unit}", "-o", output]


def cuda_library_cpp_command(unit: str, reference: dict[str, Any], output: str) -> list[str]:
    """The g++ command for a C++ unit of torch_cuda (``TranslationUnit.is_cuda_library_cpp``):
    the CPU unit's own command (compiler, optimisation, standard, includes) with its source and
    object swapped, torch_cpu's export definitions dropped and torch_cuda's added, as
    ``cmake/Codegen.cmake`` and ``caffe2/CMakeLists.txt`` give them for a CUDA build."""
    argv = entry_argv(reference)
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-o", "-c"):  # the reference's object and source: replaced below
            next(args, None)
            continue
        if arg in CPU_ONLY_DEFINES:
            continue
        out.append(arg)
    return [*out, *CUDA_LIBRARY_DEFINES, "-c", f"{CONTAINER_SRC}/{unit}", "-o", output]


def configure_file(template: str, values: dict[str, str], defined: set[str]) -> str:
    """CMake's configure_file for the two CUDA headers: @VAR@ and #cmakedefine."""
    def cmakedefine(m: re.Match) -> str:
        name = m.group(1)
        return f"#define {name}{m.group(2) or ''}" if name in defined else f"/* #undef {name} */"

    text = re.sub(r"^#cmakedefine\s+(\w+)(.*)$", cmakedefine, template, flags=re.M)
    return re.sub(r"@(\w+)@", lambda m: values.get(m.group(1), ""), text)


def first_error(output: str) -> str:
    """The compiler's first error line (gcc ``file:l:c: error:``, nvcc ``file(l): error:``)."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    for line in lines:
        if ERROR_LINE_RE.search(line) and not line.lstrip().startswith(("In file included", "from ")):
            return line.strip()[:500]
    return (lines[-1].strip() if lines else "the compiler failed without output")[:500]


def trim(text: str, limit: int = 6000) -> str:
    text = ANSI_RE.sub("", text)
    return text if len(text) <= limit else text[:limit // 2] + "\n[...]\n" + text[-limit // 2:]


def cuda_sources(paths: list[str]) -> int:
    """.cu files of the tree that a CUDA build of torch compiles (an estimate: see the docstring)."""
    return sum(1 for p in paths if p.endswith(".cu") and not p.startswith(CU_EXCLUDED_PREFIXES))


def estimate_full_build(units: list[UnitResult], cpp_steps: int, cuda_steps: int, jobs: int) -> BuildEstimate:
    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 2) if values else None

    cpp = mean([u.seconds for u in units if u.status == "pass" and u.language == "c++"])
    cu = mean([u.seconds for u in units if u.status == "pass" and u.language == "cuda"])
    total = part_cpp = part_cu = None
    if cpp is not None:
        part_cpp = round(cpp * cpp_steps / max(jobs, 1), 1)
        part_cu = round(cu * cuda_steps / max(jobs, 1), 1) if cu is not None else None
        total = round(part_cpp + (part_cu or 0.0), 1)
    method = (f"mean wall seconds per unit compiled here ({jobs} at a time) x compile steps of the real "
              f"build ({cpp_steps} C/C++ steps in build.ninja"
              + (f", {cuda_steps} .cu files of the tree a CUDA build compiles" if cu is not None else
                 ", CUDA steps not counted") + f") / {jobs} at a time; the units a patch touches are "
              "mostly ATen and JIT sources, heavier than the average step, so this estimate is high")
    return BuildEstimate(cpp_steps, cuda_steps if cu is not None else 0, cpp, cu, jobs, total, method,
                         part_cpp, part_cu)


# --- the CUDA image ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RenderedCudaImage:
    text: str
    key: str
    tag: str
    labels: dict[str, str]


def render_cuda_image(spec: BuildSpec, builder_ref: str, settings: Settings, cuda_spec: BuildSpec | None = None,
                      ) -> RenderedCudaImage:
    """The compile-check image: ``builder_ref`` (an image ID pins it) plus Debian's nvcc."""
    debian = DEBIAN_CUDA.get(spec.image.codename)
    if debian is None:
        raise CompileCheckSetupError(
            f"no Debian CUDA compiler is known for base {spec.image.codename} of {spec.build_id}",
            hint="compile-check knows " + ", ".join(sorted(DEBIAN_CUDA)) + "; use --cuda none for C/C++ only")
    labels = {LABEL_CHECK: spec.build_id, "org.patcher.compile-check.builder": builder_ref,
              "org.patcher.compile-check.nvcc": debian["nvcc"]}
    values = {
        "build_id": spec.build_id, "builder_ref": builder_ref, "codename": spec.image.codename,
        "nvcc_version": debian["nvcc"], "cuda_full": (cuda_spec.cuda_full if cuda_spec else None) or "none",
        "apt_packages": list(debian["packages"]), "uid": 1000,
        "labels": {k: json.dumps(v) for k, v in labels.items()},
    }
    text = render_template(settings, CUDA_TEMPLATE, values)
    key = hashlib.sha256(text.encode()).hexdigest()
    return RenderedCudaImage(text=text, key=key, tag=f"{CUDA_IMAGE_REPO}:{key[:16]}",
                             labels={**labels, LABEL_KEY: key})


def ensure_cuda_image(engine, rendered: RenderedCudaImage, on_log: Callable[[str], None] | None = None) -> tuple[str, bool]:
    """The image ID, built when no image carries the rendered key; (id, built)."""
    from patcher.container import ContainerError
    from patcher.dockerfile import RenderedDockerfile, build_image

    try:
        labels = engine.image_labels(rendered.tag)
    except ContainerError as exc:
        raise CompileCheckSetupError(str(exc)) from None
    if labels is not None and labels.get(LABEL_KEY) == rendered.key:
        return engine.image_id(rendered.tag), False
    as_dockerfile = RenderedDockerfile(text=rendered.text, sha256=rendered.key, image_tag=rendered.tag,
                                       build_id=rendered.labels[LABEL_CHECK], labels=rendered.labels)
    try:
        image_id = build_image(engine, as_dockerfile, on_log=on_log)
    except ImageBuildError as exc:
        raise CompileCheckSetupError(f"the compile-check CUDA image: {exc.message}",
                                     hint="the builder base needs contrib/non-free in its Debian archive") from None
    _remove_superseded(engine, rendered, image_id)
    return image_id, True


def _remove_superseded(engine, rendered: RenderedCudaImage, keep: str) -> None:
    """Remove this build's older compile-check images (about 5 GB each, made from a builder that
    has since changed); one still used by a container stays."""
    for image_id, labels in engine.images_with_label(f"{LABEL_CHECK}={rendered.labels[LABEL_CHECK]}"):
        if image_id != keep and labels.get(LABEL_KEY) != rendered.key:
            engine.remove_image(image_id)


# --- the check ---------------------------------------------------------------------------------------
def _read_required(container, path: str) -> bytes:
    data = container.read_file(path)
    if data is None:
        raise CompileCheckSetupError(f"{path} was not written in the container", hint="did the configure run CMake?")
    return data


# --- pieces of the check ------------------------------------------------------------------------
def header_units(units: list[TranslationUnit], others: list[dict[str, str]],
              entries: dict[str, dict[str, Any]], tree: Path, tree_paths: list[str]) -> list[TranslationUnit]:
    """For each touched header, one C/C++ unit of this build that includes it directly.

    A unit the series touches is preferred (it is compiled anyway), then the header's own
    source (same directory and name), then the first including unit by path that
    compile_commands.json builds.
    """
    headers = [o for o in others if o["reason"] == "header"]
    if not headers:
        return []
    sources: dict[str, str] = {}
    for path in tree_paths:
        if path.endswith(TU_SUFFIXES) and not path.endswith(CUDA_SUFFIXES) and path in entries:
            try:
                sources[path] = (tree / path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
    compiled = {u.path for u in units}
    extra: list[TranslationUnit] = []
    for other in headers:
        includers = direct_includers(other["path"], sources)
        stem = posixpath.splitext(other["path"])[0]
        chosen = (next((p for p in includers if p in compiled), None)
                  or next((p for p in includers if posixpath.splitext(p)[0] == stem), None)
                  or next(iter(includers), None))
        if chosen is None:
            other["reason"] = "header: no unit of this configuration includes it directly"
            continue
        other["reason"] = f"header: compiled through {chosen}"
        if chosen not in compiled:
            compiled.add(chosen)
            extra.append(TranslationUnit(chosen, tuple(other["patches"].split(",")), via=other["path"]))
    return extra


def tree_relative(entry: dict[str, Any]) -> str:
    file = entry["file"]
    return file[len(CONTAINER_SRC) + 1:] if file.startswith(CONTAINER_SRC + "/") else file


def reference_entry(entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A torch_cpu unit of ATen: its include paths and definitions are those of torch_cuda's."""
    for path in sorted(entries):
        out = entry_output(entries[path]) or ""
        if path.startswith("aten/src/ATen/native/") and "torch_cpu.dir" in out:
            return entries[path]
    raise CompileCheckSetupError("compile_commands.json has no torch_cpu unit of aten/src/ATen/native to "
                                 "derive the CUDA flags from", hint="is this a PyTorch tree?")


def write_cuda_headers(container, tree: Path, gencode: list[str]) -> None:
    values = {"AT_CUDNN_ENABLED": "0", "AT_ROCM_ENABLED": "0", "AT_MAGMA_ENABLED": "0",
              "NVCC_FLAGS_EXTRA": " ".join(gencode)}
    files: dict[str, bytes] = {}
    for template, dest in CUDA_CONFIGURED_HEADERS.items():
        path = tree / template
        if not path.is_file():
            raise CompileCheckSetupError(f"{template} is missing from the tree: cannot configure the CUDA headers")
        files[dest] = configure_file(path.read_text(encoding="utf-8"), values,
                                     {"C10_CUDA_BUILD_SHARED_LIBS"}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for dest, data in files.items():
            info = tarfile.TarInfo(dest)
            info.size, info.uid, info.gid, info.mode = len(data), 1000, 1000, 0o644
            tar.addfile(info, io.BytesIO(data))
    container.put_archive(BUILD_DIR, buf.getvalue())


class CompileCheck:
    def __init__(self, settings: Settings, options: CompileCheckOptions,
                 on_log: Callable[[str], None] | None = None):
        self.settings, self.options = settings, options
        self.log = on_log or (lambda _text: None)
        self.notes: list[str] = []
        self.durations: dict[str, float] = {}

    # -- inputs ----------------------------------------------------------------------------------
    def _specs(self) -> tuple[BuildSpec, BuildSpec | None]:
        opts = self.options
        spec = resolve(self.settings, opts.torch, cuda=CPU)
        wanted = opts.cuda
        if wanted is not None and wanted.lower() in ("none", "cpu"):
            if opts.arch:
                raise arch_needs_cuda()
            return spec, None
        cuda_spec = resolve(self.settings, opts.torch, cuda=wanted, arch=opts.arch)
        return spec, (None if cuda_spec.is_cpu else cuda_spec)

    def _tree(self, spec: BuildSpec, series) -> Path:
        from patcher import patches as patches_mod
        from patcher import source as source_mod
        from patcher.errors import PatcherError

        opts = self.options
        if opts.source is not None:
            tree = Path(opts.source).absolute()
            if not tree.is_dir():
                raise CompileCheckSetupError(f"source tree {tree} does not exist",
                                             hint="give --source a tree `patcher patches apply` patched")
        else:
            work = Path(opts.work) if opts.work else Path(self.settings.work_dir) / f"compile-check-{spec.build_id}"
            tree = (work / "source").absolute()
            if not tree.exists() and (work / "record.json").is_file():
                raise CompileCheckSetupError(f"the build in {work} has no source tree yet",
                                             hint=f"run `patcher build --torch {spec.torch} --until patch` for it first")
            if not tree.exists():
                self.log(f"fetching {spec.tag} into {tree}\n")
                started = time.monotonic()
                source_mod.fetch(spec, self.settings, tree)
                try:
                    patched = patches_mod.apply_series(series, tree)
                except BaseException:
                    shutil.rmtree(tree, ignore_errors=True)  # no unpatched tree left to be taken for a patched one
                    raise
                self.durations["fetch_and_patch"] = round(time.monotonic() - started, 1)
                self.log(f"applied {len(patched.patches)} patch(es): {', '.join(series.ids)}\n")
                return tree
        try:
            check = patches_mod.check_series(series, tree)
        except PatcherError as exc:
            raise CompileCheckSetupError(f"cannot tell whether {tree} holds the series of torch {series.version}: "
                                         f"{exc.message}", hint=exc.hint or "give a clean tree that "
                                         "`patcher patches apply` patched") from None
        if not check.already_applied:
            raise CompileCheckSetupError(f"{tree} does not hold the series of torch {series.version} "
                                         f"({len(series.patches)} patches): it applies, so it is not applied yet",
                                         hint=f"run `patcher patches apply --torch {series.version} --source {tree}` first")
        return tree

    def _builder_image(self, engine, spec: BuildSpec) -> str:
        import patcher.dockerfile as dockerfile

        if self.options.image:
            image_id = engine.image_id(self.options.image)
            if image_id is None:
                raise CompileCheckSetupError(f"image {self.options.image} does not exist",
                                             hint="build it, or leave out --image to render and build the builder")
            return image_id
        work = Path(self.options.work) if self.options.work else None
        record = work / "record.json" if work else None
        if record is not None and record.is_file():
            recorded = json.loads(record.read_text(encoding="utf-8")).get("image_id")
            if recorded and engine.image_id(recorded):
                return engine.image_id(recorded)
        rendered = dockerfile.render(spec, self.settings)
        existing = engine.image_id(rendered.image_tag)
        if existing:
            return existing
        self.log(f"building the builder image {rendered.image_tag}\n")
        started = time.monotonic()
        try:
            image_id = dockerfile.build_image(engine, rendered, on_log=self.log)
        except ImageBuildError as exc:
            raise CompileCheckSetupError(f"the builder image: {exc.message}") from None
        self.durations["builder_image"] = round(time.monotonic() - started, 1)
        return image_id

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> CompileCheckReport:
        with interrupts_as_exceptions():
            try:
                return self._run()
            except Terminated:
                raise KeyboardInterrupt from None  # the container is gone: say "interrupted" as on Ctrl-C

    def _run(self) -> CompileCheckReport:
        from patcher import patches as patches_mod
        from patcher.buildenv import BUILD_USER, container_environment, source_archive
        from patcher.container import Container, ContainerConfig, ContainerError, Engine
        from patcher.gitrun import run_git
        from patcher.inputs import tree_inputs
        from patcher.source import tracked_files

        started = time.monotonic()
        spec, cuda_spec = self._specs()
        series = patches_mod.load_series(self.settings.patches_dir, self.options.torch)
        units, others = units_of_series(series, self.options.patch_ids)
        if not cuda_spec:
            for u in [u for u in units if u.needs_cuda]:
                reason = "CUDA unit, --cuda none" if u.is_cuda else "C++ unit of torch_cuda, --cuda none"
                others.append({"path": u.path, "patches": ",".join(u.patches), "reason": reason})
            units = [u for u in units if not u.needs_cuda]
        tree = self._tree(spec, series)
        head = run_git("rev-parse", "HEAD", cwd=tree).stdout.strip()
        tree_paths = [p for _m, _o, p in tracked_files(tree)]

        with Engine.connect(self.settings.docker_host) as engine:
            try:
                image = self._builder_image(engine, spec)
                cuda_image = None
                if cuda_spec and any(u.needs_cuda for u in units):
                    rendered = render_cuda_image(spec, image, self.settings, cuda_spec)
                    t = time.monotonic()
                    cuda_image, built = ensure_cuda_image(engine, rendered, on_log=self.log)
                    if built:
                        self.durations["cuda_image"] = round(time.monotonic() - t, 1)
            except ContainerError as exc:
                raise CompileCheckSetupError(str(exc)) from None
            jobs = self.options.jobs or engine.cpu_count()
            env = container_environment(spec, jobs, 0)
            env.update({"CCACHE_DISABLE": "1", "CMAKE_EXPORT_COMPILE_COMMANDS": "ON"})
            config = ContainerConfig(image=cuda_image or image, user=BUILD_USER, env=env, workdir=CONTAINER_SRC,
                                     labels={LABEL_CHECK: spec.build_id},
                                     name=f"patcher-compile-check-{spec.torch}-{uuid.uuid4().hex[:8]}")
            with tempfile.TemporaryDirectory(prefix="patcher-compile-check-") as tmp:
                archive = Path(tmp) / "source.tar"
                source_archive(tree, tree_inputs(spec.inputs, self.settings), 0, archive)
                try:
                    with Container(engine, config) as container:
                        with open(archive, "rb") as fh:
                            container.put_archive(CONTAINER_SRC, fh)
                        archive.unlink()
                        container.start()
                        return self._in_container(container, spec, cuda_spec, units, others, tree, head, series,
                                                  tree_paths, image, cuda_image, jobs, started)
                except ContainerError as exc:
                    raise CompileCheckSetupError(f"the compile-check container failed: {exc}") from None

    def _step(self, container, name: str, argv: list[str], workdir: str = CONTAINER_SRC) -> str:
        self.log(f"{name} ...\n")
        code, output, seconds = self._exec(container, argv, workdir=workdir)
        self.durations[name] = round(seconds, 1)
        if code != 0:
            what = "ran past its time limit" if code in (124, 137) else f"failed (exit {code})"
            raise CompileCheckSetupError(f"{name} {what}: {meaningful_line(output)}",
                                         hint="the unpatched tree must configure in the builder image; "
                                              "see `patcher build --until configure`")
        self.log(f"{name}: {seconds:.0f} s\n")
        return output

    def _in_container(self, container, spec, cuda_spec, units, others, tree, head, series,
                      tree_paths, image, cuda_image, jobs, started) -> CompileCheckReport:
        self._step(container, "configure", ["bash", "-c", '"${PATCHER_PYTHON:-python3}" setup.py build --cmake-only'])
        entries = compile_entries(json.loads(_read_required(container, f"{BUILD_DIR}/compile_commands.json")))
        cpp_steps = count_compile_steps(_read_required(container, f"{BUILD_DIR}/build.ninja").decode("utf-8", "replace"))

        compilers = {"c++": self._version(container, ["bash", "-c", '"${CXX:-g++}" --version | head -n 1'])}
        plans: list[tuple[TranslationUnit, list[str], str, str] | UnitResult] = []
        reference = None
        gencode: list[str] = []
        dropped: list[str] = []
        if any(u.needs_cuda for u in units):
            reference = reference_entry(entries)
            debian = DEBIAN_CUDA[spec.image.codename]
            gencode, dropped = gencode_flags(cuda_spec.arch_list or "", debian["max_compute"])
            if dropped:
                self.notes.append(f"arch list entries {', '.join(dropped)} dropped: nvcc {debian['nvcc']} "
                                  f"emits compute capabilities up to {debian['max_compute']}")
            if not gencode:
                raise CompileCheckSetupError(f"no entry of the arch list {cuda_spec.arch_list!r} can be compiled "
                                             f"by nvcc {debian['nvcc']}", hint="give --arch with older entries")
            compilers["nvcc"] = self._version(container, ["bash", "-c", "nvcc --version | grep -i release"])
            write_cuda_headers(container, tree, gencode)
        host = f"g++-{spec.gcc}"
        units = units + header_units(units, others, entries, tree, tree_paths)
        order_only: list[str] = []
        for unit in units:
            if unit.is_cuda:
                obj = f"{BUILD_DIR}/compile-check-cuda/{unit.path}.o"
                argv = nvcc_command(unit.path, reference, gencode, host, cuda_spec.nvcc_flags, obj)
                plans.append((unit, argv, BUILD_DIR, f"derived from {tree_relative(reference)}"))
                order_only += self._prerequisites(container, entry_output(reference))
                continue
            entry = entries.get(unit.path)
            if entry is None and unit.is_cuda_library_cpp and reference is not None:
                obj = f"{BUILD_DIR}/compile-check-cuda/{unit.path}.o"
                plans.append((unit, cuda_library_cpp_command(unit.path, reference, obj), reference["directory"],
                              f"derived from {tree_relative(reference)} (torch_cuda definitions)"))
                order_only += self._prerequisites(container, entry_output(reference))
                continue
            if entry is None:
                plans.append(UnitResult(unit.path, "c++", unit.patches, "not-built", 0.0, compilers["c++"], "-",
                                        message="not compiled by this build's configuration"))
                continue
            plans.append((unit, entry_argv(entry), entry["directory"], "compile_commands.json"))
            order_only += self._prerequisites(container, entry_output(entry))
        targets = list(dict.fromkeys(order_only))
        if targets:
            self._step(container, "codegen", ["ninja", "-j", str(jobs), *targets], workdir=BUILD_DIR)
        else:
            self.durations["codegen"] = 0.0

        compile_started = time.monotonic()
        todo = [p for p in plans if not isinstance(p, UnitResult)]

        def compile_one(plan) -> UnitResult:
            unit, argv, workdir, flags_from = plan
            if unit.needs_cuda:
                self._exec(container, ["mkdir", "-p", posixpath.dirname(argv[-1])])
            self.log(f"compiling {unit.path}\n")
            code, output, seconds = self._exec(container, argv, workdir=workdir)
            status = "pass" if code == 0 else "fail"
            message = "" if code == 0 else (
                "the compiler ran past its time limit" if code in (124, 137) else first_error(ANSI_RE.sub("", output)))
            compiler = compilers["nvcc"] if unit.is_cuda else compilers["c++"]
            self.log(f"{status} {unit.path} ({seconds:.0f} s)\n")
            return UnitResult(unit.path, "cuda" if unit.is_cuda else "c++", unit.patches, status, round(seconds, 1),
                              compiler, flags_from, message, trim(output), tuple(argv), unit.via)

        # Not `with`: on Ctrl-C/SIGTERM the queued units are cancelled and the container goes at
        # once (removing it ends the compiles still running), instead of waiting for all of them.
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            compiled = iter([f.result() for f in [pool.submit(compile_one, plan) for plan in todo]])
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        results = [next(compiled) if not isinstance(p, UnitResult) else p for p in plans]
        self.durations["compile"] = round(time.monotonic() - compile_started, 1)
        self.durations["total"] = round(time.monotonic() - started, 1)
        estimate = estimate_full_build(results, cpp_steps, cuda_sources(tree_paths), jobs)
        return CompileCheckReport(
            torch=spec.torch, build_id=spec.build_id, cuda=cuda_spec.cuda if cuda_spec else CPU, image=image,
            cuda_image=cuda_image, compilers=compilers, gencode=tuple(gencode), arch_dropped=tuple(dropped),
            tree=str(tree), head=head, series=tuple(series.ids), units=tuple(results),
            not_compiled=tuple(others), durations=dict(self.durations), estimate=estimate, notes=tuple(self.notes))

    # -- helpers ---------------------------------------------------------------------------------
    def _prerequisites(self, container, output: str | None) -> list[str]:
        if not output:
            return []
        code, text, _ = self._exec(container, ["ninja", "-t", "query", output], workdir=BUILD_DIR)
        if code != 0:
            raise CompileCheckSetupError(f"ninja does not know {output}: {meaningful_line(text)}")
        return order_only_inputs(text)

    def _exec(self, container, argv: list[str], workdir: str = CONTAINER_SRC) -> tuple[int, str, float]:
        """Run argv in the check's container under the per-command time limit."""
        done = container.exec(argv, workdir=workdir, timeout=self.options.timeout)
        return done.exit_code, done.output, done.seconds

    def _version(self, container, argv: list[str]) -> str:
        code, text, _ = self._exec(container, argv)
        return text.strip().splitlines()[-1].strip() if code == 0 and text.strip() else "unknown"



def check_compile(settings: Settings, options: CompileCheckOptions,
                  on_log: Callable[[str], None] | None = None) -> CompileCheckReport:
    """Run the check and return its report (a failed unit is in the report, not raised)."""
    return CompileCheck(settings, options, on_log).run()


def raise_for_failures(report: CompileCheckReport) -> None:
    failed = report.failed
    if failed:
        detail = "; ".join(f"{u.path}: {u.message}" for u in failed)
        raise CompileCheckFailedError(f"{len(failed)} of {len(report.units)} unit(s) do not compile: {detail}",
                                      hint="the compiler's output is in the report (--json)")


def write_report(report: CompileCheckReport, path: Path, command: list[str] | None = None) -> None:
    """The report as JSON (temp file + rename), with the command that made it."""
    from patcher.util import write_atomic

    data = report.to_json()
    if command is not None:
        data = {"command": command, **data}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
