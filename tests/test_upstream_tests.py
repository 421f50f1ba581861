"""patcher.upstream_tests without torch: the pinned wheelhouse, the in-target runner on real old
interpreters (Python 3.6 from pyenv, and the host's) with a stand-in ``torch`` module and a small
test tree whose tests pass, fail, skip, xfail, crash, hang and fail to import, the payload for
containers, and the verdict logic (known failures, probe checks)."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from patcher import patches
from patcher import upstream_tests as ut
from patcher.errors import UpstreamTestsFailedError, UpstreamTestsSetupError
from tests.conftest import CI_CACHE

PYTHON36 = Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python"
WHEELHOUSE = CI_CACHE / "upstream-tests-wheelhouse"


def upstream_wheelhouse() -> Path:
    """The pinned test wheelhouse, built once under the CI cache (pip download, hashes checked)."""
    CI_CACHE.mkdir(parents=True, exist_ok=True)
    with open(CI_CACHE / "upstream-tests-wheelhouse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ut.build_wheelhouse(WHEELHOUSE)
    return WHEELHOUSE


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    return upstream_wheelhouse()


# A test tree with one test of every outcome. conftest-free, like 1.4's test/.
DEMO_TESTS = {
    "test_demo.py": '''\
import os
import signal
import time
import unittest

import pytest
import torch


class TestDemo(unittest.TestCase):
    def test_pass(self):
        self.assertEqual(torch.__version__, "0.0.0+standin")

    def test_fail(self):
        self.assertEqual(1, 2, "one is not two")

    @unittest.skip("needs CUDA")
    def test_skip(self):
        pass

    @unittest.expectedFailure
    def test_xfail(self):
        self.assertTrue(False)

    def test_uses_expecttest_and_hypothesis(self):
        import expecttest  # noqa: F401
        import hypothesis  # noqa: F401


def test_crash():
    os.kill(os.getpid(), signal.SIGSEGV)


def test_after_the_crash():
    pass


def test_hang():
    time.sleep(60)


@pytest.fixture
def broken():
    raise RuntimeError("setup broke")


def test_setup_error(broken):
    pass
''',
    "test_broken_import.py": "import no_such_module_anywhere\n\ndef test_x():\n    pass\n",
}
STANDIN_TORCH = "__version__ = '0.0.0+standin'\n\n\nclass cuda:\n" \
                "    @staticmethod\n    def is_available():\n        return False\n"


def standin_tree(tmp_path: Path, tests: dict[str, str]) -> tuple[Path, Path]:
    """A tree whose test/ holds ``tests`` (file name -> text), and a folder with a stand-in
    ``torch`` module to put on the target's PYTHONPATH."""
    tree = tmp_path / "tree"
    (tree / "test").mkdir(parents=True)
    for name, text in tests.items():
        (tree / "test" / name).write_text(text)
    fake = tmp_path / "standin-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(STANDIN_TORCH)
    return tree, fake


@pytest.fixture
def demo_tree(tmp_path) -> tuple[Path, Path]:
    return standin_tree(tmp_path, DEMO_TESTS)


def demo_selections() -> tuple[ut.Selection, ...]:
    tests = patches.parse_upstream_tests(
        'test_demo.py -k "TestDemo", test_demo.py -k "crash", test_demo.py::test_hang, '
        'test_demo.py::test_setup_error, test_demo.py -k "nothing_is_called_this", test_broken_import.py::test_x')
    return ut.plan(None, smoke=False, extra=[("PT-0001", t) for t in tests])


EXPECTED = {
    "test_demo.py::TestDemo::test_pass": "passed",
    "test_demo.py::TestDemo::test_fail": "failed",
    "test_demo.py::TestDemo::test_skip": "skipped",
    "test_demo.py::TestDemo::test_xfail": "xfailed",
    "test_demo.py::TestDemo::test_uses_expecttest_and_hypothesis": "passed",
    "test_demo.py::test_crash": "crashed",
    "test_demo.py::test_hang": "timeout",
    "test_demo.py::test_setup_error": "error",
    "test_broken_import.py": "error",
}


