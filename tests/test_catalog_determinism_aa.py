"""Determinism patch PT-0232 (the antialiased bilinear/bicubic interpolation backward) and its GPU
evidence (no GPU needed here).

The evidence is written on an H200 by harness/deterministic_backward/smoke_aa.py, run_harness_aa.py
and probe_all_kernels.py (harness/deterministic_backward/README.md gives the command) and checked in
under evidence/gpu/. These tests hold the recorded proof and the patch to the series' bar.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.test_catalog_determinism import (
    HARNESS,
    PATCH_DIR,
    REPO_ROOT,
    _added_text,
    _commit_message,
    _removed_lines,
    ran_cases,
    read_evidence,
)

GPU = REPO_ROOT / "evidence" / "gpu"
OPS_JSON = GPU / "deterministic-issue18-upsample-aa-ops.json"
TRAINING_JSON = GPU / "deterministic-issue18-upsample-aa-training.json"
SMOKE_LOG = GPU / "deterministic-issue18-upsample-aa-smoke.log"
PROBE_JSON = GPU / "determinism-all-kernels-h200.json"
PATCH = PATCH_DIR / "0232-deterministic-upsample-aa-backward.patch"
PROBES = ("interpolate_bilinear_aa", "interpolate_bicubic_aa")
TARGET = "aten/src/ATen/native/cuda/UpSampleBilinear2d.cu"
ALERTS = ("upsample_bilinear2d_aa_backward_out_cuda", "upsample_bicubic2d_aa_backward_out_cuda")


def _section() -> str:
    text = (HARNESS / "det_kernels_aa.cuh").read_text()
    begin, end = "// BEGIN upsample_aa\n", "// END upsample_aa\n"
    return text[text.index(begin) + len(begin):text.index(end)]


def _series() -> list[str]:
    lines = [ln.split("#", 1)[0].strip() for ln in (PATCH_DIR / "series").read_text().splitlines()]
    return [ln for ln in lines if ln]


@pytest.fixture(scope="module")
def ops() -> dict:
    return read_evidence(OPS_JSON)


def test_evidence_comes_from_an_h200_run(ops):
    assert "H200" in ops["device"] and ops["torch"].startswith("2.11") and ops["repeats"] >= 25
    assert ops["build_seconds"] > 0 and ops["register_errors"] == []


def test_every_case_ran_bitwise_and_every_op_kind_dtype_and_layout_is_covered(ops):
    ran = ran_cases(ops)
    assert len(ran) == len(ops["cases"]) >= 20
    for case in ran:
        assert case["bitwise_equal_repeats"] == case["repeats"], (case["op"], case["name"], case["dtype"])
    covered = {(c["op"], c["kind"]) for c in ran}
    assert {(op, kind) for op in ("bilinear", "bicubic") for kind in ("realistic", "small", "contention")} <= covered
    assert {c["dtype"] for c in ran} == {"float32", "float64", "float16", "bfloat16"}
    assert {c["op"] for c in ran if c["channels_last"]} == {"bilinear", "bicubic"}
    assert all(c["ours_channels_last"] for c in ran if c["channels_last"])
    # torch's atomic kernel is not repeatable in the realistic cases
    assert all(c["torch_differing_repeats"] > 0 for c in ran if c["kind"] == "realistic")


def test_errors_and_times_are_recorded_and_torchs_shared_memory_bound_is_shown(ops):
    for case in ran_cases(ops):
        assert case["max_abs_err_vs_fp64_ours"] >= 0 and case["timing"]["ours_ms"] > 0
        if "torch_error" in case:  # torch's kernel refuses a support this large
            assert "shared memory" in case["torch_error"] and case["kind"] == "contention"
            continue
        assert case["timing"]["torch_ms"] > 0 and case["error_ratio"] >= 0
        if case["dtype"] == "float64":
            assert case["max_abs_err_vs_fp64_ours"] <= case["max_abs_err_vs_fp64_torch"]
        else:  # against fp64 with the kernels' own float scale (the rounding of the scale is shared)
            assert case["error_ratio_same_scale"] <= 1.0, (case["op"], case["name"], case["dtype"])
    assert any("torch_error" in c for c in ran_cases(ops))


def test_torch_raises_under_the_flag_and_ours_runs_repeatably(ops):
    before = ops["torch_under_deterministic_flag"]
    assert set(before) == {f"interpolate_{m}_aa{f}" for m in ("bilinear", "bicubic") for f in ("", "_channels_last")}
    assert all(r["raised"] for r in before.values())
    after = ops["after_registration_under_flag"]
    assert all(not r["raised"] and r["bitwise_repeats"] == r["of"] for r in after.values())
    smoke = SMOKE_LOG.read_text()
    assert "FAILS 0" in smoke and " FAIL" not in smoke.replace("FAILS 0", "")
    assert smoke.count("gradcheck fp64") == 6
    # one non-zero output per plane: every non-zero element equals torch's CUDA kernel (the weights)
    one_term = re.findall(r"one term per element.* (\d+) of (\d+) non-zero elements bitwise equal", smoke)
    assert len(one_term) == 24 and all(a == b for a, b in one_term)


def test_training_is_bitwise_with_ours_and_not_with_torchs():
    training = json.loads(TRAINING_JSON.read_text())
    assert training["steps"] >= 200 and "H200" in training["device"]
    assert training["ours_flag_on"]["bitwise_equal"] is True
    assert training["torch_flag_off"]["bitwise_equal"] is False
    for run in ("ours_flag_on", "torch_flag_off"):
        assert all(s > 0 for s in training[run]["steps_per_s"])


def test_the_probe_with_every_kernel_registered_passes_every_determinism_check():
    report = json.loads(PROBE_JSON.read_text())
    registration = json.loads(PROBE_JSON.with_suffix(".registration.json").read_text())
    assert registration["extensions"]["build_aa"]["registered"] == []
    assert "PT-0232" in registration["patched_ids"]
    checks = {c["id"]: c for c in report["checks"]}
    for probe in PROBES:
        assert checks["determinism." + probe]["status"] == "pass", probe
    det = [c for c in report["checks"] if c["id"].startswith("determinism.")]
    assert det and all(c["status"] == "pass" for c in det)


def test_patch_trailers_and_format():
    message = _commit_message(PATCH)
    assert message[0].startswith("Subject: [PATCH] ")
    while message and not message[-1].strip():
        message.pop()
    keys = [line.split(":", 1)[0] for line in message[-7:]]
    assert keys == ["Patch-Id", "Applies-To", "Category", "Upstream-Bug", "Upstream-Fix", "Probe", "Upstream-Tests"]
    assert message[-7] == "Patch-Id: PT-0232"
    assert message[-6:-4] == ["Applies-To: ==1.13.1", "Category: determinism"]
    assert message[-2] == "Probe: " + ", ".join("determinism." + p for p in PROBES)
    assert message[-1].startswith("Upstream-Tests: test_nn.py -k ")
    text = PATCH.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert re.search(r"^index [0-9a-f]{40}\.\.[0-9a-f]{40} ", text, re.M)


def test_patch_carries_the_proved_kernel_under_the_flag_only():
    text = PATCH.read_text()
    assert f"b/{TARGET}" in text and text.count("diff --git ") == 1
    added = _added_text(PATCH)
    assert _section().strip() in added
    assert added.count("globalContext().deterministicAlgorithms()") == 2
    assert added.count("upsample_aa_backward_deterministic(grad_input, grad_output,") == 2
    # torch's kernels stay; only the two alert comments make room for the branch before the alert
    removed = [line[1:].strip() for line in _removed_lines(PATCH)]
    assert sorted(set(removed)) == ["// Nondeterministic because of atomicAdd usage",
                                    "// See Note [Writing Nondeterministic Operations]"]
    assert len(removed) == 4


def test_the_series_lists_it_after_the_other_determinism_patches():
    names = _series()
    assert names.index("0231-deterministic-index-reduce.patch") + 1 == names.index(PATCH.name)
    assert names.index("0208-deterministic-upsample-linear-backward.patch") < names.index(PATCH.name)


def test_probe_checks_name_the_patch_and_start_with_cuda_antialiasing():
    from patcher.probe.checks import determinism
    by_name = {name: patches for name, _, _, patches in determinism.OPERATIONS}
    for probe in PROBES:
        assert by_name[probe] == ("PT-0232",)
        assert determinism.TORCH_RANGES[probe] == ">=1.12"


def test_patch_applies_in_series_order_to_the_real_1_13_1_tree(realtree_checkout):
    names = _series()
    for name in names[:names.index(PATCH.name) + 1]:
        subprocess.run(["git", "apply", str(PATCH_DIR / name)], cwd=realtree_checkout, check=True)
    source = (realtree_checkout / TARGET).read_text()
    assert source.count("upsample_aa_backward_deterministic(grad_input, grad_output,") == 2
    for alert in ALERTS:  # still raised without the flag's path, right after it
        assert source.count(f'globalContext().alertNotDeterministic("{alert}");') == 1
    # PT-0208's deterministic path of the plain bilinear backward is still there
    assert "upsample_backward_deterministic(grad_input, grad_output, /*spatial=*/2" in source
