"""The CycloneDX SBOM of a wheel: what went into it and what it needs at run time.

Three parts, kept apart so each can be tested and moved on its own:

1. **The wheel** (pure): ``wheel_elves(wheel)`` reads every ELF file inside the wheel (its
   sha256, SONAME, NEEDED, RUNPATH); ``external_sonames`` is what they need that the wheel
   does not carry itself.
2. **The image** (the one impure part): ``gather_inventory(wheel, image)`` runs
   ``patcher/imagescan.py`` inside the builder image (``image_scan_command``), which resolves
   those sonames the way the dynamic linker would, to closure, and names the dpkg package and
   exact version that owns each file, the package's DEP-5 licenses, the image's full package
   list and its Python distributions (through ``patcher.container``).  The result (``Inventory``) is saved as
   ``image-inventory.json`` beside the build's ``record.json``; certify reads it from there.
3. **The SBOM** (pure): ``build_sbom(record, spec, wheel_path, inventory)`` turns the record,
   the wheel's ELF facts and the inventory into CycloneDX 1.6 JSON, byte-stable for one build;
   ``image_package_dependencies(inventory)`` gives the provenance the image's package list.

The dependency graph: torch (the wheel) -> the source tag, each vendored submodule (commit),
each patch, each pinned input, CUDA/cuDNN where used, each Python build requirement, the base
image, each ELF file of the wheel; each ELF file -> the ELF files of the wheel and the shared
libraries of the image that it needs; each library -> the libraries it needs.  A library
file is a component nested inside the Debian package component that ships it (or inside the
CUDA / cuDNN component when it came from NVIDIA's runfile / archive); one that no package owns,
or that the image does not hold at all (``libcuda.so.1``: the driver's), is a component of its
own that says so.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import re
import tempfile
import uuid
import zipfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from patcher import __version__, imagescan
from patcher.errors import EvidenceFormatError, ImageScanError
from patcher.record import BuildRecord
from patcher.spec import BuildSpec
from patcher.util import sha256_file

INVENTORY_FILE = "image-inventory.json"
INVENTORY_SCHEMA = 1
SBOM_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:patcher:sbom")
_CHUNK = 1 << 20
SCAN_LABEL = "org.patcher.sbom-scan"

# Licenses that are facts about well-known sources, where no machine-readable file says them.
# PyTorch's LICENSE (the tree's top level) is the 3-clause BSD license.
TORCH_LICENSE = "BSD-3-Clause"
PATCHER_LICENSE = "BSD-3-Clause"   # the catalog's patches are this project's work (pyproject.toml)
# Vendored submodules of PyTorch, by repository name: the SPDX id of each one's LICENSE file.
SUBMODULE_LICENSES = {
    "fmt": "MIT", "pybind11": "BSD-3-Clause", "eigen": "MPL-2.0", "googletest": "BSD-3-Clause",
    "benchmark": "Apache-2.0", "protobuf": "BSD-3-Clause", "onnx": "Apache-2.0", "sleef": "BSL-1.0",
    "cpuinfo": "BSD-2-Clause", "pthreadpool": "BSD-2-Clause", "FP16": "MIT", "FXdiv": "MIT", "psimd": "MIT",
    "XNNPACK": "BSD-3-Clause", "NNPACK": "BSD-2-Clause", "gloo": "BSD-3-Clause", "oneDNN": "Apache-2.0",
    "fbgemm": "BSD-3-Clause", "flatbuffers": "Apache-2.0", "kineto": "BSD-3-Clause",
    "tensorpipe": "BSD-3-Clause", "nccl": "BSD-3-Clause", "cutlass": "BSD-3-Clause", "cub": "BSD-3-Clause",
    "pocketfft": "BSD-3-Clause", "json": "MIT", "foxi": "MIT",
}
# Debian source packages whose copyright file is free-form: the license of the runtime libraries.
FREEFORM_LICENSES = (
    (re.compile(r"^glibc$"), "LGPL-2.1-or-later"),
    (re.compile(r"^gcc-\d+(\.\d+)?$"), "GPL-3.0-or-later WITH GCC-exception-3.1"),
    (re.compile(r"^python3\.\d+$"), "PSF-2.0"),
    (re.compile(r"^zlib$"), "Zlib"),
)
NVIDIA_LICENSES = {"cuda": "NVIDIA CUDA Toolkit End User License Agreement",
                   "cudnn": "NVIDIA cuDNN Software License Agreement"}


# --------------------------------------------------------------------------------------------
# 1. the wheel
@dataclass(frozen=True)
class WheelElf:
    path: str                 # inside the wheel, e.g. torch/lib/libtorch_cpu.so
    sha256: str
    size: int
    elf_class: int            # 1 = 32-bit, 2 = 64-bit
    machine: int              # e_machine (62 = x86-64)
    soname: str | None
    needed: tuple[str, ...]
    runpath: str | None


def wheel_elves(wheel: Path) -> list[WheelElf]:
    """Every ELF file in the wheel, with its dynamic-linking facts (sorted by path)."""
    out: list[WheelElf] = []
    try:
        with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="patcher-sbom-") as tmp:
            for info in sorted(zf.infolist(), key=lambda i: i.filename):
                if info.is_dir() or info.file_size < 64:
                    continue
                with zf.open(info) as fh:
                    if not imagescan.is_elf(fh.read(4)):
                        continue
                # One member at a time through a temp file: libtorch_cuda.so is larger than memory likes.
                target = Path(tmp) / "member"
                digest = hashlib.sha256()
                with zf.open(info) as src, open(target, "wb") as dst:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
                with open(target, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    facts = imagescan.elf_dynamic(data)
                target.unlink()
                if facts is None:
                    continue
                out.append(WheelElf(path=info.filename, sha256=digest.hexdigest(), size=info.file_size,
                                    elf_class=facts["class"], machine=facts["machine"], soname=facts["soname"],
                                    needed=tuple(facts["needed"]), runpath=facts["runpath"] or facts["rpath"]))
    except (zipfile.BadZipFile, OSError) as exc:
        raise EvidenceFormatError(f"wheel {wheel} cannot be read: {exc}") from None
    return out


def _provided(elves: list[WheelElf]) -> dict[str, WheelElf]:
    """soname -> the wheel's ELF file that answers to it (its SONAME, or its file name)."""
    out: dict[str, WheelElf] = {}
    for elf in elves:
        out.setdefault(Path(elf.path).name, elf)
    for elf in elves:
        if elf.soname:
            out[elf.soname] = elf
    return out