@pytest.mark.parametrize("python", [str(PYTHON36), sys.executable], ids=["python3.6", "host-python"])
def test_the_runner_reports_every_outcome(python, demo_tree, wheelhouse, tmp_path):
    if python == str(PYTHON36):
        assert PYTHON36.is_file(), f"{PYTHON36} is missing: this machine kind's image carries pyenv's 3.6.15"
    tree, fake = demo_tree
    report = ut.run_upstream_tests(tree, python, None, wheelhouse, selections=demo_selections(), timeout_s=10,
                                   env={"PYTHONPATH": str(fake)})
    assert report.error is None, report.error
    assert report.torch_version == "0.0.0+standin"
    assert report.python_version.startswith("3.6." if python == str(PYTHON36) else "3.")
    assert report.outcomes() == EXPECTED
    crash = next(n for n in report.nodes if n.node == "test_demo.py::test_crash")
    assert crash.message == "killed by signal 11"
    assert "one is not two" in next(n for n in report.nodes if n.node.endswith("test_fail")).message
    assert next(n for n in report.nodes if n.node.endswith("test_skip")).message == "needs CUDA"
    errors = {s.selection: s.error for s in report.selections if s.error}
    assert errors == {'test_demo.py -k "nothing_is_called_this"': "selects no test in this tree",
                      "test_demo.py::test_hang": "timed out after 10 s"}
    # the pinned set for this Python was installed, each file with its pinned sha256
    pinned: dict[str, set[str]] = {}
    for pin in ut.read_requirements():
        pinned.setdefault(pin.name, set()).update(pin.hashes)
    installed = {canonicalize_name(f.split("-")[0]): digest for f, digest in report.wheels}
    assert all(digest in pinned[name] for name, digest in installed.items())
    assert ("importlib-metadata" in installed) == (python == str(PYTHON36))
    assert not report.passed
    with pytest.raises(UpstreamTestsFailedError):
        report.raise_for_failures()
    assert json.loads(json.dumps(report.to_json())) == report.to_json()
    assert ut.UpstreamTestReport.from_json(report.to_json()) == report
    # the tree itself stays as it was: the tests ran from a copy
    assert sorted(p.name for p in (tree / "test").iterdir()) == sorted(DEMO_TESTS)


def test_a_failure_the_unpatched_release_shares_is_known(demo_tree, wheelhouse):
    tree, fake = demo_tree
    tests = patches.parse_upstream_tests('test_demo.py -k "TestDemo"')
    sel = ut.plan(None, smoke=False, extra=[("PT-0001", t) for t in tests])
    env = {"PYTHONPATH": str(fake)}
    report = ut.run_upstream_tests(tree, sys.executable, None, wheelhouse, selections=sel, env=env,
                                   baseline_python=sys.executable)
    (fail,) = [n for n in report.nodes if n.failing]
    assert fail.known_failure and fail.baseline_outcome == "failed"
    assert report.baseline["nodes_run"] == 1  # only the failing node ran again
    assert report.passed and not report.failures and report.known_failures == (fail,)
    (check,) = report.probe_checks()
    assert check["id"] == "upstream.PT-0001" and check["status"] == "pass"
    assert "1 known failure(s) of the unpatched release" in check["message"]
    assert check["details"]["known_failures"][0]["node"] == "test_demo.py::TestDemo::test_fail"


