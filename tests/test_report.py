"""`patcher report`: the page is made from the signed evidence only, says on top whether it checked out,
is self-contained (no script, no external asset), shows a signed VEX when there is one, and the
static index links it."""

from __future__ import annotations

import base64
import hashlib
import json
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


def test_report_of_a_certified_wheel_is_verified_and_self_contained(certified_bundle):
    b = certified_bundle
    result = report.write_report(b.wheel, public_key=b.public_key, catalog=b.catalog)
    assert result.html == b.wheel.with_name(b.wheel.name + report.REPORT_SUFFIX)
    assert result.verdict == "verified", result.checks
    page = result.html.read_text()
    assert_self_contained(page)
    assert "Signature verified." in page
    assert page.index('id="verdict"') < page.index('id="checks"')     # the verdict comes first
    record = json.loads(b.record.read_text())
    assert record["wheel"]["sha256"] in page
    for patch in record["patches"]:
        assert patch["id"] in page
    assert "<svg" in page and "max_pool2d_nhwc_large_c" in page     # the probe chart, inline
    vex = b.wheel.with_name(b.wheel.name + report.VEX_SUFFIX)
    if vex.is_file():   # certify's VEX: every advisory it states is in the advisory table
        for v in json.loads(vex.read_text()).get("vulnerabilities", []):
            assert v["id"] in page
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
    assert result.verdict == "verified", result.checks
    page = (tmp_path / "s.html").read_text()
    assert "CVE-2025-32434" in page and "exploitable" in page and "resolved_with_pedigree" in page


def test_report_of_the_recorded_1131_build_verifies_without_the_wheel(tmp_path):
    # No catalog: the catalog's 1.13.1 series has moved on since that build (new patches, new trailers);
    # the committed page (report/report.html) was made against the catalog of the recording commit.
    result = report.write_report(RECORDED, out=tmp_path / "r.html", public_key=RECORDED / "signing-key.pub.pem",
                                 catalog=None)
    assert result.verdict == "incomplete"
    status = {c.name: c.status for c in result.checks}
    assert status == {"signature": "ok", "wheel": "absent", "SBOM": "ok", "probe report": "ok", "probe": "ok",
                      "patch series": "skipped"}
    page = (tmp_path / "r.html").read_text()
    assert_self_contained(page)
    for fact in ("2dd83d5fd0b91c075f8c0d5692e01ada016deed675ac56e4e8b33014cb21c87a", "PT-0906", "v1.13.1",
                 "security.cve_2024_31583", "tag_commit", "not checked", "No VEX document is signed"):
        assert fact in page, fact
    # against today's catalog, a changed patch is named, not hidden
    result = report.write_report(RECORDED, out=tmp_path / "r2.html", public_key=RECORDED / "signing-key.pub.pem",
                                 catalog=REPO_ROOT)
    series = next(c for c in result.checks if c.name == "patch series")
    assert series.status in ("ok", "failed")
    if series.status == "failed":
        assert result.verdict == "failed" and "differs from the catalog" in series.detail


def test_report_command_and_index_link(certified_bundle, tmp_path):
    b = certified_bundle
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
    # not a wheel with evidence: one clear error
    res = run_patcher("report", str(tmp_path))
    assert res.exit_code == 65 and "provenance" in res.stderr