def external_sonames(elves: list[WheelElf]) -> list[str]:
    """What the wheel's ELF files need that the wheel itself does not hold (sorted)."""
    inside = _provided(elves)
    return sorted({n for e in elves for n in e.needed if n not in inside})


# --------------------------------------------------------------------------------------------
# 2. the image
@dataclass(frozen=True)
class Inventory:
    """What ``imagescan`` found in one image for one wheel (saved as ``image-inventory.json``)."""

    image: str
    image_id: str
    wheel: str
    wheel_sha256: str
    scan: dict[str, Any]
    schema: int = INVENTORY_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "image": self.image, "image_id": self.image_id, "wheel": self.wheel,
                "wheel_sha256": self.wheel_sha256, "scan": self.scan}

    @classmethod
    def from_json(cls, data: Any, what: str = "image inventory") -> Inventory:
        if not isinstance(data, dict) or data.get("schema") != INVENTORY_SCHEMA:
            raise EvidenceFormatError(f"{what} is not a schema {INVENTORY_SCHEMA} patcher image inventory")
        try:
            inv = cls(image=str(data["image"]), image_id=str(data.get("image_id") or ""), wheel=str(data["wheel"]),
                      wheel_sha256=str(data["wheel_sha256"]), scan=parse_scan(data["scan"], what))
        except KeyError as exc:
            raise EvidenceFormatError(f"{what} lacks {exc.args[0]!r}") from None
        return inv

    @property
    def libraries(self) -> list[dict[str, Any]]:
        return list(self.scan.get("libraries") or [])

    @property
    def packages(self) -> list[dict[str, Any]]:
        return list(self.scan.get("packages") or [])


