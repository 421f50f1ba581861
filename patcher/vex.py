"""The VEX of a wheel: CycloneDX 1.6 JSON, one vulnerability per published torch advisory.

Certify writes ``W.vex.json`` beside the SBOM and signs it as a byproduct of the provenance;
verify checks it is the signed one.  Its states come from :func:`patcher.advisories.assess`:
the build's flags (spec), the patches the wheel carries (record) and its probe report.  Our
own backports are ``resolved_with_pedigree``: the fix is one of the patches the SBOM's
pedigree lists.  The document is plain JSON written deterministically (sorted keys, serial
number from the wheel's digest, the SBOM's timestamp); the tests validate it against the
CycloneDX schema with cyclonedx-python-lib's validator.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from patcher import __version__
from patcher import advisories as adv_mod
from patcher.errors import EvidenceFormatError, VexMismatchError

VEX_SUFFIX = ".vex.json"
SPEC_VERSION = "1.6"
VEX_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:patcher:vex")
_METHODS = {"3.0": "CVSSv3", "3.1": "CVSSv31", "4.0": "CVSSv4"}
_VEX_STATE = {"resolved": "resolved_with_pedigree"}


def _vuln_source(ident: str) -> dict[str, str]:
    if ident.startswith("CVE-"):
        return {"name": "NVD", "url": f"https://nvd.nist.gov/vuln/detail/{ident}"}
    if ident.startswith("GHSA-"):
        return {"name": "GitHub Advisories", "url": f"https://github.com/advisories/{ident}"}
    if ident.startswith("PYSEC-"):
        return {"name": "PyPA", "url": f"https://osv.dev/vulnerability/{ident}"}
    return {"name": "patcher"}


def _vulnerability(finding: adv_mod.Finding, affects_ref: str) -> dict[str, Any]:
    a = finding.advisory
    analysis: dict[str, Any] = {"state": _VEX_STATE.get(finding.state, finding.state), "detail": finding.detail}
    if finding.justification:
        analysis["justification"] = finding.justification
    if finding.state == "exploitable" and finding.patch:
        analysis["response"] = ["update"]   # a build that carries the patch fixes it
    props = [{"name": "patcher:basis", "value": finding.basis}, {"name": "patcher:origin", "value": finding.origin}]
    if finding.patch:
        props.append({"name": "patcher:patch-id", "value": finding.patch})
    props += [{"name": "patcher:probe", "value": p} for p in finding.probes]
    for r in a.ranges:
        bounds = ", ".join(f"{k} {v if isinstance(v, str) else '/'.join(v)}" for k, v in sorted(r.items())
                           if k != "source")
        props.append({"name": "patcher:published-range", "value": f"{r['source']}: {bounds}"})
    vuln: dict[str, Any] = {
        "bom-ref": f"vuln:{a.id}",
        "id": a.id,
        "source": _vuln_source(a.id),
        "description": a.summary,
        "analysis": analysis,
        "affects": [{"ref": affects_ref}],
        "properties": props,
    }
    if a.aliases:
        vuln["references"] = [{"id": alias, "source": _vuln_source(alias)} for alias in a.aliases]
    if a.cvss:
        vuln["ratings"] = [{"source": {"name": c.source}, "score": c.score, "severity": c.severity,
                            "method": _METHODS.get(c.version, "other"), "vector": c.vector} for c in a.cvss]
    if a.published:
        vuln["published"] = f"{a.published}T00:00:00Z"
    links = list(a.fixes) + [r for r in a.references if r not in a.fixes]
    if links:
        vuln["advisories"] = [{"url": u} for u in links]
    return vuln


def build_vex(*, wheel_name: str, wheel_sha256: str, torch_version: str, findings: list[adv_mod.Finding],
              sources: tuple[tuple[str, str], ...], sbom_serial: str, timestamp: str) -> bytes:
    """The VEX document for one wheel (bytes; identical for identical inputs)."""
    affects_ref = f"urn:cdx:{sbom_serial}/1#wheel"
    props = [{"name": "patcher:sbom", "value": wheel_name + ".cdx.json"}]
    for path, digest in sources:
        props.append({"name": "patcher:advisories", "value": f"{Path(path).name} sha256:{digest}"})
    for state, n in adv_mod.counts(findings).items():
        props.append({"name": f"patcher:count:{state}", "value": str(n)})
    doc = {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.uuid5(VEX_NAMESPACE, wheel_sha256)}",
        "version": 1,
        "metadata": {
            "timestamp": timestamp,
            "tools": {"components": [{"type": "application", "name": "patcher", "version": __version__}]},
            "component": {"type": "library", "bom-ref": "wheel", "name": "torch", "version": torch_version,
                          "hashes": [{"alg": "SHA-256", "content": wheel_sha256}],
                          "properties": [{"name": "patcher:wheel", "value": wheel_name}]},
            "properties": props,
        },
        "vulnerabilities": [_vulnerability(f, affects_ref) for f in sorted(findings, key=lambda f: f.advisory.id)],
    }
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def probe_checks_of(report_data: bytes) -> dict[str, Mapping[str, Any]]:
    """The probe report's checks by id (the report was validated by evidence.read_probe_report)."""
    report = json.loads(report_data)
    return {str(c.get("id")): c for c in report.get("checks", []) if isinstance(c, dict)}


def findings_for_build(record: Any, spec: Any, report_data: bytes | None,
                       advisories_file: Path | None = None) -> tuple[list[adv_mod.Finding], adv_mod.AdvisoryData]:
    data = adv_mod.load(site=advisories_file)
    checks = probe_checks_of(report_data) if report_data is not None else None
    findings = adv_mod.assess(data, spec.torch, adv_mod.build_flags(spec), [p.id for p in record.patches], checks)
    return findings, data


def summary(path: Path) -> dict[str, int]:
    """State counts of a VEX file (for verify's output)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        vulns = doc["vulnerabilities"]
    except (OSError, ValueError, KeyError, TypeError):
        raise EvidenceFormatError(f"VEX {Path(path).name} is not a CycloneDX document with vulnerabilities") from None
    out: dict[str, int] = {}
    for v in vulns:
        state = str(v.get("analysis", {}).get("state", "?"))
        out[state] = out.get(state, 0) + 1
    return dict(sorted(out.items()))


def check_beside(wheel: Path, byproduct: Mapping[str, Any] | None) -> Path:
    """The VEX beside ``wheel``, once its digest is the one the signed statement records."""
    if byproduct is None:
        raise VexMismatchError(f"the signed statement of {wheel.name} records no VEX",
                               hint="certify the build again with this patcher; it writes and signs the VEX")
    name = str(byproduct.get("name", ""))
    if not name or "/" in name or name.startswith(".") or not name.endswith(VEX_SUFFIX):
        raise VexMismatchError(f"the statement's VEX name {name!r} is not a plain .vex.json file name")
    path = wheel.with_name(name)
    try:
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise VexMismatchError(f"no VEX {name} beside the wheel", hint="publish and copy it with the wheel") from None
    expected = byproduct.get("digest", {}).get("sha256")
    if actual != expected:
        raise VexMismatchError(f"VEX {name} has sha256 {actual}, the signed statement says {expected}",
                               hint="the VEX was edited or replaced after certification")
    return path
