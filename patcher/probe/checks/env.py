"""The environment: what is installed, and whether this GPU can run this wheel's kernels.

The compiled CUDA arch list is read by the first source that answers:

1. ``torch.cuda.get_arch_list()`` (newer releases; empty when no GPU is visible);
2. ``torch._C._cuda_getArchFlags()`` (the string behind 1., present in some releases
   that lack the public function; answers without a GPU);
3. the build flags in ``torch.__config__.show()`` (``-gencode;arch=compute_XX,code=sm_XX``
   or ``TORCH_CUDA_ARCH_LIST``), where the build recorded them;
4. the fatbins embedded in torch's CUDA library itself (``.nv_fatbin`` ELF section of
   libtorch_cuda.so, libtorch_cuda_cu.so, libtorch.so (1.4 keeps its kernels there) or
   libcaffe2_gpu.so): each fatbin entry header names its kind (SASS or PTX) and its
   architecture.  This is ground truth for any release, and needs no cuobjdump.

When a GPU is present the fatbin reading is recorded too, as a cross-check of 1.-3.
"""

import os
import platform
import re
import struct
import subprocess
import sys

from ..framework import Fail, Finding, check

FATBIN_MAGIC = 0xBA55ED50
FATBIN_KIND_PTX = 1
FATBIN_KIND_SASS = 2
CUDA_LIBRARIES = ("libtorch_cuda.so", "libtorch_cuda_cu.so", "libtorch.so", "libcaffe2_gpu.so")
_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)([a-z]?)$")


# --- arch list sources --------------------------------------------------------------------------
def arch_list_from_flags(text):
    """Arch names from nvcc flags ('-gencode;arch=compute_70,code=sm_70') or a
    TORCH_CUDA_ARCH_LIST ('3.7+PTX;5.0')."""
    names = []
    for code in re.findall(r"arch=compute_\d+[a-z]?,code=\[?([a-z0-9_,]+)\]?", text):
        names.extend(part for part in code.split(",") if part)
    if not names:
        match = re.search(r"TORCH_CUDA_ARCH_LIST[=:]\s*\"?([0-9.;+ PTXa-z]+)", text)
        if match:
            for item in re.split(r"[; ]+", match.group(1).strip()):
                ptx = item.endswith("+PTX")
                number = item.replace("+PTX", "").strip()
                if not re.match(r"^\d+\.\d+[a-z]?$", number):
                    continue
                digits = number.replace(".", "")
                names.append("sm_" + digits)
                if ptx:
                    names.append("compute_" + digits)
    return _unique(names)


