"""`patcher report`: the page is made from the signed evidence only, says on top whether it checked out,
is self-contained (no script, no external asset), shows a signed VEX when there is one, and the
static index links it."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

from patcher import evidence, index, report
from patcher.keys import load_private_key
from tests.fixtures.common import run_patcher

REPO_ROOT = Path(__file__).resolve().parent.parent
RECORDED = REPO_ROOT / "evidence" / "runs" / "torch-1.13.1-cpu" / "evidence"


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if "id" in a:
            self.ids.add(a["id"])


def assert_self_contained(page: str) -> _Refs:
    """No script, no frame, nothing fetched: every src/href that loads something is data: or in-page."""
    refs = _Refs()
    refs.feed(page)
    for tag, attrs in refs.tags:
        assert tag not in ("script", "iframe", "object", "embed", "img", "video", "audio", "base"), tag
        if tag == "link":
            assert attrs.get("href", "").startswith("data:"), attrs
        assert "src" not in attrs, (tag, attrs)
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        if tag == "a" and attrs.get("href", "").startswith("#"):
            assert attrs["href"][1:] in refs.ids or attrs["href"] == "#", f"broken internal link {attrs['href']}"
    assert "@import" not in page and "url(" not in page
    return refs


# The 1.4.0 advisories that keep a wheel carrying the whole series from green: exploitable (patcher's
# assessments of the real tree) for the bundle's cu101 build.  A site that has ruled them out says so.
BLOCKING_140 = ("CVE-2024-48063", "CVE-2025-3000", "CVE-2025-46148")


def site_assessments(not_affected=BLOCKING_140, exploitable=(), in_triage=()) -> str:
    """A site's advisories file (the real feature: its assessments override patcher's)."""
    parts = ["schema = 1"]
    for ident in not_affected:
        parts.append(f'[assess."{ident}"."1.4.0"]\nstate = "not_affected"\njustification = "code_not_present"\n'
                     'absent = ["torch/csrc/jit/mobile/interpreter.cpp"]\ndetail = "the site builds without it"\n'
                     'by = "site security team"')
    for ident in in_triage:
        parts.append(f'[assess."{ident}"."1.4.0"]\nstate = "in_triage"\ndetail = "not yet established here"\n'
                     'by = "site security team"')
    for ident in exploitable:
        parts.append(f'[assess."{ident}"."1.4.0"]\nstate = "exploitable"\ndetail = "reached from our service"\n'
                     'by = "site security team"')
    return "\n".join(parts) + "\n"


def recertify(b, tmp_path, *, missing=(), failing=(), site=None):
    """Certify the bundle's build again with a probe report in the real probe's words: every check the
    1.4.0 series' Probe trailers name passes, except ``missing`` (not run) and ``failing``."""
    from patcher.patches import load_series

    series = load_series(b.catalog / "patches", "1.4.0")
    checks = [{"id": c, "status": "fail" if c in failing else "pass", "patches": [p.id], "duration_s": 0.05,
               "message": "wrong result" if c in failing else ""}
              for p in series.patches for c in p.probes if c not in missing]
    probe = {"schema": 1, "torch": "1.4.0", "python": "3.7.17", "passed": not failing,
             "started": "2026-01-02T05:10:00Z", "duration_s": 1.5, "checks": checks,
             "environment": {"python": {"executable": "/opt/probe/venv/bin/python", "version": "3.7.17"},
                             "platform": {"system": "Linux", "machine": "x86_64"},
                             "torch": {"version": "1.4.0+cu101.pt1"}},
             "summary": {"pass": sum(c["status"] == "pass" for c in checks), "fail": len(failing)}}
    probe_path = tmp_path / "probe-recertify.json"
    probe_path.write_text(json.dumps(probe, indent=2) + "\n")
    site_path = tmp_path / "site-advisories.toml"
    site_path.write_text(site if site is not None else site_assessments())
    evidence.certify(b.record, probe_path, b.key, advisories_file=site_path, catalog=b.catalog,
                     allow_failed_probe=bool(failing))
    return series


