"""Determinism patches PT-0201 / PT-0202 and their GPU evidence (no GPU needed here).

The evidence JSON is written on an H200 by harness/deterministic_backward/run_harness.py
(see harness/deterministic_backward/README.md for the command) and checked in under
evidence/gpu/. These tests hold the patches and the recorded proof to the issue's bar.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = REPO_ROOT / "evidence" / "gpu" / "deterministic-backward.json"
HARNESS = REPO_ROOT / "harness" / "deterministic_backward"
PATCH_DIR = REPO_ROOT / "patches" / "1.13.1"
AMP_PATCH = PATCH_DIR / "0201-deterministic-adaptive-max-pool2d-backward.patch"
GS_PATCH = PATCH_DIR / "0202-deterministic-grid-sampler-2d-backward.patch"

MIN_REPEATS = 20
MAX_TIME_RATIO = 3.0

TRAILERS = {
    AMP_PATCH: [
        "Patch-Id: PT-0201",
        "Applies-To: ==1.13.1",
        "Category: determinism",
        "Upstream-Bug: https://github.com/pytorch/pytorch/issues/131972",
        "Upstream-Fix: none",
        "Probe: determinism.adaptive_max_pool2d",
        'Upstream-Tests: test_nn.py -k "AdaptiveMaxPool2d or adaptive_max_pool2d or',
        ' adaptive_pooling_max", test_torch.py -k "nondeterministic_alert_AdaptiveMaxPool2d"',
    ],
    GS_PATCH: [
        "Patch-Id: PT-0202",
        "Applies-To: ==1.13.1",
        "Category: determinism",
        "Upstream-Bug: https://github.com/pytorch/pytorch/issues/68959",
        "Upstream-Fix: none",
        "Probe: determinism.grid_sampler_2d",
        'Upstream-Tests: test_nn.py -k "(grid_sample or GridSample or grid_sampler) and not large",',
        ' test_torch.py -k "nondeterministic_alert_grid_sample_2d"',
    ],
}
OPS = ("adaptive_max_pool2d", "grid_sampler_2d")


@pytest.fixture(scope="module")
def evidence() -> dict:
    assert EVIDENCE.is_file(), f"missing {EVIDENCE}"
    return json.loads(EVIDENCE.read_text())


def _errors(value) -> list[float]:
    if isinstance(value, dict):
        return [float(v) for v in value.values()]
    return [float(value)]


def test_evidence_comes_from_a_gpu_run(evidence):
    assert "build_error" not in evidence
    assert "H200" in evidence["device"]
    assert evidence["torch"].startswith("2.")
    assert evidence["repeats"] >= MIN_REPEATS


@pytest.mark.parametrize("op", OPS)
def test_every_case_is_bitwise_stable(evidence, op):
    cases = evidence[op]["cases"]
    assert len(cases) >= 5
    dtypes = set()
    for case in cases:
        assert "error" not in case, case
        assert case["repeats"] >= MIN_REPEATS
        assert case["bitwise_equal_repeats"] == case["repeats"], case["name"]
        dtypes.add(case["dtype"])
    assert {"fp16", "fp32", "fp64"} <= dtypes


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_passed_in_fp64(evidence, op):
    checks = evidence[op]["gradcheck"]
    assert isinstance(checks, list) and checks
    assert all(entry["passed"] for entry in checks), checks


def test_gradcheck_covers_all_grid_sampler_modes(evidence):
    combos = {(e["interpolation"], e["padding"], e["align_corners"])
              for e in evidence["grid_sampler_2d"]["gradcheck"]}
    assert len(combos) == 12


@pytest.mark.parametrize("op", OPS)
def test_agreement_with_torch_is_recorded(evidence, op):
    for case in evidence[op]["cases"]:
        for key in ("max_abs_err_vs_torch", "max_abs_err_vs_fp64_ours", "max_abs_err_vs_fp64_torch"):
            values = _errors(case[key])
            assert values and all(math.isfinite(v) and v >= 0 for v in values), (case["name"], key)
        if case["dtype"] == "fp64":
            # in fp64 the two kernels differ only by summation order
            scale = max(_errors(case["max_abs_grad"])) or 1.0
            if op == "adaptive_max_pool2d":
                assert case["max_abs_err_vs_torch"] <= 1e-12 * scale
            else:
                assert case["max_abs_err_vs_torch"]["grad_input"] <= 1e-12 * scale
                assert case["max_abs_err_vs_torch"]["grad_grid"] <= 1e-12 * scale
        if case["dtype"] == "fp32" and op == "grid_sampler_2d":
            # grad_grid has no race: same arithmetic as the atomic kernel, bit for bit
            assert case["max_abs_err_vs_torch"]["grad_grid"] == 0.0, case["name"]


@pytest.mark.parametrize("op", OPS)
def test_time_ratio_within_budget(evidence, op):
    timed = [c for c in evidence[op]["cases"] if "timing" in c]
    assert any(c["timing"].get("reference_size") for c in timed)
    for case in timed:
        t = case["timing"]
        assert t["torch_atomic_ms"] > 0 and t["ours_ms"] > 0
        assert t["ratio"] == pytest.approx(t["ours_ms"] / t["torch_atomic_ms"])
        assert t["ratio"] <= MAX_TIME_RATIO, (case["name"], t["ratio"])


@pytest.mark.parametrize("op", OPS)
def test_torch_kernels_are_not_deterministic(evidence, op):
    flag = evidence["torch_under_deterministic_flag"][op]
    assert flag["raised"] is True
    assert "does not have a deterministic implementation" in flag["message"]
    assert flag["ours_runs_under_flag"] is True
    unstable = [c for c in evidence[op]["cases"] if c["torch_differing_repeats"] > 0]
    assert unstable, "torch's atomic kernel never differed: the comparison proves nothing"


def _commit_message(patch: Path) -> list[str]:
    text = patch.read_text()
    head, sep, _ = text.partition("\n---\n")
    assert sep, "no '---' separator after the commit message"
    lines = head.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Subject: "))
    return lines[start:]


@pytest.mark.parametrize("patch", sorted(TRAILERS), ids=lambda p: p.name)
def test_patch_trailers(patch):
    assert patch.is_file(), f"missing {patch}"
    message = _commit_message(patch)
    assert message[0].startswith("Subject: [PATCH] ")
    while message and not message[-1].strip():
        message.pop()
    expected = TRAILERS[patch]
    assert message[-len(expected):] == expected
    # a body explaining bug and fix sits between subject and trailers
    body = [line for line in message[1:-len(expected)] if line.strip()]
    assert len(body) >= 5


@pytest.mark.parametrize("patch", sorted(TRAILERS), ids=lambda p: p.name)
def test_patch_format(patch):
    text = patch.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "From: patcher maintainers <maintainers@patcher.invalid>" in text
    assert "Date: Mon, 30 Nov 2026 00:00:00 +0000" in text
    assert re.search(r"^index [0-9a-f]{40}\.\.[0-9a-f]{40} ", text, re.M), "needs --full-index"
    assert not text.rstrip().endswith("-- \n2."), "signature must be omitted"


def _diff_lines(patch: Path) -> list[str]:
    text = patch.read_text()
    return text[text.index("\ndiff --git ") + 1:].splitlines()


def _added_text(patch: Path) -> str:
    return "\n".join(line[1:] for line in _diff_lines(patch)
                     if line.startswith("+") and not line.startswith("+++"))


def _removed_lines(patch: Path) -> list[str]:
    return [line for line in _diff_lines(patch) if line.startswith("-") and not line.startswith("---")]


@pytest.mark.parametrize("patch,section", [(AMP_PATCH, "adaptive_max_pool2d"),
                                           (GS_PATCH, "grid_sampler_2d")],
                         ids=["0201", "0202"])
def test_patch_carries_the_proved_kernels(patch, section):
    source = (HARNESS / "det_kernels.cuh").read_text()
    begin, end = f"// BEGIN {section}\n", f"// END {section}\n"
    kernels = source[source.index(begin) + len(begin):source.index(end)]
    assert kernels.strip() in _added_text(patch)


def test_patches_take_the_deterministic_path_only_under_the_flag():
    amp = _added_text(AMP_PATCH)
    gs = _added_text(GS_PATCH)
    assert "globalContext().deterministicAlgorithms()" in amp
    assert "globalContext().deterministicAlgorithms()" in gs
    # the atomic kernels stay: only added lines here, the old launch code is untouched
    assert _removed_lines(AMP_PATCH) == [
        "-  globalContext().alertNotDeterministic(",
        '-      "adaptive_max_pool2d_backward_cuda");',
    ]
    assert _removed_lines(GS_PATCH) == []


def test_patches_apply_to_the_real_1_13_1_tree(realtree_checkout):
    for patch in (AMP_PATCH, GS_PATCH):
        subprocess.run(["git", "apply", "--check", str(patch)], cwd=realtree_checkout, check=True)
    subprocess.run(["git", "apply", str(AMP_PATCH), str(GS_PATCH)], cwd=realtree_checkout, check=True)
    amp = (realtree_checkout / "aten/src/ATen/native/cuda/AdaptiveMaxPooling2d.cu").read_text()
    assert 'alertNotDeterministic(\n      "adaptive_max_pool2d_backward_cuda")' not in amp
