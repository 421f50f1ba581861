"""The builder image's contract, shared by the build stages and the compile check.

The image (``dockerfiles/builder.Dockerfile.j2``) has the unprivileged user ``builder``, the tree
in ``/src``, ccache in ``/ccache``, wheels in ``/out`` and the interpreter in
``$PATCHER_PYTHON``.  Here: the environment PyTorch's setup.py reads in such a container, the
script that records the toolchain, and the tree as the tar that goes into ``/src``.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from collections.abc import Collection
from pathlib import Path

from patcher.spec import BuildSpec

# The image contract (patcher/dockerfile.py): user builder, the tree in /src, ccache in /ccache,
# wheels in /out, the interpreter in $PATCHER_PYTHON.
BUILD_USER = "builder"
BUILDER_UID = 1000
CONTAINER_SRC = "/src"
CONTAINER_CCACHE = "/ccache"
CONTAINER_OUT = "/out"
TOOLCHAIN_FILE = "/tmp/patcher-toolchain.txt"
LABEL_BUILD = "org.patcher.build-id"
LABEL_STAGE = "org.patcher.stage"
LABEL_WORK_DIR = "org.patcher.work-dir"  # tells concurrent builds of one spec apart
LABEL_CCACHE = "org.patcher.ccache"

TOOLCHAIN_SCRIPT = f"""\
{{
  echo "== gcc"; "${{CC:-gcc}}" --version | head -n 1
  echo "== g++"; "${{CXX:-g++}}" --version | head -n 1
  echo "== python"; "${{PATCHER_PYTHON:-python3}}" --version 2>&1
  if command -v cmake >/dev/null; then echo "== cmake"; cmake --version | head -n 1; fi
  if command -v ninja >/dev/null; then echo "== ninja"; ninja --version; fi
  if command -v ccache >/dev/null; then echo "== ccache"; ccache --version | head -n 1; fi
  if command -v nvcc >/dev/null; then echo "== nvcc"; nvcc --version | tail -n 1; fi
}} > {TOOLCHAIN_FILE} 2>&1 || true
"""


def prefix_map_flag(gcc: int) -> str:
    """Strip the build path from objects: -ffile-prefix-map from gcc 8 on, debug info only before."""
    return "-ffile-prefix-map=/src=." if gcc >= 8 else "-fdebug-prefix-map=/src=."


def container_environment(spec: BuildSpec, jobs: int, source_date_epoch: int) -> dict[str, str]:
    """The variables PyTorch's setup.py reads, plus what makes the build reproducible."""
    flags = prefix_map_flag(spec.gcc)
    env = {
        "MAX_JOBS": str(jobs),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
        "PYTORCH_BUILD_VERSION": spec.wheel_version,
        "PYTORCH_BUILD_NUMBER": str(spec.build_number),
        "USE_CUDA": "0" if spec.is_cpu else "1",
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "PYTHONHASHSEED": "0",
        "CFLAGS": flags,
        "CXXFLAGS": flags,
        # distutils links extensions with sysconfig's LDSHARED (x86_64-linux-gnu-gcc on Debian's
        # Python 3.9, a compiler the image does not have): CC alone does not change it there.
        "LDSHARED": f"gcc-{spec.gcc} -pthread -shared",
        "CCACHE_DIR": CONTAINER_CCACHE,
        "CCACHE_BASEDIR": CONTAINER_SRC,
        "HOME": f"/home/{BUILD_USER}",
    }
    if not spec.is_cpu:
        env["TORCH_CUDA_ARCH_LIST"] = spec.arch_list or ""
        if spec.nvcc_flags:
            env["TORCH_NVCC_FLAGS"] = spec.nvcc_flags
    env.update(spec.build_env)
    return dict(sorted(env.items()))


def parse_toolchain(text: str) -> dict[str, str]:
    """'== gcc\\ngcc-10 (Debian 10.2.1-6) 10.2.1\\n== python\\n...' -> {'gcc': '...', ...}."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^== (\S+)$", line)
        if m:
            name = m.group(1)
        elif name and line.strip() and name not in out:
            out[name] = line.strip()
    return out


def source_archive(tree: Path, inputs: list[tuple[str, bytes]], mtime: int, dest: Path,
                   only: Collection[str] | None = None, extra_files: dict[str, bytes] | None = None) -> None:
    """A tar of the tree for put_archive into /src: git-tracked files only (no .git, no build
    outputs), plus the pinned inputs at their places; sorted, fixed mtime, owned by the builder.
    ``only``: just these paths (a kept build tree's changed files); ``extra_files`` go last."""
    from patcher.source import tracked_files

    entries = sorted(tracked_files(tree), key=lambda e: e[2].encode("utf-8", "surrogateescape"))
    wanted = None if only is None else set(only)
    if wanted is not None:
        entries = [e for e in entries if e[2] in wanted]
    overridden = {path for path, _data in inputs}  # an input replaces a tracked file of that name
    extra = {path: data for path, data in inputs if wanted is None or path in wanted}
    dirs: set[str] = set()

    def info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.size, ti.mtime = kind, mode, size, mtime
        ti.uid = ti.gid = BUILDER_UID
        ti.uname = ti.gname = BUILD_USER
        return ti

    def add_parents(tar: tarfile.TarFile, path: str) -> None:
        # Every directory explicitly, so the unprivileged builder owns it (not root).
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                tar.addfile(info(d, tarfile.DIRTYPE, 0o755))

    with open(dest, "wb") as fh, tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for mode, _oid, path in entries:
            if mode == 0o160000 or path in overridden:
                continue
            full = tree / path
            add_parents(tar, path)
            if mode == 0o120000:
                ti = info(path, tarfile.SYMTYPE, 0o777)
                ti.linkname = os.readlink(full)
                tar.addfile(ti)
            elif full.is_file():
                ti = info(path, tarfile.REGTYPE, 0o755 if mode == 0o100755 else 0o644, full.stat().st_size)
                with open(full, "rb") as data:
                    tar.addfile(ti, data)
        for path, data in [*sorted(extra.items()), *(extra_files or {}).items()]:
            add_parents(tar, path)
            tar.addfile(info(path, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
