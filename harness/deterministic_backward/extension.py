"""What every build_*.py of the harness shares: JIT-build one torch extension from this folder
(torch.utils.cpp_extension.load, for the H200's sm_90 unless TORCH_CUDA_ARCH_LIST says
otherwise), and its dispatcher registration (det_register.h)."""
import os
import time

from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))


def build_directory(env_var, default):
    """The extension's build folder: ``env_var`` when set (a run keeps several apart), else ``default``."""
    path = os.environ.get(env_var, default)
    os.makedirs(path, exist_ok=True)
    return path


def load_extension(name, sources, build_dir, verbose=False, extra_cuda_cflags=(), extra_include_paths=()):
    """Build (or reuse) extension ``name`` from ``sources`` (names in this folder, or paths);
    returns (module, seconds)."""
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("MAX_JOBS", "16")
    started = time.time()
    module = load(
        name=name,
        sources=[source if os.path.isabs(source) else os.path.join(HERE, source) for source in sources],
        build_directory=build_dir,
        extra_cflags=["-O2"],
        extra_cuda_cflags=["-O3", *extra_cuda_cflags],
        extra_include_paths=[HERE, *extra_include_paths],
        verbose=verbose,
    )
    return module, time.time() - started


def register_aten_cuda(module):
    """Register the extension's kernels for aten's CUDA key; returns the refusals (empty: all)."""
    return module.register_aten_cuda()


def report(build):
    """``python3 build_X.py``: build, list what the module offers, register."""
    module, seconds = build(verbose=False)
    print(f"built in {seconds:.1f} s", [n for n in dir(module) if not n.startswith("_")])
    print("register:", register_aten_cuda(module))
