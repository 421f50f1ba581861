"""`patcher probe --wheel` and `--image` for real: Debian's torch packaged as wheels, installed
offline into clean venvs; bullseye's torch 1.7.1 inside a container made here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from patcher.buildenv import LABEL_WORK_DIR
from tests.fixtures.common import run_patcher
from tests.fixtures.torch_env import write_wheel

NO_CUDA = "needs CUDA; this torch is built without CUDA"
NEWER_TORCH = re.compile(r"needs torch >=(\d+)\.(\d+); this is 1\.7\.0a0")
QUICK = "env,security.cve_2025_2953"  # the fingerprint, and one isolated check (a child process)


def load(path: Path) -> dict:
    report = json.loads(path.read_text())
    return report | {"by_id": {c["id"]: c for c in report["checks"]}}


def assert_consistent(result, report):
    assert result.exit_code == (0 if report["passed"] else 50), result.stderr
    assert all(c["status"] in ("pass", "fail", "skip", "error") for c in report["checks"])


# --- a wheel on this machine ---------------------------------------------------------------------
def test_wheel_in_a_clean_venv(debian_torch_wheel, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "report.json"
    result = run_patcher("probe", "--wheel", debian_torch_wheel.wheel, "--python", "/usr/bin/python3",
                         "--wheelhouse", debian_torch_wheel.wheelhouse, "--only", QUICK, "--json", out,
                         env={"TMPDIR": str(tmp)}, timeout=900)
    report = load(out)
    assert_consistent(result, report)
    torch_info = report["environment"]["torch"]
    assert torch_info["version"] == debian_torch_wheel.torch_version
    # the torch that ran is the wheel's, inside the temporary venv, not Debian's dist-packages
    assert torch_info["path"].startswith(str(tmp)) and "/site-packages/torch" in torch_info["path"]
    assert report["by_id"]["env.fingerprint"]["status"] == "pass"
    assert report["by_id"]["security.cve_2025_2953"]["message"] == "killed by SIGFPE (exit -8)"
    assert list(tmp.iterdir()) == []  # the venv and the staged probe are gone


def test_wheel_whose_dependency_is_not_offline(debian_torch_wheel, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    result = run_patcher("probe", "--wheel", debian_torch_wheel.wheel, "--python", "/usr/bin/python3",
                         env={"TMPDIR": str(tmp)}, timeout=900)
    assert result.exit_code == 54, result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"patcher: error: pip could not install {debian_torch_wheel.wheel.name} offline: ")
    assert "typing" in line and line.endswith("(put its dependencies' wheels in a folder and pass --wheelhouse)")
    assert "\n" not in line and list(tmp.iterdir()) == []


def test_not_a_wheel(tmp_path):
    bogus = tmp_path / "torch.tar.gz"
    bogus.write_text("x")
    result = run_patcher("probe", "--wheel", bogus)
    assert result.exit_code == 52
    assert result.stderr.strip() == f"patcher: error: wheel {bogus} does not exist or is not a .whl file"


# --- containers ----------------------------------------------------------------------------------
@pytest.mark.docker
def test_image_with_legacy_torch(bullseye_torch_image, tmp_path, no_probe_containers):
    out, junit = tmp_path / "report.json", tmp_path / "report.xml"
    result = run_patcher("probe", "--image", bullseye_torch_image.tag, "--json", out, "--junit", junit,
                         timeout=900)
    report = load(out)
    assert_consistent(result, report)
    env = report["environment"]
    assert env["torch"]["version"] == "1.7.0a0" and env["python"]["version"].startswith("3.9.")  # 1.7.1
    assert env["torch"]["path"] == "/usr/lib/python3/dist-packages/torch"
    assert report["by_id"]["env.fingerprint"]["status"] == "pass"
    for check_id, entry in report["by_id"].items():
        if check_id.startswith(("maxpool2d.", "determinism.")) or check_id == "env.arch_coverage":
            # a check of a newer op says first that 1.7 lacks it (determinism.reflection_pad3d: >= 1.10,
            # determinism.cumsum_complex: >= 1.8); the range it names must lie above 1.7
            newer = NEWER_TORCH.fullmatch(entry["message"] or "")
            assert entry["status"] == "skip" and (entry["message"] == NO_CUDA or (
                newer is not None and (int(newer[1]), int(newer[2])) > (1, 7))), entry
    assert junit.read_text().startswith("<testsuites>")


@pytest.mark.docker
def test_wheel_in_a_fresh_container(bullseye_torch_wheel, bullseye_torch_image, tmp_path, no_probe_containers):
    out = tmp_path / "report.json"
    result = run_patcher("probe", "--wheel", bullseye_torch_wheel.wheel, "--image", bullseye_torch_image.tag,
                         "--wheelhouse", bullseye_torch_wheel.wheelhouse, "--only", "env", "--json", out,
                         timeout=900)
    assert result.exit_code == 0, result.stderr
    report = load(out)
    torch_info = report["environment"]["torch"]
    assert torch_info["version"] == bullseye_torch_wheel.torch_version
    assert torch_info["path"].startswith("/tmp/patcher-probe/venv/lib/python3.9/site-packages/torch")


@pytest.mark.docker
def test_wheel_for_another_python_in_a_container(bullseye_python_image, tmp_path, no_probe_containers):
    # a real (small) wheel built for CPython 3.11, offered to the image's Python 3.9
    wheel = write_wheel(tmp_path, "wrongtag", "1.0", "cp311-cp311-linux_x86_64", {"wrongtag.py": b"X = 1\n"})
    result = run_patcher("probe", "--wheel", wheel, "--image", bullseye_python_image.tag, timeout=900)
    assert result.exit_code == 54, result.stderr
    assert result.stderr.startswith(f"patcher: error: pip could not install {wheel.name} "
                                    f"offline in image {bullseye_python_image.tag}: ")
    assert "is not a supported wheel on this platform" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.docker
def test_image_without_torch(bullseye_python_image, no_probe_containers):
    result = run_patcher("probe", "--image", bullseye_python_image.tag, timeout=600)
    assert result.exit_code == 53, result.stderr
    assert result.stderr.strip() == (f"patcher: error: image {bullseye_python_image.tag} cannot import torch: "
                                     "ModuleNotFoundError: No module named 'torch' "
                                     "(probe an interpreter, image or wheel that provides torch)")


@pytest.mark.docker
def test_image_without_python(bullseye_base_image, no_probe_containers):
    result = run_patcher("probe", "--image", bullseye_base_image.tag, timeout=600)
    assert result.exit_code == 52, result.stderr
    assert result.stderr.strip() == (f"patcher: error: image {bullseye_base_image.tag} has no python3 "
                                     "(probe an image that has Python and torch)")


@pytest.mark.docker
def test_image_that_is_not_here(docker_client, no_probe_containers):
    result = run_patcher("probe", "--image", "patcher-test/no-such-image:never")
    assert result.exit_code == 52
    assert "is not on this machine (images are never pulled)" in result.stderr


@pytest.mark.docker
def test_container_removed_when_the_probe_times_out(bullseye_torch_image, no_probe_containers):
    # half a second: less than the container needs to start Python and import torch
    result = run_patcher("probe", "--image", bullseye_torch_image.tag, "--timeout", "0.5", timeout=600)
    assert result.exit_code == 55, result.stderr
    assert result.stderr.strip().startswith(f"patcher: error: the probe in image {bullseye_torch_image.tag} "
                                            "ran past 0.5 s and was stopped")


@pytest.fixture
def no_probe_containers(docker_client):
    """Every container the probe makes carries this label; none may outlive a test.  A build's
    probe stage labels its container with the build's work directory too: those belong to a build
    running beside the tests (its own tests count them by work directory), not to this test."""
    yield
    left = [c for c in docker_client.containers.list(all=True, filters={"label": "org.patcher.probe=1"})
            if LABEL_WORK_DIR not in (c.labels or {})]
    assert not left, f"left behind: {[c.name for c in left]}"


def test_docker_engine_unreachable():
    result = run_patcher("probe", "--image", "anything", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.exit_code == 40
    assert result.stderr.startswith("patcher: error: the Docker engine at unix:///nonexistent/docker.sock is not "
                                    "reachable: ")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("args, fragment", [
    (["--python", "python3", "--upstream-tests"], "--upstream-tests needs --source TREE"),
    (["--wheel", "w.whl", "--upstream-tests", "--source", "."], "a target of --python, --image, or --wheel with"),
    (["--python", "python3", "--source", "."], "go with --upstream-tests"),
    (["--python", "python3", "--no-upstream-smoke"], "go with --upstream-tests"),
])
def test_upstream_tests_flags_are_checked_before_anything_runs(args, fragment):
    result = run_patcher("probe", *args)
    assert result.exit_code == 2 and fragment in result.stderr and "Traceback" not in result.stderr
