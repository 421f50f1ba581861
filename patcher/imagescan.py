"""What an image holds that a wheel's ELF files need: run *inside* the builder image.

This file is two things at once:

* on the host, a module: ``elf_dynamic(data)`` reads the dynamic section of an ELF file
  (SONAME, NEEDED, RPATH, RUNPATH, class, machine); ``patcher.sbom`` uses it on the wheel;
* in the image, a script: ``python3 -c "$(cat imagescan.py)" --class 2 --machine 62 SONAME...``
  prints one JSON document (``SCAN_SCHEMA``) on stdout: the OS release, the full dpkg package
  list, each shared library the wanted sonames resolve to (with what *they* need, to closure),
  the Debian package that owns each library file and its version, the DEP-5 license names of
  those packages' copyright files, and the Python distributions installed (build requirements).

Inside the image only the standard library is there and Python may be as old as 3.6, so this
file imports nothing else, uses no syntax newer than 3.6 and carries no type annotations.
It reads the dpkg database (``dpkg-query -W`` and ``/var/lib/dpkg/info/*.list``), the
``ldconfig -p`` cache and the files themselves; it changes nothing in the image.
"""

import hashlib
import json
import os
import re
import struct
import subprocess
import sys

SCAN_SCHEMA = 1
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 14, 15, 29
_DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")
_MULTIARCH = {62: "x86_64-linux-gnu", 183: "aarch64-linux-gnu", 21: "powerpc64le-linux-gnu", 3: "i386-linux-gnu"}
# dpkg-query -W fields, tab separated; the names are dpkg's own.
_DPKG_FIELDS = ("binary:Package", "Package", "Version", "Architecture", "source:Package", "source:Version",
                "Maintainer", "db:Status-Abbrev")


# --- ELF --------------------------------------------------------------------------------------
def is_elf(head):
    return head[:4] == b"\x7fELF"


def elf_dynamic(data):
    """The dynamic-linking facts of one ELF file (bytes), or None when it is not a readable ELF.

    Returns a dict: class (1 = 32-bit, 2 = 64-bit), machine (e_machine), type (e_type),
    soname, needed (list, in order), rpath, runpath (strings or None).
    """
    if len(data) < 64 or not is_elf(data):
        return None
    klass, order = data[4], data[5]
    if klass not in (1, 2) or order not in (1, 2):
        return None
    end = "<" if order == 1 else ">"
    try:
        if klass == 2:
            e_type, e_machine = struct.unpack_from(end + "HH", data, 16)
            e_phoff, = struct.unpack_from(end + "Q", data, 32)
            e_phentsize, e_phnum = struct.unpack_from(end + "HH", data, 54)
        else:
            e_type, e_machine = struct.unpack_from(end + "HH", data, 16)
            e_phoff, = struct.unpack_from(end + "I", data, 28)
            e_phentsize, e_phnum = struct.unpack_from(end + "HH", data, 42)
        loads, dynamic = [], None
        for i in range(e_phnum):
            off = e_phoff + i * e_phentsize
            if klass == 2:
                p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(end + "IIQQQQ", data, off)
            else:
                p_type, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(end + "IIIII", data, off)
            if p_type == PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        result = {"class": klass, "machine": e_machine, "type": e_type, "soname": None, "needed": [],
                  "rpath": None, "runpath": None}
        if dynamic is None:
            return result
        entry = struct.Struct(end + ("qQ" if klass == 2 else "iI"))
        tags = []
        offset, size = dynamic
        for pos in range(offset, min(offset + size, len(data)) - entry.size + 1, entry.size):
            tag, val = entry.unpack_from(data, pos)
            if tag == DT_NULL:
                break
            tags.append((tag, val))
        strtab = None
        for tag, val in tags:
            if tag == DT_STRTAB:
                for vaddr, foff, fsize in loads:
                    if vaddr <= val < vaddr + fsize:
                        strtab = val - vaddr + foff
                        break
        if strtab is None:
            return result

        def string(at):
            start = strtab + at
            stop = data.find(b"\0", start)
            return data[start:stop if stop >= 0 else len(data)].decode("utf-8", "replace")

        for tag, val in tags:
            if tag == DT_NEEDED:
                result["needed"].append(string(val))
            elif tag == DT_SONAME:
                result["soname"] = string(val)
            elif tag == DT_RPATH:
                result["rpath"] = string(val)
            elif tag == DT_RUNPATH:
                result["runpath"] = string(val)
        return result
    except struct.error:
        return None


