"""Upstream's own tests against a wheel (issue 21).

Every patch names, in its ``Upstream-Tests`` trailer, the upstream tests that exercise the code
it changes (``patcher.patches.UpstreamTest``).  This module runs the union of a series'
selections plus a fixed smoke selection (``SMOKE``) from a source tree's ``test/`` against a
target interpreter (or, through ``container_payload``, inside an image), and returns the
outcome of every test node as a typed ``UpstreamTestReport`` that merges into the probe report.

How it runs:

- The tree's ``test/`` (and its ``pytest.ini``) is copied into a private payload directory, so
  the tests never see the tree's own ``torch/`` sources and never write into the tree.
- The test dependencies (pytest, expecttest, hypothesis and their own dependencies, and numpy,
  which PyTorch's test harness imports) come from a wheelhouse pinned by sha256 in
  ``data/upstream-tests-requirements.txt``; ``build_wheelhouse`` fills one with ``pip download
  --require-hashes`` (pip's own index settings, or patcher's ``pypi_index``), a binary wheel
  per target interpreter (CPython, manylinux x86_64) where a project has no pure-Python one.
  Nothing is downloaded while the tests run.
- numpy (and yaml) is the target's own where it has one (``TARGET_FIRST``): a torch is built
  against the numpy of its environment, and another one in front of it could break its C API.
  The pinned ones serve a clean venv, such as the probe's venv for a built wheel.
- ``patcher/upstream_runner.py`` is the part that runs in the target.  It follows the probe's
  rule (standard library only, Python 3.6 syntax): it checks each wheel's sha256 again, unpacks
  the wheels into the payload (no pip or venv needed in the target), then runs one
  ``python -m pytest`` child per selection.  The tests themselves cannot follow that rule, they
  are upstream's pytest/unittest programs: they run under the wheelhouse's pytest, in child
  processes, and nothing of the probe imports them.  The runner is also the pytest plugin that
  records each node as it runs, so a test that kills the interpreter is reported as
  ``crashed`` with its signal instead of losing the selection.
- A selected test that fails on the patched wheel fails the report, unless it fails on the
  unpatched release too: ``with_baseline`` (or ``run_upstream_tests(baseline_python=...)``,
  which re-runs only the failing nodes there) marks it a known failure and records the
  unpatched outcome; it is reported, never hidden.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from patcher.errors import UpstreamTestsFailedError, UpstreamTestsSetupError
from patcher.patches import Series, UpstreamTest, parse_upstream_tests

SCHEMA = "patcher.upstream-tests/1"
REQUIREMENTS = Path(__file__).resolve().parent / "data" / "upstream-tests-requirements.txt"
RUNNER = Path(__file__).resolve().parent / "upstream_runner.py"
PYTHONS = ("3.6", "3.7", "3.8", "3.9", "3.10", "3.11", "3.12", "3.13")  # the interpreters the pinned set serves
PLATFORM = "manylinux2014_x86_64"  # binary wheels are for this platform (pip also takes older manylinux tags)
# project -> the module that shows the target has its own copy; the runner then leaves the
# pinned wheel out (see the module docstring)
TARGET_FIRST = {"numpy": "numpy", "pyyaml": "yaml"}
DEFAULT_TIMEOUT_S = 1200  # per selection
SMOKE_ID = "smoke"

# The fixed smoke selection: core classes of test_torch / test_autograd / test_nn, CPU only
# (CUDA variants are named *_cuda or live in the DeviceType classes). Measured on 2 cores with
# Debian's torch 1.13.1: about 4 s, 12 s and 42 s (1,700 tests).
SMOKE: tuple[UpstreamTest, ...] = parse_upstream_tests(
    'test_torch.py -k "TestTorch and not DeviceType", '
    'test_autograd.py -k "TestAutograd and not DeviceType", '
    'test_nn.py -k "TestNN and not DeviceType and not cuda"')

OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", "xpassed", "crashed", "timeout")
FAILING = ("failed", "error", "xpassed", "crashed", "timeout")


# --- the pinned wheelhouse ---------------------------------------------------------------------
@dataclass(frozen=True)
class Pin:
    name: str  # canonical project name
    version: str
    marker: str | None
    hashes: tuple[str, ...]  # sha256 hex digests

    def applies_to(self, python: str) -> bool:
        if self.marker is None:
            return True
        env = {"python_version": python, "python_full_version": python + ".0", "implementation_name": "cpython",
               "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
               "os_name": "posix"}
        return Marker(self.marker).evaluate(env)

    def line(self) -> str:
        """The requirement line for pip, without its marker (the wheelhouse serves every Python)."""
        return f"{self.name}=={self.version} " + " ".join(f"--hash=sha256:{h}" for h in self.hashes)


def read_requirements(path: Path = REQUIREMENTS) -> tuple[Pin, ...]:
    """Parse a pip requirements file of exact pins with --hash options (continuations allowed)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UpstreamTestsSetupError(f"cannot read the test requirements {path}: {exc.strerror}") from None
    logical, current = [], ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            logical.append(current.strip())
        current = ""
    pins = []
    for entry in logical:
        words = entry.split()
        hashes = tuple(w.split("sha256:", 1)[1] for w in words if w.startswith("--hash=sha256:"))
        spec = " ".join(w for w in words if not w.startswith("--hash="))
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            raise UpstreamTestsSetupError(f"{path}: {entry!r} is not a requirement: {exc}") from None
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or not hashes:
            raise UpstreamTestsSetupError(f"{path}: {req.name} must be pinned as name==version with --hash=sha256:")
        pins.append(Pin(canonicalize_name(req.name), specs[0].version, str(req.marker) if req.marker else None,
                        hashes))
    return tuple(pins)