def parse_scan(data: Any, what: str = "image scan") -> dict[str, Any]:
    """The JSON ``imagescan`` printed, checked for the fields the SBOM reads."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EvidenceFormatError(f"{what} is not JSON") from None
    if not isinstance(data, dict) or data.get("schema") != imagescan.SCAN_SCHEMA:
        raise EvidenceFormatError(f"{what} is not a schema {imagescan.SCAN_SCHEMA} image scan")
    if not isinstance(data.get("libraries"), list):
        raise EvidenceFormatError(f"{what} has no libraries list")
    if data.get("packages") is not None and not isinstance(data["packages"], list):
        raise EvidenceFormatError(f"{what} has a packages field that is not a list")
    return data


SCAN_OUTPUT = "/tmp/patcher-image-scan.json"


def image_scan_command(sonames: list[str], elf_class: int = 2, machine: int = 62,
                       out: str | None = None) -> list[str]:
    """The command to run in the image: its python runs ``imagescan.py``; JSON on stdout, or into
    the file ``out`` (so that nothing the image prints on stderr can mix into it).

    ``sh -c`` finds the image's interpreter (python3, else python); the script travels as the
    argument of ``-c``, so nothing needs copying into the container beforehand.
    """
    source = Path(imagescan.__file__).read_text(encoding="utf-8")
    finder = 'py=$(command -v python3 || command -v python) || { echo "no python in the image" >&2; exit 127; }; ' \
             'exec "$py" -c "$0" "$@"'
    return ["sh", "-c", finder, source, "--class", str(elf_class), "--machine", str(machine),
            *(["--out", out] if out else []), *sonames]


def _wheel_arch(elves: list[WheelElf]) -> tuple[int, int]:
    for elf in elves:
        return elf.elf_class, elf.machine
    return 2, 62


def scan_image(image: str, sonames: list[str], elf_class: int = 2, machine: int = 62,
               engine: Any = None, timeout: float = 600) -> tuple[dict[str, Any], str]:
    """Run the scan in a throw-away container of ``image`` (no network, the image's own user,
    removed on every way out); returns (scan, image id).  The one part that needs an engine."""
    from patcher.container import Container, ContainerConfig, ContainerError, Engine

    own = engine is None
    engine = Engine.connect() if own else engine
    try:
        image_id = engine.image_id(image)
        if image_id is None:
            raise ImageScanError(f"image {image} is not on this engine",
                                 hint="scan the builder image the build ran in (record.json: image_id)")
        config = ContainerConfig(image=image, labels={SCAN_LABEL: "1"},
                                 command=tuple(image_scan_command(sonames, elf_class, machine, out=SCAN_OUTPUT)))
        try:
            with Container(engine, config) as box:
                box.start()
                code = box.wait(timeout)
                if code != 0:
                    lines = box.logs().strip().splitlines()
                    raise ImageScanError(f"the image scan failed in {image} (exit {code}): "
                                         f"{lines[-1] if lines else 'no message'}")
                data = box.read_file(SCAN_OUTPUT)
        except ContainerError as exc:
            raise ImageScanError(f"the image scan could not run in {image}: {exc}") from None
        if data is None:
            raise ImageScanError(f"the image scan in {image} wrote no {SCAN_OUTPUT}")
        return parse_scan(data, f"the image scan of {image}"), image_id
    finally:
        if own:
            engine.close()


def gather_inventory(wheel: Path, image: str, engine: Any = None) -> Inventory:
    """Resolve what ``wheel``'s ELF files need inside ``image`` (the builder image)."""
    wheel = Path(wheel)
    elves = wheel_elves(wheel)
    elf_class, machine = _wheel_arch(elves)
    scan, image_id = scan_image(image, external_sonames(elves), elf_class, machine, engine=engine)
    return Inventory(image=image, image_id=image_id, wheel=wheel.name, wheel_sha256=sha256_file(wheel), scan=scan)


def save_inventory(inventory: Inventory, directory: Path) -> Path:
    from patcher.record import write_atomic

    path = Path(directory) / INVENTORY_FILE
    write_atomic(path, json.dumps(inventory.to_json(), indent=2, sort_keys=True) + "\n")
    return path


def load_inventory(directory: Path) -> Inventory | None:
    """The inventory saved beside a build's record, or None when the build has none."""
    path = Path(directory) / INVENTORY_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EvidenceFormatError(f"image inventory {path} cannot be read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise EvidenceFormatError(f"image inventory {path} is not valid JSON") from None
    return Inventory.from_json(data, what=f"image inventory {path}")


def read_reproducibility(record_path: Path) -> dict[str, Any] | None:
    """The ``reproducibility`` result the build stage keeps in record.json (None when not checked)."""
    try:
        value = json.loads(Path(record_path).read_text(encoding="utf-8")).get("reproducibility")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, dict) else None


