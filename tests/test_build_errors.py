"""`patcher build` in a bad environment: one line, its own exit code, no traceback, nothing left
behind (containers, volumes, temp files) and the log kept."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from patcher.errors import (
    BuildTimeoutError,
    DiskFullError,
    DockerPermissionError,
    DockerUnavailableError,
    ImageBuildError,
    InterruptedByUser,
    UnreachableInputError,
    WheelBuildError,
)
from tests.fixtures.standin import make_standin

REPO_ROOT = Path(__file__).resolve().parent.parent


def _one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("patcher: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def _no_temp_files(work: Path) -> None:
    leftovers = [p for p in work.rglob("*") if p.name.endswith((".tmp", ".part")) or p.name.startswith(".source-")]
    assert not leftovers, leftovers


def _build_containers(docker_client, build_dir: Path) -> list[str]:
    """Containers of the build in ``build_dir`` (other sessions may build the same spec meanwhile)."""
    label = f"org.patcher.work-dir={build_dir.absolute()}"
    return [c.name for c in docker_client.containers.list(all=True, filters={"label": label})]


# --- the engine ------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["env", "flag"])
def test_no_docker_daemon(standin_offline, tmp_path, patcher_cli, how):
    work = tmp_path / "work"
    args = standin_offline.build_args(work)
    env = dict(standin_offline.env)
    if how == "env":
        env["DOCKER_HOST"] = "unix:///nonexistent"
    else:
        args += ["--docker-host", "unix:///nonexistent"]
    started = time.monotonic()
    res = patcher_cli(*args, env=env)
    assert res.exit_code == DockerUnavailableError.exit_code
    line = _one_line_error(res.stderr)
    assert "the Docker engine at unix:///nonexistent is not reachable" in line and "DOCKER_HOST" in line
    assert time.monotonic() - started < 60
    record = json.loads((work / standin_offline.build_id / "record.json").read_text())
    assert record["completed_stages"] == []  # it failed before fetching anything
    assert "not reachable" in (work / standin_offline.build_id / "build.log").read_text()
    _no_temp_files(work)


def test_no_permission_on_the_socket():
    """As an unprivileged user (nobody), who may not open the engine's socket."""
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed"
    # pytest's tmp dirs are private to root: this test needs a directory nobody can read.
    root = Path(tempfile.mkdtemp(prefix="patcher-test-nobody-"))
    try:
        root.chmod(0o755)
        made = make_standin(root / "standin")
        work = root / "work"
        work.mkdir()
        work.chmod(0o777)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PATCHER_", "XDG_"))}
        env.update(made.env, HOME=str(work), PATCHER_CACHE_DIR=str(work / "cache"))
        env.pop("DOCKER_HOST", None)
        proc = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                               sys.executable, "-m", "patcher", *made.build_args(work)],
                              capture_output=True, text=True, env=env, cwd=work, timeout=300)
        assert proc.returncode == DockerPermissionError.exit_code, proc.stderr
        line = _one_line_error(proc.stderr)
        assert "no permission to use the Docker engine" in line and "docker group" in line
        _no_temp_files(work)
    finally:
        shutil.rmtree(root)


# --- no network ----------------------------------------------------------------------------------------
def test_offline_build_stops_at_the_first_unreachable_input_and_names_the_mirror(tmp_path, patcher_cli):
    """`patcher build --torch 1.4.0 --cuda 10.1` with no network: the git fetch of github.com fails
    fast (a proxy that refuses every connection stands for the missing network)."""
    work = tmp_path / "work"
    env = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "http_proxy": "http://127.0.0.1:9", "no_proxy": "", "NO_PROXY": ""}
    started = time.monotonic()
    res = patcher_cli("build", "--torch", "1.4.0", "--cuda", "10.1", "--work", work, env=env, timeout=300)
    elapsed = time.monotonic() - started
    assert res.exit_code == UnreachableInputError.exit_code, res.stderr
    line = _one_line_error(res.stderr)
    assert "https://github.com/pytorch/pytorch.git" in line and "v1.4.0" in line
    assert "--git-mirror" in line and "PATCHER_GIT_MIRROR" in line and "`mirror`" in line
    assert elapsed < 90, f"took {elapsed:.0f} s: an unreachable input must fail fast"
    record = json.loads((work / "torch-1.4.0-cu101.pt1-py3.7" / "record.json").read_text())
    assert record["completed_stages"] == ["resolve"]
    assert not (work / "torch-1.4.0-cu101.pt1-py3.7" / "source").exists()
    _no_temp_files(work)