@dataclass(frozen=True)
class WheelFile:
    file: str
    sha256: str
    project: str
    version: str


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wheel_project(name: str) -> tuple[str, str] | None:
    parts = name[:-len(".whl")].split("-") if name.endswith(".whl") else []
    return (canonicalize_name(parts[0]), parts[1]) if len(parts) >= 5 else None


def serves(wheel_file: str, python: str) -> bool:
    """Whether a wheel (by its file name's tags) installs into CPython ``python`` on ``PLATFORM``."""
    try:
        tags = parse_wheel_filename(wheel_file)[3]
    except InvalidWheelFilename:
        return False
    major, minor = python.split(".")
    interpreters = {f"cp{major}{minor}", f"py{major}{minor}", f"py{major}"}
    abis = {"none", "abi3", f"cp{major}{minor}", f"cp{major}{minor}m"}
    arch = PLATFORM.split("_", 1)[1]
    return any(tag.interpreter in interpreters and tag.abi in abis
               and (tag.platform == "any" or (tag.platform.startswith("manylinux") and tag.platform.endswith(arch)))
               for tag in tags)


def resolve_wheels(wheelhouse: Path, requirements: Path = REQUIREMENTS) -> dict[str, tuple[WheelFile, ...]]:
    """For each supported Python, the wheelhouse files the pins ask for, each checked by sha256
    (a pin with binary wheels has one hash per interpreter; each Python gets the one it can use)."""
    house = Path(wheelhouse)
    if not house.is_dir():
        raise UpstreamTestsSetupError(f"the test wheelhouse {house} does not exist",
                                      hint="fill it with patcher.upstream_tests.build_wheelhouse")
    pins = read_requirements(requirements)
    by_hash: dict[str, WheelFile] = {}
    for path in sorted(house.glob("*.whl")):
        project = _wheel_project(path.name)
        if project is not None:
            digest = _sha256(path)
            by_hash[digest] = WheelFile(path.name, digest, *project)
    resolved: dict[str, tuple[WheelFile, ...]] = {}
    for python in PYTHONS:
        chosen = []
        for pin in (p for p in pins if p.applies_to(python)):
            found = [by_hash[h] for h in pin.hashes if h in by_hash]
            for wheel in found:
                if (wheel.project, wheel.version) != (pin.name, pin.version):
                    raise UpstreamTestsSetupError(f"{wheel.file} has the sha256 pinned for {pin.name}=={pin.version}")
            usable = [w for w in found if serves(w.file, python)]
            if not usable:
                named = [p.name for p in house.glob("*.whl") if _wheel_project(p.name) == (pin.name, pin.version)
                         and serves(p.name, python)]
                what = f"{named[0]} does not have a pinned sha256" if named else f"for Python {python} is not in it"
                raise UpstreamTestsSetupError(f"test dependency {pin.name}=={pin.version} {what} ({house})",
                                              hint="rebuild the wheelhouse with build_wheelhouse")
            chosen.append(usable[0])
        resolved[python] = tuple(chosen)
    return resolved


