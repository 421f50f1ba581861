"""Probe stage (host side): run the probe suite against an interpreter, an image or a wheel
and load its report.

The probe package (``patcher/probe/``) runs *inside* the target; this module only stages a
copy of it (``<dir>/patcher/__init__.py`` empty + ``<dir>/patcher/probe/``), starts
``python -m patcher.probe --json ...`` there and reads the JSON back into a ``ProbeReport``.

* ``probe_python(python)``: a local interpreter that has torch, in a temp directory.
* ``probe_image(image)``: a fresh container of a local image (never pulled), the probe copied
  in with ``put_archive``, no network; the container is removed whatever happens.
* ``probe_wheel(wheel)``: a clean venv (no system site-packages) made by ``--python`` (or the
  image's ``python3``), the wheel installed offline with ``pip --no-index`` (dependencies only
  from the wheel's folder and ``wheelhouse``), then probed like an interpreter.

Exit statuses of the probe module: 0 passed, 1 a required check failed, 2 bad arguments,
3 torch cannot be imported.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from patcher.errors import (
    ProbeFailedError,
    ProbeRunError,
    ProbeTargetError,
    ProbeTimeoutError,
    TorchMissingError,
    WheelInstallError,
)
from patcher.util import write_atomic

PROBE_PACKAGE = Path(__file__).resolve().parent / "probe"
CONTAINER_DIR = "/tmp/patcher-probe"
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NO_TORCH = 0, 1, 2, 3
# exit statuses of the in-container install script (outside the probe's own 0-3)
EXIT_NO_VENV, EXIT_PIP_FAILED = 201, 202
STATUSES = ("pass", "fail", "skip", "error")


# --- the report ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckResult:
    id: str
    status: str  # pass | fail | skip | error
    required: bool
    message: str
    details: Any
    patches: tuple[str, ...]
    duration_s: float
    finding: bool = False

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "error")


@dataclass(frozen=True)
class ProbeReport:
    schema: int
    probe_version: str
    started: str
    duration_s: float
    environment: dict[str, Any]
    patched_ids: tuple[str, ...]
    checks: tuple[CheckResult, ...]
    summary: dict[str, int]
    passed: bool

    @classmethod
    def from_json(cls, data: Any, source: str = "probe report") -> ProbeReport:
        """Validate and load a report dict (schema 1); a malformed one is a ProbeRunError."""
        try:
            if not isinstance(data, dict) or data.get("schema") != 1:
                raise ValueError(f"schema is {data.get('schema') if isinstance(data, dict) else None!r}, not 1")
            checks = []
            for entry in data["checks"]:
                if entry["status"] not in STATUSES:
                    raise ValueError(f"check {entry.get('id')} has status {entry['status']!r}")
                checks.append(CheckResult(
                    id=str(entry["id"]), status=entry["status"], required=bool(entry["required"]),
                    message=str(entry.get("message") or ""), details=entry.get("details"),
                    patches=tuple(entry.get("patches") or ()), duration_s=float(entry.get("duration_s") or 0),
                    finding=bool(entry.get("finding", False))))
            return cls(schema=1, probe_version=str(data["probe_version"]), started=str(data["started"]),
                       duration_s=float(data["duration_s"]), environment=dict(data.get("environment") or {}),
                       patched_ids=tuple(data.get("patched_ids") or ()), checks=tuple(checks),
                       summary={k: int(data["summary"].get(k, 0)) for k in STATUSES},
                       passed=bool(data["passed"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProbeRunError(f"{source} is not a valid probe report: {exc}",
                                hint="the probe package and the host disagree, or the probe crashed") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> ProbeReport:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ProbeRunError(f"cannot read probe report {path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ProbeRunError(f"probe report {path} is not JSON: {exc}") from None
        return cls.from_json(data, source=str(path))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["patched_ids"] = list(self.patched_ids)
        data["checks"] = [dict(asdict(c), patches=list(c.patches)) for c in self.checks]
        return data

    def check(self, check_id: str) -> CheckResult:
        for entry in self.checks:
            if entry.id == check_id:
                return entry
        raise KeyError(check_id)

    @property
    def failed_required(self) -> list[CheckResult]:
        return [c for c in self.checks if c.required and c.failed]

    @property
    def torch_version(self) -> str | None:
        return (self.environment.get("torch") or {}).get("version")

    def write(self, json_out: str | os.PathLike | None = None, junit_out: str | os.PathLike | None = None) -> None:
        """Write the JSON and/or JUnit XML renderings atomically (temp name + os.replace)."""
        from patcher.probe import report as render

        for path, text in ((json_out, render.to_json(self.to_json()) if json_out else None),
                           (junit_out, render.to_junit(self.to_json()) if junit_out else None)):
            if path is not None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                write_atomic(Path(path), text)

    def table(self) -> str:
        from patcher.probe import report as render

        return render.to_table(self.to_json())

    def raise_if_failed(self) -> None:
        failed = self.failed_required
        if failed:
            names = ", ".join(f"{c.id} ({c.status})" for c in failed[:5])
            more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
            raise ProbeFailedError(f"{len(failed)} required probe check(s) failed: {names}{more}",
                                   hint="the table and the JSON report say what each found")


# --- options ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeOptions:
    patched_ids: tuple[str, ...] = ()
    budget: float | None = None  # seconds; checks past it are skipped with that reason
    only: str | None = None  # comma-separated ids, prefixes or globs
    timeout: float = 1800.0  # the whole probe run (install included), seconds
    extra_env: dict[str, str] = field(default_factory=dict)

    def probe_args(self, json_path: str) -> list[str]:
        args = ["-m", "patcher.probe", "--json", json_path, "--quiet"]
        if self.patched_ids:
            args += ["--patched-ids", ",".join(self.patched_ids)]
        if self.budget is not None:
            args += ["--budget", str(self.budget)]
        if self.only:
            args += ["--only", self.only]
        return args


# --- staging the probe package -----------------------------------------------------------------
def stage_probe(dest: Path) -> Path:
    """Copy the probe package to ``dest/patcher/probe`` with an empty ``dest/patcher/__init__.py``:
    the layout ``python -m patcher.probe`` needs, with nothing else of patcher beside it."""
    package = dest / "patcher"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    shutil.copytree(PROBE_PACKAGE, package / "probe", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


# --- a local interpreter -----------------------------------------------------------------------
def _resolve_interpreter(python: str) -> str:
    found = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if not found or not os.path.isfile(found):
        raise ProbeTargetError(f"interpreter {python} does not exist or is not executable",
                               hint="pass --python with the path of a Python that has torch")
    # absolute, not resolved: a venv's python must keep its own path to find its site-packages
    return os.path.abspath(found)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _report_from_run(returncode: int, stderr: str, report_text: str | None, target: str) -> ProbeReport:
    if returncode == EXIT_NO_TORCH:
        line = _last_line(stderr)
        reason = re.search(r"cannot be imported by \S+: (.*)$", line)
        raise TorchMissingError(f"{target} cannot import torch: {reason.group(1) if reason else line}",
                                hint="probe an interpreter, image or wheel that provides torch")
    if returncode not in (EXIT_PASSED, EXIT_FAILED) or report_text is None:
        raise ProbeRunError(f"the probe in {target} exited with {returncode} and no report: {_last_line(stderr)}")
    try:
        data = json.loads(report_text)
    except ValueError as exc:
        raise ProbeRunError(f"the probe in {target} wrote a report that is not JSON: {exc}") from None
    return ProbeReport.from_json(data, source=f"the report from {target}")


def probe_python(python: str, options: ProbeOptions | None = None) -> ProbeReport:
    """Run the probe with a local interpreter (it must have torch)."""
    options = options or ProbeOptions()
    interpreter = _resolve_interpreter(python)
    with tempfile.TemporaryDirectory(prefix="patcher-probe-") as temp:
        staged = stage_probe(Path(temp) / "stage")
        report_path = Path(temp) / "report.json"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
        env.update(options.extra_env)
        env["PYTHONPATH"] = str(staged)
        try:
            proc = subprocess.run([interpreter, *options.probe_args(str(report_path))], cwd=staged, env=env,
                                  capture_output=True, text=True, timeout=options.timeout)
        except subprocess.TimeoutExpired:
            raise ProbeTimeoutError(f"the probe with {interpreter} ran past {options.timeout:g} s and was stopped",
                                    hint="raise --timeout or narrow the run with --only/--budget") from None
        except OSError as exc:
            raise ProbeTargetError(f"cannot start {interpreter}: {exc.strerror}") from None
        text = report_path.read_text(encoding="utf-8") if report_path.exists() else None
        return _report_from_run(proc.returncode, proc.stderr, text, interpreter)


# --- a wheel in a clean venv ---------------------------------------------------------------------
def _check_wheel(wheel: str | os.PathLike) -> Path:
    path = Path(wheel).resolve()
    if not path.is_file() or path.suffix != ".whl":
        raise ProbeTargetError(f"wheel {wheel} does not exist or is not a .whl file")
    return path


def _wheel_sources(wheel: Path, wheelhouse: str | os.PathLike | None) -> list[Path]:
    sources = [wheel.parent]
    if wheelhouse is not None:
        house = Path(wheelhouse).resolve()
        if not house.is_dir():
            raise ProbeTargetError(f"wheelhouse {wheelhouse} is not a directory")
        sources.append(house)
    return sources


def pip_install_args(wheel: str, find_links: list[str]) -> list[str]:
    """Offline: only the given folders, never an index; --isolated keeps the user's pip
    configuration (PIP_FIND_LINKS, pip.conf) from adding other sources."""
    args = ["-m", "pip", "install", "--isolated", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
            "--no-compile", "--quiet"]
    for link in find_links:
        args += ["--find-links", link]
    return args + [wheel]


def probe_wheel(wheel: str | os.PathLike, options: ProbeOptions | None = None, *, python: str = "python3",
                wheelhouse: str | os.PathLike | None = None) -> ProbeReport:
    """Install ``wheel`` into a fresh venv made by ``python`` (offline) and probe it there."""
    options = options or ProbeOptions()
    path = _check_wheel(wheel)
    sources = _wheel_sources(path, wheelhouse)
    base = _resolve_interpreter(python)
    with tempfile.TemporaryDirectory(prefix="patcher-probe-venv-") as temp:
        venv = Path(temp) / "venv"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_INDEX_URL")}
        try:
            made = subprocess.run([base, "-m", "venv", str(venv)], capture_output=True, text=True, env=env,
                                  timeout=300)
        except subprocess.TimeoutExpired:
            raise ProbeTimeoutError(f"creating a venv with {base} took more than 300 s") from None
        if made.returncode != 0:
            raise WheelInstallError(f"cannot create a venv with {base}: {_last_line(made.stderr + made.stdout)}",
                                    hint="install the interpreter's venv module (Debian: python3-venv)")
        venv_python = str(venv / "bin" / "python")
        try:
            installed = subprocess.run([venv_python, *pip_install_args(str(path), [str(s) for s in sources])],
                                       capture_output=True, text=True, env=env, timeout=options.timeout)
        except subprocess.TimeoutExpired:
            raise ProbeTimeoutError(f"installing {path.name} ran past {options.timeout:g} s") from None
        if installed.returncode != 0:
            raise WheelInstallError(f"pip could not install {path.name} offline: "
                                    f"{_last_line(installed.stderr + installed.stdout)}",
                                    hint="put its dependencies' wheels in a folder and pass --wheelhouse")
        return probe_python(venv_python, options)


# --- a container ------------------------------------------------------------------------------
UPSTREAM_DIR = f"{CONTAINER_DIR}/upstream"  # upstream's tests (patcher.upstream_tests), when asked for


@dataclass(frozen=True)
class ImageProbe:
    report: ProbeReport
    gpus_requested: bool  # whether the container was given the engine's GPUs
    upstream: Any = None  # patcher.upstream_tests.UpstreamTestReport, when upstream's tests ran

    def report_json(self) -> dict[str, Any]:
        """The report as written: with upstream's tests merged in (their checks decide too)."""
        data = self.report.to_json()
        return self.upstream.merge_into(data) if self.upstream is not None else data