# --- the image -------------------------------------------------------------------------------------------
def test_image_build_step_failing(standin, tmp_path, patcher_cli, docker_client, no_leaks):
    catalog = tmp_path / "catalog"
    shutil.copytree(standin.catalog / "patches", catalog / "patches")
    (catalog / "dockerfiles").mkdir()
    template = (REPO_ROOT / "dockerfiles" / "builder.Dockerfile.j2").read_text()
    lines = template.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    lines.insert(at + 1, "RUN echo 'patcher test: this step fails' && exit 7\n")
    (catalog / "dockerfiles" / "builder.Dockerfile.j2").write_text("".join(lines))
    env = dict(standin.env, PATCHER_CATALOG=str(catalog))
    work = tmp_path / "work"
    res = patcher_cli(*standin.build_args(work, "--ccache-volume", "patcher-test-unused"), env=env)
    assert res.exit_code == ImageBuildError.exit_code, res.stderr
    line = _one_line_error(res.stderr)
    assert "docker build of torch-1.4.0-cpu.pt1-py3.9 failed" in line and "non-zero code: 7" in line
    assert line.endswith("patcher test: this step fails (full log: "
                         f"{(work / standin.build_id / 'build.log').absolute()})")
    record = json.loads((work / standin.build_id / "record.json").read_text())
    assert record["completed_stages"][-1] == "render"
    assert "patcher test: this step fails" in (work / standin.build_id / "build.log").read_text()
    assert not docker_client.images.list(name=record["image_tag"])


# --- the wheel -------------------------------------------------------------------------------------------
def test_wheel_build_failing(standin_factory, tmp_path, patcher_cli, docker_client, no_leaks, ccache_volume_name):
    variant = standin_factory("fails")
    work = tmp_path / "work"
    res = patcher_cli(*variant.build_args(work, "--ccache-volume", ccache_volume_name), env=variant.env)
    assert res.exit_code == WheelBuildError.exit_code, res.stderr
    line = _one_line_error(res.stderr)
    assert line.startswith("patcher: error: wheel failed in the container (exit 1)")
    assert "stand-in compiler failure" in line and "build.log" in line
    build_dir = work / variant.build_id
    assert "stand-in compiler failure" in (build_dir / "build.log").read_text()
    record = json.loads((build_dir / "record.json").read_text())
    assert record["completed_stages"][-1] == "configure" and "wheel" not in record
    assert not (build_dir / "dist").exists() or not list((build_dir / "dist").iterdir())
    assert _build_containers(docker_client, work / variant.build_id) == []
    _no_temp_files(work)


def test_disk_filling_up_in_the_container(standin_factory, tmp_path, patcher_cli, docker_client, no_leaks,
                                          ccache_volume_name):
    variant = standin_factory("diskfull")
    # A 4 MiB tmpfs as the ccache volume: the build's writes run past it.
    docker_client.volumes.create(name=ccache_volume_name, driver="local",
                                 driver_opts={"type": "tmpfs", "device": "tmpfs", "o": "size=4m,uid=1000,gid=1000"})
    work = tmp_path / "work"
    res = patcher_cli(*variant.build_args(work, "--ccache-volume", ccache_volume_name), env=variant.env)
    assert res.exit_code == DiskFullError.exit_code, res.stderr
    line = _one_line_error(res.stderr)
    assert "wheel ran out of disk space in the container" in line and "No space left on device" in line
    assert "No space left on device" in (work / variant.build_id / "build.log").read_text()
    assert _build_containers(docker_client, work / variant.build_id) == []
    _no_temp_files(work)


def test_timeout_removes_the_container(standin, tmp_path, patcher_cli, docker_client, no_leaks, ccache_volume_name):
    work = tmp_path / "work"
    res = patcher_cli(*standin.build_args(work, "--until", "configure", "--ccache-volume", ccache_volume_name),
                      env=standin.env)
    assert res.exit_code == 0, res.stderr
    res = patcher_cli(*standin.build_args(work, "--resume", "--timeout", "2", "--ccache-volume", ccache_volume_name),
                      env=standin.env)
    assert res.exit_code == BuildTimeoutError.exit_code, res.stderr
    assert "wheel ran past 2 s and was stopped" in _one_line_error(res.stderr)
    assert _build_containers(docker_client, work / standin.build_id) == []
    record = json.loads((work / standin.build_id / "record.json").read_text())
    assert record["completed_stages"][-1] == "configure"
    _no_temp_files(work)