def build_wheelhouse(dest: Path, requirements: Path = REQUIREMENTS, index_url: str | None = None,
                     pip: Sequence[str] | None = None) -> tuple[Path, ...]:
    """Download every pinned wheel into ``dest`` with ``pip download --require-hashes``.

    pip reads its index from its own configuration and environment (PIP_INDEX_URL, pip.conf);
    ``index_url`` (e.g. ``Settings.pypi_base()``) overrides it.  Files already there with a
    pinned hash are kept; the result is checked with ``resolve_wheels``.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    pins = read_requirements(requirements)
    have = {_sha256(p): p.name for p in dest.glob("*.whl")}
    for python in PYTHONS:  # one pip run per interpreter that lacks a pinned wheel it can use
        missing = [p for p in pins if p.applies_to(python)
                   and not any(serves(have[h], python) for h in p.hashes if h in have)]
        if not missing:
            continue
        with tempfile.TemporaryDirectory(prefix="patcher-wheelhouse-") as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text("".join(p.line() + "\n" for p in missing), encoding="utf-8")
            command = [*(pip or (sys.executable, "-m", "pip")), "download", "--quiet", "--no-deps",
                       "--only-binary=:all:", "--ignore-requires-python", "--require-hashes",
                       "--python-version", python, "--implementation", "cp", "--platform", PLATFORM,
                       "--dest", str(dest), "-r", str(req)]
            if index_url:
                command += ["--index-url", index_url]
            proc = subprocess.run(command, capture_output=True, text=True)
            if proc.returncode != 0:
                lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
                raise UpstreamTestsSetupError(f"pip download of the test dependencies for Python {python} failed: "
                                              f"{lines[-1] if lines else proc.returncode}",
                                              hint="set PIP_INDEX_URL or patcher's pypi_index to a reachable index")
        known = set(have.values())  # hash only what this download added
        have.update({_sha256(p): p.name for p in dest.glob("*.whl") if p.name not in known})
    resolve_wheels(dest, requirements)
    return tuple(sorted(dest.glob("*.whl")))


# --- what to run -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    id: str  # "s01", ...
    test: UpstreamTest
    patches: tuple[str, ...]  # the Patch-Ids that name it, and/or "smoke"

    def args(self) -> list[str]:
        if self.test.keyword is not None:
            return [self.test.file, "-k", self.test.keyword]
        return [self.test.node_id or self.test.file]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "selection": str(self.test), "patches": list(self.patches), "args": self.args()}


def plan(series: Series | None = None, smoke: bool = True,
         extra: Iterable[tuple[str, UpstreamTest]] = ()) -> tuple[Selection, ...]:
    """The series' Upstream-Tests union (each selection once, with every patch that names it),
    then the smoke selection; ``extra`` adds (owner, test) pairs."""
    owners: dict[UpstreamTest, list[str]] = {}
    pairs = [(p.id, t) for p in (series.patches if series else ()) for t in p.upstream_tests]
    pairs += list(extra)
    pairs += [(SMOKE_ID, t) for t in SMOKE] if smoke else []
    for owner, test in pairs:
        owners.setdefault(test, [])
        if owner not in owners[test]:
            owners[test].append(owner)
    return tuple(Selection(f"s{i:02d}", test, tuple(ids)) for i, (test, ids) in enumerate(owners.items(), 1))


# --- results -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeResult:
    node: str  # pytest node id relative to the tree's test/, e.g. test_nn.py::TestNN::test_x
    outcome: str  # one of OUTCOMES
    duration_s: float
    selection: str  # Selection.id
    message: str = ""
    known_failure: bool = False  # it fails on the unpatched release too
    baseline_outcome: str | None = None  # its outcome on the unpatched release, where that ran

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING


@dataclass(frozen=True)
class SelectionResult:
    id: str
    selection: str
    patches: tuple[str, ...]
    args: tuple[str, ...]
    returncode: int | None
    duration_s: float
    collected: int | None
    error: str | None = None  # the selection as a whole could not run, or selected nothing
    output_tail: str = field(default="", repr=False)


@dataclass(frozen=True)
class UpstreamTestReport:
    tree: str
    python: str  # the interpreter (path, or "python3 in IMAGE")
    python_version: str
    torch_version: str | None
    torch_file: str | None
    duration_s: float
    wheels: tuple[tuple[str, str], ...]  # (file, sha256) installed in the target
    selections: tuple[SelectionResult, ...]
    nodes: tuple[NodeResult, ...]
    error: str | None = None  # the run as a whole failed (no torch, no pinned set, ...)
    baseline: dict[str, Any] | None = None  # {"python", "torch_version", "nodes_run"} of the unpatched run
    # (file, module, where the target has it): pinned wheels left out for the target's own copy
    target_provided: tuple[tuple[str, str, str], ...] = ()
    schema: str = SCHEMA

    # -- verdicts -------------------------------------------------------------------------------
    @property
    def failures(self) -> tuple[NodeResult, ...]:
        """Failing nodes that are not known failures of the unpatched release."""
        return tuple(n for n in self.nodes if n.failing and not n.known_failure)

    @property
    def known_failures(self) -> tuple[NodeResult, ...]:
        return tuple(n for n in self.nodes if n.failing and n.known_failure)

    @property
    def selection_errors(self) -> tuple[SelectionResult, ...]:
        return tuple(s for s in self.selections if s.error)

    @property
    def passed(self) -> bool:
        return self.error is None and not self.failures and not self.selection_errors

    def summary(self) -> dict[str, int]:
        counts = {o: 0 for o in OUTCOMES}
        for node in self.nodes:
            counts[node.outcome] += 1
        counts["known_failures"] = len(self.known_failures)
        return counts

    def outcomes(self) -> dict[str, str]:
        """node id -> outcome (a node run by several selections: its worst outcome)."""
        rank = {o: i for i, o in enumerate(("passed", "xfailed", "skipped", "xpassed", "failed", "error",
                                            "timeout", "crashed"))}
        out: dict[str, str] = {}
        for node in self.nodes:
            if node.node not in out or rank[node.outcome] > rank[out[node.node]]:
                out[node.node] = node.outcome
        return out

    def for_patch(self, patch_id: str) -> tuple[NodeResult, ...]:
        ids = {s.id for s in self.selections if patch_id in s.patches}
        return tuple(n for n in self.nodes if n.selection in ids)

    def raise_for_failures(self) -> None:
        if self.error:
            raise UpstreamTestsSetupError(f"upstream tests could not run: {self.error}")
        if not self.passed:
            first = (self.failures[0].node if self.failures else self.selection_errors[0].selection)
            raise UpstreamTestsFailedError(
                f"{len(self.failures)} upstream test(s) failed and {len(self.selection_errors)} selection(s) "
                f"could not run on {self.python} (first: {first})",
                hint="the report names each; a failure the unpatched release shares is a known failure")

    # -- into the probe report --------------------------------------------------------------------
    def probe_checks(self) -> list[dict[str, Any]]:
        """One probe-report check per patch (``upstream.PT-0102``) and one for the smoke selection,
        in the probe report's check format (patcher/probe/report.py)."""
        owners: list[str] = []
        for sel in self.selections:
            owners += [p for p in sel.patches if p not in owners]
        checks = []
        for owner in owners:
            sels = [s for s in self.selections if owner in s.patches]
            nodes = [n for n in self.nodes if n.selection in {s.id for s in sels}]
            failing = [n for n in nodes if n.failing and not n.known_failure]
            known = [n for n in nodes if n.failing and n.known_failure]
            errors = [s for s in sels if s.error]
            ran = [n for n in nodes if n.outcome not in ("skipped",)]
            if self.error or errors:
                status = "error"
                message = self.error or "; ".join(f"{s.selection}: {s.error}" for s in errors)
            elif failing:
                status = "fail"
                message = f"{len(failing)} of {len(nodes)} upstream tests failed: " + ", ".join(
                    n.node for n in failing[:5]) + (" ..." if len(failing) > 5 else "")
            elif not ran:
                status = "skip"
                message = f"all {len(nodes)} selected upstream tests were skipped here"
            else:
                status = "pass"
                message = f"{len(ran)} upstream tests ran, none failed" + (
                    f" ({len(known)} known failure(s) of the unpatched release)" if known else "")
            checks.append({
                "id": f"upstream.{owner}", "status": status, "required": True, "message": message,
                "details": {"selections": [s.selection for s in sels],
                            "counts": {o: sum(1 for n in nodes if n.outcome == o) for o in OUTCOMES},
                            "failures": [asdict(n) for n in failing], "known_failures": [asdict(n) for n in known]},
                "patches": [] if owner == SMOKE_ID else [owner],
                "duration_s": round(sum(s.duration_s for s in sels), 3), "finding": False})
        if self.error and not checks:  # the run itself failed before any selection: never a silent pass
            checks.append({"id": "upstream.run", "status": "error", "required": True, "message": self.error,
                           "details": {}, "patches": [], "duration_s": round(self.duration_s, 3), "finding": False})
        return checks

    def merge_into(self, probe_report: dict[str, Any]) -> dict[str, Any]:
        """A copy of a probe report (schema 1 dict) with these checks added and the verdict redone."""
        merged = json.loads(json.dumps(probe_report))
        merged["checks"] = [c for c in merged.get("checks", []) if not c["id"].startswith("upstream.")]
        merged["checks"] += self.probe_checks()
        summary = {s: 0 for s in ("pass", "fail", "skip", "error")}
        for check in merged["checks"]:
            summary[check["status"]] = summary.get(check["status"], 0) + 1
        merged["summary"] = summary
        merged["passed"] = not any(c["required"] and c["status"] in ("fail", "error") for c in merged["checks"])
        merged["upstream_tests"] = self.to_json()
        return merged

    # -- the unpatched release ------------------------------------------------------------------
    def with_baseline(self, unpatched: UpstreamTestReport) -> UpstreamTestReport:
        """Mark failures that the unpatched release shares as known, recording its outcome."""
        theirs = unpatched.outcomes()
        nodes = []
        for node in self.nodes:
            base = theirs.get(node.node)
            if node.failing and base is not None:
                node = replace(node, baseline_outcome=base, known_failure=base in FAILING)
            nodes.append(node)
        baseline = {"python": unpatched.python, "python_version": unpatched.python_version,
                    "torch_version": unpatched.torch_version, "nodes_run": len(unpatched.nodes),
                    "error": unpatched.error}
        return replace(self, nodes=tuple(nodes), baseline=baseline)

    def baseline_selections(self) -> tuple[Selection, ...]:
        """What to run on the unpatched release: every failing node by its id (a selection that
        failed as a whole: again as it was)."""
        out: list[Selection] = []
        for node in self.nodes:
            if node.failing and "::" in node.node:
                file, *names = node.node.split("::")
                out.append(Selection(f"b{len(out) + 1:02d}", UpstreamTest(file=file, node=tuple(names)),
                                     ("baseline",)))
        by_id = {s.id: s for s in self.selections}
        for sel in self.selection_errors:
            test = parse_upstream_tests(by_id[sel.id].selection)[0]
            out.append(Selection(f"b{len(out) + 1:02d}", test, ("baseline",)))
        return tuple(out)

    # -- JSON -----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        data["summary"] = self.summary()
        return json.loads(json.dumps(data))  # tuples become lists: the JSON it is written as

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpstreamTestReport:
        data = {k: v for k, v in data.items() if k not in ("passed", "summary")}
        data["wheels"] = tuple(tuple(w) for w in data["wheels"])
        data["target_provided"] = tuple(tuple(w) for w in data.get("target_provided", ()))  # older reports lack it
        data["selections"] = tuple(SelectionResult(**{**s, "patches": tuple(s["patches"]), "args": tuple(s["args"])})
                                   for s in data["selections"])
        data["nodes"] = tuple(NodeResult(**n) for n in data["nodes"])
        return cls(**data)