@pytest.mark.parametrize("file, python, expected", [
    ("pytest-7.0.1-py3-none-any.whl", "3.6", True),
    ("iniconfig-1.1.1-py2.py3-none-any.whl", "3.11", True),
    ("numpy-1.19.5-cp36-cp36m-manylinux2010_x86_64.whl", "3.6", True),
    ("numpy-1.19.5-cp36-cp36m-manylinux2010_x86_64.whl", "3.7", False),
    ("numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.11", True),
    ("numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.10", False),
    ("numpy-1.23.5-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl", "3.11", False),
    ("numpy-1.23.5-cp311-cp311-musllinux_1_1_x86_64.whl", "3.11", False),
    ("numpy-1.23.5-cp311-cp311-win_amd64.whl", "3.11", False),
    ("not-a-wheel.tar.gz", "3.11", False),
])
def test_which_wheel_serves_which_python(file, python, expected):
    assert ut.serves(file, python) is expected


def test_a_binary_pin_without_the_wheel_of_one_python_is_named(wheelhouse, tmp_path):
    house = tmp_path / "house"
    shutil.copytree(wheelhouse, house)
    next(house.glob("numpy-1.23.5-cp39-*.whl")).unlink()
    with pytest.raises(UpstreamTestsSetupError, match=r"test dependency numpy==1.23.5 for Python 3.9 is not in it"):
        ut.resolve_wheels(house)


NUMPY_TESTS = '''\
import os

import numpy


def test_which_numpy():
    print("NUMPY", numpy.__version__, numpy.__file__)
    assert numpy.__version__ == os.environ["EXPECTED_NUMPY"], (numpy.__version__, numpy.__file__)
'''


@pytest.mark.parametrize("has_numpy", [False, True], ids=["clean-target", "target-with-numpy"])
def test_numpy_is_the_targets_own_where_it_has_one(has_numpy, tmp_path, wheelhouse):
    """Python 3.6 from pyenv has no numpy: the runner unpacks the pinned 1.19.5 (a binary wheel)
    and the tests import it. Given a numpy of its own (here a stand-in on its path), the target
    keeps it and the pinned wheel is left out, recorded as such."""
    assert PYTHON36.is_file(), f"{PYTHON36} is missing: this machine kind's image carries pyenv's 3.6.15"
    tree, fake = standin_tree(tmp_path, {"test_numpy.py": NUMPY_TESTS})
    if has_numpy:
        (fake / "numpy").mkdir()
        (fake / "numpy" / "__init__.py").write_text("__version__ = '0.0+target'\n")
    selections = ut.plan(None, smoke=False, extra=[("PT-0001", patches.parse_upstream_tests("test_numpy.py::test_which_numpy")[0])])
    report = ut.run_upstream_tests(tree, str(PYTHON36), None, wheelhouse, selections=selections, timeout_s=120,
                                   env={"PYTHONPATH": str(fake),
                                        "EXPECTED_NUMPY": "0.0+target" if has_numpy else "1.19.5"})
    assert report.error is None, report.error
    assert report.outcomes() == {"test_numpy.py::test_which_numpy": "passed"}
    numpy_wheel = "numpy-1.19.5-cp36-cp36m-manylinux2010_x86_64.whl"
    installed = [f for f, _ in report.wheels]
    if has_numpy:
        assert report.target_provided == ((numpy_wheel, "numpy", str(fake / "numpy" / "__init__.py")),)
        assert numpy_wheel not in installed
    else:
        assert report.target_provided == () and numpy_wheel in installed
    assert ut.UpstreamTestReport.from_json(report.to_json()) == report


