"""Determinism patches PT-0230 (scatter_reduce in every mode, scatter with reduce=) and PT-0231
(index_reduce in every mode) and their GPU evidence (no GPU needed here).

The evidence JSON is written on an H200 by harness/deterministic_backward/run_harness_scatter.py and
probe_all_kernels.py (harness/deterministic_backward/README.md gives the commands) and checked in
under evidence/gpu/. These tests hold the recorded proof and the patches to issue 18's bar.
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

OPS_JSON = REPO_ROOT / "evidence" / "gpu" / "deterministic-issue18-scatter-index-reduce-ops.json"
PROBE_JSON = REPO_ROOT / "evidence" / "gpu" / "determinism-all-kernels-h200.json"

# patch file -> (Patch-Id, probe ids, target file, the functions that take the deterministic path)
PATCHES = {
    "0230-deterministic-scatter-reduce.patch":
        ("PT-0230", ("scatter_reduce_prod", "scatter_multiply"), "ScatterGatherKernel.cu",
         ("scatter_reduce_cuda_kernel", "scatter_reduce_two_cuda_kernel")),
    "0231-deterministic-index-reduce.patch":
        ("PT-0231", ("index_reduce_prod",), "Indexing.cu", ("index_reduce_cuda_out",)),
}
# torch 2.11's CUDA ops that raise under the flag and that these kernels replace (measured on the H200)
RAISING_IN_211 = {"scatter_reduce_prod", "scatter_reduce_multiply", "index_reduce_prod", "index_reduce_mean",
                  "index_reduce_amax", "index_reduce_amin"}


def _section() -> str:
    text = (HARNESS / "det_kernels_scatter.cuh").read_text()
    begin, end = "// BEGIN det_gather_reduce\n", "// END det_gather_reduce\n"
    return text[text.index(begin) + len(begin):text.index(end)]


@pytest.fixture(scope="module")
def ops() -> dict:
    return read_evidence(OPS_JSON)


def test_evidence_comes_from_an_h200_run(ops):
    assert "H200" in ops["device"] and ops["torch"].startswith("2.11") and ops["repeats"] >= 25
    assert ops["build_seconds"] > 0


def test_every_case_is_bitwise_stable_and_every_op_and_kind_is_covered(ops):
    # the recorded run measured scatter_reduce(prod) only: its time ran out before the contention,
    # scatter_(reduce=) and index_reduce cases (the harness README says so); index_reduce and
    # scatter_(reduce="multiply") are proved by the smoke log and the probe run below
    ran = ran_cases(ops)
    assert len(ran) >= 10
    for case in ran:
        assert case["bitwise_equal_repeats"] == case["repeats"], (case["op"], case["name"], case["dtype"])
    covered = {(c["op"], c["kind"]) for c in ran}
    assert {("scatter_reduce", "realistic"), ("scatter_reduce", "small")} <= covered
    assert {c["dtype"] for c in ran} >= {"float32", "float64", "float16", "bfloat16", "int32"}


def test_results_equal_the_cpu_and_times_are_recorded(ops):
    for case in ran_cases(ops):
        assert case["equal_cpu_ours"] is True, (case["op"], case["name"], case["dtype"])
        assert case["timing"]["ours_ms"] > 0 and case["timing"]["torch_ms"] > 0
        if case["dtype"] in ("float32", "float64", "float16", "bfloat16"):
            assert case["max_abs_err_vs_fp64_ours"] >= 0 and case["error_ratio"] >= 0


def test_torch_raises_under_the_flag_and_ours_runs_deterministically(ops):
    before = ops["torch_under_deterministic_flag"]
    raised = {name for name, r in before.items() if r["raised"]}
    assert RAISING_IN_211 <= raised, RAISING_IN_211 - raised
    # after registration: the probe run with every kernel registered (next test) and the smoke log
    smoke = (REPO_ROOT / "evidence" / "gpu" / "deterministic-issue18-scatter-index-reduce-smoke.log").read_text()
    assert "FAILS 0" in smoke and " FAIL" not in smoke.replace("FAILS 0", "")


def test_the_probe_with_every_kernel_registered_passes_every_determinism_check():
    report = json.loads(PROBE_JSON.read_text())
    registration = json.loads(PROBE_JSON.with_suffix(".registration.json").read_text())
    assert registration["extensions"]["build_scatter"]["registered"] == []
    assert {"PT-0230", "PT-0231"} <= set(registration["patched_ids"])
    checks = {c["id"]: c for c in report["checks"]}
    for probe in ("scatter_reduce_prod", "scatter_multiply", "index_reduce_prod"):
        assert checks["determinism." + probe]["status"] == "pass", probe
    det = [c for c in report["checks"] if c["id"].startswith("determinism.")]
    assert det and all(c["status"] == "pass" for c in det)


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_patch_trailers_and_format(name):
    patch = PATCH_DIR / name
    pid, probes, _, _ = PATCHES[name]
    message = _commit_message(patch)
    assert message[0].startswith("Subject: [PATCH] ")
    while message and not message[-1].strip():
        message.pop()
    keys = [line.split(":", 1)[0] for line in message[-7:]]
    assert keys == ["Patch-Id", "Applies-To", "Category", "Upstream-Bug", "Upstream-Fix", "Probe", "Upstream-Tests"]
    assert message[-7] == f"Patch-Id: {pid}"
    assert message[-6:-4] == ["Applies-To: ==1.13.1", "Category: determinism"]
    assert message[-2] == "Probe: " + ", ".join("determinism." + p for p in probes)
    assert "test_" in message[-1]
    text = patch.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert re.search(r"^index [0-9a-f]{40}\.\.[0-9a-f]{40} ", text, re.M)


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_patch_carries_the_proved_kernel_under_the_flag(name):
    patch = PATCH_DIR / name
    _, _, target, functions = PATCHES[name]
    assert f"b/aten/src/ATen/native/cuda/{target}" in patch.read_text()
    added = _added_text(patch)
    assert _section().strip() in added
    assert "at::cuda::cub::radix_sort_pairs<int64_t, int64_t>(" in added
    assert added.count("globalContext().deterministicAlgorithms()") == len(functions)
    # nothing of torch's own kernels is removed: the deterministic path is added before them
    assert not _removed_lines(patch)


def test_the_series_lists_both_after_the_other_determinism_patches():
    lines = [ln.split("#", 1)[0].strip() for ln in (PATCH_DIR / "series").read_text().splitlines()]
    names = [ln for ln in lines if ln]
    assert names.index("0230-deterministic-scatter-reduce.patch") + 1 == names.index(
        "0231-deterministic-index-reduce.patch")
    assert names.index("0221-deterministic-cumsum.patch") < names.index("0230-deterministic-scatter-reduce.patch")


def test_probe_checks_name_the_patches():
    from patcher.probe.checks import determinism
    by_name = {name: patches for name, _, _, patches in determinism.OPERATIONS}
    for name, (pid, probes, _, _) in PATCHES.items():
        for probe in probes:
            assert by_name[probe] == (pid,), (name, probe)


def test_patches_apply_in_series_order_to_the_real_1_13_1_tree(realtree_checkout):
    lines = [ln.split("#", 1)[0].strip() for ln in (PATCH_DIR / "series").read_text().splitlines()]
    names = [ln for ln in lines if ln]
    last = max(names.index(n) for n in PATCHES)
    for name in names[:last + 1]:
        subprocess.run(["git", "apply", str(PATCH_DIR / name)], cwd=realtree_checkout, check=True)
    scatter = (realtree_checkout / "aten/src/ATen/native/cuda/ScatterGatherKernel.cu").read_text()
    assert scatter.count("scatter_reduce_deterministic(self, dim, index, src,") == 2
    indexing = (realtree_checkout / "aten/src/ATen/native/cuda/Indexing.cu").read_text()
    assert "index_reduce_deterministic(result, dim, index, source, op, include_self);" in indexing