# --- in the image --------------------------------------------------------------------------------
def _run(argv):
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError:
        return None
    out, _err = proc.communicate()
    return out.decode("utf-8", "replace") if proc.returncode == 0 else None


def os_release():
    info = {}
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path) as fh:
                for line in fh:
                    key, sep, value = line.strip().partition("=")
                    if sep:
                        info[key] = value.strip().strip('"')
            break
        except OSError:
            continue
    try:
        with open("/etc/debian_version") as fh:
            info["DEBIAN_VERSION"] = fh.read().strip()
    except OSError:
        pass
    return info


def dpkg_packages():
    out = _run(["dpkg-query", "-W", "-f=" + "\t".join("${" + f + "}" for f in _DPKG_FIELDS) + "\n"])
    if out is None:
        return None
    packages = []
    for line in out.splitlines():
        cols = line.split("\t")
        if len(cols) != len(_DPKG_FIELDS):
            continue
        row = dict(zip(("id", "name", "version", "architecture", "source", "source_version", "maintainer",
                        "status"), cols))
        if not row["status"].startswith("i"):
            continue  # removed, config-files only: not in the image
        row["source"] = row["source"] or row["name"]
        row["source_version"] = row["source_version"] or row["version"]
        packages.append(row)
    packages.sort(key=lambda p: (p["name"], p["architecture"]))
    return packages


def _path_variants(path):
    real = os.path.realpath(path)
    out = []
    for p in (path, real):
        out.append(p)
        out.append(p[4:] if p.startswith("/usr/") else "/usr" + p)  # merged /usr
    seen, unique = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            unique.append(p)
    return unique


def dpkg_owners(paths):
    """path -> owning dpkg package id (e.g. libc6:amd64), from /var/lib/dpkg/info/*.list."""
    wanted = {}
    for path in paths:
        for variant in _path_variants(path):
            wanted.setdefault(variant, path)
    owners = {}
    info = "/var/lib/dpkg/info"
    try:
        names = sorted(os.listdir(info))
    except OSError:
        return owners
    for name in names:
        if not name.endswith(".list"):
            continue
        try:
            with open(os.path.join(info, name), "rb") as fh:
                for raw in fh:
                    line = raw.rstrip(b"\n").decode("utf-8", "replace")
                    orig = wanted.get(line)
                    if orig is not None and orig not in owners:
                        owners[orig] = name[:-len(".list")]
        except OSError:
            continue
    return owners


def ldconfig_cache():
    """soname -> [paths] from ``ldconfig -p`` (every architecture; the caller checks ELF class)."""
    cache = {}
    out = _run(["ldconfig", "-p"]) or _run(["/sbin/ldconfig", "-p"]) or ""
    for line in out.splitlines():
        m = re.match(r"^\s+(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$", line)
        if m:
            cache.setdefault(m.group(1), []).append(m.group(3))
    return cache


def _read(path, limit=None):
    with open(path, "rb") as fh:
        return fh.read() if limit is None else fh.read(limit)


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
    return digest.hexdigest()


def _expand(dirs, origin):
    out = []
    for d in (dirs or "").split(":"):
        if d:
            out.append(d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin))
    return out


def resolve(soname, klass, machine, cache, search=()):
    """The file the dynamic linker would load for ``soname`` (RPATH/RUNPATH dirs, cache, defaults)."""
    multiarch = _MULTIARCH.get(machine)
    dirs = list(search)
    candidates = [os.path.join(d, soname) for d in dirs] + list(cache.get(soname, ()))
    defaults = list(_DEFAULT_DIRS)
    if multiarch:
        defaults = ["/lib/" + multiarch, "/usr/lib/" + multiarch] + defaults
    candidates += [os.path.join(d, soname) for d in defaults]
    for path in candidates:
        try:
            head = _read(path, 64)
        except OSError:
            continue
        if len(head) >= 20 and is_elf(head):
            order = "<" if head[5] == 1 else ">"
            if head[4] == klass and struct.unpack_from(order + "H", head, 18)[0] == machine:
                return path
    return None