def test_report_of_a_fresh_certified_wheel_is_not_green_and_names_why(certified_bundle):
    """The bundle's probe report runs none of the checks its patches' Probe trailers name, and its VEX
    has advisories in triage at CVSS >= 7: the signature verifies, but the page is not green."""
    b = certified_bundle
    result = report.write_report(b.wheel, public_key=b.public_key, catalog=b.catalog)
    assert result.html == b.wheel.with_name(b.wheel.name + report.REPORT_SUFFIX)
    # red, not amber: patcher's assessments of the real 1.4.0 tree leave CVE-2024-48063 (RPC, built with
    # USE_DISTRIBUTED in cu101) exploitable, and this site has not ruled it out
    assert result.verdict == "failed", result.checks
    status = {c.name: c.status for c in result.checks}
    assert status["signature"] == "ok" and status["patch proofs"] == "unproven" and status["advisories"] == "failed"
    page = result.html.read_text()
    assert_self_contained(page)
    top = page[page.index('id="verdict"'):page.index('id="checks"')]
    assert "Every check below passed" not in page and "this wheel FAILS a check" in top
    assert "maxpool2d.nhwc_large_channels not in the report" in top and "exploitable: CVE-2024-48063" in top
    assert report.VERDICT_RULE in html.unescape(top)                                # the rule, in one sentence, under the verdict
    record = json.loads(b.record.read_text())
    assert record["wheel"]["sha256"] in page
    for patch in record["patches"]:
        assert patch["id"] in page and patch["sha256"] in page
    # certified without a catalog: subjects and trailers from the catalog's files with the signed sha256
    assert page.count("matched by sha256: catalog file") == len(record["patches"])
    assert "max_pool2d: bound NHWC shared memory" in page
    assert "<svg" in page and "max_pool2d_nhwc_large_c" in page     # the probe chart, inline
    vex = json.loads(b.wheel.with_name(b.wheel.name + report.VEX_SUFFIX).read_text())
    for v in vex["vulnerabilities"]:    # every advisory the signed VEX states, with its state
        assert v["id"] in page
    assert "in_triage" in page and "9.8 critical" in page
    assert f"patcher verify {b.wheel.name} --key" in page


def test_report_says_not_verified_on_top_when_evidence_was_altered(certified_bundle, tmp_path):
    b = certified_bundle
    probe = b.wheel.with_name(b.wheel.name + evidence.PROBE_SUFFIX)
    probe.write_text(probe.read_text().replace('"passed": true', '"passed": true, "edited": 1'))
    result = report.write_report(b.wheel, out=tmp_path / "r.html", public_key=b.public_key, catalog=b.catalog)
    assert result.verdict == "failed"
    page = (tmp_path / "r.html").read_text()
    top = page[page.index('id="verdict"'):page.index('id="checks"')]
    assert "NOT VERIFIED" in top and "probe report" in top and "altered or replaced" in top

    # another key: the signature does not check out, the page still shows what the statement says
    from patcher import keys

    other = tmp_path / "other.pem"
    keys.generate_key(other)
    result = report.write_report(b.wheel, out=tmp_path / "r2.html", public_key=other, catalog=b.catalog)
    assert result.verdict == "failed"
    assert next(c for c in result.checks if c.name == "signature").status == "failed"


def test_report_shows_a_signed_vex_and_refuses_an_unsigned_one(certified_bundle, tmp_path):
    b = certified_bundle
    vex = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "vulnerabilities": [
        {"id": "CVE-2025-32434", "ratings": [{"severity": "critical", "score": 9.8}],
         "analysis": {"state": "exploitable", "response": ["update"], "detail": "open in every legacy release"}},
        {"id": "CVE-2022-45907", "analysis": {"state": "resolved_with_pedigree", "detail": "PT-0101"}}]}
    vex_path = b.wheel.with_name(b.wheel.name + report.VEX_SUFFIX)
    vex_path.write_text(json.dumps(vex))
    prov = b.wheel.with_name(b.wheel.name + evidence.PROVENANCE_SUFFIX)
    statement = json.loads(base64.b64decode(json.loads(prov.read_text())["payload"]))
    byproducts = statement["predicate"]["runDetails"]["byproducts"]
    byproducts[:] = [p for p in byproducts if p["annotations"]["kind"] != "vex"]   # as before VEX existed
    env = evidence.sign_envelope(evidence.canonical_json(statement), load_private_key(b.key))
    prov.write_bytes(evidence.canonical_json(env) + b"\n")
    # beside the wheel but not signed: named as a failure
    result = report.write_report(b.wheel, out=tmp_path / "u.html", public_key=b.public_key, catalog=b.catalog)
    assert any(c.name == "VEX" and c.status == "failed" for c in result.checks)
    # signed (a statement with the VEX byproduct, as certify's VEX hook writes it)
    statement["predicate"]["runDetails"]["byproducts"].append(
        {"name": vex_path.name, "digest": {"sha256": hashlib.sha256(vex_path.read_bytes()).hexdigest()},
         "annotations": {"kind": "vex"}})
    env = evidence.sign_envelope(evidence.canonical_json(statement), load_private_key(b.key))
    prov.write_bytes(evidence.canonical_json(env) + b"\n")
    result = report.write_report(b.wheel, out=tmp_path / "s.html", public_key=b.public_key, catalog=b.catalog)
    assert next(c for c in result.checks if c.name == "VEX").status == "ok"
    assert next(c for c in result.checks if c.name == "advisories").status == "failed"   # exploitable: red
    assert result.verdict == "failed", result.checks
    page = (tmp_path / "s.html").read_text()
    assert "CVE-2025-32434" in page and "exploitable" in page and "resolved_with_pedigree" in page
    assert "this wheel FAILS a check" in page and "NOT VERIFIED" not in page


