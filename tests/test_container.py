"""patcher.container: the GPU request it sends (pure logic), and against the real engine: files
owned by the container's user, logs, timeouts, errors, and the container gone on every way out.

No GPU container ran here: this machine's engine has no GPU runtime.  What the tests prove is
the request itself (its wire form) and that the engine receives it (it refuses the request for
want of a GPU driver, with the engine's own one-line reason)."""

from __future__ import annotations

import io
import signal
import uuid

import pytest

from patcher.container import (
    Container,
    ContainerConfig,
    ContainerError,
    ContainerTimeout,
    Engine,
    engine_has_gpus,
    gpu_device_requests,
)
from patcher.errors import DockerUnavailableError

WHOLE_GPU_REQUEST = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]


# --- the GPU request (pure) ---------------------------------------------------------------------
def test_gpus_all_asks_for_every_gpu_like_docker_run_gpus_all():
    assert gpu_device_requests("all", engine_has_gpus=False) == WHOLE_GPU_REQUEST
    assert gpu_device_requests("all", engine_has_gpus=True) == WHOLE_GPU_REQUEST


def test_gpus_auto_asks_only_when_the_engine_has_a_gpu_runtime():
    assert gpu_device_requests("auto", engine_has_gpus=True) == WHOLE_GPU_REQUEST
    assert gpu_device_requests("auto", engine_has_gpus=False) is None
    assert gpu_device_requests("none", engine_has_gpus=True) is None
    with pytest.raises(ValueError, match="gpus must be one of"):
        gpu_device_requests("some", engine_has_gpus=True)


def test_engine_gpu_detection_reads_the_runtimes_and_cdi_devices():
    assert engine_has_gpus({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}})
    assert engine_has_gpus({"Runtimes": {"runc": {}}, "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]})
    assert not engine_has_gpus({"Runtimes": {"runc": {}, "io.containerd.runc.v2": {}}})
    assert not engine_has_gpus({})


def test_the_request_reaches_the_engine_in_docker_s_wire_form():
    import docker.types

    wire = dict(docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]]))
    assert {k: v for k, v in wire.items() if v not in (None, [], {})} == \
        {k: v for k, v in WHOLE_GPU_REQUEST[0].items() if v not in (None, [], {})}


# --- the real engine ----------------------------------------------------------------------------


@pytest.fixture
def engine():
    with Engine.connect() as eng:
        yield eng


def _labels() -> dict[str, str]:
    return {"org.patcher.test": f"container-{uuid.uuid4().hex[:8]}"}


def _gone(engine: Engine, labels: dict[str, str]) -> bool:
    (key, value), = labels.items()
    return engine.containers_with_label(f"{key}={value}") == []


@pytest.mark.docker
def test_an_unreachable_engine_is_one_error():
    with pytest.raises(DockerUnavailableError, match="not reachable") as err:
        Engine.connect("unix:///nonexistent/docker.sock")
    assert "\n" not in str(err.value)


@pytest.mark.docker
def test_files_go_in_owned_by_the_image_user_and_come_back(engine, bullseye_python_image, no_leaks):
    labels = _labels()
    config = ContainerConfig(image=bullseye_python_image.tag, user="nobody", labels=labels,
                             command=("sh", "-c", "id -u; stat -c '%u %U' /tmp/in/a/b.txt; cat /tmp/in/a/b.txt; "
                                      "echo written > /tmp/in/a/out.txt"))
    seen: list[str] = []
    with Container(engine, config) as container:
        container.put_files("/tmp", {"in/a/b.txt": b"hello\n"})
        container.follow_logs(seen.append)
        container.start()
        assert container.wait(60) == 0
        container.wait_for_logs()
        assert container.read_file("/tmp/in/a/out.txt") == b"written\n"
        assert container.read_file("/tmp/in/nothing") is None
        buf = io.BytesIO()
        container.copy_out("/tmp/in/a", buf)
        assert buf.getvalue()[:3]  # a tar came back
    lines = "".join(seen).split()
    assert lines[0] == "65534" and lines[1:3] == ["65534", "nobody"] and "hello" in lines
    assert _gone(engine, labels)


@pytest.mark.docker
def test_a_timeout_stops_and_removes_the_container(engine, bullseye_python_image, no_leaks):
    labels = _labels()
    with pytest.raises(ContainerTimeout, match="ran past 2 s"):
        with Container(engine, ContainerConfig(image=bullseye_python_image.tag, labels=labels,
                                               command=("sleep", "300"))) as container:
            container.start()
            container.wait(2)
    assert _gone(engine, labels)