@pytest.fixture
def slow_volume(docker_client, bullseye_base_image):
    """``make(stage)``: a ccache volume (owned by the builder) that makes the slow stand-in wait
    in ``stage``; removed afterwards."""
    made: list[str] = []

    def make(stage: str) -> str:
        name = f"patcher-test-slow-{stage}-{uuid.uuid4().hex[:8]}"
        docker_client.volumes.create(name=name)
        made.append(name)
        docker_client.containers.run(bullseye_base_image.tag, ["sh", "-c", f"touch /v/slow-{stage} && chown -R 1000:1000 /v"],
                                     volumes={name: {"bind": "/v", "mode": "rw"}}, remove=True, network_disabled=True)
        return name

    yield make
    for name in made:
        try:
            docker_client.volumes.get(name).remove(force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


def _interrupt_in_stage(args: list[str], env: dict[str, str], build_dir: Path, stage: str, signum: int,
                        docker_client) -> str:
    """Start `patcher build`, wait until ``stage``'s container runs, send ``signum``; its stderr.

    SIGINT goes back to its default disposition in the child: a CI started in the background
    (which ignores SIGINT) must not decide what this test sees."""
    def default_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "patcher", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, **env), preexec_fn=default_sigint)
    labels = [f"org.patcher.work-dir={build_dir.absolute()}", f"org.patcher.stage={stage}"]
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and proc.poll() is None:
            if docker_client.api.containers(filters={"label": labels, "status": "running"}):
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the build ended before its {stage} stage could be interrupted: " + \
            (proc.stderr.read() if proc.stderr else "")
        time.sleep(2)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == InterruptedByUser.exit_code, stderr
    assert "interrupted" in _one_line_error(stderr)
    return stderr


@pytest.mark.parametrize("stage", ["configure", "wheel", "probe"])
def test_sigint_then_sigterm_in_a_container_stage_leave_no_container_and_keep_the_log(
        standin_factory, tmp_path, docker_client, no_leaks, slow_volume, stage):
    variant = standin_factory("slow")
    work = tmp_path / "work"
    build_dir = work / variant.build_id
    env = dict(variant.env, HOME=str(tmp_path / "home"))
    args = variant.build_args(work, "--ccache-volume", slow_volume(stage))
    before = STAGES_BEFORE[stage]
    for signum in (signal.SIGINT, signal.SIGTERM):  # the second run continues the first, and is stopped too
        _interrupt_in_stage(args, env, build_dir, stage, signum, docker_client)
        assert _build_containers(docker_client, build_dir) == []
        assert f"==> {stage}" in (build_dir / "build.log").read_text()
        record = json.loads((build_dir / "record.json").read_text())
        assert record["completed_stages"][-1] == before
        _no_temp_files(work)


STAGES_BEFORE = {"configure": "image", "wheel": "configure", "probe": "wheel"}


def test_interrupt_during_the_image_build_leaves_no_container(standin, tmp_path, docker_client, no_leaks):
    """The engine cancels a classic build when its client goes; forcerm removes the step's container."""
    marker = f"patcher-test-slow-step-{uuid.uuid4().hex[:8]}"
    catalog = tmp_path / "catalog"
    shutil.copytree(standin.catalog / "patches", catalog / "patches")
    (catalog / "dockerfiles").mkdir()
    lines = (REPO_ROOT / "dockerfiles" / "builder.Dockerfile.j2").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    lines.insert(at + 1, f"RUN echo {marker} && sleep 300\n")
    (catalog / "dockerfiles" / "builder.Dockerfile.j2").write_text("".join(lines))
    work = tmp_path / "work"
    env = dict(os.environ, **dict(standin.env, PATCHER_CATALOG=str(catalog)))

    def step_containers() -> list:
        # the low-level list: no per-container inspect that races with containers going away
        return [c["Id"] for c in docker_client.api.containers(all=True) if marker in (c.get("Command") or "")]

    proc = subprocess.Popen([sys.executable, "-m", "patcher", *standin.build_args(work)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not step_containers():
            time.sleep(0.3)
        assert proc.poll() is None and step_containers(), "the slow image step never started"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == InterruptedByUser.exit_code, stderr
    assert "interrupted" in _one_line_error(stderr)
    deadline = time.monotonic() + 30
    while step_containers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert step_containers() == []
    assert marker in (work / standin.build_id / "build.log").read_text()