# --- the payload: what goes into the target --------------------------------------------------------
@dataclass(frozen=True)
class Payload:
    """A directory holding everything the target needs: the runner, the tests, the wheels, the
    manifest.  Run ``command()`` in the target (the directory at ``root_in_target``); it writes
    ``result_name`` beside the manifest."""

    root: Path
    selections: tuple[Selection, ...]
    tree: str
    result_name: str = "result.json"

    def command(self, python: str = "python3", root_in_target: str | None = None) -> list[str]:
        root = root_in_target or str(self.root)
        return [python, f"{root}/upstream_runner.py", f"{root}/manifest.json", f"{root}/{self.result_name}"]

    def script(self, python: str = "python3", root_in_target: str = "/tmp/patcher-upstream-tests") -> str:
        """A POSIX shell script for a container: run the runner, keep its exit status."""
        argv = " ".join(_sh_quote(a) for a in self.command(python, root_in_target))
        return ("#!/bin/sh\n# upstream tests (patcher.upstream_tests): payload at " + root_in_target + "\n"
                f"cd {_sh_quote(root_in_target)} || exit 2\nexec {argv}\n")

    def read_result(self, python: str, text: str | None = None) -> UpstreamTestReport:
        raw = text if text is not None else (self.root / self.result_name).read_text(encoding="utf-8")
        return report_from_result(json.loads(raw), self.selections, self.tree, python)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def prepare_payload(tree: Path, selections: Sequence[Selection], wheelhouse: Path, dest: Path,
                    requirements: Path = REQUIREMENTS, timeout_s: float = DEFAULT_TIMEOUT_S,
                    jobs: int | None = None) -> Payload:
    """Fill ``dest`` (a new or empty directory) with the runner, a copy of the tree's tests,
    the pinned wheels and the manifest.  ``jobs``: selections run at once in the target (None:
    the runner picks one per CPU it may use, at most four)."""
    if jobs is not None and jobs < 1:
        raise UpstreamTestsSetupError(f"jobs must be at least 1, not {jobs}")
    tree = Path(tree)
    tests = tree / "test"
    if not tests.is_dir():
        raise UpstreamTestsSetupError(f"{tree} has no test/ directory: upstream's tests come from the source tree",
                                      hint="pass the tree `patcher fetch` made (--source)")
    wheels = resolve_wheels(wheelhouse, requirements)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise UpstreamTestsSetupError(f"the payload directory {dest} is not empty")
    shutil.copy2(RUNNER, dest / "upstream_runner.py")
    shutil.copytree(tests, dest / "tree" / "test", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", ".hypothesis"))
    ini = tree / "pytest.ini"
    (dest / "tree" / "pytest.ini").write_text(ini.read_text(encoding="utf-8") if ini.is_file() else "[pytest]\n",
                                              encoding="utf-8")
    (dest / "wheels").mkdir()
    for wheel in {w for group in wheels.values() for w in group}:
        shutil.copy2(Path(wheelhouse) / wheel.file, dest / "wheels" / wheel.file)
    manifest = {"schema": 1, "tests_dir": "tree/test", "rootdir": "tree", "site_dir": "site", "wheel_dir": "wheels",
                "wheels": {py: [_manifest_wheel(w) for w in group] for py, group in wheels.items()},
                "jobs": jobs,
                # the smoke selections hold most of the nodes: started first, they do not end up last alone
                "selections": [{"id": s.id, "args": s.args(), "timeout_s": timeout_s,
                                "heavy": SMOKE_ID in s.patches} for s in selections]}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return Payload(root=dest, selections=tuple(selections), tree=str(tree))


def _manifest_wheel(wheel: WheelFile) -> dict[str, str]:
    entry = {"file": wheel.file, "sha256": wheel.sha256}
    if wheel.project in TARGET_FIRST:
        entry["unless_importable"] = TARGET_FIRST[wheel.project]
    return entry


def _relative(node: str) -> str:
    return node[len("test/"):] if node.startswith("test/") else node


def report_from_result(result: dict[str, Any], selections: Sequence[Selection], tree: str,
                       python: str) -> UpstreamTestReport:
    """The runner's RESULT (see upstream_runner.py) as a typed report."""
    by_id = {s.id: s for s in selections}
    sel_results, nodes = [], []
    for entry in result.get("selections", []):
        sel = by_id[entry["id"]]
        sel_results.append(SelectionResult(
            id=sel.id, selection=str(sel.test), patches=sel.patches, args=tuple(entry["args"]),
            returncode=entry["returncode"], duration_s=entry["duration_s"], collected=entry["collected"],
            error=entry["error"], output_tail=entry.get("output_tail", "")))
        for node in entry["nodes"]:
            nodes.append(NodeResult(node=_relative(node["node"]), outcome=node["outcome"],
                                    duration_s=node["duration_s"], selection=sel.id, message=node.get("message", "")))
    torch = result.get("torch") or {}
    return UpstreamTestReport(
        tree=tree, python=python, python_version=result.get("python", "?"), torch_version=torch.get("version"),
        torch_file=torch.get("file"), duration_s=result.get("duration_s", 0.0),
        wheels=tuple((w["file"], w["sha256"]) for w in result.get("installed", [])),
        target_provided=tuple((w["file"], w["module"], w["origin"]) for w in result.get("target_provided", [])),
        selections=tuple(sel_results), nodes=tuple(nodes), error=result.get("error"))


# --- running ---------------------------------------------------------------------------------------
def run_payload(payload: Payload, python: str, timeout_s: float | None = None,
                env: dict[str, str] | None = None) -> UpstreamTestReport:
    """Run a prepared payload with a local interpreter."""
    if shutil.which(python) is None and not Path(python).is_file():
        raise UpstreamTestsSetupError(f"no interpreter {python}")
    started = time.time()
    proc = subprocess.run(payload.command(python), cwd=payload.root, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})
    result = payload.root / payload.result_name
    if not result.is_file():
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise UpstreamTestsSetupError(f"the upstream test runner wrote no result with {python} "
                                      f"(exit {proc.returncode}): {lines[-1] if lines else ''}",
                                      hint="the runner needs Python 3.6 or later in the target")
    report = payload.read_result(python)
    return replace(report, duration_s=round(time.time() - started, 3))


