"""The committed run of upstream's own tests on a patched build (issue 21):
evidence/runs/torch-1.13.1-cpu/upstream-tests-2026-12-02 holds the probe stage of a real cold 1.13.1
CPU build with `--upstream-tests`. Its report must say what the run's README says: every patch of
the build's series had its selection run in the wheel's clean venv, nothing failed."""

from __future__ import annotations

import json
from pathlib import Path

from patcher import upstream_tests as ut

RUN_DIR = Path(__file__).resolve().parent.parent / "evidence" / "runs" / "torch-1.13.1-cpu" / "upstream-tests-2026-12-02"


def test_upstream_tests_ran_on_the_recorded_patched_build_and_none_failed():
    report = json.loads((RUN_DIR / "probe-stage-upstream-tests-report.json").read_text())
    upstream = ut.UpstreamTestReport.from_json(report["upstream_tests"])
    assert report["passed"] and upstream.passed and upstream.error is None
    assert upstream.torch_version == "1.13.1+cpu.pt1" and upstream.python_version.startswith("3.9.")
    counts = upstream.summary()
    assert counts["passed"] > 2000 and all(counts[o] == 0 for o in ut.FAILING)
    assert not upstream.selection_errors
    # the clean venv had no numpy, PyYAML or six of its own: the pinned ones ran
    assert {f.split("-")[0] for f, _ in upstream.wheels} >= {"numpy", "PyYAML", "six", "pytest"}
    assert upstream.target_provided == ()
    record = json.loads((RUN_DIR / "record-cold.json").read_text())
    ids = [p["id"] for p in record["patches"]]
    assert len(ids) == 38 and record["wheel"]["sha256"].startswith("61a4699f")
    for patch_id in ids:
        assert upstream.for_patch(patch_id), f"{patch_id}: no upstream test of it ran on the build"


def test_the_kept_tree_rebuilds_took_one_file_and_the_way_back_is_the_cold_wheel():
    """Issue 22 on the real tree: one patch changed, then changed back, on the kept build tree."""
    cold, warm, back = (json.loads((RUN_DIR / f"record-{name}.json").read_text()) for name in ("cold", "warm", "back"))
    assert back["wheel"]["sha256"] == cold["wheel"]["sha256"] != warm["wheel"]["sha256"]
    steps = (RUN_DIR / "steps" / "10-back-to-the-cold-source.txt").read_text()
    assert "identical: the rebuild after one patch changed (back) is the cold build's wheel" in steps
    assert "(kept build tree: 1 files changed)" in (RUN_DIR / "steps" / "09-warm-build.txt").read_text()