def dep5_licenses(package_name):
    """(format, [License names]) of /usr/share/doc/<package>/copyright."""
    path = os.path.join("/usr/share/doc", package_name, "copyright")
    try:
        text = _read(path).decode("utf-8", "replace")
    except OSError:
        return "absent", []
    if not re.match(r"^Format:\s*\S+", text):
        return "free-form", []
    names = []
    for m in re.finditer(r"^License:[ \t]*([^\n]*)$", text, re.M):
        name = m.group(1).strip()
        if name and name not in names:
            names.append(name)
    return "dep5", names


def python_distributions():
    """Name, version, license, author of each distribution on the image's python's sys.path."""
    import email.parser

    dists, seen = [], set()
    for base in sys.path:
        if not base:
            continue  # the working directory of ``python -c``: not an installation
        try:
            entries = sorted(os.listdir(base or "."))
        except OSError:
            continue
        for entry in entries:
            meta = None
            if entry.endswith(".dist-info"):
                meta = os.path.join(base, entry, "METADATA")
            elif entry.endswith(".egg-info"):
                meta = os.path.join(base, entry, "PKG-INFO") if os.path.isdir(os.path.join(base, entry)) \
                    else os.path.join(base, entry)
            if meta is None or not os.path.isfile(meta):
                continue
            try:
                headers = email.parser.Parser().parsestr(_read(meta).decode("utf-8", "replace"), headersonly=True)
            except Exception:  # a broken METADATA file: skip it, the package list says enough
                continue
            name, version = headers.get("Name"), headers.get("Version")
            if not name or not version or (name.lower(), version) in seen:
                continue
            seen.add((name.lower(), version))
            dists.append({"name": name, "version": version, "license": headers.get("License-Expression")
                          or headers.get("License") or "", "author": headers.get("Author") or "",
                          "author_email": headers.get("Author-email") or "", "location": base})
    dists.sort(key=lambda d: d["name"].lower())
    return dists


def scan(sonames, klass, machine):
    cache = ldconfig_cache()
    libraries = {}
    queue = [(s, ()) for s in sonames]
    while queue:
        soname, search = queue.pop(0)
        if soname in libraries:
            continue
        path = resolve(soname, klass, machine, cache, search)
        lib = {"soname": soname, "path": path, "found": path is not None, "needed": []}
        libraries[soname] = lib
        if path is None:
            continue
        real = os.path.realpath(path)
        lib["realpath"] = real
        lib["sha256"] = _sha256(real)
        facts = elf_dynamic(_read(real)) or {}
        lib["needed"] = list(facts.get("needed", ()))
        origin = os.path.dirname(real)
        more = _expand(facts.get("runpath") or facts.get("rpath"), origin)
        for need in lib["needed"]:
            queue.append((need, tuple(more)))
    owners = dpkg_owners([lib["path"] for lib in libraries.values() if lib["path"]])
    packages = dpkg_packages()
    by_id = dict((p["id"], p) for p in packages or ())
    by_name = {}
    for p in packages or ():
        by_name.setdefault(p["name"], p)
    licenses = {}
    for lib in libraries.values():
        owner = owners.get(lib["path"]) if lib["path"] else None
        pkg = by_id.get(owner) or by_name.get((owner or "").split(":")[0])
        lib["package"] = pkg["name"] if pkg else None
        lib["package_id"] = owner
        lib["version"] = pkg["version"] if pkg else None
        lib["architecture"] = pkg["architecture"] if pkg else None
        if pkg and pkg["name"] not in licenses:
            fmt, names = dep5_licenses(pkg["name"])
            licenses[pkg["name"]] = {"format": fmt, "licenses": names}
    return {"schema": SCAN_SCHEMA, "os_release": os_release(), "elf": {"class": klass, "machine": machine},
            "requested": list(sonames), "libraries": [libraries[k] for k in sorted(libraries)],
            "packages": packages, "package_licenses": licenses,
            "python": {"version": sys.version.split()[0], "executable": sys.executable},
            "python_distributions": python_distributions()}


def main(argv):
    klass, machine, sonames, out = 2, 62, [], None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--class":
            klass = int(args.pop(0))
        elif arg == "--machine":
            machine = int(args.pop(0))
        elif arg == "--out":
            out = args.pop(0)
        else:
            sonames.append(arg)
    text = json.dumps(scan(sonames, klass, machine), sort_keys=True) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        with open(out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
