"""The committed record of the real 1.13.1 CPU build (evidence/runs/torch-1.13.1-cpu) holds together.

The wheel itself is not committed, so these checks tie everything else to its sha256: the signed
statement is about that wheel and verifies with the committed public key, the SBOM and probe report
in the folder are the signed ones, the probe passed with every patch's own check, and the cold/warm
numbers in run.json are those of the build records beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patcher.evidence import (
    PROBE_SUFFIX,
    PROVENANCE_SUFFIX,
    PROVENANCE_TYPE,
    SBOM_SUFFIX,
    open_envelope,
    sha256_file,
)
from patcher.keys import load_public_key

RUN_DIR = Path(__file__).resolve().parent.parent / "evidence" / "runs" / "torch-1.13.1-cpu"


@pytest.fixture(scope="module")
def run() -> dict:
    return json.loads((RUN_DIR / "run.json").read_text())


@pytest.fixture(scope="module")
def wheel_name(run) -> str:
    return run["cold"]["wheel"]["name"]


@pytest.fixture(scope="module")
def statement(wheel_name) -> dict:
    key = load_public_key(RUN_DIR / "evidence" / "signing-key.pub.pem")
    lines = (RUN_DIR / "evidence" / (wheel_name + PROVENANCE_SUFFIX)).read_text().splitlines()
    assert len(lines) == 1
    found = json.loads(open_envelope(json.loads(lines[0]), key))
    assert found["predicateType"] == PROVENANCE_TYPE
    return found


def test_the_cold_build_ran_every_stage_and_names_its_wheel(run, wheel_name):
    cold = run["cold"]
    assert cold["completed_stages"] == ["resolve", "fetch", "patch", "render", "image", "configure",
                                        "wheel", "probe", "certify"]
    assert wheel_name.startswith("torch-1.13.1+cpu.pt1-cp39-cp39-linux_x86_64")
    assert len(cold["wheel"]["sha256"]) == 64
    record = json.loads((RUN_DIR / "record-cold.json").read_text())
    assert record["wheel"]["sha256"] == cold["wheel"]["sha256"]
    assert [p["id"] for p in record["patches"]] == cold["patches"]


def test_the_signed_statement_is_about_the_recorded_wheel(statement, run, wheel_name):
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects == {wheel_name: run["cold"]["wheel"]["sha256"]}


@pytest.mark.parametrize("kind,suffix", [("sbom", SBOM_SUFFIX), ("probe-report", PROBE_SUFFIX)])
def test_the_evidence_files_are_the_signed_ones(statement, wheel_name, kind, suffix):
    byproducts = {b["annotations"]["kind"]: b for b in statement["predicate"]["runDetails"]["byproducts"]}
    assert byproducts[kind]["name"] == wheel_name + suffix
    assert sha256_file(RUN_DIR / "evidence" / (wheel_name + suffix)) == byproducts[kind]["digest"]["sha256"]


def test_the_signed_patches_are_the_recorded_series(statement, run):
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    signed = [d["annotations"]["patchId"] for d in sorted(
        (d for d in deps if d.get("annotations", {}).get("kind") == "patch"),
        key=lambda d: d["annotations"]["position"])]
    assert signed == run["cold"]["patches"]


def test_the_probe_passed_with_every_patch_check(run, wheel_name):
    report = json.loads((RUN_DIR / "evidence" / (wheel_name + PROBE_SUFFIX)).read_text())
    assert report["passed"] is True
    assert report["environment"]["torch"]["version"] == "1.13.1+cpu.pt1"
    by_id = {c["id"]: c for c in report["checks"]}
    proving = [c for c in report["checks"] if set(c.get("patches", [])) & set(run["cold"]["patches"])]
    for check in proving:
        # a CPU build has no CUDA kernels (PT-0201/0202) and this one no oneDNN (PT-0103): those
        # checks skip, saying why; every other check of a patch must pass
        absent = ("needs CUDA" in check["message"] or "without MKL-DNN" in check["message"])
        assert check["required"] and (check["status"] == "pass" or (check["status"] == "skip" and absent)), check
    passed = {c["id"] for c in proving if c["status"] == "pass"}
    assert passed == {"security.cve_2022_45907", "security.cve_2022_45907_bypass", "security.cve_2025_3730",
                      "security.cve_2024_31580", "security.cve_2024_31583"}
    assert not [c for c in by_id.values() if c["status"] in ("fail", "error")]
    assert run["probe"]["passed"] is True and run["probe"]["required_failed"] == []


def test_warm_rebuild_numbers_are_the_records(run):
    warm = json.loads((RUN_DIR / "record-warm.json").read_text())
    cold = json.loads((RUN_DIR / "record-cold.json").read_text())
    ratio = run["warm_vs_cold"]
    # the cold build ran in parts (attempts stopped by build errors, each fixed by a patch); its cold
    # wheel time is the sum of every part's wheel stage
    parts = [a["wheel_s"] for a in run.get("cold_attempts", [])] + [cold["stage_durations"]["wheel"]]
    assert ratio["wheel_cold_s"] == round(sum(parts), 3)
    assert ratio["wheel_warm_s"] == warm["stage_durations"]["wheel"]
    assert ratio["wheel_cold_over_warm"] == round(ratio["wheel_cold_s"] / ratio["wheel_warm_s"], 2)
    # the warm build really ran with one patch changed: its patch series digests differ in one place
    changed = [c["id"] for c, w in zip(cold["patches"], warm["patches"]) if c["sha256"] != w["sha256"]]
    assert changed == ["PT-0102"]