def _run_container(engine, image: str, script: str, payload: dict[str, bytes | Path], options: ProbeOptions,
                   gpus: str, target: str, labels: dict[str, str] | None = None,
                   read_back: str | None = None) -> tuple[int, str, str | None, bool, str | None]:
    """Run ``script`` (sh) in a fresh container of ``image`` as the image's own user, the payload
    under CONTAINER_DIR owned by that user, no network; the container is removed in every case.
    Returns (exit status, log, report text, whether GPUs were requested, the text of ``read_back``)."""
    from patcher.container import Container, ContainerConfig, ContainerError, ContainerTimeout

    try:
        if engine.image_id(image) is None:
            raise ProbeTargetError(f"image {image} is not on this machine (images are never pulled)",
                                   hint="build or load it first (docker images lists what is there)")
        config = ContainerConfig(image=image, command=("sh", "-c", script), workdir="/tmp", gpus=gpus,
                                 env={"PYTHONPATH": CONTAINER_DIR, "PYTHONDONTWRITEBYTECODE": "1", **options.extra_env},
                                 labels={"org.patcher.probe": "1", **(labels or {})})
        with Container(engine, config) as container:
            parent, _, name = CONTAINER_DIR.rpartition("/")
            container.put_files(parent, {f"{name}/{path}": content for path, content in payload.items()})
            container.start()
            status = container.wait(options.timeout)
            log = container.logs()
            report = None
            if status in (EXIT_PASSED, EXIT_FAILED):
                data = container.read_file(f"{CONTAINER_DIR}/report.json")
                report = data.decode("utf-8") if data is not None else None
            extra = container.read_file(read_back) if read_back else None
            return status, log, report, container.gpus_requested, extra.decode("utf-8") if extra else None
    except ContainerTimeout:
        raise ProbeTimeoutError(f"the probe in {target} ran past {options.timeout:g} s and was stopped",
                                hint="raise --timeout or narrow the run with --only/--budget") from None
    except ContainerError as exc:
        raise ProbeTargetError(f"cannot run the probe in {target}: {exc}") from None