def test_report_of_the_recorded_1131_build_verifies_without_the_wheel(tmp_path):
    # No catalog: the page shows what the signed evidence has of each patch (Patch-Id, file, sha256)
    result = report.write_report(RECORDED, out=tmp_path / "r.html", public_key=RECORDED / "signing-key.pub.pem",
                                 catalog=None)
    assert result.verdict == "incomplete"
    status = {c.name: c.status for c in result.checks}
    assert status == {"signature": "ok", "wheel": "absent", "SBOM": "ok", "probe report": "ok", "probe": "ok",
                      "patch series": "ok", "patch proofs": "unproven", "advisories": "absent"}
    page = (tmp_path / "r.html").read_text()
    assert_self_contained(page)
    for fact in ("2dd83d5fd0b91c075f8c0d5692e01ada016deed675ac56e4e8b33014cb21c87a", "PT-0906", "v1.13.1",
                 "security.cve_2024_31583", "tag_commit", "not checked", "No VEX document is signed",
                 "49e8ed6b80e2bafadb0dd5340595e46f31a60fc9f41cd7c4b72b357877a414e4", "no catalog given",
                 "The wheel is not here."):
        assert fact in page, fact
    assert "unreadable" not in page


def test_report_command_and_index_link(certified_bundle, tmp_path):
    b = certified_bundle
    recertify(b, tmp_path)
    res = run_patcher("report", str(b.wheel), "--key", str(b.public_key), "--catalog", str(b.catalog))
    assert res.exit_code == 0, res.stderr
    assert "verdict    verified" in res.stdout
    out = index.publish(tmp_path / "index", [b.wheel])
    assert out.published == [b.wheel.name]
    page = (tmp_path / "index" / "simple" / "torch" / "index.html").read_text()
    import html as html_mod

    assert f'href="{html_mod.escape("../../files/" + b.wheel.name + report.REPORT_SUFFIX)}"' in page
    assert (tmp_path / "index" / "files" / (b.wheel.name + report.REPORT_SUFFIX)).is_file()
    data = json.loads((tmp_path / "index" / "simple" / "torch" / "index.json").read_text())
    assert "report.html" in data["files"][0]["_patcher_evidence"]


def test_report_of_a_folder_without_one_wheels_evidence_is_one_error_and_no_page(certified_bundle, tmp_path):
    b = certified_bundle
    empty = tmp_path / "empty"
    empty.mkdir()
    for target, says in ((empty, "holds 0 wheels' signed evidence"), (tmp_path / "nothing", "neither a wheel"),
                         (b.dist / "torch-9.9.9-py3-none-any.whl", "no provenance")):
        out = tmp_path / "page.html"
        res = run_patcher("report", str(target), "-o", str(out), "--key", str(b.public_key))
        assert res.exit_code == 102, (target, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("patcher: error: ") and says in lines[0], res.stderr
        assert "Traceback" not in res.stderr and res.stdout == ""
        assert not out.exists() and not list(tmp_path.glob(".page.html*"))   # nothing half-written
    # two wheels' evidence in one folder: which one is meant is not guessed
    shutil.copytree(b.dist, empty / "a")
    shutil.copytree(b.dist, empty / "b")
    res = run_patcher("report", str(empty), "-o", str(tmp_path / "page.html"), "--key", str(b.public_key))
    assert res.exit_code == 102 and "holds 2 wheels' signed evidence" in res.stderr


def test_report_command_on_the_recorded_run_folder_says_the_wheel_is_gone(tmp_path):
    """`patcher report evidence/runs/torch-1.13.1-cpu`: no wheel there, nor asked for: one stderr line says
    so, and the page is made from the signed evidence in its evidence/ folder."""
    out = tmp_path / "recorded.html"
    res = run_patcher("report", str(RECORDED.parent), "-o", str(out), "--key", str(RECORDED / "signing-key.pub.pem"),
                      "--catalog", str(REPO_ROOT))
    assert res.exit_code == 0, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("patcher: note: ") and "--catalog" in lines[0], res.stderr
    assert "torch-1.13.1+cpu.pt1-cp39-cp39-linux_x86_64.whl is not in" in lines[0]
    assert "verdict    incomplete" in res.stdout
    page = out.read_text()
    assert "The wheel is not here." in page and "the wheel's own sha256 is not" in page