# --------------------------------------------------------------------------------------------
# licenses
_GNU = re.compile(r"^(A?GPL|LGPL|GFDL)-(\d)(\.\d)?(\+)?$", re.I)


def dep5_to_spdx(name: str) -> str | None:
    """A DEP-5 short license name as an SPDX id or expression, or None when it has none."""
    from cyclonedx.spdx import fixup_id

    raw = name.strip()
    exception = None
    m = re.match(r"^(.*?)\s+with\s+(.+?)\s+exception$", raw, re.I)
    if m:
        raw, exception = m.group(1), m.group(2)
    special = {"expat": "MIT", "public-domain": None, "zlib": "Zlib", "psf-2": "PSF-2.0", "bsd-3-clause": "BSD-3-Clause",
               "bsd-2-clause": "BSD-2-Clause", "permissive": None}
    if raw.lower() in special:
        spdx = special[raw.lower()]
    elif gnu := _GNU.match(raw):
        family, major, minor, plus = gnu.groups()
        spdx = fixup_id(f"{family}-{major}{minor or '.0'}-{'or-later' if plus else 'only'}")
    else:
        spdx = fixup_id(raw)
    if spdx is None:
        return None
    if exception:
        exc_id = {"gcc-3.1": "GCC-exception-3.1", "gcc": "GCC-exception-3.1", "openssl": "OpenSSL-exception",
                  "autoconf": "Autoconf-exception-3.0", "classpath": "Classpath-exception-2.0"}.get(exception.lower())
        return f"{spdx} WITH {exc_id}" if exc_id else None
    return spdx


def _licenses(values: list[str]) -> list[Any]:
    """CycloneDX licenses: SPDX ids where known, else the name as written; one expression alone."""
    from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression

    out: list[Any] = []
    seen: set[str] = set()
    for value in values:
        if not value or value in seen:
            continue
        seen.add(value)
        if " WITH " in value or " OR " in value or " AND " in value:
            if len(values) == 1:
                return [LicenseExpression(value)]
            out.append(DisjunctiveLicense(name=value))
        else:
            from cyclonedx.spdx import is_supported_id

            out.append(DisjunctiveLicense(id=value) if is_supported_id(value) else DisjunctiveLicense(name=value))
    return out


def package_licenses(inventory: Inventory, package: dict[str, Any]) -> tuple[list[str], str]:
    """(licenses, where they come from) of one dpkg package of the inventory."""
    info = (inventory.scan.get("package_licenses") or {}).get(package["name"]) or {}
    names = [n for n in info.get("licenses") or [] if isinstance(n, str)]
    if info.get("format") == "dep5" and names:
        mapped = [dep5_to_spdx(n) or n for n in names]
        return mapped, "debian-copyright-dep5"
    for pattern, spdx in FREEFORM_LICENSES:
        if pattern.match(package.get("source") or ""):
            return [spdx], "patcher-table"
    return [], "unknown"


# --------------------------------------------------------------------------------------------
# 3. the SBOM
def _purl_deb(pkg: dict[str, Any], os_release: dict[str, str]):
    from packageurl import PackageURL

    vendor = (os_release.get("ID") or "debian").lower()
    qualifiers = {"arch": pkg.get("architecture") or ""}
    distro = os_release.get("VERSION_ID") and f"{vendor}-{os_release['VERSION_ID']}" or os_release.get("VERSION_CODENAME")
    if distro:
        qualifiers["distro"] = distro
    return PackageURL("deb", vendor, pkg["name"], pkg["version"], {k: v for k, v in qualifiers.items() if v})


def _maintainer(value: str):
    from cyclonedx.model.contact import OrganizationalContact, OrganizationalEntity

    m = re.match(r"^\s*(.*?)\s*<([^>]+)>\s*$", value or "")
    if not m:
        return OrganizationalEntity(name=value) if value else None
    return OrganizationalEntity(name=m.group(1) or m.group(2), contacts=[OrganizationalContact(name=m.group(1) or None,
                                                                                               email=m.group(2))])


def _github(url: str) -> tuple[str, str] | None:
    m = re.match(r"^(?:https?://|git@|ssh://git@)github\.com[/:]([^/]+)/([^/]+?)(?:\.git)?/?$", url)
    return (m.group(1), m.group(2)) if m else None


def _torch_cpe(version: str) -> str:
    return f"cpe:2.3:a:linuxfoundation:pytorch:{version}:*:*:*:*:*:*:*"