def test_verdicts_and_probe_report_merge():
    def node(name, outcome, sel="s01"):
        return ut.NodeResult(node=name, outcome=outcome, duration_s=0.1, selection=sel)

    def selection(sid, patches_, error=None):
        return ut.SelectionResult(id=sid, selection=f"t_{sid}.py -k \"x\"", patches=patches_, args=(), returncode=0,
                                  duration_s=1.0, collected=1, error=error)

    report = ut.UpstreamTestReport(
        tree="/t", python="py", python_version="3.11.2", torch_version="1.13.1", torch_file=None, duration_s=3.0,
        wheels=(), selections=(selection("s01", ("PT-0102",)), selection("s02", ("PT-0102", "PT-0201")),
                               selection("s03", ("smoke",))),
        nodes=(node("t.py::a", "passed"), node("t.py::b", "skipped", "s02"), node("t.py::c", "failed", "s03")))
    unpatched = ut.UpstreamTestReport(
        tree="/t", python="base", python_version="3.11.2", torch_version="1.13.1", torch_file=None, duration_s=1.0,
        wheels=(), selections=(), nodes=(node("t.py::c", "passed", "b01"),))
    assert not report.passed
    merged = report.with_baseline(unpatched)
    assert merged.failures[0].baseline_outcome == "passed" and not merged.failures[0].known_failure
    checks = {c["id"]: c for c in merged.probe_checks()}
    assert [c["status"] for c in checks.values()] == ["pass", "skip", "fail"]
    assert checks["upstream.smoke"]["patches"] == [] and checks["upstream.PT-0201"]["patches"] == ["PT-0201"]
    probe = {"schema": 1, "checks": [{"id": "env.fingerprint", "status": "pass", "required": True}],
             "summary": {"pass": 1}, "passed": True}
    combined = merged.merge_into(probe)
    assert combined["passed"] is False and combined["summary"] == {"pass": 2, "fail": 1, "skip": 1, "error": 0}
    assert combined["upstream_tests"]["schema"] == ut.SCHEMA and probe["passed"] is True
    assert [str(s.test) for s in merged.baseline_selections()] == ["t.py::c"]


def test_the_payload_runs_as_a_container_would(demo_tree, wheelhouse, tmp_path):
    """container_payload + its shell script, run here with sh at the path a container would use."""
    tree, fake = demo_tree
    tests = patches.parse_upstream_tests('test_demo.py -k "test_pass or test_skip"')
    sel = ut.plan(None, smoke=False, extra=[("PT-0001", t) for t in tests])
    payload = ut.container_payload(tree, None, wheelhouse, tmp_path / "payload", selections=sel)
    root = tmp_path / "in-container"
    shutil.copytree(payload.root, root)  # as `docker cp` / put_archive would place it
    script = payload.script("python3", str(root))
    assert script.startswith("#!/bin/sh\n") and "exec 'python3'" in script
    (root / "run.sh").write_text(script)
    proc = subprocess.run(["sh", str(root / "run.sh")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(fake)})
    assert proc.returncode == 0, proc.stderr
    report = payload.read_result("python3 in a container", (root / "result.json").read_text())
    assert report.outcomes() == {"test_demo.py::TestDemo::test_pass": "passed",
                                 "test_demo.py::TestDemo::test_skip": "skipped"}
    assert report.passed and report.python == "python3 in a container"


def test_a_tampered_wheel_is_refused(demo_tree, wheelhouse, tmp_path):
    tree, fake = demo_tree
    house = tmp_path / "house"
    shutil.copytree(wheelhouse, house)
    victim = next(house.glob("pytest-7.0.1-*.whl"))
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(UpstreamTestsSetupError, match=rf"test dependency pytest==7.0.1 {victim.name} does not "
                                                      r"have a pinned sha256"):
        ut.resolve_wheels(house)
    # and in the target: the runner checks every hash again before it unpacks anything
    sel = ut.plan(None, smoke=False, extra=[("PT-0001", patches.parse_upstream_tests("test_demo.py::TestDemo")[0])])
    payload = ut.prepare_payload(tree, sel, wheelhouse, tmp_path / "payload")
    wheel = next((payload.root / "wheels").glob("attrs-*.whl"))
    wheel.write_bytes(b"not the pinned file")
    report = ut.run_payload(payload, sys.executable, env={"PYTHONPATH": str(fake)})
    assert report.error.startswith(f"test dependency {wheel.name} has sha256 ") and not report.passed
    assert not (payload.root / "site" / "pytest").exists()


