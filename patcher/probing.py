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

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from patcher.errors import (
    DockerUnavailableError,
    ProbeFailedError,
    ProbeRunError,
    ProbeTargetError,
    ProbeTimeoutError,
    TorchMissingError,
    WheelInstallError,
)

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
                _write_atomic(Path(path), text)

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


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


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


def probe_tar(prefix: str, extra: dict[str, Path] | None = None) -> bytes:
    """A tar of the staged probe under ``prefix/`` (plus ``extra`` files: name -> path)."""
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="patcher-probe-stage-") as temp:
        staged = stage_probe(Path(temp))
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(str(staged / "patcher"), arcname=f"{prefix}/patcher")
            for name, path in (extra or {}).items():
                tar.add(str(path), arcname=f"{prefix}/{name}")
    return buffer.getvalue()


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
def docker_client(docker_host: str | None = None):
    import docker

    try:
        client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        raise DockerUnavailableError(f"the Docker engine is not reachable: {_last_line(str(exc))}",
                                     hint="start the engine or set DOCKER_HOST / docker_host") from None


def _container_report(container) -> str | None:
    import docker

    try:
        stream, _ = container.get_archive(f"{CONTAINER_DIR}/report.json")
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.extractfile("report.json")
        return member.read().decode("utf-8") if member else None


def _run_container(client, image: str, script: str, payload: bytes, options: ProbeOptions, gpus: bool,
                   target: str) -> tuple[int, str, str | None]:
    """Run ``script`` (sh) in a fresh container with ``payload`` unpacked under /tmp; the
    container is removed in every case.  Returns (exit status, log, report text)."""
    import docker
    import requests

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ProbeTargetError(f"image {image} is not on this machine (images are never pulled)",
                               hint="build or load it first (docker images lists what is there)") from None
    device_requests = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None
    container = None
    try:
        container = client.containers.create(
            image, command=["sh", "-c", script], working_dir="/tmp", network_disabled=True,
            environment={"PYTHONPATH": CONTAINER_DIR, "PYTHONDONTWRITEBYTECODE": "1", **options.extra_env},
            labels={"org.patcher.probe": "1"}, device_requests=device_requests, entrypoint=[])
        container.put_archive("/tmp", payload)
        container.start()
        try:
            status = container.wait(timeout=options.timeout)["StatusCode"]
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            raise ProbeTimeoutError(f"the probe in {target} ran past {options.timeout:g} s and was stopped",
                                    hint="raise --timeout or narrow the run with --only/--budget") from None
        log = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        return status, log, _container_report(container) if status in (EXIT_PASSED, EXIT_FAILED) else None
    except docker.errors.APIError as exc:
        raise ProbeTargetError(f"cannot run the probe in {target}: {_last_line(str(exc.explanation or exc))}") from None
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


def _probe_command(python: str, options: ProbeOptions) -> str:
    args = options.probe_args(f"{CONTAINER_DIR}/report.json")
    return f"cd {CONTAINER_DIR} && exec {shlex.quote(python)} " + " ".join(shlex.quote(a) for a in args)


def probe_image(image: str, options: ProbeOptions | None = None, *, python: str = "python3", gpus: bool = False,
                client=None, docker_host: str | None = None) -> ProbeReport:
    """Run the probe with ``python`` inside a fresh container of a local ``image``."""
    options = options or ProbeOptions()
    client = client or docker_client(docker_host)
    target = f"image {image}"
    script = (f"command -v {shlex.quote(python)} >/dev/null || {{ echo 'probe: no {python} in the image' >&2; "
              f"exit 127; }}; " + _probe_command(python, options))
    status, log, report = _run_container(client, image, script, probe_tar("patcher-probe"), options, gpus, target)
    if status == 127:
        raise ProbeTargetError(f"{target} has no {python}", hint="probe an image that has Python and torch")
    return _report_from_run(status, log, report, target)


def probe_wheel_in_image(wheel: str | os.PathLike, image: str, options: ProbeOptions | None = None, *,
                         python: str = "python3", wheelhouse: str | os.PathLike | None = None,
                         gpus: bool = False, client=None, docker_host: str | None = None) -> ProbeReport:
    """Install ``wheel`` offline into a clean venv inside a fresh container of ``image``, probe it."""
    options = options or ProbeOptions()
    path = _check_wheel(wheel)
    sources = _wheel_sources(path, wheelhouse)
    client = client or docker_client(docker_host)
    extra = {f"wheels/{path.name}": path}
    if len(sources) > 1:
        for dependency in sorted(sources[1].glob("*.whl")):
            extra.setdefault(f"wheels/{dependency.name}", dependency)
    venv = f"{CONTAINER_DIR}/venv"
    pip = " ".join(shlex.quote(a) for a in pip_install_args(f"{CONTAINER_DIR}/wheels/{path.name}",
                                                           [f"{CONTAINER_DIR}/wheels"]))
    script = (f"{shlex.quote(python)} -m venv {venv} || exit {EXIT_NO_VENV}; "
              f"{venv}/bin/python {pip} || exit {EXIT_PIP_FAILED}; "
              + _probe_command(f"{venv}/bin/python", options))
    target = f"a venv in image {image}"
    status, log, report = _run_container(client, image, script, probe_tar("patcher-probe", extra), options, gpus,
                                         target)
    if status == EXIT_NO_VENV:
        raise WheelInstallError(f"cannot create a venv with {python} in image {image}: {_last_line(log)}",
                                hint="the image needs python3-venv")
    if status == EXIT_PIP_FAILED:
        raise WheelInstallError(f"pip could not install {path.name} offline in image {image}: {_last_line(log)}",
                                hint="the wheel must suit the image's Python; pass --wheelhouse for dependencies")
    return _report_from_run(status, log, report, target)