def build_sbom(record: BuildRecord, spec: BuildSpec, wheel_path: Path | None = None,
               inventory: Inventory | None = None, timestamp: datetime | None = None,
               reproducibility: dict[str, Any] | None = None, supplier: str | None = None) -> bytes:
    """CycloneDX 1.6 JSON of the wheel; deterministic for one set of inputs."""
    from cyclonedx.model import (
        ExternalReference,
        ExternalReferenceType,
        HashAlgorithm,
        HashType,
        Property,
        XsUri,
    )
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import (
        Commit,
        Component,
        ComponentType,
        Diff,
        Patch,
        PatchClassification,
        Pedigree,
    )
    from cyclonedx.model.contact import OrganizationalEntity
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    def sha(hexdigest: str | None) -> list[HashType]:
        return [HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)] if hexdigest else []

    def props(**values: Any) -> list[Property]:
        return [Property(name=f"patcher:{k}", value=str(v)) for k, v in values.items() if v is not None]

    def org(name: str, url: str | None = None) -> OrganizationalEntity:
        return OrganizationalEntity(name=name, urls=[XsUri(url)] if url else None)

    torch_version = record.spec.get("torch", "")
    version = torch_version + "+" + record.spec.get("local_label", "")
    builder = org(supplier or "patcher rebuild")
    src = record.source
    upstream = _github(src.repo)
    overridden = bool(record.spec.get("commit_overridden"))
    # A commit the site trusted by override is not upstream's: the purl names the tag then, not the SHA.
    source_purl = (PackageURL("github", upstream[0], upstream[1], src.tag if overridden else src.commit)
                   if upstream else None)
    source = Component(
        name="pytorch", version=src.tag, type=ComponentType.LIBRARY, bom_ref="source",
        supplier=org("PyTorch", src.repo if upstream else None), purl=source_purl, cpe=_torch_cpe(torch_version),
        licenses=_licenses([TORCH_LICENSE]),
        external_references=[ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(src.repo))],
        properties=props(kind="source", commit=src.commit, tree_hash=src.tree_hash,
                         commit_overridden=overridden or None,
                         license_source="upstream LICENSE file"))
    top: list[Component] = [source]
    for sub in src.submodules:
        gh = _github(sub.url)
        repo_name = gh[1] if gh else Path(sub.path).name
        lic = SUBMODULE_LICENSES.get(repo_name)
        top.append(Component(
            name=repo_name, version=sub.commit, type=ComponentType.LIBRARY, bom_ref=f"submodule:{sub.path}",
            supplier=org(gh[0] if gh else repo_name, sub.url), licenses=_licenses([lic] if lic else []),
            purl=PackageURL("github", gh[0], gh[1], sub.commit) if gh else None,
            external_references=[ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(sub.url))],
            properties=props(kind="submodule", path=sub.path, commit=sub.commit,
                             license_source="upstream LICENSE file" if lic else None)))
    for position, patch in enumerate(record.patches, start=1):
        top.append(Component(
            name=patch.file, version=patch.id, type=ComponentType.FILE, bom_ref=f"patch:{patch.file}",
            supplier=org("patcher catalog"), hashes=sha(patch.sha256), licenses=_licenses([PATCHER_LICENSE]),
            purl=PackageURL("generic", "patcher-catalog", patch.file, patch.id,
                            {"checksum": f"sha256:{patch.sha256}"}),
            properties=props(kind="patch", patch_id=patch.id, commit=patch.commit, position=position,
                             series=torch_version)))
    image_digest = record.base_image_digest.partition(":")[2] or record.base_image_digest
    image_repo = spec.image.ref.split("@")[0]
    if ":" in image_repo.rsplit("/", 1)[-1]:
        image_repo = image_repo.rsplit(":", 1)[0]          # the tag goes; the digest names the image
    registry_path, _, image_name = image_repo.rpartition("/")
    top.append(Component(
        name=spec.image.ref, version=record.base_image_digest, type=ComponentType.CONTAINER, bom_ref="base-image",
        supplier=org("Debian") if spec.image.name.startswith("debian") else None, hashes=sha(image_digest),
        purl=PackageURL("oci", None, image_name, record.base_image_digest,
                        {"repository_url": image_repo} if registry_path else None),
        properties=props(kind="base-image", image=spec.image.name, overridden=spec.image.overridden or None)))
    nvidia: dict[str, Component] = {}
    for kind, art in (("cuda", spec.cuda_runfile), ("cudnn", spec.cudnn_archive),
                      *(("input", a) for a in spec.inputs)):
        if art is None:
            continue
        art_version = {"cuda": spec.cuda_full, "cudnn": spec.cudnn}.get(kind)
        purl_name = {"cuda": "cuda", "cudnn": "cudnn"}.get(kind, art.name)
        comp = Component(
            name=art.name, version=art_version, type=ComponentType.FILE, bom_ref=f"{kind}:{art.name}",
            hashes=sha(art.sha256), supplier=org("NVIDIA") if kind in NVIDIA_LICENSES else None,
            licenses=_licenses([NVIDIA_LICENSES[kind]]) if kind in NVIDIA_LICENSES else [],
            cpe=f"cpe:2.3:a:nvidia:cuda_toolkit:{art_version}:*:*:*:*:*:*:*" if kind == "cuda" and art_version else None,
            purl=PackageURL("generic", "nvidia" if kind in NVIDIA_LICENSES else None, purl_name,
                            art_version, {"checksum": f"sha256:{art.sha256}", "download_url": art.url}),
            external_references=[ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(art.url))],
            properties=props(kind=kind, overridden=art.overridden or None))
        if kind in NVIDIA_LICENSES:
            nvidia[kind] = comp
        top.append(comp)
    dists = {}
    if inventory is not None:
        for d in inventory.scan.get("python_distributions") or []:
            if isinstance(d, dict) and d.get("name"):
                dists[re.sub(r"[-_.]+", "-", d["name"]).lower()] = d
    for req in record.build_requirements:
        dist = dists.get(re.sub(r"[-_.]+", "-", req.name).lower())
        if dist and dist.get("version") != req.version:
            dist = None
        top.append(Component(
            name=req.name, version=req.version, type=ComponentType.LIBRARY, bom_ref=f"pip:{req.name}",
            purl=PackageURL("pypi", None, req.name, req.version), hashes=sha(req.sha256),
            # the distribution's own Author field in the image; else the project that publishes it
            supplier=org(dist["author"]) if dist and dist.get("author") else org(f"{req.name} (PyPI project)"),
            licenses=_licenses([dist["license"]]) if dist and dist.get("license") and len(dist["license"]) < 80 else [],
            properties=props(kind="pip-build-requirement")))

    # the wheel's ELF files and what they need
    elves = wheel_elves(wheel_path) if wheel_path is not None else []
    inside = _provided(elves)
    files = {e.path: Component(
        name=e.path, version=version, type=ComponentType.FILE, bom_ref=f"file:{e.path}", hashes=sha(e.sha256),
        supplier=builder, licenses=_licenses([TORCH_LICENSE]),
        properties=props(kind="wheel-elf", soname=e.soname, runpath=e.runpath, size=e.size,
                         needed=" ".join(e.needed) or None)) for e in elves}
    libs: dict[str, Component] = {}           # soname -> library file component
    lib_needs: dict[str, list[str]] = {}
    packages: dict[str, Component] = {}
    unresolved: list[Component] = []
    if inventory is not None:
        osr = inventory.scan.get("os_release") or {}
        by_name = {p["name"]: p for p in inventory.packages if isinstance(p, dict) and p.get("name")}
        for lib in sorted(inventory.libraries, key=lambda x: x.get("soname", "")):
            soname = lib.get("soname")
            if not soname or soname in inside:
                continue
            lib_needs[soname] = [n for n in lib.get("needed") or [] if isinstance(n, str)]
            pkg = by_name.get(lib.get("package") or "")
            path = lib.get("path")
            where = "dpkg" if pkg else ("absent" if not lib.get("found") else "unowned")
            comp = Component(
                name=soname, version=pkg["version"] if pkg else None, type=ComponentType.LIBRARY,
                bom_ref=f"lib:{soname}", hashes=sha(lib.get("sha256")),
                properties=props(kind="shared-library", path=path, realpath=lib.get("realpath"),
                                 package=lib.get("package"), resolved=where))
            libs[soname] = comp
            if pkg:
                if pkg["name"] not in packages:
                    lic, lic_source = package_licenses(inventory, pkg)
                    packages[pkg["name"]] = Component(
                        name=pkg["name"], version=pkg["version"], type=ComponentType.LIBRARY,
                        bom_ref=f"deb:{pkg['name']}", supplier=_maintainer(pkg.get("maintainer") or ""),
                        publisher=osr.get("NAME") or None, purl=_purl_deb(pkg, osr), licenses=_licenses(lic),
                        properties=props(kind="debian-package", source=pkg.get("source"),
                                         source_version=pkg.get("source_version"), architecture=pkg.get("architecture"),
                                         license_source=lic_source))
                comp.supplier = packages[pkg["name"]].supplier
                comp.licenses = packages[pkg["name"]].licenses
                packages[pkg["name"]].components.add(comp)
                continue
            owner = None
            if path and spec.cuda_runfile is not None and re.match(r"^/usr/local/cuda", path):
                owner = nvidia.get("cuda")
            if re.match(r"^libcudnn", soname):
                owner = nvidia.get("cudnn") or owner
            if owner is not None and lib.get("found"):
                comp.version = owner.version
                comp.supplier = owner.supplier
                comp.licenses = owner.licenses
                owner.components.add(comp)
                continue
            if re.match(r"^lib(cuda|nvidia-ml)\.so", soname):
                comp.supplier = org("NVIDIA")
                comp.properties.add(Property(name="patcher:provided_by", value="the NVIDIA driver at run time"))
            unresolved.append(comp)
        top.extend(packages[name] for name in sorted(packages))
        top.extend(unresolved)
    top.extend(files[p] for p in sorted(files))

    root_props = {"wheel": record.wheel.name, "build_id": record.build_id,
                  **{f"toolchain:{k}": v for k, v in sorted(record.toolchain.items())}}
    if inventory is not None:
        root_props.update({"image": inventory.image, "image_id": inventory.image_id or None,
                           "image_os": (inventory.scan.get("os_release") or {}).get("PRETTY_NAME"),
                           "image_packages": len(inventory.packages)})
    if reproducibility is not None:
        shas = reproducibility.get("sha256") or []
        root_props.update({"reproducibility:reproducible": str(bool(reproducibility.get("reproducible"))).lower(),
                           "reproducibility:builds": reproducibility.get("builds"),
                           "reproducibility:sha256": " ".join(str(s) for s in shas) or None})
    root = Component(
        name="torch", version=version, type=ComponentType.LIBRARY, bom_ref="wheel", supplier=builder,
        purl=PackageURL("pypi", None, "torch", version), hashes=sha(record.wheel.sha256),
        cpe=_torch_cpe(torch_version), licenses=_licenses([TORCH_LICENSE]),
        pedigree=Pedigree(
            ancestors=[Component(name="pytorch", version=src.tag, type=ComponentType.LIBRARY,
                                 bom_ref="ancestor:source", purl=source_purl, supplier=org("PyTorch"))],
            commits=[Commit(uid=src.commit, url=XsUri(src.repo))],
            patches=[Patch(type=PatchClassification.UNOFFICIAL,
                           diff=Diff(url=XsUri(f"patches/{spec.torch}/{p.file}"))) for p in record.patches]),
        properties=props(**root_props))
    tools = ToolRepository(components=[Component(name="patcher", version=__version__, supplier=org("patcher"),
                                                 type=ComponentType.APPLICATION, bom_ref="tool:patcher")])
    bom = Bom(serial_number=uuid.uuid5(SBOM_NAMESPACE, record.wheel.sha256),
              metadata=BomMetaData(component=root, timestamp=timestamp, tools=tools, supplier=builder))
    for comp in top:
        bom.components.add(comp)
    bom.register_dependency(root, top)
    for e in elves:
        needs = [files[inside[n].path] for n in e.needed if n in inside and inside[n].path != e.path]
        needs += [libs[n] for n in e.needed if n not in inside and n in libs]
        bom.register_dependency(files[e.path], needs)
    for soname, comp in libs.items():
        bom.register_dependency(comp, [libs[n] for n in lib_needs.get(soname, []) if n in libs and n != soname])
    for pkg in packages.values():
        bom.register_dependency(pkg, list(pkg.components))
    for comp in nvidia.values():
        if comp.components:
            bom.register_dependency(comp, list(comp.components))
    return (JsonV1Dot6(bom).output_as_string(indent=2) + "\n").encode("utf-8")


