"""What `make test-slow` proves is committed as evidence stamped with the series it checked; CI
holds each file to today's catalog and fails when a patch changed since (then run make test-slow
again and commit what it writes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patcher import slow_evidence

REPO = Path(__file__).resolve().parent.parent
# evidence file -> the test of `make test-slow` that writes it
SLOW_EVIDENCE = {
    "evidence/compile-check-1.4.0.json":
        "tests/test_realtree_1_4_0.py::test_every_unit_of_the_1_4_0_series_compiles",
    "evidence/compile-check-1.13.1-series.json":
        "tests/test_compile_check.py::test_every_unit_of_the_1_13_1_series_compiles",
    "evidence/compile-check-2.6.0-series.json":
        "tests/test_realtree_2_6_0.py::test_every_unit_of_the_2_6_0_series_compiles",
}


@pytest.mark.parametrize("path", list(SLOW_EVIDENCE))
def test_slow_evidence_speaks_for_todays_catalog(path):
    report = json.loads((REPO / path).read_text())
    reason = slow_evidence.stale_reason(report, REPO / "patches")
    assert reason is None, f"{path} is stale: {reason}; run `make test-slow` ({SLOW_EVIDENCE[path]}) and commit it"
    assert report["units"] and all(u["status"] == "pass" for u in report["units"])
    assert report.get("failed", 0) == 0 and report["passed"] in (True, len(report["units"]))


def test_a_changed_patch_makes_the_evidence_stale(tmp_path):
    patches = tmp_path / "patches"
    (patches / "9.9.9").mkdir(parents=True)
    (patches / "9.9.9" / "series").write_text("0001-a.patch\n# a comment\n0002-b.patch\n")
    (patches / "9.9.9" / "0001-a.patch").write_text("one\n")
    (patches / "9.9.9" / "0002-b.patch").write_text("two\n")
    report = slow_evidence.stamp({"passed": True}, patches, "9.9.9")
    assert report["catalog"]["patches"] == ["0001-a.patch", "0002-b.patch"]
    assert slow_evidence.stale_reason(report, patches) is None
    (patches / "9.9.9" / "0002-b.patch").write_text("two, changed\n")
    assert "the bytes of a patch" in slow_evidence.stale_reason(report, patches)
    (patches / "9.9.9" / "series").write_text("0001-a.patch\n")
    assert "0002-b.patch" in slow_evidence.stale_reason(report, patches)
    assert slow_evidence.stale_reason({"passed": True}, patches) == "it carries no catalog stamp"