def run_upstream_tests(tree: Path, python: str, series: Series | None, wheelhouse: Path, *,
                       smoke: bool = True, baseline_python: str | None = None,
                       requirements: Path = REQUIREMENTS, timeout_s: float = DEFAULT_TIMEOUT_S,
                       selections: Sequence[Selection] | None = None, work_dir: Path | None = None,
                       env: dict[str, str] | None = None, jobs: int | None = None) -> UpstreamTestReport:
    """Run the series' Upstream-Tests (plus ``SMOKE``) from ``tree``'s test/ with ``python``.

    ``baseline_python``: an interpreter with the unpatched release; the nodes that fail with
    ``python`` are run there again and, where they fail too, marked known failures.
    ``selections`` replaces ``plan(series, smoke)``.  ``work_dir`` keeps the payloads (else a
    temporary directory is removed afterwards).
    """
    chosen = tuple(selections) if selections is not None else plan(series, smoke)
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="patcher-upstream-")))
        else:
            base = Path(tempfile.mkdtemp(prefix="upstream-tests-", dir=work_dir))
        payload = prepare_payload(tree, chosen, wheelhouse, base / "patched", requirements, timeout_s, jobs)
        report = run_payload(payload, python, env=env)
        if baseline_python and (report.failures or report.selection_errors):
            again = prepare_payload(tree, report.baseline_selections(), wheelhouse, base / "baseline",
                                    requirements, timeout_s, jobs)
            report = report.with_baseline(run_payload(again, baseline_python, env=env))
    return report