def image_package_dependencies(inventory: Inventory | None) -> list[dict[str, Any]]:
    """The builder image's full package list as SLSA resolved dependencies (``.buildinfo`` style)."""
    if inventory is None:
        return []
    osr = inventory.scan.get("os_release") or {}
    out = []
    for pkg in inventory.packages:
        if not isinstance(pkg, dict) or not pkg.get("name") or not pkg.get("version"):
            continue
        annotations = {"kind": "image-package", "architecture": pkg.get("architecture", "")}
        if pkg.get("source") and (pkg["source"], pkg.get("source_version")) != (pkg["name"], pkg["version"]):
            annotations["source"] = f"{pkg['source']} (= {pkg.get('source_version') or pkg['version']})"
        out.append({"name": f"{pkg['name']} (= {pkg['version']})", "uri": _purl_deb(pkg, osr).to_string(),
                    "annotations": annotations})
    return out


def validate(sbom: bytes | str) -> None:
    """Raise EvidenceFormatError when the SBOM is not valid CycloneDX 1.6 JSON (strict schema)."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = sbom.decode("utf-8") if isinstance(sbom, bytes) else sbom
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise EvidenceFormatError(f"the SBOM is not valid CycloneDX 1.6: {error}")


@dataclass(frozen=True)
class SbomSummary:
    """What a reader wants from an SBOM at a glance (the report's SBOM section)."""

    components: int
    by_kind: dict[str, int] = field(default_factory=dict)
    licenses: dict[str, int] = field(default_factory=dict)
    without_license: list[str] = field(default_factory=list)
    libraries: list[dict[str, str]] = field(default_factory=list)   # soname, package, version, license
    image_packages: str | None = None
    image_os: str | None = None


def _walk(components: list[dict[str, Any]]):
    for comp in components or []:
        yield comp
        yield from _walk(comp.get("components") or [])


def _props(comp: dict[str, Any]) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in comp.get("properties") or [] if isinstance(p, dict)}


