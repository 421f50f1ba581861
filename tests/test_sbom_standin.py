"""The SBOM of a real build: the stand-in built by `patcher build` in its bullseye builder image, the
builder image scanned for what the wheel's ELF files need, certified; the SBOM names every library."""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from patcher import evidence, sbom
from tests.fixtures.index_env import make_probe_report


@dataclass(frozen=True)
class CertifiedStandin:
    build_dir: Path
    wheel: Path
    record: dict
    public_key: Path
    catalog: Path
    inventory: sbom.Inventory


@pytest.fixture(scope="session")
def standin_certified(standin, tmp_path_factory, docker_engine, docker_client) -> CertifiedStandin:
    """The stand-in built (reproducibility checked), its builder image scanned, certified."""
    import uuid

    from click.testing import CliRunner

    from patcher import keys
    from patcher.cli import _register, cli

    _register()
    root = tmp_path_factory.mktemp("standin-certified")
    work = root / "work"
    volume = f"patcher-test-ccache-{uuid.uuid4().hex[:12]}"
    try:
        res = CliRunner().invoke(cli, standin.build_args(work, "--until", "wheel", "--check-reproducible",
                                                         "--ccache-volume", volume),
                                 env=standin.env, catch_exceptions=False)
        assert res.exit_code == 0, res.output
    finally:
        try:
            docker_client.volumes.get(volume).remove(force=True)
        except Exception:  # noqa: BLE001 - not created
            pass
    build_dir = work / standin.build_id
    record = json.loads((build_dir / "record.json").read_text())
    wheel = build_dir / record["wheel"]["path"]
    inventory = sbom.gather_inventory(wheel, record["image_id"], engine=docker_engine)
    sbom.save_inventory(inventory, build_dir)
    key = root / "signing.pem"
    keys.generate_key(key)
    public = root / "signing.pub.pem"
    keys.export_public(key, out=public)
    report = make_probe_report(root / "probe.json")
    evidence.certify(build_dir / "record.json", report, key)
    return CertifiedStandin(build_dir=build_dir, wheel=wheel, record=record, public_key=public,
                            catalog=standin.catalog, inventory=inventory)


@pytest.mark.docker
@pytest.mark.slow
def test_standin_sbom_names_every_linked_library_of_the_wheel(standin_certified):
    s = standin_certified
    data = s.wheel.with_name(s.wheel.name + evidence.SBOM_SUFFIX).read_bytes()
    sbom.validate(data)
    doc = json.loads(data)
    comps = {c["bom-ref"]: c for c in sbom._walk(doc["components"])}
    elves = sbom.wheel_elves(s.wheel)
    with zipfile.ZipFile(s.wheel) as zf:
        so_names = [n for n in zf.namelist() if n.endswith(".so")]
    assert so_names and {e.path for e in elves} == set(so_names)
    external = sbom.external_sonames(elves)
    assert {"libstdc++.so.6", "libc.so.6"} <= set(external)
    scan_pkgs = {p["name"]: p["version"] for p in s.inventory.packages}
    for soname in external:
        lib = comps[f"lib:{soname}"]
        package = next(p for p in lib["properties"] if p["name"] == "patcher:package")["value"]
        assert lib["version"] == scan_pkgs[package], soname       # the exact version in the builder image
        parent = comps[f"deb:{package}"]
        assert parent["purl"].startswith(f"pkg:deb/debian/{package.replace('+', '%2B')}@")
        assert "distro=debian-11" in parent["purl"]
        assert parent["supplier"]["name"]
    # the graph from the wheel's extension to the image's libraries
    graph = {d["ref"]: set(d.get("dependsOn", [])) for d in doc["dependencies"]}
    ext = next(e for e in elves if e.path.startswith("torch/_C"))
    assert {f"lib:{n}" for n in ext.needed} <= graph[f"file:{ext.path}"]
    assert "submodule:third_party/dep" in graph["wheel"]
    # reproducibility, from the build's own check, is in the signed SBOM
    props = {p["name"]: p["value"] for p in doc["metadata"]["component"]["properties"]}
    assert props["patcher:reproducibility:reproducible"] == "true"
    assert props["patcher:image_os"].startswith("Debian GNU/Linux 11")
    # and the provenance carries the builder image's full package list
    verified = evidence.verify(s.wheel, s.public_key, s.catalog)
    assert verified.sbom.endswith(".cdx.json")
    envelope = json.loads(s.wheel.with_name(s.wheel.name + evidence.PROVENANCE_SUFFIX).read_text().splitlines()[0])
    import base64

    deps = json.loads(base64.b64decode(envelope["payload"]))["predicate"]["buildDefinition"]["resolvedDependencies"]
    listed = {d["name"] for d in deps if d["annotations"]["kind"] == "image-package"}
    assert listed == {f"{n} (= {v})" for n, v in scan_pkgs.items()}
    assert any(n.startswith("g++-10 (= 10.2.1") for n in listed)