MEETING_TESTS = '''\
import os
import time

import torch


def _meet(mine, other):
    meet = os.environ["MEETING_DIR"]
    open(os.path.join(meet, mine), "w").close()
    deadline = time.time() + 20
    while not os.path.exists(os.path.join(meet, other)):
        assert time.time() < deadline, "the other selection never ran beside this one"
        time.sleep(0.05)


def test_a():
    _meet("a", "b")


def test_b():
    _meet("b", "a")


def test_alone():
    pass
'''


@pytest.mark.parametrize("jobs", [1, 2])
def test_selections_run_at_the_same_time_and_are_reported_in_order(jobs, tmp_path, wheelhouse):
    """Two selections that can only pass together (each waits for the other's file): with two
    jobs they meet, with one they cannot; the result lists selections in the plan's order."""
    tree, fake = standin_tree(tmp_path, {"test_meet.py": MEETING_TESTS})
    meeting = tmp_path / "meet"
    meeting.mkdir()
    tests = patches.parse_upstream_tests("test_meet.py::test_alone, test_meet.py::test_a, test_meet.py::test_b")
    selections = ut.plan(None, smoke=False, extra=[("PT-0001", t) for t in tests])
    report = ut.run_upstream_tests(tree, sys.executable, None, wheelhouse, selections=selections, timeout_s=60,
                                   env={"PYTHONPATH": str(fake), "MEETING_DIR": str(meeting)}, jobs=jobs)
    assert [s.id for s in report.selections] == [s.id for s in selections]
    # one at a time, test_a waits in vain; test_b, after it, finds test_a's file
    assert report.outcomes() == {"test_meet.py::test_alone": "passed",
                                 "test_meet.py::test_a": "passed" if jobs == 2 else "failed",
                                 "test_meet.py::test_b": "passed"}


def test_jobs_below_one_are_refused(demo_tree, wheelhouse, tmp_path):
    with pytest.raises(UpstreamTestsSetupError, match="jobs must be at least 1, not 0"):
        ut.prepare_payload(demo_tree[0], demo_selections(), wheelhouse, tmp_path / "p", jobs=0)


def test_no_test_directory_and_no_wheelhouse(tmp_path, wheelhouse):
    with pytest.raises(UpstreamTestsSetupError, match="has no test/ directory"):
        ut.prepare_payload(tmp_path, (), wheelhouse, tmp_path / "p")
    with pytest.raises(UpstreamTestsSetupError, match="does not exist"):
        ut.resolve_wheels(tmp_path / "nowhere")


def test_requirements_pin_a_complete_set_for_every_python(wheelhouse):
    """Every pin is exact and hashed; for each supported Python the pinned wheels' own
    Requires-Dist (markers evaluated for it, extras left out) are all in the set."""
    import zipfile

    from packaging.markers import default_environment

    pins = ut.read_requirements()
    assert {p.name for p in pins} >= {"pytest", "expecttest", "hypothesis"}
    assert all(p.hashes and all(len(h) == 64 for h in p.hashes) for p in pins)
    # one hash a pin, but for binary wheels: one a CPython the pin serves
    assert {p.name for p in pins if len(p.hashes) > 1} == {"numpy", "pyyaml"}
    resolved = ut.resolve_wheels(wheelhouse)
    assert set(resolved) == set(ut.PYTHONS)
    for python, wheels in resolved.items():
        have = {w.project: w.version for w in wheels}
        assert len(have) == len(wheels), (python, wheels)  # one file a project
        assert all(ut.serves(w.file, python) for w in wheels), (python, wheels)
        assert have["numpy"] == {"3.6": "1.19.5", "3.7": "1.21.6", "3.12": "2.1.3", "3.13": "2.1.3"}.get(python, "1.23.5")
        assert have["pytest"] == ("8.3.4" if python in ("3.12", "3.13") else "7.0.1")
        env = {**default_environment(), "python_version": python, "python_full_version": python + ".0",
               "sys_platform": "linux", "extra": ""}
        for wheel in wheels:
            with zipfile.ZipFile(wheelhouse / wheel.file) as archive:
                meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
                lines = archive.read(meta).decode().splitlines()
            requires = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
            python_req = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Python:")]
            if python_req:
                from packaging.specifiers import SpecifierSet
                assert SpecifierSet(python_req[0]).contains(python + ".0"), (python, wheel.file, python_req)
            for text in requires:
                req = Requirement(text)
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
                name = canonicalize_name(req.name)
                assert name in have, (python, wheel.file, text)
                assert req.specifier.contains(have[name], prereleases=True), (python, wheel.file, text)