def license_names(comp: dict[str, Any]) -> list[str]:
    out = []
    for entry in comp.get("licenses") or []:
        if "expression" in entry:
            out.append(entry["expression"])
        lic = entry.get("license") or {}
        if lic.get("id") or lic.get("name"):
            out.append(lic.get("id") or lic.get("name"))
    return out


def summarize(sbom: dict[str, Any]) -> SbomSummary:
    """Counts by kind and license, and the runtime libraries with their packages."""
    comps = list(_walk(sbom.get("components") or []))
    by_kind: dict[str, int] = {}
    licenses: dict[str, int] = {}
    without: list[str] = []
    libraries = []
    parents = {}
    for comp in sbom.get("components") or []:
        for child in _walk(comp.get("components") or []):
            parents[child.get("bom-ref")] = comp
    for comp in comps:
        props = _props(comp)
        kind = props.get("patcher:kind") or comp.get("type", "?")
        by_kind[kind] = by_kind.get(kind, 0) + 1
        names = license_names(comp)
        for name in names:
            licenses[name] = licenses.get(name, 0) + 1
        if not names and kind not in ("base-image",):
            without.append(f"{comp.get('name')} {comp.get('version') or ''}".strip())
        if kind == "shared-library":
            parent = parents.get(comp.get("bom-ref")) or {}
            libraries.append({"soname": comp.get("name", ""), "package": parent.get("name") or "",
                              "version": comp.get("version") or "", "license": ", ".join(names),
                              "resolved": props.get("patcher:resolved", ""),
                              "note": props.get("patcher:provided_by", "")})
    root_props = _props((sbom.get("metadata") or {}).get("component") or {})
    return SbomSummary(components=len(comps), by_kind=dict(sorted(by_kind.items())),
                       licenses=dict(sorted(licenses.items(), key=lambda kv: (-kv[1], kv[0]))),
                       without_license=without, libraries=sorted(libraries, key=lambda x: x["soname"]),
                       image_packages=root_props.get("patcher:image_packages"),
                       image_os=root_props.get("patcher:image_os"))


__all__ = ["INVENTORY_FILE", "Inventory", "SbomSummary", "WheelElf", "build_sbom", "dep5_to_spdx",
           "external_sonames", "gather_inventory", "image_package_dependencies", "image_scan_command",
           "load_inventory", "parse_scan", "read_reproducibility", "save_inventory", "scan_image", "summarize",
           "validate", "wheel_elves"]