def _probe_payload(extra: dict[str, Path] | None = None) -> dict[str, bytes | Path]:
    """The probe package (and ``extra`` files) as the files of CONTAINER_DIR."""
    files: dict[str, bytes | Path] = {"patcher/__init__.py": b""}
    for path in sorted(PROBE_PACKAGE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files["patcher/probe/" + path.relative_to(PROBE_PACKAGE).as_posix()] = path
    files.update(extra or {})
    return files


def _probe_command(python: str, options: ProbeOptions, then: bool = False) -> str:
    """The probe's command line; ``then``: something runs after it (no exec)."""
    args = options.probe_args(f"{CONTAINER_DIR}/report.json")
    return (f"cd {CONTAINER_DIR} && {'' if then else 'exec '}{shlex.quote(python)} "
            + " ".join(shlex.quote(a) for a in args))


def _engine(engine, docker_host: str | None):
    from patcher.container import Engine

    return engine or Engine.connect(docker_host)


def probe_image(image: str, options: ProbeOptions | None = None, *, python: str = "python3", gpus: str = "auto",
                engine=None, docker_host: str | None = None, upstream=None) -> ImageProbe:
    """Run the probe with ``python`` inside a fresh container of a local ``image`` (its own
    torch).  ``upstream``: a payload of patcher.upstream_tests, run after the probe with the
    same ``python`` in the same container."""
    options = options or ProbeOptions()
    target = f"image {image}"
    script = (f"command -v {shlex.quote(python)} >/dev/null || {{ echo 'probe: no {python} in the image' >&2; "
              f"exit 127; }}; " + _probe_command(python, options, then=upstream is not None))
    extra: dict[str, Path] = {}
    if upstream is not None:
        script += _upstream_script(upstream, python, extra)
    read_back = f"{UPSTREAM_DIR}/{upstream.result_name}" if upstream is not None else None
    status, log, report, with_gpus, upstream_text = _run_container(
        _engine(engine, docker_host), image, script, _probe_payload(extra), options, gpus, target, None, read_back)
    if status == 127:
        raise ProbeTargetError(f"{target} has no {python}", hint="probe an image that has Python and torch")
    probed = _report_from_run(status, log, report, target)
    ran_upstream = None
    if upstream is not None:
        ran_upstream = _upstream_result(upstream, upstream_text, f"{python} in image {image}", target)
    return ImageProbe(probed, with_gpus, ran_upstream)


def probe_wheel_in_image(wheel: str | os.PathLike, image: str, options: ProbeOptions | None = None, *,
                         python: str = "python3", wheelhouse: str | os.PathLike | None = None,
                         gpus: str = "auto", engine=None, docker_host: str | None = None,
                         system_site_packages: bool = False, labels: dict[str, str] | None = None,
                         upstream=None) -> ImageProbe:
    """Install ``wheel`` offline into a clean venv inside a fresh container of ``image``, probe it.

    ``system_site_packages``: the venv sees the image's own modules, so the wheel's dependencies
    may come from there (the builder image has them: it built the wheel).  ``upstream``: a
    payload of patcher.upstream_tests, run after the probe with the venv's Python in the same
    container (upstream's tests against the installed wheel)."""
    options = options or ProbeOptions()
    path = _check_wheel(wheel)
    sources = _wheel_sources(path, wheelhouse)
    extra = {f"wheels/{path.name}": path}
    if len(sources) > 1:
        for dependency in sorted(sources[1].glob("*.whl")):
            extra.setdefault(f"wheels/{dependency.name}", dependency)
    venv = f"{CONTAINER_DIR}/venv"
    pip = " ".join(shlex.quote(a) for a in pip_install_args(f"{CONTAINER_DIR}/wheels/{path.name}",
                                                           [f"{CONTAINER_DIR}/wheels"]))
    flags = " --system-site-packages" if system_site_packages else ""
    script = (f"{shlex.quote(python)} -m venv{flags} {venv} || exit {EXIT_NO_VENV}; "
              f"{venv}/bin/python {pip} || exit {EXIT_PIP_FAILED}; "
              + _probe_command(f"{venv}/bin/python", options, then=upstream is not None))
    if upstream is not None:
        script += _upstream_script(upstream, f"{venv}/bin/python", extra)
    target = f"a venv in image {image}"
    read_back = f"{UPSTREAM_DIR}/{upstream.result_name}" if upstream is not None else None
    status, log, report, with_gpus, upstream_text = _run_container(
        _engine(engine, docker_host), image, script, _probe_payload(extra), options, gpus, target, labels, read_back)
    if status == EXIT_NO_VENV:
        raise WheelInstallError(f"cannot create a venv with {python} in image {image}: {_last_line(log)}",
                                hint=f"the image needs {python}'s venv module (Debian: python3-venv)")
    if status == EXIT_PIP_FAILED:
        raise WheelInstallError(f"pip could not install {path.name} offline in image {image}: {_last_line(log)}",
                                hint="the wheel must suit the image's Python; pass --wheelhouse for dependencies")
    probed = _report_from_run(status, log, report, target)
    ran_upstream = None
    if upstream is not None:
        ran_upstream = _upstream_result(upstream, upstream_text, f"{venv}/bin/python in image {image}", target)
    return ImageProbe(probed, with_gpus, ran_upstream)


def _upstream_script(upstream, python: str, extra: dict[str, Path]) -> str:
    """The shell that runs upstream's tests after the probe (``upstream``: a payload of
    patcher.upstream_tests, added to ``extra``).  The probe's own status stays the container's;
    the runner writes its result beside its payload."""
    runner = " ".join(shlex.quote(a) for a in upstream.command(python, UPSTREAM_DIR))
    extra.update({f"upstream/{path.relative_to(upstream.root).as_posix()}": path
                  for path in sorted(upstream.root.rglob("*")) if path.is_file() and not path.is_symlink()})
    return (f"; status=$?; cd {UPSTREAM_DIR} && env -u PYTHONPATH {runner} > {UPSTREAM_DIR}/runner.log 2>&1; "
            "exit $status")


def _upstream_result(upstream, text: str | None, python: str, target: str):
    if text is None:
        from patcher.errors import UpstreamTestsSetupError

        raise UpstreamTestsSetupError(f"upstream's tests wrote no result in {target}",
                                      hint="the runner's log is runner.log in the payload; it needs Python >= 3.6")
    return upstream.read_result(python, text)


# --- what the report proves of a series ------------------------------------------------------------
def unproven_patches(report: ProbeReport, probes_by_patch: dict[str, tuple[str, ...]],
                     gpus_requested: bool | None = None):
    """Each patch none of whose probe checks passed or failed on this run, with the reason its
    checks gave (skipped: no GPU, no such kernel in this build, ...).  ``gpus_requested`` False
    says that the container had no GPU, which is the reason behind a CUDA skip."""
    from patcher.record import UnprovenPatch

    by_id = {c.id: c for c in report.checks}
    out = []
    for patch_id, check_ids in probes_by_patch.items():
        ran = [by_id[c] for c in check_ids if c in by_id]
        if any(c.status in ("pass", "fail", "error") for c in ran):
            continue
        reasons = list(dict.fromkeys(c.message.strip() or "skipped" for c in ran))
        absent = [c for c in check_ids if c not in by_id]
        if absent:
            reasons.append(f"check(s) {', '.join(absent)} not in this probe")
        reason = "; ".join(reasons) or "no probe check names it"
        if gpus_requested is False and any("cuda" in c.message.lower() or "gpu" in c.message.lower() for c in ran):
            reason = f"no GPU in the probe container ({reason})"
        out.append(UnprovenPatch(id=patch_id, checks=tuple(check_ids), reason=reason))
    return tuple(out)