def _unique(items):
    seen = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def elf_section(path, wanted):
    """(offset, size) of the named section of a 64-bit little-endian ELF file, or None."""
    with open(path, "rb") as handle:
        ident = handle.read(64)
        if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            return None
        shoff = struct.unpack_from("<Q", ident, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
        if shoff == 0 or shnum == 0 or shentsize < 64:
            return None
        handle.seek(shoff)
        table = handle.read(shentsize * shnum)
        headers = []
        for index in range(shnum):
            base = index * shentsize
            name, _type = struct.unpack_from("<II", table, base)
            offset, size = struct.unpack_from("<QQ", table, base + 24)
            headers.append((name, offset, size))
        names_offset, names_size = headers[shstrndx][1], headers[shstrndx][2]
        handle.seek(names_offset)
        names = handle.read(names_size)
        for name, offset, size in headers:
            end = names.find(b"\0", name)
            if names[name:end].decode("ascii", "replace") == wanted:
                return offset, size
    return None


def fatbin_arches(path, max_entries=200000):
    """Arch names ('sm_90', 'compute_80') of every fatbin entry in a library's .nv_fatbin
    section.  Reads only headers: payloads are skipped with seek."""
    section = elf_section(path, ".nv_fatbin")
    if section is None:
        return []
    start, size = section
    end = start + size
    found = set()
    entries = 0
    with open(path, "rb") as handle:
        position = start
        while position + 16 <= end and entries < max_entries:
            handle.seek(position)
            header = handle.read(16)
            magic, _version, header_size, fat_size = struct.unpack("<IHHQ", header)
            if magic != FATBIN_MAGIC:
                position = _next_magic(handle, position + 1, start, end)
                if position is None:
                    break
                continue
            entry = position + header_size
            container_end = min(entry + fat_size, end)
            while entry + 32 <= container_end:
                handle.seek(entry)
                raw = handle.read(32)
                kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", raw, 0)
                arch = struct.unpack_from("<I", raw, 28)[0]
                if entry_header < 32:
                    break
                if kind == FATBIN_KIND_SASS:
                    found.add(("sm", arch))
                elif kind == FATBIN_KIND_PTX:
                    found.add(("compute", arch))
                entries += 1
                entry += entry_header + payload
            position = container_end
    return ["%s_%d" % item for item in sorted(found, key=lambda item: (item[1], item[0] != "sm"))]


def _next_magic(handle, position, start, end, window=1 << 20):
    """Containers are padded: find the next fatbin magic at or after position, 8-byte
    aligned from the start of the section."""
    magic = struct.pack("<I", FATBIN_MAGIC)
    position += (start - position) % 8
    while position < end:
        handle.seek(position)
        chunk = handle.read(min(window, end - position))
        index = chunk.find(magic)
        while index != -1 and index % 8:
            index = chunk.find(magic, index + 1)
        if index != -1:
            return position + index
        if len(chunk) < 16:
            return None
        position += len(chunk) - 8
        position += (start - position) % 8
    return None


def cuda_library_paths(torch):
    lib_dir = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib")
    paths = []
    for name in CUDA_LIBRARIES:
        path = os.path.join(lib_dir, name)
        if os.path.isfile(path):
            paths.append(path)
    return paths


def arch_list_from_fatbins(torch):
    """(arch list, library) from the first of torch's libraries holding fatbins."""
    for path in cuda_library_paths(torch):
        try:
            arches = fatbin_arches(path)
        except (OSError, struct.error):
            continue
        if arches:
            return arches, path
    return [], None


def compiled_arch_list(torch):
    """(arch list, source) by the fallback chain in the module docstring."""
    if getattr(torch.version, "cuda", None) is None:
        return [], "none (CPU-only build)"
    getter = getattr(torch.cuda, "get_arch_list", None)
    if getter is not None:
        try:
            arches = list(getter())
        except Exception:
            arches = []
        if arches:
            return arches, "torch.cuda.get_arch_list()"
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    if flags is not None:
        try:
            arches = (flags() or "").split()
        except Exception:
            arches = []
        if arches:
            return arches, "torch._C._cuda_getArchFlags()"
    arches = arch_list_from_flags(config_text(torch))
    if arches:
        return arches, "torch.__config__.show()"
    arches, path = arch_list_from_fatbins(torch)
    if arches:
        return arches, "fatbin headers of %s" % os.path.basename(path)
    return [], "unknown (no source answered)"


# --- coverage ---------------------------------------------------------------------------------
def parse_arch(name):
    """'sm_86' -> ('sm', (8, 6), ''); 'compute_90a' -> ('compute', (9, 0), 'a'); else None."""
    match = _ARCH_RE.match(name.strip())
    if not match:
        return None
    number = int(match.group(2))
    return match.group(1), (number // 10, number % 10), match.group(3)


def arch_coverage(arches, capability):
    """How a GPU of ``capability`` (major, minor) runs this build's kernels.

    SASS runs on the same major version at an equal or higher minor; an arch-specific
    ('a') build runs only on its exact capability.  PTX is JIT-compiled for any
    capability at or above its own.
    """
    capability = tuple(capability)
    sass, ptx = [], []
    for name in arches:
        parsed = parse_arch(name)
        if parsed is None:
            continue
        kind, cc, suffix = parsed
        if kind == "sm":
            fits = cc == capability if suffix == "a" else (cc[0] == capability[0] and cc[1] <= capability[1])
            if fits:
                sass.append(name)
        elif cc <= capability and suffix != "a":
            ptx.append(name)
    if sass:
        return {"covered": True, "by": "sass", "matching": sass}
    if ptx:
        return {"covered": True, "by": "ptx", "matching": ptx}
    return {"covered": False, "by": None, "matching": []}


# --- fingerprint ------------------------------------------------------------------------------
def config_text(torch):
    try:
        return torch.__config__.show()
    except Exception:
        return ""


def driver_version():
    """The NVIDIA kernel driver version, from /proc or nvidia-smi; None when absent."""
    try:
        with open("/proc/driver/nvidia/version") as handle:
            match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", handle.read())
            if match:
                return match.group(1)
    except OSError:
        pass
    try:
        out = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                      stderr=subprocess.DEVNULL, universal_newlines=True, timeout=20)
        return out.strip().splitlines()[0].strip() or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _safe(call, default=None):
    try:
        return call()
    except Exception:
        return default


def _device_info(torch, index):
    return {"index": index, "name": _safe(lambda: torch.cuda.get_device_name(index)),
            "capability": _safe(lambda: list(torch.cuda.get_device_capability(index))),
            "memory_bytes": _safe(lambda: torch.cuda.get_device_properties(index).total_memory)}


def collect_fingerprint(torch, has_cuda, cross_check=True):
    info = {
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "machine": platform.machine(), "release": platform.release()},
        "torch": {"version": torch.__version__,
                  "git_version": getattr(torch.version, "git_version", None),
                  "path": os.path.dirname(os.path.abspath(torch.__file__)),
                  "debug": getattr(torch.version, "debug", None)},
        "cuda": {"compiled": getattr(torch.version, "cuda", None),
                 "cudnn": _safe(lambda: torch.backends.cudnn.version()) if has_cuda or getattr(
                     torch.version, "cuda", None) else None,
                 "available": bool(has_cuda),
                 "driver": driver_version() if getattr(torch.version, "cuda", None) else None},
    }
    arches, source = compiled_arch_list(torch)
    info["cuda"]["arch_list"] = arches
    info["cuda"]["arch_list_source"] = source
    if has_cuda:
        count = _safe(torch.cuda.device_count, 0)
        devices = []
        for index in range(count):
            devices.append(_device_info(torch, index))
        info["cuda"]["devices"] = devices
        if cross_check and not source.startswith("fatbin"):
            fat, path = _safe(lambda: arch_list_from_fatbins(torch), ([], None))
            info["cuda"]["arch_list_fatbin"] = {"arches": fat, "library": path and os.path.basename(path)}
    info["config"] = config_text(torch).strip().splitlines()
    return info


