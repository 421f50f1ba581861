"""Issue 21, CI: the 1.13.1 series' Upstream-Tests plus the smoke selection, from Debian's real
1.13.1 tree (with the series applied, so the tests the patches add are there) against Debian's
python3-torch 1.13.1, the unpatched release; every selected test's outcome is asserted against
tests/data/upstream-tests/debian-1.13.1.json.

Then the Python-level patches (PT-0101, PT-0106, PT-0107, PT-0109) are loaded into the same torch in
place of the installed files (the sitecustomize hook of test_catalog_security.py): their
selections must pass, PT-0101's own regression test included, which fails on the unpatched
release; and a failure the patched run shares with the unpatched one is marked known.

Re-record the expectations (after a deliberate change of the catalog's selections):
    PATCHER_RECORD_UPSTREAM_TESTS=1 .venv/bin/pytest tests/test_upstream_tests_debian.py
A selection that has no recorded expectation yet (another patch added since) must not fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from patcher import patches
from patcher import upstream_tests as ut
from patcher.config import DEFAULT_CATALOG
from tests.test_catalog_security import MODULE_OVERRIDE_SITECUSTOMIZE
from tests.test_upstream_tests import upstream_wheelhouse

pytestmark = [pytest.mark.realtree, pytest.mark.slow]

EXPECTATIONS = Path(__file__).parent / "data" / "upstream-tests" / "debian-1.13.1.json"
RECORD = os.environ.get("PATCHER_RECORD_UPSTREAM_TESTS") == "1"
PT0101_TEST = "test_jit.py::TestScript::test_non_type_expressions_in_type_annotations"
PYTHON_LEVEL = {"PT-0101": ["torch/jit/annotations.py"], "PT-0106": ["torch/serialization.py"],
                "PT-0107": ["torch/_weights_only_unpickler.py", "torch/serialization.py"],
                "PT-0109": ["torch/fx/graph.py"]}


# Upstream tests whose outcome changes from run to run here, with what was seen: a node id, or a
# class ("file::Class::") for all its tests. Their outcome is reported, not asserted (they are
# still collected and counted: the node set's digest and the count hold them).
FLAKY = (
    # profiler sequence numbers: passed in 2 of the 4 recorded runs of the smoke selection
    # (2026-12-01/02, 2 cores, other selections running beside it), failed in the others
    "test_autograd.py::TestAutograd::test_profiler_seq_nr",
    # 2.6.0: hypothesis draws new examples every run (no derandomize outside PyTorch's CI);
    # test_conv2d_transpose failed in the recording run and passed in the next (2026-12-02)
    "test_xnnpack_integration.py::TestXNNPACKOps::",
)


def _steady(outcomes: dict[str, str]) -> dict[str, str]:
    return {node: outcome for node, outcome in outcomes.items()
            if not any(node == flaky or (flaky.endswith("::") and node.startswith(flaky)) for flaky in FLAKY)}


def _digest(nodes) -> str:
    return hashlib.sha256("\n".join(sorted(nodes)).encode()).hexdigest()


def _expectation(report: ut.UpstreamTestReport, sel: ut.SelectionResult) -> dict:
    outcomes = {n.node: n.outcome for n in report.nodes if n.selection == sel.id}
    entry = {"patches": list(sel.patches), "count": len(outcomes),
             "counts": {o: c for o in ut.OUTCOMES if (c := sum(1 for v in outcomes.values() if v == o))}}
    if sel.patches == (ut.SMOKE_ID,):  # 1,700 nodes: their set by digest, the ones that did not pass by name
        entry["nodes_sha256"] = _digest(outcomes)
        entry["not_passed"] = {k: v for k, v in sorted(outcomes.items()) if v != "passed"}
    else:
        entry["outcomes"] = dict(sorted(outcomes.items()))
    return entry


def record_or_read_expectations(report: ut.UpstreamTestReport, path: Path, what: str) -> dict:
    """The recorded outcome of each selection (written first from ``report`` when RECORD)."""
    if RECORD:
        path.parent.mkdir(parents=True, exist_ok=True)
        recorded = {"what": "outcome of each selected upstream test: " + what,
                    "torch": report.torch_version, "python": report.python_version, "duration_s": report.duration_s,
                    "selections": {s.selection: _expectation(report, s) for s in report.selections}}
        path.write_text(json.dumps(recorded, indent=1) + "\n")
    return json.loads(path.read_text())["selections"]


def check_expectations(report: ut.UpstreamTestReport, expected: dict) -> list[str]:
    """Assert each selection's outcomes as recorded (FLAKY nodes' outcome excepted); a selection
    with no record yet must pass.  Returns those selections."""
    unrecorded = []
    for sel in report.selections:
        got = _expectation(report, sel)
        want = expected.get(sel.selection)
        if want is None:
            unrecorded.append(sel.selection)
            failing = [n.node for n in report.nodes if n.selection == sel.id and n.failing]
            assert not failing, f"{sel.selection} (no recorded expectation yet) fails: {failing}"
            continue
        assert got["count"] == want["count"], sel.selection
        if "outcomes" in want:
            assert _steady(got["outcomes"]) == _steady(want["outcomes"]), sel.selection
        else:
            assert (got["nodes_sha256"], _steady(got["not_passed"])) == \
                (want["nodes_sha256"], _steady(want["not_passed"])), sel.selection
    return unrecorded


def _overlay_env(tree: Path, files: list[str], hook: Path) -> dict[str, str]:
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(MODULE_OVERRIDE_SITECUSTOMIZE)
    modules = {f[:-len(".py")].replace("/", "."): tree / f for f in files}
    return {"PYTHONPATH": str(hook),
            "PATCHER_MODULE_OVERRIDES": ";".join(f"{name}={path}" for name, path in modules.items())}


def test_the_series_selection_on_debian_torch(realtree_checkout, system_torch_python, tmp_path):
    wheelhouse = upstream_wheelhouse()
    series = patches.load_series(DEFAULT_CATALOG / "patches", "1.13.1")
    patches.apply_series(series, realtree_checkout)
    head = patches.run_git("rev-parse", "HEAD", cwd=realtree_checkout).stdout.strip()
    assert ut.check_selections(realtree_checkout, ut.plan(series)) == []

    started = time.time()
    report = ut.run_upstream_tests(realtree_checkout, system_torch_python, series, wheelhouse)
    wall = time.time() - started
    print(f"\nupstream tests: {len(report.nodes)} nodes in {len(report.selections)} selections, "
          f"{report.duration_s:.1f} s ({wall:.1f} s with the payload), torch {report.torch_version}: "
          f"{report.summary()}")
    for sel in report.selections:
        print(f"  {sel.duration_s:6.1f} s {sel.collected or 0:5d} {sel.selection}  [{', '.join(sel.patches)}]")

    assert report.error is None, report.error
    assert report.torch_version == "1.13.0a0" and report.python_version.startswith("3.11.")
    assert not report.selection_errors, [(s.selection, s.error) for s in report.selection_errors]
    # Debian's torch was built against Debian's numpy: the runner left the pinned one out
    provided = {module: origin for _, module, origin in report.target_provided}
    assert provided["numpy"].startswith("/usr/lib/python3/dist-packages/numpy/")
    assert not any(f.startswith("numpy-") for f, _ in report.wheels)
    # the tests ran from a copy: the tree is as the series left it
    assert patches.run_git("status", "--porcelain", "--ignored", cwd=realtree_checkout).stdout.strip() == ""
    assert patches.run_git("rev-parse", "HEAD", cwd=realtree_checkout).stdout.strip() == head

    expected = record_or_read_expectations(report, EXPECTATIONS, "Debian's pytorch 1.13.1 tree with the 1.13.1 series "
                                           "applied, against Debian's python3-torch 1.13.1 (the unpatched release)")
    unrecorded = check_expectations(report, expected)
    if unrecorded:
        print("  no recorded expectation yet (must pass): " + "; ".join(unrecorded))
    # what the catalog's selections are for: each patch's own selection ran some tests here
    for patch in series.patches:
        ran = [n for n in report.for_patch(patch.id)]
        assert ran, f"{patch.id}: its Upstream-Tests select nothing in the real tree"
    # on the unpatched release, PT-0101's own regression test fails (the #151233 bypass is there)
    assert report.outcomes()[PT0101_TEST] == "failed"

    # --- the Python-level patches loaded into the same torch ------------------------------------
    python_level = [p for p in series.patches if p.id in PYTHON_LEVEL]
    files = sorted({f for p in python_level for f in PYTHON_LEVEL[p.id]})
    assert all(set(PYTHON_LEVEL[p.id]) <= set(p.files) for p in python_level)
    env = _overlay_env(realtree_checkout, files, tmp_path / "overlay")
    smoke_torch = next(s for s in ut.plan(None) if s.test.file == "test_torch.py")
    chosen = [s for s in ut.plan(series) if set(s.patches) & set(PYTHON_LEVEL)] + [smoke_torch]
    patched = ut.run_upstream_tests(realtree_checkout, system_torch_python, None, wheelhouse, selections=chosen,
                                    env=env)
    assert patched.error is None and not patched.selection_errors
    assert patched.outcomes()[PT0101_TEST] == "passed"
    # the failures the patched run shares with the unpatched release are known, and recorded as such
    baseline = ut.run_upstream_tests(realtree_checkout, system_torch_python, None, wheelhouse,
                                     selections=patched.baseline_selections())
    judged = patched.with_baseline(baseline)
    known = {n.node: n.baseline_outcome for n in judged.known_failures}
    assert known == {n: o for n, o in expected[str(smoke_torch.test)]["not_passed"].items() if o == "failed"}
    assert judged.passed, [(n.node, n.message) for n in judged.failures]
    checks = {c["id"]: c["status"] for c in judged.probe_checks()}
    assert checks == {"upstream.PT-0101": "pass", "upstream.PT-0106": "pass", "upstream.PT-0107": "pass",
                      "upstream.PT-0109": "pass", "upstream.smoke": "pass"}
    print(f"  Python-level patches loaded: {patched.summary()} in {patched.duration_s:.1f} s; known failures "
          f"{sorted(known)} (baseline {baseline.duration_s:.1f} s)")