def check_selections(tree: Path, selections: Sequence[Selection]) -> list[str]:
    """What a tree's test/ lacks for ``selections``, found without running anything: a missing
    file, or a node id whose class or function the file does not define (-k expressions are only
    checked for their file).  Empty when every selection can be collected."""
    import ast

    problems = []
    for sel in selections:
        path = Path(tree) / "test" / sel.test.file
        if not path.is_file():
            problems.append(f"{sel.test}: test/{sel.test.file} does not exist ({', '.join(sel.patches)})")
            continue
        if not sel.test.node:
            continue
        try:
            module = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue  # the target's interpreter judges that
        names = sel.test.node
        scope: list[ast.stmt] = module.body
        for depth, name in enumerate(names):
            bare = name.split("[", 1)[0]
            found = next((n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                          and n.name == bare), None)
            if found is None:
                # imported classes (test_jit.py imports its jit/ tests) and generated tests cannot
                # be seen here: only a missing first name in a file that neither imports nor makes it
                if depth == 0 and bare not in path.read_text(encoding="utf-8", errors="replace"):
                    problems.append(f"{sel.test}: test/{sel.test.file} has no {bare} ({', '.join(sel.patches)})")
                break
            scope = getattr(found, "body", [])
    return problems


def container_payload(tree: Path, series: Series | None, wheelhouse: Path, dest: Path, *, smoke: bool = True,
                      selections: Sequence[Selection] | None = None, requirements: Path = REQUIREMENTS,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> Payload:
    """The same run for an image: ``dest`` is copied into the container (at ``root_in_target``,
    owned by the container's user), ``payload.script(python, root_in_target)`` is run there (no
    network needed), and the ``result.json`` it writes is read back with
    ``payload.read_result(python_label, text)``."""
    chosen = tuple(selections) if selections is not None else plan(series, smoke)
    return prepare_payload(tree, chosen, wheelhouse, dest, requirements, timeout_s)
