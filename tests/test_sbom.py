"""The SBOM: ELF facts of a real wheel, the image scan (run for real: on this Debian host through the
exact command the build runs in its image, and in a bullseye image through the Docker engine), the
CycloneDX document (strict 1.6 schema), its dependency graph, and certify's use of the inventory."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from patcher import evidence, imagescan, sbom
from patcher.errors import EvidenceFormatError, ImageScanError
from patcher.record import load_record
from tests.fixtures.index_env import make_build_record, make_probe_report

DEP_C = "int dep_value(void) { return 41; }\n"
EXT_CPP = """#include <cmath>
#include <string>
extern "C" int dep_value(void);
extern "C" double torch_ext(double x) { return std::sqrt(x) + dep_value() + std::string("ab").size(); }
"""


def make_elf_wheel(dest: Path, version: str = "1.4.0+cu101.pt1") -> Path:
    """A torch wheel holding two real ELF files: torch/lib/libdep.so (SONAME libdep.so.1) and
    torch/_C.so (needs libdep.so.1 through RUNPATH $ORIGIN/lib, libstdc++, libm, libc)."""
    if shutil.which("gcc") is None or shutil.which("g++") is None:
        pytest.fail("gcc/g++ are needed to make the test's ELF files (install build-essential)")
    build = dest / ".elf-build"
    build.mkdir(parents=True)
    (build / "dep.c").write_text(DEP_C)
    (build / "ext.cpp").write_text(EXT_CPP)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libdep.so.1", "-o", "libdep.so", "dep.c"],
                   cwd=build, check=True)
    subprocess.run(["g++", "-shared", "-fPIC", "-o", "_C.so", "ext.cpp", "-L.", "-ldep",
                    "-Wl,-rpath,$ORIGIN/lib", "-Wl,--enable-new-dtags"], cwd=build, check=True)
    dist = "torch"
    info = f"{dist}-{version}.dist-info"
    members = {
        f"{dist}/__init__.py": b'__version__ = "%s"\n' % version.encode(),
        f"{dist}/_C.so": (build / "_C.so").read_bytes(),
        f"{dist}/lib/libdep.so": (build / "libdep.so").read_bytes(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: patcher-tests\nRoot-Is-Purelib: false\nTag: cp39-cp39-linux_x86_64\n",
    }
    lines = []
    for arc, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{arc},sha256={digest},{len(data)}")
    lines.append(f"{info}/RECORD,,")
    members[f"{info}/RECORD"] = ("\n".join(lines) + "\n").encode()
    wheel = dest / f"{dist}-{version}-cp39-cp39-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in members.items():
            zf.writestr(zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0)), data)
    shutil.rmtree(build)
    return wheel


def host_scan(sonames, elf_class=2, machine=62) -> dict:
    """The scan as the image runs it (the same argv), here on this Debian host."""
    out = subprocess.run(sbom.image_scan_command(sonames, elf_class, machine), capture_output=True, check=True)
    return sbom.parse_scan(out.stdout)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def elf_wheel(tmp_path) -> Path:
    return make_elf_wheel(tmp_path / "dist")


# --- the wheel --------------------------------------------------------------------------------
def test_wheel_elves_reads_soname_needed_runpath_and_hashes(elf_wheel):
    elves = {e.path: e for e in sbom.wheel_elves(elf_wheel)}
    assert set(elves) == {"torch/_C.so", "torch/lib/libdep.so"}
    dep, ext = elves["torch/lib/libdep.so"], elves["torch/_C.so"]
    assert dep.soname == "libdep.so.1"
    assert "libdep.so.1" in ext.needed and "libstdc++.so.6" in ext.needed and "libc.so.6" in ext.needed
    assert ext.runpath == "$ORIGIN/lib"
    assert (ext.elf_class, ext.machine) == (2, 62)
    with zipfile.ZipFile(elf_wheel) as zf:
        assert ext.sha256 == hashlib.sha256(zf.read("torch/_C.so")).hexdigest()
    # what the wheel carries itself is not external
    external = sbom.external_sonames(list(elves.values()))
    assert "libdep.so.1" not in external
    assert {"libstdc++.so.6", "libc.so.6"} <= set(external)


def test_elf_parser_agrees_with_readelf_on_system_libraries():
    if shutil.which("readelf") is None:
        pytest.fail("readelf (binutils) is needed to cross-check the ELF parser")
    for path in ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/bin/ls"):
        real = Path(path).resolve()
        facts = imagescan.elf_dynamic(real.read_bytes())
        out = subprocess.run(["readelf", "-d", str(real)], capture_output=True, text=True, check=True).stdout
        needed = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
        assert facts["needed"] == needed, path
        soname = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(SONAME)" in line]
        assert facts["soname"] == (soname[0] if soname else None)
    assert imagescan.elf_dynamic(b"#!/bin/sh\n" + b"\0" * 80) is None


# --- the scan ---------------------------------------------------------------------------------
def test_host_scan_resolves_sonames_to_dpkg_packages_with_versions_to_closure():
    scan = host_scan(["libstdc++.so.6", "libnot-there-at-all.so.7"])
    libs = {lib["soname"]: lib for lib in scan["libraries"]}
    std = libs["libstdc++.so.6"]
    assert std["found"] and std["package"] == "libstdc++6"
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libstdc++6"], capture_output=True,
                               text=True, check=True).stdout
    assert std["version"] == installed
    assert std["sha256"] == _sha(Path(std["realpath"]))
    # closure: what libstdc++ needs is resolved too (libc, libm, libgcc_s)
    assert {"libc.so.6", "libm.so.6", "libgcc_s.so.1"} <= set(libs)
    assert libs["libc.so.6"]["package"] == "libc6"
    assert libs["libnot-there-at-all.so.7"]["found"] is False
    # the full package list, as dpkg-query has it
    names = {p["name"] for p in scan["packages"]}
    assert {"libc6", "libstdc++6", "dpkg"} <= names
    assert scan["os_release"]["ID"] == "debian"
    assert scan["package_licenses"]["libstdc++6"]["format"] in ("dep5", "free-form")


def test_dep5_license_names_map_to_spdx():
    assert sbom.dep5_to_spdx("Expat") == "MIT"
    assert sbom.dep5_to_spdx("GPL-2+") == "GPL-2.0-or-later"
    assert sbom.dep5_to_spdx("LGPL-2.1") == "LGPL-2.1-only"
    assert sbom.dep5_to_spdx("BSD-3-clause") == "BSD-3-Clause"
    assert sbom.dep5_to_spdx("GPL-3+ with GCC-3.1 exception") == "GPL-3.0-or-later WITH GCC-exception-3.1"
    assert sbom.dep5_to_spdx("public-domain") is None
    assert sbom.dep5_to_spdx("BSL-1.0") == "BSL-1.0"


def test_parse_scan_refuses_what_is_not_a_scan():
    with pytest.raises(EvidenceFormatError, match="not JSON"):
        sbom.parse_scan(b"no python in the image")
    with pytest.raises(EvidenceFormatError, match="schema"):
        sbom.parse_scan({"schema": 99, "libraries": []})


# --- the SBOM ---------------------------------------------------------------------------------
def _inventory_for(wheel: Path) -> sbom.Inventory:
    elves = sbom.wheel_elves(wheel)
    return sbom.Inventory(image="host", image_id="", wheel=wheel.name, wheel_sha256=_sha(wheel),
                          scan=host_scan(sbom.external_sonames(elves)))


def _components(doc):
    return list(sbom._walk(doc["components"]))


def test_sbom_names_every_linked_library_with_package_version_license_and_is_schema_valid(tmp_path, elf_wheel):
    record_path = make_build_record(tmp_path / "work", elf_wheel)
    record = load_record(record_path)
    inv = _inventory_for(elf_wheel)
    data = evidence.build_sbom(record, evidence._spec_of(record), wheel_path=elf_wheel, inventory=inv)
    sbom.validate(data)
    doc = json.loads(data)
    comps = {c["bom-ref"]: c for c in _components(doc)}
    # every soname the wheel's ELF files need from outside is a component, nested in its package
    for soname in sbom.external_sonames(sbom.wheel_elves(elf_wheel)):
        lib = comps[f"lib:{soname}"]
        assert lib["hashes"][0]["alg"] == "SHA-256"
    std_pkg = comps["deb:libstdc++6"]
    assert "lib:libstdc++.so.6" in [c["bom-ref"] for c in std_pkg["components"]]
    assert std_pkg["purl"].startswith("pkg:deb/debian/libstdc%2B%2B6@") or std_pkg["purl"].startswith("pkg:deb/debian/libstdc++6@")
    assert std_pkg["supplier"]["name"]
    assert sbom.license_names(std_pkg)      # DEP-5 or the table for gcc's runtime
    assert sbom.license_names(comps["deb:libc6"]) == ["LGPL-2.1-or-later"] or sbom.license_names(comps["deb:libc6"])
    # the wheel's own ELF files, with hashes, and the graph: _C.so -> libdep (inside) and libstdc++ (image)
    ext = comps["file:torch/_C.so"]
    with zipfile.ZipFile(elf_wheel) as zf:
        assert ext["hashes"][0]["content"] == hashlib.sha256(zf.read("torch/_C.so")).hexdigest()
    graph = {d["ref"]: set(d.get("dependsOn", [])) for d in doc["dependencies"]}
    assert {"file:torch/lib/libdep.so", "lib:libstdc++.so.6", "lib:libc.so.6"} <= graph["file:torch/_C.so"]
    assert "lib:libc.so.6" in graph["lib:libstdc++.so.6"]
    assert {"source", "submodule:third_party/fmt", "file:torch/_C.so", "deb:libstdc++6"} <= graph["wheel"]
    # NTIA minimum elements on every top-level component but the base image: name, version, supplier
    for comp in doc["components"]:
        assert comp["name"] and comp.get("version"), comp["bom-ref"]
        if comp["bom-ref"] != "base-image":
            assert comp.get("supplier", {}).get("name"), comp["bom-ref"]
    assert doc["metadata"]["component"]["cpe"].startswith("cpe:2.3:a:linuxfoundation:pytorch:1.4.0")
    # byte-stable
    again = evidence.build_sbom(record, evidence._spec_of(record), wheel_path=elf_wheel, inventory=inv)
    assert again == data


def test_sbom_without_wheel_or_inventory_is_still_valid_and_names_licenses(tmp_path, torch_wheel):
    record = load_record(make_build_record(tmp_path / "work", torch_wheel))
    data = evidence.build_sbom(record, evidence._spec_of(record))
    sbom.validate(data)
    doc = json.loads(data)
    summary = sbom.summarize(doc)
    assert summary.licenses.get("BSD-3-Clause")
    assert summary.libraries == []
    cuda = next(c for c in doc["components"] if c["bom-ref"].startswith("cuda:"))
    assert cuda["supplier"]["name"] == "NVIDIA" and cuda["cpe"].startswith("cpe:2.3:a:nvidia:cuda_toolkit:10.1")


def test_recorded_1131_sbom_regenerates_from_its_record_with_more_facts():
    run = Path(__file__).resolve().parent.parent / "evidence" / "runs" / "torch-1.13.1-cpu"
    record = load_record(run / "record-cold.json")
    old = json.loads((run / "evidence" / (record.wheel.name + ".cdx.json")).read_text())
    data = evidence.build_sbom(record, evidence._spec_of(record))
    sbom.validate(data)
    new = json.loads(data)
    assert len(_components(new)) == len(_components(old)) == 17
    with_purl = [c for c in _components(new) if c.get("purl")]
    assert len(with_purl) == 17 > len([c for c in _components(old) if c.get("purl")])
    # the tree was trusted by override: its purl names the tag, never the re-imported commit
    source = next(c for c in new["components"] if c["bom-ref"] == "source")
    assert source["purl"] == "pkg:github/pytorch/pytorch@v1.13.1"


def test_provenance_lists_the_image_packages_and_certify_checks_the_inventory(tmp_path, elf_wheel):
    from patcher import keys

    record_path = make_build_record(tmp_path / "work", elf_wheel)
    report = make_probe_report(tmp_path / "probe.json")
    key = tmp_path / "key.pem"
    keys.generate_key(key)
    inv = _inventory_for(elf_wheel)
    sbom.save_inventory(inv, record_path.parent)
    result = evidence.certify(record_path, report, key)
    envelope = json.loads(result.provenance.read_text().splitlines()[0])
    statement = json.loads(base64.b64decode(envelope["payload"]))
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    pkgs = [d for d in deps if d["annotations"]["kind"] == "image-package"]
    assert len(pkgs) == len(inv.packages) > 100
    libc = next(d for d in pkgs if d["name"].startswith("libc6 (= "))
    assert libc["uri"].startswith("pkg:deb/debian/libc6@")
    doc = json.loads(result.sbom.read_text())
    assert any(c["bom-ref"] == "lib:libstdc++.so.6" for c in _components(doc))
    # an inventory of another wheel is refused, naming it
    stale = sbom.Inventory(image="host", image_id="", wheel=elf_wheel.name, wheel_sha256="0" * 64, scan=inv.scan)
    sbom.save_inventory(stale, record_path.parent)
    with pytest.raises(EvidenceFormatError, match="another wheel"):
        evidence.certify(record_path, report, key)


# --- in a real image --------------------------------------------------------------------------
@pytest.mark.docker
def test_scan_in_a_bullseye_image_names_bullseye_packages(tmp_path, docker_client, docker_engine, bullseye_python_image,
                                                        elf_wheel):
    inv = sbom.gather_inventory(elf_wheel, bullseye_python_image.tag, engine=docker_engine)
    assert inv.image_id == bullseye_python_image.image_id
    assert inv.scan["os_release"]["VERSION_CODENAME"] == "bullseye"
    libs = {lib["soname"]: lib for lib in inv.libraries}
    assert libs["libstdc++.so.6"]["package"] == "libstdc++6"
    assert libs["libstdc++.so.6"]["version"].startswith("10.")      # bullseye's gcc 10 runtime
    assert libs["libc.so.6"]["version"].startswith("2.31")
    leftover = docker_client.containers.list(all=True, filters={"label": sbom.SCAN_LABEL})
    assert leftover == []
    with pytest.raises(ImageScanError, match="not on this engine"):
        sbom.gather_inventory(elf_wheel, "patcher-test/no-such-image:never", engine=docker_engine)
