"""The report's verdict is the worst of its parts, as a reader sees it in Chromium: green only when
every patch's own probe checks ran and passed, no advisory is exploitable and none is in triage at
CVSS >= 7; and the recorded 1.13.1 build's patch table is read from its signed evidence."""

from __future__ import annotations

import base64
import json
import re

from patcher import evidence, report
from tests.test_report import BLOCKING_140, RECORDED, REPO_ROOT, recertify, site_assessments
from tests.test_report_chromium import AMBER, GREEN, RED, render_and_check


def _top(page_text: str) -> str:
    """The verdict banner and the rule under it, as rendered text."""
    return page_text[:page_text.index("Checks Built from")]


def recertified_report(b, tmp_path, **recertify_args):
    """The bundle certified again (tests.test_report.recertify) and its report written: (series, result)."""
    series = recertify(b, tmp_path, **recertify_args)
    return series, report.write_report(b.wheel, out=tmp_path / "r.html", public_key=b.public_key, catalog=b.catalog)


def test_all_parts_passing_is_green(certified_bundle, tmp_path):
    b = certified_bundle
    series = recertify(b, tmp_path)
    result = report.write_report(b.wheel, out=tmp_path / "green.html", public_key=b.public_key, catalog=None)
    assert result.verdict == "verified", result.checks
    assert {c.name: c.status for c in result.checks}["advisories"] == "ok"
    text = render_and_check(result.html, tmp_path, ["Signature verified. Every check below passed.",
                                                    f"every one of the {len(series.patches)} patches' Probe checks ran "
                                                    "and passed",
                                                    "ran 2026-01-02T05:10:00Z with /opt/probe/venv/bin/python"], GREEN)
    # certify signed each patch's subject and trailers: the table needs no catalog (none was given)
    for patch in series.patches:
        assert patch.subject in text, patch.subject
    assert text.count("signed in the provenance") == len(series.patches)
    assert "The verdict is the worst of its parts" in text
    prov = b.wheel.with_name(b.wheel.name + evidence.PROVENANCE_SUFFIX)
    statement = json.loads(base64.b64decode(json.loads(prov.read_text())["payload"]))
    signed = [d["annotations"] for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
              if d["annotations"]["kind"] == "patch"]
    assert [a["patchTrailers"]["Probe"] for a in signed] == [p.trailers["Probe"] for p in series.patches]


def test_a_patch_whose_probe_checks_did_not_run_is_not_green(certified_bundle, tmp_path):
    b = certified_bundle
    series, result = recertified_report(b, tmp_path, missing=("security.cve_2025_2953",))
    assert result.verdict == "incomplete", result.checks
    text = render_and_check(result.html, tmp_path, ["not everything is proven"], AMBER)
    assert f"patch proofs: unproven: 1 of {len(series.patches)} patches not proven by a passing probe check: PT-0103: " \
           "security.cve_2025_2953 not in the report" in _top(text)
    assert "Every check below passed" not in text


def test_a_failed_patch_probe_check_is_red(certified_bundle, tmp_path):
    b = certified_bundle
    _, result = recertified_report(b, tmp_path, failing=("security.cve_2022_45907",))
    assert result.verdict == "failed", result.checks
    text = render_and_check(result.html, tmp_path, ["this wheel FAILS a check"], RED)
    assert "PT-0101: security.cve_2022_45907 fail" in _top(text)


def test_an_advisory_in_triage_at_cvss_7_or_more_is_not_green(certified_bundle, tmp_path):
    b = certified_bundle
    # the site reopens two advisories: one at CVSS 9.8, one at 4.8
    _, result = recertified_report(b, tmp_path, site=site_assessments(
        not_affected=[a for a in BLOCKING_140 if a != "CVE-2024-48063"],
        in_triage=("CVE-2024-48063", "CVE-2025-2998")))
    assert result.verdict == "incomplete", result.checks
    assert {c.name: c.status for c in result.checks}["patch proofs"] == "ok"
    text = render_and_check(result.html, tmp_path, ["not everything is proven"], AMBER)
    assert "advisories: open: 1 in triage at CVSS >= 7 or unscored: CVE-2024-48063 (CVSS 9.8)" in _top(text)
    # advisories in triage below 7 do not hold it back, and the page lists every one with its CVSS
    assert re.search(r"CVE-2025-2998 GHSA-[a-z0-9-]+, PYSEC-[0-9-]+ 4\.8 medium in_triage", text)


def test_an_exploitable_advisory_is_red(certified_bundle, tmp_path):
    b = certified_bundle
    _, result = recertified_report(b, tmp_path, site=site_assessments(exploitable=("CVE-2025-2998",)))
    assert result.verdict == "failed", result.checks
    text = render_and_check(result.html, tmp_path, ["this wheel FAILS a check"], RED)
    assert "advisories: failed: 1 exploitable: CVE-2025-2998" in _top(text)
    assert "NOT VERIFIED" not in text           # the evidence itself checks out; the wheel does not