@check("env.fingerprint", torch=">=1.4", device="any")
def fingerprint(ctx):
    details = collect_fingerprint(ctx.torch, ctx.has_cuda)
    if details["torch"]["git_version"] in (None, "", "Unknown"):
        ctx.log("torch.version.git_version is %r: this build does not say which commit it came from"
                % (details["torch"]["git_version"],))
    return details


@check("env.arch_coverage", torch=">=1.4", device="cuda")
def arch_coverage_check(ctx):
    torch = ctx.torch
    arches, source = compiled_arch_list(torch)
    capability = tuple(torch.cuda.get_device_capability(0))
    name = torch.cuda.get_device_name(0)
    details = {"gpu": name, "capability": "%d.%d" % capability, "arch_list": arches, "source": source}
    if not arches:
        raise Fail("could not read which architectures this wheel was compiled for (%s)" % source, details)
    coverage = arch_coverage(arches, capability)
    details.update(coverage)
    # Run one kernel: a wheel that claims coverage must also launch.
    try:
        value = (torch.ones(4, device="cuda") * 2).sum().item()
        details["kernel_launch"] = "ok" if value == 8 else "wrong result %r" % value
    except RuntimeError as exc:
        details["kernel_launch"] = str(exc).splitlines()[0]
    if not coverage["covered"]:
        raise Finding("this wheel cannot run CUDA kernels on this GPU: %s is compute capability %d.%d and "
                      "the wheel carries only %s" % (name, capability[0], capability[1], " ".join(arches)),
                      details)
    if details["kernel_launch"] != "ok":
        raise Fail("a CUDA kernel failed on %s although %s claims coverage: %s"
                   % (name, coverage["matching"], details["kernel_launch"]), details)
    if coverage["by"] == "ptx":
        ctx.log("no SASS for %d.%d: kernels are JIT-compiled from %s at first use"
                % (capability + (",".join(coverage["matching"]),)))
    return details
