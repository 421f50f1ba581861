"""`patcher build` as README gives it: no --until, no --probe-image, nothing but the stand-in's
matrix/config environment.  It must go all the way: the wheel probed in the builder image as its
own user, certified, and accepted by `patcher verify`; and a second run of the same command, a
run after a failed attempt, and a run of another spec behave as a user expects."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from patcher.errors import WheelInstallError, WorkDirError

pytestmark = pytest.mark.docker

README = Path(__file__).resolve().parent.parent / "README.md"
VOLUME = "patcher-ccache-1.4.0-none"  # the default ccache volume of this spec (kept by design)


def _readme_build_command() -> list[str]:
    """README's main command, as a user copies it (the torch and CUDA flags are the stand-in's)."""
    text = README.read_text()
    line = next(ln for ln in text.splitlines() if "patcher build --torch" in ln and "make install" in ln)
    command = line.split("&&", 1)[1].split("#", 1)[0].split()
    assert command[:4] == [".venv/bin/patcher", "build", "--torch", "1.4.0"] and command[4] == "--cuda", command
    return command[1:]


@pytest.fixture
def default_volume(docker_client):
    """The spec's default ccache volume, absent before and removed after (it is the cache a real
    site keeps between builds)."""
    import docker

    def remove() -> None:
        try:
            docker_client.volumes.get(VOLUME).remove(force=True)
        except docker.errors.NotFound:
            pass

    remove()
    yield VOLUME
    remove()


def test_readme_command_goes_to_a_verified_certified_wheel(standin, tmp_path, patcher_cli, docker_client, no_leaks,
                                                           default_volume):
    command = _readme_build_command()
    args = [*command[:4], "none"]  # the stand-in is a CPU build: only the CUDA value differs from README
    home = tmp_path / "home"  # no signing key yet: the build makes one where it looks by default
    env = dict(standin.env, HOME=str(home))
    res = patcher_cli(*args, env=env, cwd=tmp_path)
    assert res.exit_code == 0, res.stderr
    build_dir = tmp_path / "work" / "torch-1.4.0-cpu.pt1-py3.9"
    record = json.loads((build_dir / "record.json").read_text())
    assert record["completed_stages"] == ["resolve", "fetch", "patch", "render", "image", "configure", "wheel",
                                          "probe", "certify"]
    assert "[probe] done" in res.stderr and "[certify] done" in res.stderr
    assert "made " + str(home / ".config" / "patcher" / "signing-key.pem") in res.stderr
    wheel = build_dir / record["wheel"]["path"]
    report = json.loads(wheel.with_name(wheel.name + ".probe.json").read_text())
    assert report["passed"] is True
    assert report["environment"]["torch"]["version"] == "1.4.0+cpu.pt1"
    # PT-0090's check (the stand-in's own) passed; nothing of the series went unproven here
    assert report["unproven_patches"] == [] and record.get("unproven_patches", []) == []

    # verify accepts the wheel with the key the build made
    pub = tmp_path / "signing.pub"
    res = patcher_cli("keys", "export", "--key", home / ".config" / "patcher" / "signing-key.pem", "-o", pub,
                      env=env, cwd=tmp_path)
    assert res.exit_code == 0, res.stderr
    res = patcher_cli("verify", wheel, "--key", pub, env=env, cwd=tmp_path)
    assert res.exit_code == 0, res.stderr

    # the SBOM names the libraries the wheel links, as packages of the builder image
    from patcher.evidence import SBOM_SUFFIX

    sbom = json.loads(wheel.with_name(wheel.name + SBOM_SUFFIX).read_text())
    names = {c["name"] for c in sbom["components"]}
    assert {"libc6", "libstdc++6"} <= names, sorted(names)

    # the same command again: everything is done, nothing is redone
    res = patcher_cli(*args, env=env, cwd=tmp_path)
    assert res.exit_code == 0, res.stderr
    assert "[wheel] started" not in res.stderr and "continuing after certify" in res.stderr
    assert json.loads((build_dir / "record.json").read_text())["started"] == record["started"]

    # what is left: the wheel and its evidence, and the ccache volume kept by design
    assert docker_client.volumes.get(default_volume)


def test_after_a_failed_attempt_the_same_command_continues(standin, tmp_path, patcher_cli, no_leaks,
                                                           bullseye_base_image, ccache_volume_name):
    work = tmp_path / "work"
    env = dict(standin.env, HOME=str(tmp_path / "home"))
    # The first attempt fails at its probe: an image without Python.
    first = patcher_cli(*standin.build_args(work, "--ccache-volume", ccache_volume_name, "--probe-image",
                                            bullseye_base_image.tag), env=env)
    assert first.exit_code == WheelInstallError.exit_code, first.stderr
    assert "Traceback" not in first.stderr
    build_dir = work / standin.build_id
    record = json.loads((build_dir / "record.json").read_text())
    assert record["completed_stages"][-1] == "wheel"
    res = patcher_cli(*standin.build_args(work, "--ccache-volume", ccache_volume_name), env=env)
    assert res.exit_code == 0, res.stderr
    assert "continuing after wheel" in res.stderr and "[configure] started" not in res.stderr
    assert "[wheel] started" not in res.stderr and "[probe] done" in res.stderr and "[certify] done" in res.stderr
    again = json.loads((build_dir / "record.json").read_text())
    assert again["started"] == record["started"] and again["wheel"] == record["wheel"]


def test_another_spec_in_the_same_work_dir_is_refused(standin, tmp_path, patcher_cli):
    work = tmp_path / "work"
    res = patcher_cli(*standin.build_args(work, "--until", "resolve"), env=standin.env)
    assert res.exit_code == 0, res.stderr
    record_path = work / standin.build_id / "record.json"
    data = json.loads(record_path.read_text())
    data["spec"]["build_env"] = {**data["spec"].get("build_env", {}), "USE_SOMETHING": "1"}
    record_path.write_text(json.dumps(data))
    res = patcher_cli(*standin.build_args(work, "--until", "fetch"), env=standin.env)
    assert res.exit_code == WorkDirError.exit_code
    assert "holds another build's record" in res.stderr.strip().splitlines()[-1] and "Traceback" not in res.stderr
    assert json.loads(record_path.read_text()) == data  # nothing of it touched


def test_an_edited_patch_refetches_and_repatches(standin_factory, tmp_path, patcher_cli):
    variant = standin_factory("reproducible")
    work = tmp_path / "work"
    res = patcher_cli(*variant.build_args(work, "--until", "patch"), env=variant.env)
    assert res.exit_code == 0, res.stderr
    series_dir = Path(variant.catalog) / "patches" / "1.4.0"
    patch = next(p for p in series_dir.glob("*.patch"))
    text = patch.read_text()
    if patch.is_symlink():
        patch.unlink()
    assert "so every caller got a - b." in text
    patch.write_text(text.replace("so every caller got a - b.", "so every caller got a - b (and no test saw it).", 1))
    res = patcher_cli(*variant.build_args(work, "--until", "patch"), env=variant.env)
    assert res.exit_code == 0, res.stderr
    assert "series of torch 1.4.0 changed" in res.stderr and "[fetch] started" in res.stderr
    record = json.loads((work / variant.build_id / "record.json").read_text())
    import hashlib

    assert record["patches"][0]["sha256"] == hashlib.sha256(patch.read_bytes()).hexdigest()
    assert os.path.isdir(work / variant.build_id / "source")
    shutil.rmtree(work)


def test_upstream_tests_run_in_the_probe_stage_against_the_installed_wheel(standin, tmp_path, patcher_cli,
                                                                          no_leaks, ccache_volume_name):
    work = tmp_path / "work"
    env = dict(standin.env, HOME=str(tmp_path / "home"), PATCHER_CACHE_DIR=str(tmp_path / "cache"))
    res = patcher_cli(*standin.build_args(work, "--ccache-volume", ccache_volume_name, "--until", "probe",
                                          "--upstream-tests"), env=env)
    assert res.exit_code == 0, res.stderr
    assert "upstream smoke selection" in res.stderr  # the stand-in has no test_nn.py: said, not hidden
    build_dir = work / standin.build_id
    record = json.loads((build_dir / "record.json").read_text())
    report = json.loads((build_dir / record["probe_report"]).read_text())
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["upstream.PT-0090"]["status"] == "pass" and by_id["upstream.PT-0090"]["required"] is True
    nodes = {n["node"]: n["outcome"] for n in report["upstream_tests"]["nodes"]}
    assert nodes == {"test_ops.py::test_add": "passed"}
    assert report["upstream_tests"]["torch_version"] == "1.4.0+cpu.pt1"
    assert not list(build_dir.glob(".upstream-tests-*"))  # the payload went with the stage