@pytest.fixture
def sigint_raises():
    """Python's own Ctrl-C handler, whatever the test run inherited: a run started as a background
    job of a shell has SIGINT ignored, and a raised SIGINT would then do nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.docker
def test_an_interrupt_inside_removes_the_container(engine, bullseye_python_image, no_leaks, sigint_raises):
    labels = _labels()
    with pytest.raises(KeyboardInterrupt):
        with Container(engine, ContainerConfig(image=bullseye_python_image.tag, labels=labels)) as container:
            container.start()
            signal.raise_signal(signal.SIGINT)
    assert _gone(engine, labels)


@pytest.mark.docker
def test_exec_runs_under_a_time_limit(engine, bullseye_python_image, no_leaks):
    labels = _labels()
    with Container(engine, ContainerConfig(image=bullseye_python_image.tag, labels=labels)) as container:
        container.start()
        done = container.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (done.exit_code, sorted(done.output.split())) == (3, ["err", "out"])
        assert container.exec(["sleep", "30"], timeout=1).exit_code == 124
    assert _gone(engine, labels)


@pytest.mark.docker
def test_gpus_all_is_sent_and_refused_by_an_engine_without_gpus(engine, bullseye_python_image, no_leaks):
    if engine.has_gpus():
        pytest.fail("this engine has a GPU runtime: the test expects the CI machine's engine, which has none")
    labels = _labels()
    with pytest.raises(ContainerError) as err:
        with Container(engine, ContainerConfig(image=bullseye_python_image.tag, labels=labels, gpus="all",
                                               command=("true",))) as container:
            assert container.gpus_requested
            container.start()
    assert "could not select device driver" in str(err.value) and "\n" not in str(err.value)
    assert _gone(engine, labels)
    with Container(engine, ContainerConfig(image=bullseye_python_image.tag, labels=labels, gpus="auto",
                                           command=("true",))) as container:
        assert not container.gpus_requested
        container.start()
        assert container.wait(60) == 0
    assert _gone(engine, labels)


@pytest.mark.docker
def test_a_missing_image_is_one_error(engine, no_leaks):
    with pytest.raises(ContainerError, match="is not on this engine"):
        with Container(engine, ContainerConfig(image="patcher-test/none:absent")):
            pass


# --- containers whose maker was killed outright -----------------------------------------------------
MAKER = """
import sys, time
from patcher.container import Container, ContainerConfig, Engine
with Engine.connect() as engine:
    container = Container(engine, ContainerConfig(image=sys.argv[1], labels={"org.patcher.test": sys.argv[2]},
                                                  command=("sleep", "300")))
    container.__enter__()
    container.start()
    print("started", flush=True)
    time.sleep(300)
"""


def _maker(image: str, label: str):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", MAKER, image, label], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    return proc


@pytest.mark.docker
def test_a_container_whose_maker_was_killed_is_removed_by_the_next_container_made(
        engine, bullseye_python_image, capfd):
    import os

    from patcher.container import OWNER_LABEL, owner_id, owner_is_gone

    killed_label, alive_label = _labels(), _labels()
    killed = _maker(bullseye_python_image.tag, killed_label["org.patcher.test"])
    alive = _maker(bullseye_python_image.tag, alive_label["org.patcher.test"])
    try:
        killed.kill()  # SIGKILL: no __exit__, no finally; the container stays
        killed.wait()
        (orphan,) = engine.containers_with_label("org.patcher.test=" + killed_label["org.patcher.test"])
        owner = engine.client.api.inspect_container(orphan.id)["Config"]["Labels"][OWNER_LABEL]
        assert owner.split(":")[1] == str(killed.pid) and owner_is_gone(owner)
        assert not owner_is_gone(owner_id(alive.pid)) and not owner_is_gone(owner_id(os.getpid()))
        capfd.readouterr()
        with Engine.connect() as fresh:  # a later patcher process: its first container reaps
            with Container(fresh, ContainerConfig(image=bullseye_python_image.tag, labels=_labels())):
                pass
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and "whose patcher process is gone" in err and orphan.name in err
        assert _gone(engine, killed_label)
        assert not _gone(engine, alive_label)  # its maker still runs: never touched
    finally:
        alive.kill()
        alive.wait()
        for found in engine.containers_with_label("org.patcher.test=" + alive_label["org.patcher.test"]):
            engine.remove_container(found.id)
    assert _gone(engine, alive_label)


def test_an_owner_from_another_boot_or_namespace_or_unreadable_is_never_gone():
    from patcher.container import owner_id, owner_is_gone

    mine = owner_id()
    boot, _, rest = mine.partition(":")
    assert mine and not owner_is_gone(mine)
    assert not owner_is_gone("another-boot/4026531836:" + rest)
    assert not owner_is_gone(boot.split("/")[0] + "/1:" + rest)  # another PID namespace
    assert not owner_is_gone("") and not owner_is_gone("garbage")
