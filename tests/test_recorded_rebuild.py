"""The committed rebuild of the patched 1.13.1 CPU wheel (evidence/runs/torch-1.13.1-cpu/rebuild-2026-12-02)
holds together: the signed statement is about the recorded wheel, the probe passed every security
check of its series on it (PT-0108's C++ fix among them), and the warm rebuild's numbers are its records'."""

from __future__ import annotations

import json
from pathlib import Path

from patcher.evidence import PROBE_SUFFIX, PROVENANCE_SUFFIX, open_envelope
from patcher.keys import load_public_key

RUN_DIR = Path(__file__).resolve().parent.parent / "evidence" / "runs" / "torch-1.13.1-cpu" / "rebuild-2026-12-02"
SECURITY = {"security.cve_2022_45907": "PT-0101", "security.cve_2022_45907_bypass": "PT-0101",
            "security.cve_2025_3730": "PT-0102", "security.cve_2024_31580": "PT-0104",
            "security.cve_2024_31583": "PT-0105", "security.cve_2025_32434": "PT-0106",
            "security.cve_2026_24747": "PT-0107", "security.cve_2025_2148": "PT-0108",
            "security.cve_2025_55553": "PT-0109"}


def _run() -> dict:
    return json.loads((RUN_DIR / "run.json").read_text())


def test_the_signed_statement_is_about_the_recorded_wheel_and_its_36_patches():
    run = _run()
    name, sha = run["cold"]["wheel"]["name"], run["cold"]["wheel"]["sha256"]
    key = load_public_key(RUN_DIR / "evidence" / "signing-key.pub.pem")
    (line,) = (RUN_DIR / "evidence" / (name + PROVENANCE_SUFFIX)).read_text().splitlines()
    statement = json.loads(open_envelope(json.loads(line), key))
    assert {s["name"]: s["digest"]["sha256"] for s in statement["subject"]} == {name: sha}
    record = json.loads((RUN_DIR / "record-cold.json").read_text())
    assert record["wheel"]["sha256"] == sha and len(record["patches"]) == 36
    assert "PT-0108" in [p["id"] for p in record["patches"]]


def test_every_security_check_of_the_series_passed_on_the_built_wheel():
    run = _run()
    report = json.loads((RUN_DIR / "evidence" / (run["cold"]["wheel"]["name"] + PROBE_SUFFIX)).read_text())
    assert report["passed"] is True and report["environment"]["torch"]["version"] == "1.13.1+cpu.pt1"
    by_id = {c["id"]: c for c in report["checks"]}
    for check_id, patch_id in SECURITY.items():
        assert by_id[check_id]["status"] == "pass" and by_id[check_id]["required"], check_id
        assert patch_id in by_id[check_id]["patches"]
    assert not [c for c in report["checks"] if c["status"] in ("fail", "error")]


def test_the_upstream_selections_of_the_probe_stage_are_recorded_as_they_failed():
    """What the README says: upstream's tests could not collect in the wheel's clean venv (no numpy)."""
    report = json.loads((RUN_DIR / "probe-stage-upstream-tests-report.json").read_text())
    upstream = [c for c in report["checks"] if c["id"].startswith("upstream.")]
    assert len(upstream) == 37 and all(c["status"] == "fail" for c in upstream)
    assert all("No module named 'numpy'" in f["message"] for c in upstream for f in c["details"]["failures"])


def test_the_warm_rebuild_kept_its_build_tree_and_its_ratio_is_the_records():
    run = _run()
    cold = json.loads((RUN_DIR / "record-cold.json").read_text())
    warm = json.loads((RUN_DIR / "record-warm.json").read_text())
    assert warm["build_tree"]["reused"] is True and warm["build_tree"]["written"] == 3
    ratio = run["warm_vs_cold"]
    assert ratio["wheel_cold_s"] == cold["stage_durations"]["wheel"]
    assert ratio["wheel_warm_s"] == warm["stage_durations"]["wheel"]
    assert ratio["wheel_cold_over_warm"] == round(ratio["wheel_cold_s"] / ratio["wheel_warm_s"], 2) >= 100
