"""`patcher build` end to end on the stand-in (tests/fixtures/standin.py), with the real Docker
engine: fetched from a git mirror (submodule URL rewritten), patched, image built by the real
template, configured and built into a wheel in containers, installed into a fresh container and
imported; reproducibility proven both ways (the stand-in is reproducible, a variant that
embeds the build time is caught with a diffoscope report)."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from patcher.errors import ReproducibilityError

pytestmark = pytest.mark.docker


def _install_and_import(docker_client, image: str, wheel: Path) -> str:
    """pip-install the wheel offline into a venv in a fresh container and import it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(wheel), arcname=f"wheels/{wheel.name}")
    script = ("python3 -m venv /tmp/venv && /tmp/venv/bin/pip install -q --no-index --no-cache-dir "
              f"/tmp/wheels/{wheel.name} && cd / && /tmp/venv/bin/python -c "
              "'import torch, json; print(json.dumps({\"version\": torch.__version__, "
              "\"add\": torch._C.add(2, 3), \"scale\": torch._C.scale(2), \"checksum\": torch._C.checksum(), "
              "\"file\": torch.__file__}))'")
    container = docker_client.containers.create(image, command=["sh", "-c", script], network_disabled=True,
                                                labels={"org.patcher.test": "standin-import"})
    try:
        container.put_archive("/tmp", buf.getvalue())
        container.start()
        status = container.wait(timeout=300)["StatusCode"]
        out = container.logs().decode()
        assert status == 0, out
        return out.strip().splitlines()[-1]
    finally:
        container.remove(force=True)


def test_standin_builds_end_to_end_and_imports(standin, tmp_path, patcher_cli, docker_client, no_leaks,
                                              bullseye_python_image, ccache_volume_name):
    work = tmp_path / "work"
    res = patcher_cli(*standin.build_args(work, "--until", "configure", "--ccache-volume", ccache_volume_name),
                      env=standin.env)
    assert res.exit_code == 0, res.stderr
    build_dir = work / standin.build_id
    record = json.loads((build_dir / "record.json").read_text())
    assert record["completed_stages"] == ["resolve", "fetch", "patch", "render", "image", "configure"]
    assert "wheel" not in record
    assert "-- Configuring done" in (build_dir / "build.log").read_text()
    assert record["toolchain"]["gcc"].startswith("gcc-10") and record["toolchain"]["python"] == "Python 3.9.2"

    # the wheel, built twice in fresh containers with fresh ccache volumes: the same bytes
    res = patcher_cli(*standin.build_args(work, "--until", "wheel", "--resume", "--check-reproducible",
                                          "--ccache-volume", ccache_volume_name), env=standin.env)
    assert res.exit_code == 0, res.stderr
    record = json.loads((build_dir / "record.json").read_text())
    assert record["completed_stages"][-2:] == ["configure", "wheel"]
    repro = record["reproducibility"]
    assert repro["reproducible"] is True and repro["sha256"][0] == repro["sha256"][1] == record["wheel"]["sha256"]
    assert not [v for v in docker_client.volumes.list() if "-repro-" in v.name and "1.4.0" in v.name]
    wheel = build_dir / record["wheel"]["path"]
    assert wheel.name == "torch-1.4.0+cpu.pt1-cp39-cp39-linux_x86_64.whl"
    assert f"{wheel} sha256:{record['wheel']['sha256']}" in res.stdout

    # the record: what certify needs, and what the build really used
    assert record["source"]["commit"] == standin.commit
    assert record["source"]["submodules"] == [{"path": "third_party/dep", "url": "https://github.com/standin/dep.git",
                                               "commit": standin.dep_commit}]
    assert [p["id"] for p in record["patches"]] == ["PT-0090"]
    assert record["image_id"].startswith("sha256:") and len(record["dockerfile_sha256"]) == 64
    assert record["container_env"]["PYTORCH_BUILD_VERSION"] == "1.4.0+cpu.pt1"
    assert record["container_env"]["SOURCE_DATE_EPOCH"] == "1579046400"  # the tag commit's time
    assert set(record["stage_durations"]) == set(record["completed_stages"])
    from patcher.record import BuildRecord

    parsed = BuildRecord.from_json(record)
    assert parsed.wheel.sha256 == record["wheel"]["sha256"]

    # hermetic: only tracked files went in, and no build path is left in the binary
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        so = next(n for n in names if n.startswith("torch/_C") and n.endswith(".so"))
        assert b"/src/" not in zf.read(so)
        assert zf.read("torch/version.py").decode().startswith('__version__ = "1.4.0+cpu.pt1"')
        assert not any("source-manifest" in n for n in names)

    out = json.loads(_install_and_import(docker_client, bullseye_python_image.tag, wheel))
    assert out == {"version": "1.4.0+cpu.pt1", "add": 5, "scale": 6, "checksum": 0 + 1 + 2 + 3,
                   "file": "/tmp/venv/lib/python3.9/site-packages/torch/__init__.py"}

    # the second build of an unchanged spec reuses the image
    res = patcher_cli(*standin.build_args(work, "--until", "image", "--fresh"), env=standin.env)
    assert res.exit_code == 0, res.stderr
    assert json.loads((build_dir / "record.json").read_text())["image_reused"] is True


def test_check_reproducible_catches_a_timestamp_and_writes_a_diffoscope_report(standin_factory, tmp_path,
                                                                               patcher_cli, no_leaks,
                                                                               ccache_volume_name):
    variant = standin_factory("timestamp")
    work = tmp_path / "work"
    res = patcher_cli(*variant.build_args(work, "--until", "wheel", "--check-reproducible", "--ccache-volume",
                                          ccache_volume_name), env=variant.env)
    assert res.exit_code == ReproducibilityError.exit_code, res.stderr
    message = res.stderr.strip().splitlines()[-1]
    assert message.startswith("patcher: error: two builds of torch-1.4.0+cpu.pt1-cp39-cp39-linux_x86_64.whl")
    assert "Traceback" not in res.stderr
    report = work / variant.build_id / "reproducibility" / "diffoscope.txt"
    assert str(report) in message
    text = report.read_text()
    assert "torch/version.py" in text and "build_time" in text
    record = json.loads((work / variant.build_id / "record.json").read_text())
    assert record["reproducibility"]["reproducible"] is False
    assert "wheel" not in record["completed_stages"] and "wheel" not in record