def test_the_runner_follows_the_probe_rule():
    """Standard library only, Python 3.6 syntax: it runs inside old targets."""
    source = ut.RUNNER.read_text()
    tree = ast.parse(source, feature_version=(3, 6))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert "torch" not in imported and "patcher" not in imported


def test_plan_unions_the_series_and_the_smoke_selection():
    series = patches.load_series(Path(patches.__file__).resolve().parent.parent / "patches", "1.13.1")
    chosen = ut.plan(series)
    every = [str(t) for p in series.patches for t in p.upstream_tests]
    assert [str(s.test) for s in chosen if s.patches != (ut.SMOKE_ID,)] == list(dict.fromkeys(every))
    assert [str(s.test) for s in chosen if s.patches == (ut.SMOKE_ID,)] == [str(t) for t in ut.SMOKE]
    lite = next(s for s in chosen if s.test.file == "mobile/test_lite_script_module.py")
    assert lite.patches == ("PT-0104", "PT-0105")
    assert [s.id for s in chosen] == [f"s{i:02d}" for i in range(1, len(chosen) + 1)]


def test_check_selections_finds_what_a_tree_lacks(demo_tree):
    tree, _ = demo_tree
    tests = patches.parse_upstream_tests('test_demo.py::TestDemo::test_pass, test_demo.py::TestGone::test_x, '
                                         'test_gone.py -k "x", test_demo.py -k "anything"')
    chosen = ut.plan(None, smoke=False, extra=[("PT-0001", t) for t in tests])
    assert ut.check_selections(tree, chosen) == [
        "test_demo.py::TestGone::test_x: test/test_demo.py has no TestGone (PT-0001)",
        'test_gone.py -k "x": test/test_gone.py does not exist (PT-0001)']


def test_a_run_that_failed_before_any_selection_is_an_error_check_not_a_pass():
    from patcher.upstream_tests import UpstreamTestReport

    report = UpstreamTestReport(tree="t", python="python3", python_version="3.9.2", torch_version=None,
                                torch_file=None, duration_s=0.5, wheels=(), selections=(), nodes=(),
                                error="the target cannot import torch: ImportError: nope")
    checks = report.probe_checks()
    assert [(c["id"], c["status"], c["required"]) for c in checks] == [("upstream.run", "error", True)]
    merged = report.merge_into({"schema": 1, "checks": [], "summary": {}, "passed": True})
    assert merged["passed"] is False and merged["summary"]["error"] == 1


def test_an_unreachable_index_is_one_error_naming_the_python_and_leaves_no_wheel(tmp_path, monkeypatch):
    """pip download against a closed loopback port: the setup error names the first interpreter
    whose pinned set could not be fetched, and the wheelhouse stays empty."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)  # this machine's local wheel folder would answer
    house = tmp_path / "house"
    with pytest.raises(UpstreamTestsSetupError, match=r"^pip download of the test dependencies for Python 3\.6 "
                                                      r"failed: ") as caught:
        ut.build_wheelhouse(house, index_url=f"http://127.0.0.1:{port}/simple")
    assert "\n" not in str(caught.value) and "PIP_INDEX_URL" in caught.value.hint
    assert list(house.glob("*.whl")) == []