def test_recorded_1131_page_has_the_patches_real_subjects_from_the_signed_bytes(tmp_path):
    """The recorded build's provenance signs only each patch's file and sha256; today's catalog has other
    bytes for every one of them, so subjects come from the catalog's history, matched by sha256."""
    result = report.write_report(RECORDED, out=tmp_path / "recorded.html", public_key=RECORDED / "signing-key.pub.pem",
                                 catalog=REPO_ROOT)
    subjects = ["cmake: build without third_party/foxi",
                "jit: parse type comments as type expressions, never run them",
                "ctc_loss: refuse an empty log_probs instead of dividing by zero",
                "mkldnn pooling: refuse a stride that is not positive"]
    text = render_and_check(result.html, tmp_path, ["The wheel is not here.", *subjects], AMBER)
    # the subjects are those of today's catalog files of the same Patch-Id (a patch keeps its subject)
    for subject in subjects:
        assert subject in {evidence.patch_header(p.read_bytes())["subject"]
                           for p in (REPO_ROOT / "patches" / "1.13.1").glob("*.patch")}
    assert text.count("matched by sha256: ") == 13 and "unreadable" not in text
    assert "13 patches signed by file name and sha256; subject and trailers signed for 0, matched by sha256 " \
           "in the catalog for 13, unknown for 0" in text
    assert "PT-0201: determinism.adaptive_max_pool2d skip" in _top(text)
    assert "advisories: absent: no VEX is signed" in _top(text)


def test_the_image_scan_and_the_libraries_it_resolved_are_on_the_page(tmp_path):
    """A wheel with real ELF files, its builder image scanned (here: this Debian host, with the argv the
    image runs), certified: the page lists the image's packages the provenance signs."""
    from patcher import keys, sbom
    from tests.fixtures.index_env import make_build_record, make_probe_report
    from tests.test_sbom import host_scan, make_elf_wheel

    wheel = make_elf_wheel(tmp_path / "dist")
    record = make_build_record(tmp_path / "work", wheel)
    inventory = sbom.Inventory(image="host", image_id="", wheel=wheel.name,
                               wheel_sha256=evidence.sha256_file(wheel),
                               scan=host_scan(sbom.external_sonames(sbom.wheel_elves(wheel))))
    sbom.save_inventory(inventory, record.parent)
    key, public = tmp_path / "key.pem", tmp_path / "key.pub.pem"
    keys.generate_key(key)
    keys.export_public(key, out=public)
    evidence.certify(record, make_probe_report(tmp_path / "probe.json"), key, catalog=REPO_ROOT)
    result = report.write_report(wheel, out=tmp_path / "scan.html", public_key=public, catalog=None)
    libc = next(p for p in inventory.packages if p["name"] == "libc6")
    text = render_and_check(result.html, tmp_path, [
        "Builder image scan", f"names the builder image's {len(inventory.packages)} Debian packages",
        f"libc6 (= {libc['version']})", "libc.so.6"], RED)  # a 1.4.0 wheel with exploitable advisories
    assert "carries no scan of the builder image" not in text


def test_certify_signs_a_patch_header_only_for_the_bytes_the_build_used(certified_bundle, tmp_path):
    """A catalog file edited after the build is not the patch the wheel carries: certify signs no subject
    for it, and the report shows what the evidence has (file and sha256) instead of the new text."""
    b = certified_bundle
    edited = b.catalog / "patches" / "1.4.0" / "0102-ctc-loss-refuse-empty-log-probs.patch"
    edited.write_text(edited.read_text().replace("Subject: [PATCH] ", "Subject: [PATCH] EDITED "))
    recertify(b, tmp_path)
    prov = b.wheel.with_name(b.wheel.name + evidence.PROVENANCE_SUFFIX)
    statement = json.loads(base64.b64decode(json.loads(prov.read_text())["payload"]))
    signed = {d["name"]: d["annotations"] for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
              if d["annotations"]["kind"] == "patch"}
    assert "patchSubject" not in signed[edited.name]
    assert sum("patchSubject" in a for a in signed.values()) == len(signed) - 1
    result = report.write_report(b.wheel, out=tmp_path / "r.html", public_key=b.public_key, catalog=b.catalog)
    page = result.html.read_text()
    assert "EDITED" not in page and "no catalog file has this sha256: subject and trailers unknown" in page
    proofs = next(c for c in result.checks if c.name == "patch proofs")
    assert proofs.status == "unproven" and "PT-0102: which checks prove it is unknown" in proofs.detail
