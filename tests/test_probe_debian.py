"""The probe suite against Debian's real torch 1.13.1 (python3-torch, CPU, /usr/bin/python3),
through the real command line; and every error path of `patcher probe --python`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from patcher.probe import all_check_ids, describe_checks
from tests.fixtures.common import run_patcher

REPO = Path(__file__).resolve().parent.parent
NO_CUDA = "needs CUDA; this torch is built without CUDA"

# What is true of Debian's python3-torch 1.13.1 on a CPU machine, for every check id:
# (status, message pattern, finding).  The security checks are the security backports'
# (patcher/probe/checks/security.py); their rows say what those checks find here.
EXPECTED_DEBIAN = {
    "env.fingerprint": ("pass", r"^$", False),
    "security.cve_2022_45907": ("pass", r"^$", False),  # the fix is in 1.13.1
    "security.cve_2022_45907_bypass": ("fail", r"pytorch#151233", True),  # the open bypass
    "security.cve_2025_3730": ("pass", r"^$", False),
    "security.cve_2025_2953": ("fail", r"^killed by SIGFPE \(exit -8\)$", False),  # FACTS.md
    # an out-of-bounds read: the signal depends on what lies past the table (SEGV, BUS, or
    # ABRT when the allocator notices the damage first), or it survives and the check sees the
    # unchecked operand used; either way the defect is found
    "security.cve_2024_31580": ("fail", r"^(killed by SIG(SEGV|BUS|ABRT) \(exit -(11|7|6)\)|.*without checking it.*)$", None),
    "security.cve_2024_31583": ("fail", r"^(killed by SIG(SEGV|BUS|ABRT) \(exit -(11|7|6)\)|.*without checking it.*)$", None),
    # issue 16's backports: torch.load(weights_only=True) runs a TorchScript archive's code, the
    # weights_only loader takes oversized storages and SETITEM on tensors, None as a Future crashes
    "security.cve_2025_32434": ("fail", r"wrote the probe's marker file \(CVE-2025-32434\)$", True),
    "security.cve_2026_24747": ("fail", r"a storage larger than its record and SETITEM writing into a tensor", True),
    "security.cve_2025_2148": ("fail", r"^killed by SIGSEGV \(exit -11\)$", False),
    # FX writes the keyword `from` into generated code: make_fx of random_(3, 7) and
    # symbolic_trace of uniform_(from=...) both raise SyntaxError (PT-0109)
    "security.cve_2025_55553": ("fail", r"named 'from' \(aten::random_\.from, make_fx\) and a keyword argument "
                                r"named 'from' \(fx\.symbolic_trace\): the trace fails with a SyntaxError "
                                r"\(CVE-2025-55553\)$", True),
    # written and proven for 1.4's kernel (PT-0110): the version gate says so
    "security.cve_2025_2998": ("skip", "^" + re.escape("needs torch >=1.4,<1.5; this is 1.13.0a0") + "$", False),
    "security.cve_2025_3001": ("skip", "^" + re.escape("needs torch >=1.4,<1.5; this is 1.13.0a0") + "$", False),
}
for _id in all_check_ids():
    if _id.split(".")[0] in ("maxpool2d", "determinism") or _id == "env.arch_coverage":
        EXPECTED_DEBIAN[_id] = ("skip", "^" + re.escape(NO_CUDA) + "$", False)


@pytest.fixture(scope="module")
def debian_run(system_torch_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe-debian")
    result = run_patcher("probe", "--python", system_torch_python, "--json", out / "report.json",
                         "--junit", out / "report.xml", timeout=600)
    return result, out


def test_every_check_has_an_expectation():
    assert set(EXPECTED_DEBIAN) == set(all_check_ids())


def test_debian_torch_findings(debian_run):
    result, out = debian_run
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == 1 and report["probe_version"]
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", report["started"])
    found = {c["id"]: c for c in report["checks"]}
    assert list(found) == all_check_ids()
    for check_id, (status, pattern, finding) in EXPECTED_DEBIAN.items():
        entry = found[check_id]
        assert entry["status"] == status, f"{check_id}: {entry['status']} {entry['message']}"
        assert re.search(pattern, entry["message"]), f"{check_id}: {entry['message']!r}"
        if finding is not None:  # None: a crash (not a finding) and a detected use (a finding) both count
            assert entry["finding"] is finding, check_id
    required_failures = [c["id"] for c in report["checks"] if c["required"] and c["status"] in ("fail", "error")]
    assert report["passed"] is (not required_failures)
    assert result.exit_code == (0 if report["passed"] else 50), result.stderr
    env = report["environment"]
    assert env["torch"]["version"] == "1.13.0a0" and env["torch"]["git_version"] == "Unknown"
    assert env["python"]["version"].startswith("3.11.")
    assert env["cuda"] == {"compiled": None, "cudnn": None, "available": False, "driver": None,
                           "arch_list": [], "arch_list_source": "none (CPU-only build)"}
    assert found["env.fingerprint"]["details"]["log"][0].startswith("torch.version.git_version is 'Unknown'")
    # the table on stdout, one row per check
    for check_id in all_check_ids():
        assert re.search(rf"^{re.escape(check_id)}\s", result.stdout, re.M)
    junit = ET.parse(out / "report.xml").getroot().find("testsuite")
    assert int(junit.get("tests")) == len(all_check_ids())
    assert int(junit.get("skipped")) == sum(1 for s, _, _ in EXPECTED_DEBIAN.values() if s == "skip")


def test_a_carried_patch_turns_a_finding_into_a_failure(system_torch_python, tmp_path):
    """The SIGFPE of CVE-2025-2953 fails the run once the wheel claims the patch that fixes it."""
    patches = {d["id"]: d["patches"] for d in describe_checks()}["security.cve_2025_2953"]
    assert patches, "security.cve_2025_2953 names no patch"
    report_path = tmp_path / "r.json"
    result = run_patcher("probe", "--python", system_torch_python, "--only", "security.cve_2025_2953",
                         "--patched-ids", ",".join(patches), "--json", report_path, timeout=300)
    assert result.exit_code == 50, result.stderr
    assert result.stderr.strip() == ("patcher: error: 1 required probe check(s) failed: security.cve_2025_2953 "
                                     "(fail) (the table and the JSON report say what each found)")
    report = json.loads(report_path.read_text())
    assert report["patched_ids"] == sorted(patches) and report["passed"] is False
    assert report["checks"][0]["required"] is True


# --- the package runs from a copied folder, under both names -------------------------------------------
@pytest.mark.parametrize("layout", ["patcher/probe", "probe"])
def test_runs_from_a_copied_folder(system_torch_python, tmp_path, layout):
    dest = tmp_path / layout
    shutil.copytree(REPO / "patcher" / "probe", dest, ignore=shutil.ignore_patterns("__pycache__"))
    if layout == "patcher/probe":
        (tmp_path / "patcher" / "__init__.py").write_text("")
    module = layout.replace("/", ".")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([system_torch_python, "-m", module, "--only", "env.fingerprint,security.cve_2025_2953",
                           "--json", "-"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    statuses = {c["id"]: (c["status"], c["message"]) for c in report["checks"]}
    assert statuses["env.fingerprint"] == ("pass", "")
    # the isolated check's child interpreter found the copied package too
    assert statuses["security.cve_2025_2953"] == ("fail", "killed by SIGFPE (exit -8)")


# --- the framework with real torch: isolation, time limits, budget, site checks -----------------------
SITE_CHECKS = '''
import os, signal, time
from patcher.probe.framework import Finding, Skip, check

@check("site.divide_by_zero", isolate=True)
def divide_by_zero(ctx):
    os.kill(os.getpid(), signal.SIGFPE)

@check("site.hangs", isolate=True, timeout=2)
def hangs(ctx):
    time.sleep(60)

@check("site.isolated_pass", isolate=True, patches=("PT-9999",), required=False)
def isolated_pass(ctx):
    ctx.log("from the child")
    return {"version": list(ctx.torch_version), "patched": sorted(ctx.patched_ids)}

@check("site.gap", required=False)
def gap(ctx):
    raise Finding("a known gap", {"seen": True})

@check("site.slow", timeout=30)
def slow(ctx):
    time.sleep(1.5)

@check("site.after_budget")
def after_budget(ctx):
    return None

@check("site.gpu_only", device="cuda")
def gpu_only(ctx):
    return None

@check("site.future", torch=">=9.0")
def future(ctx):
    return None
'''


def run_site_checks(python, tmp_path, *args):
    (tmp_path / "site_checks.py").write_text(textwrap.dedent(SITE_CHECKS))
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}", PATCHER_PROBE_EXTRA_CHECKS="site_checks")
    proc = subprocess.run([python, "-m", "patcher.probe", *args, "--json", "-"], env=env, capture_output=True,
                          text=True, timeout=300)
    report = json.loads(proc.stdout)
    return proc.returncode, report, {c["id"]: c for c in report["checks"]}


def test_isolation_signals_and_time_limits(system_torch_python, tmp_path):
    code, report, got = run_site_checks(system_torch_python, tmp_path, "--patched-ids", "PT-9999", "--only",
                                        "site.divide_by_zero,site.hangs,site.isolated_pass")
    assert (got["site.divide_by_zero"]["status"], got["site.divide_by_zero"]["message"]) == \
        ("fail", "killed by SIGFPE (exit -8)")
    assert got["site.hangs"]["message"] == "timed out after 2 s (child process killed)"
    passed = got["site.isolated_pass"]
    assert passed["status"] == "pass" and passed["required"] is True  # PT-9999 is carried
    assert passed["details"] == {"version": [1, 13, 0], "patched": ["PT-9999"], "log": ["from the child"]}
    assert report["passed"] is False and code == 1  # the SIGFPE and the hang are required


def test_budget_gates_and_findings(system_torch_python, tmp_path):
    code, report, got = run_site_checks(system_torch_python, tmp_path, "--budget", "1", "--only",
                                        "site.gap,site.slow,site.after_budget,site.gpu_only,site.future")
    assert (got["site.gap"]["status"], got["site.gap"]["finding"], got["site.gap"]["required"]) == \
        ("fail", True, False)
    assert got["site.gap"]["details"] == {"seen": True}
    assert got["site.slow"]["status"] == "pass"
    assert (got["site.after_budget"]["status"], got["site.after_budget"]["message"]) == \
        ("skip", "the probe's time budget was spent before this check")
    assert got["site.gpu_only"]["message"] == NO_CUDA
    assert got["site.future"]["message"] == "needs torch >=9.0; this is 1.13.0a0"
    assert report["passed"] is True and code == 0  # the only failure is an optional finding


# --- the CUDA checks' logic, run on the CPU with real torch ---------------------------------------------
CPU_LOGIC = '''
import json, sys, torch
from patcher.probe.checks import determinism, maxpool
out = {}
small = dict(sizes=(31, 32, 64), batches=(1, 3, 5), dtypes=("float32",), device="cpu")
out["batched"] = maxpool.sweep_batched(torch, **small)[:2]
out["naive"] = maxpool.sweep_naive(torch, **small)[:2]
cases = [c for c in maxpool.LARGE_CHANNEL_CASES if c[4] != "float16"]
out["large"] = maxpool.large_channel_results(torch, cases, device="cpu")
out["provoked"] = maxpool.provoke_launch_failures(torch, maxpool.PROVOCATIONS[:1], device="cpu")
out["misreport"] = [maxpool.is_misreported("max_pool2d_with_indices_out_cuda_frame failed with error code 0", "forward"),
                    maxpool.is_misreported("fractional_max_pool2d_backward_out_cuda failed with error code 0", "backward"),
                    maxpool.is_misreported("CUDA error: invalid argument", "forward")]
out["unpool"] = determinism.measure(torch, determinism.op_max_unpool2d, device="cpu", repeats=2)
out["histc"] = determinism.measure(torch, determinism.op_histc, device="cpu", repeats=2)
out["flag_after"] = [torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()]
print(json.dumps(out))
'''


def test_cuda_check_logic_on_the_cpu(system_torch_python):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([system_torch_python, "-c", CPU_LOGIC], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    cases, totals = out["batched"]
    assert len(cases) == 3 * 3 * 3 and all(t == [0, 0] for t in totals)
    assert sorted(map(tuple, out["naive"][0])) == sorted(map(tuple, cases))
    results, wrong = out["large"]
    assert wrong == [] and {r["forward"] for r in results} == {"ok"} and {r["backward"] for r in results} == {"ok"}
    assert out["provoked"] == [[], []]
    assert out["misreport"] == [True, True, False]
    unpool = out["unpool"]
    assert (unpool["flagged"], unpool["warn_only"], unpool["unflagged"]) == ("raises", "warns", "deterministic")
    assert unpool["error"] == "max_unpooling2d_forward_out does not have a deterministic implementation"
    assert out["histc"]["flagged"] == "deterministic"
    assert out["flag_after"] == [False, False]


# --- error paths: one line, a distinct exit code, nothing left behind -----------------------------------
def leftovers(tmp_dir: Path) -> list[str]:
    return sorted(p.name for p in tmp_dir.iterdir())


def test_missing_interpreter(tmp_path):
    result = run_patcher("probe", "--python", tmp_path / "no-such-python")
    assert result.exit_code == 52
    assert result.stderr.strip().startswith("patcher: error: interpreter ") and "Traceback" not in result.stderr


def test_interpreter_without_torch(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    result = run_patcher("probe", "--python", sys.executable, env={"TMPDIR": str(tmp)})
    assert result.exit_code == 53, result.stderr
    assert result.stderr.strip().endswith("cannot import torch: ModuleNotFoundError: No module named 'torch' "
                                          "(probe an interpreter, image or wheel that provides torch)")
    assert leftovers(tmp) == []


def test_probe_that_writes_no_report(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'not a python' >&2\nexit 0\n")
    fake.chmod(0o755)
    result = run_patcher("probe", "--python", fake)
    assert result.exit_code == 51
    assert result.stderr.strip() == f"patcher: error: the probe in {fake} exited with 0 and no report: not a python"


def test_timeout_stops_the_probe_and_cleans_up(system_torch_python, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    json_out = tmp_path / "r.json"
    result = run_patcher("probe", "--python", system_torch_python, "--timeout", "0.5", "--json", json_out,
                         env={"TMPDIR": str(tmp)})
    assert result.exit_code == 55, result.stderr
    assert "ran past 0.5 s and was stopped" in result.stderr and "Traceback" not in result.stderr
    assert leftovers(tmp) == [] and not json_out.exists()


def test_usage_errors():
    assert run_patcher("probe").exit_code == 2
    assert run_patcher("probe", "--python", "a", "--image", "b").exit_code == 2
    assert run_patcher("probe", "--python", "a", "--wheelhouse", "/tmp").exit_code == 2
