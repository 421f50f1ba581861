"""The probe suite on real legacy runtimes: PyPI's torch 1.4.0 on CPython 3.6 (the probe's own
floor) and 1.8.1, 2.0.1 and 2.1.2 on CPython 3.8, each in its own venv made from pyenv's
interpreter by .ci/fetch-legacy-wheels.sh (`make host`), through the real `patcher probe
--python`.  Every check's outcome is asserted; the unpatched defects are found.  A runtime that
is missing fails, it never skips.  One line per runtime goes to the CI log."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from patcher import advisories
from patcher.probe import all_check_ids, describe_checks
from patcher.probe.framework import parse_range, parse_torch_version, version_in_range
from tests.conftest import CI_CACHE
from tests.fixtures.common import run_patcher

LEGACY = CI_CACHE / "legacy-torch"
NO_GPU = "needs CUDA; torch.cuda.is_available() is False (no GPU or driver)"
NO_LITE = (r"^this torch has no Python binding for the mobile \(lite\) interpreter "
           r"\(torch\.jit\.mobile\._load_for_lite_interpreter, torch >= 1\.6\)$")
# an out-of-bounds read: the signal depends on what lies past the table, or the process survives
# and the check sees the unchecked operand used; either way the defect is found
OOB = r"^(killed by SIG(SEGV|BUS|ABRT) \(exit -(11|7|6)\)|.*without checking it.*)$"
TYPE_CALL = r"^parse_type_line ran a call written in a type comment \(CVE-2022-45907\)$"
BYPASS_ALL = (r"^parse_type_line evaluated a type comment that reaches Python code without a call: "
              r"comparison on a resolved object, pytorch#151233 comprehension \(pytorch#151233\)$")
BYPASS_OPERATOR = (r"^parse_type_line evaluated a type comment that reaches Python code without a call: "
                   r"comparison on a resolved object \(pytorch#151233\)$")
MARKER = r"^torch\.load\(weights_only=True\) ran code from a TorchScript archive: it wrote the probe's marker file \(CVE-2025-32434\)$"
UNPICKLER = r"^the weights_only loader accepted a storage larger than its record and SETITEM writing into a tensor \(CVE-2026-24747\)$"
FX_FROM = (r"^FX generated code that does not compile for an operator overload named 'from' \(aten::random_\.from, "
           r"make_fx\) and a keyword argument named 'from' \(fx\.symbolic_trace\): the trace fails with a SyntaxError "
           r"\(CVE-2025-55553\)$")
# 1.8 has torch.fx but no make_fx (torch/fx/experimental/proxy_tensor.py came in 1.13): FX's own
# tracer writes `from = 2.0` all the same
FX_FROM_KEYWORD = (r"^FX generated code that does not compile for a keyword argument named 'from' "
                   r"\(fx\.symbolic_trace\): the trace fails with a SyntaxError \(CVE-2025-55553\)$")


def _needs(check_id: str, version: str) -> str:
    torch_range = {d["id"]: d["torch"] for d in describe_checks()}[check_id]
    return "^" + re.escape(f"needs torch {torch_range}; this is {version}") + "$"


# runtime -> (torch, Python minor, {check id: (status, message pattern, finding)}); the CUDA
# checks are added below (these are CUDA wheels on a machine without a GPU)
RUNTIMES = {
    "torch-1.4.0-py3.6": ("1.4.0", "3.6", {
        "env.fingerprint": ("pass", r"^$", False),
        # the 3.6 comprehension is a call (refused), the operator route is not: both evaluate here
        "security.cve_2022_45907": ("fail", TYPE_CALL, True),
        "security.cve_2022_45907_bypass": ("fail", BYPASS_ALL, True),
        "security.cve_2025_3730": ("pass", r"^$", False),
        "security.cve_2025_2953": ("fail", r"^killed by SIGFPE \(exit -8\)$", False),
        "security.cve_2024_31580": ("skip", NO_LITE, False),
        "security.cve_2024_31583": ("skip", NO_LITE, False),
        "security.cve_2025_32434": ("skip", None, False),
        "security.cve_2026_24747": ("skip", None, False),
        "security.cve_2025_2148": ("skip", None, False),
        "security.cve_2025_55553": ("skip", None, False),  # no torch.fx before 1.8
        # a hand-made PackedSequence whose batch sizes rise again: the kernel writes below its
        # lengths array (PT-0110); glibc aborts or the process faults, depending on the heap
        "security.cve_2025_2998": ("fail", r"^killed by SIG(ABRT|SEGV) \(exit -(6|11)\)$", False),
        # LSTMCell with a 5-D hidden state: the cell indexes gate pieces chunk() never made (PT-0111)
        "security.cve_2025_3001": ("fail", r"^killed by SIGSEGV \(exit -11\)$", False),
    }),
    "torch-1.8.1-py3.8": ("1.8.1+cu102", "3.8", {
        "env.fingerprint": ("pass", r"^$", False),
        # no call check yet (it came in 1.13.1): the comprehension's call is evaluated too
        "security.cve_2022_45907": ("fail", TYPE_CALL, True),
        "security.cve_2022_45907_bypass": ("fail", BYPASS_ALL, True),
        "security.cve_2025_3730": ("pass", r"^$", False),
        "security.cve_2025_2953": ("fail", r"^killed by SIGFPE \(exit -8\)$", False),
        "security.cve_2024_31580": ("fail", OOB, None),
        "security.cve_2024_31583": ("fail", OOB, None),
        "security.cve_2025_32434": ("skip", None, False),
        "security.cve_2026_24747": ("skip", None, False),
        "security.cve_2025_2148": ("fail", r"^killed by SIGSEGV \(exit -11\)$", False),
        "security.cve_2025_55553": ("fail", FX_FROM_KEYWORD, True),
        "security.cve_2025_2998": ("skip", None, False),  # the check is gated to 1.4
        "security.cve_2025_3001": ("skip", None, False),  # the check is gated to 1.4
    }),
}
for _name, _version in (("torch-2.0.1-py3.8", "2.0.1+cu117"), ("torch-2.1.2-py3.8", "2.1.2+cu121")):
    RUNTIMES[_name] = (_version, "3.8", {
        "env.fingerprint": ("pass", r"^$", False),
        # upstream's call check is in (1.13.1); on 3.8 the comprehension is a call and is refused,
        # the comparison on a resolved object is not
        "security.cve_2022_45907": ("pass", r"^$", False),
        "security.cve_2022_45907_bypass": ("fail", BYPASS_OPERATOR, True),
        "security.cve_2025_3730": ("pass", r"^$", False),
        "security.cve_2025_2953": ("fail", r"^killed by SIGFPE \(exit -8\)$", False),
        "security.cve_2024_31580": ("fail", OOB, None),
        "security.cve_2024_31583": ("fail", OOB, None),
        "security.cve_2025_32434": ("fail", MARKER, True),
        "security.cve_2026_24747": ("fail", UNPICKLER, True),
        "security.cve_2025_2148": ("fail", r"^killed by SIGSEGV \(exit -11\)$", False),
        "security.cve_2025_55553": ("fail", FX_FROM, True),
        "security.cve_2025_2998": ("skip", None, False),  # the check is gated to 1.4
        "security.cve_2025_3001": ("skip", None, False),  # the check is gated to 1.4
    })


def _expected(name: str) -> dict[str, tuple[str, str, bool | None]]:
    version, _, rows = RUNTIMES[name]
    out = {}
    for check_id in all_check_ids():
        status, pattern, finding = rows.get(check_id, ("skip", None, False))
        if check_id not in rows and not (check_id.startswith(("maxpool2d.", "determinism."))
                                         or check_id == "env.arch_coverage"):
            raise AssertionError(f"{name}: no expectation for {check_id}")
        if pattern is None:
            # a version gate says so first; a CUDA check in range says there is no GPU
            torch_range = {d["id"]: d["torch"] for d in describe_checks()}[check_id]
            in_range = version_in_range(parse_torch_version(version), parse_range(torch_range))
            pattern = ("^" + re.escape(NO_GPU) + "$") if in_range else _needs(check_id, version)
        out[check_id] = (status, pattern, finding)
    return out


def runtime_python(name: str) -> Path:
    venv = LEGACY / "venvs" / name
    python = venv / "bin" / "python"
    stamp = venv / ".patcher-stamp"
    if not python.exists() or not stamp.exists():
        pytest.fail(f"the legacy runtime {name} is not in {LEGACY} (run `make host`: .ci/fetch-legacy-wheels.sh)",
                    pytrace=False)
    return python


@pytest.fixture(scope="module", params=sorted(RUNTIMES))
def legacy_run(request, tmp_path_factory):
    name = request.param
    python = runtime_python(name)
    out = tmp_path_factory.mktemp("probe-" + name)
    result = run_patcher("probe", "--python", python, "--json", out / "report.json", timeout=900)
    report_path = out / "report.json"
    assert report_path.exists(), result.stderr
    return name, python, result, json.loads(report_path.read_text())


def test_every_check_is_expected_on_every_runtime():
    for name in RUNTIMES:
        assert set(_expected(name)) == set(all_check_ids()), name


def test_the_runtime_is_the_pinned_one(legacy_run):
    name, python, _, report = legacy_run
    version, minor, _ = RUNTIMES[name]
    env = report["environment"]
    assert env["torch"]["version"] == version  # PyPI's own version string, with its CUDA label from 1.8 on
    assert env["python"]["version"].startswith(minor + "."), env["python"]
    # the venv's own torch, made from pyenv's interpreter of that minor version
    assert env["torch"]["path"].startswith(str(python.parent.parent) + "/lib/python" + minor + "/site-packages/")
    home = dict(line.split(" = ", 1) for line in (python.parent.parent / "pyvenv.cfg").read_text().splitlines()
                if " = " in line)["home"]
    assert re.search(rf"/versions/{re.escape(minor)}\.\d+/bin$", home), home
    assert env["cuda"]["compiled"] and env["cuda"]["available"] is False  # PyPI's CUDA wheel, no GPU here


def test_every_check_outcome(legacy_run, capsys):
    name, _, result, report = legacy_run
    found = {c["id"]: c for c in report["checks"]}
    assert list(found) == all_check_ids()
    for check_id, (status, pattern, finding) in _expected(name).items():
        entry = found[check_id]
        assert entry["status"] == status, f"{name} {check_id}: {entry['status']} {entry['message']}"
        assert re.search(pattern, entry["message"]), f"{name} {check_id}: {entry['message']!r}"
        if finding is not None:
            assert entry["finding"] is finding, f"{name} {check_id}"
    # a stock wheel claims no patch: every failure here is optional, so the run passes
    assert report["passed"] is True and result.exit_code == 0, result.stderr
    summary = report["summary"]
    findings = sum(1 for c in report["checks"] if c["status"] == "fail")
    with capsys.disabled():
        print(f"\nprobe on Python {report['environment']['python']['version']} + torch "
              f"{report['environment']['torch']['version']}: {summary['pass']} pass, {summary['skip']} skip, "
              f"{findings} findings, {summary['error']} error ({report['duration_s']:.1f} s)")


def test_the_fx_check_says_which_route_found_the_keyword(legacy_run):
    """CVE-2025-55553 has two routes into FX's code generator: make_fx (from 1.13) and
    fx.symbolic_trace (torch.fx, from 1.8); the check's details say what each route gave."""
    name, _, _, report = legacy_run
    entry = {c["id"]: c for c in report["checks"]}["security.cve_2025_55553"]
    make_fx = "an operator overload named 'from' (aten::random_.from, make_fx)"
    symbolic = "a keyword argument named 'from' (fx.symbolic_trace)"
    if name == "torch-1.4.0-py3.6":
        assert entry["status"] == "skip" and entry["details"] is None
    elif name == "torch-1.8.1-py3.8":
        assert entry["details"]["routes"] == {
            make_fx: "not run: this torch has no torch.fx.experimental.proxy_tensor", symbolic: "found"}
        assert "random_(3, 7) under make_fx" not in entry["details"]
        assert entry["details"]["uniform_(**{'from': 2.0, 'to': 3.0}) under fx.symbolic_trace"].startswith(
            "SyntaxError: invalid syntax: uniform_ = x.uniform_(from = 2.0")
    else:
        assert entry["details"]["routes"] == {make_fx: "found", symbolic: "found"}, entry["details"]


def test_the_exploitable_assessments_are_found(legacy_run):
    """An advisory assessed `exploitable` with probe checks for this release: the CI sees each
    of those checks find the defect on the real runtime."""
    name, _, _, report = legacy_run
    version = RUNTIMES[name][0].split("+")[0]
    found = {c["id"]: c for c in report["checks"]}
    for adv in advisories.load().advisories:
        a = adv.assess.get(version)
        if a is None or a.state != "exploitable":
            continue
        for check_id in a.probes:
            assert found[check_id]["status"] == "fail", f"{adv.id} on {version}: {check_id} {found[check_id]}"


def test_a_missing_interpreter_fails_the_fetch_loudly(tmp_path):
    """No pyenv CPython 3.6: the script stops with one line, before it asks any index for anything."""
    script = Path(__file__).resolve().parent.parent / ".ci" / "fetch-legacy-wheels.sh"
    env = dict(os.environ, PYENV_ROOT=str(tmp_path / "no-pyenv"), PATCHER_CI_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == f"ci: no CPython 3.6 under {tmp_path / 'no-pyenv'}/versions (the legacy runtimes need pyenv's builds)\n"
    assert list((tmp_path / "cache" / "legacy-torch" / "wheels").iterdir()) == []
