"""`patcher mirror check`: complete (0), something missing (80) or damaged (81), each item named."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

from tests.fixtures.common import run_patcher
from tests.fixtures.mirror_env import git


def _check(synced_mirror, mirror, *more: str):
    return run_patcher(*synced_mirror.check_args(mirror), *more, env=synced_mirror.upstream.env())


def _one_line_error(result) -> str:
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


def test_a_complete_mirror_passes(synced_mirror):
    result = _check(synced_mirror, synced_mirror.path)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "is complete for torch-1.4.0-cu101.pt1-py3.9" in result.stdout
    assert result.stdout.count("\nok ") == 9  # 4 repositories, 3 files, 1 wheel, 1 image


def test_a_deleted_loose_object_of_a_nested_submodule_is_named(synced_mirror, tmp_path):
    mirror = synced_mirror.copy_to(tmp_path / "m")
    repo = mirror / "git" / "standin" / "nested.git"
    # Explode the pack into loose objects, then lose one: the blob of nested.h.
    pack = next((repo / "objects" / "pack").glob("*.pack"))
    data = pack.read_bytes()
    for old in (repo / "objects" / "pack").iterdir():
        old.unlink()
    subprocess.run(["git", "unpack-objects", "-q"], cwd=repo, input=data, check=True)
    blob = git("rev-parse", f"{synced_mirror.upstream.commits['nested']}:nested.h", cwd=repo)
    (repo / "objects" / blob[:2] / blob[2:]).unlink()

    result = _check(synced_mirror, mirror)
    assert result.exit_code == 81, result.stdout + result.stderr
    error = _one_line_error(result)
    assert "standin/nested (third_party/dep/nested)" in error and blob in error
    lines = [ln for ln in result.stdout.splitlines() if not ln.startswith("ok ")]
    assert any(ln.startswith("corrupt") and "standin/nested" in ln for ln in lines)


def test_a_missing_submodule_repository_is_named(synced_mirror, tmp_path):
    mirror = synced_mirror.copy_to(tmp_path / "m")
    shutil.rmtree(mirror / "git" / "standin" / "dep.git")
    result = _check(synced_mirror, mirror, "--json")
    assert result.exit_code == 80, result.stderr
    error = _one_line_error(result)
    assert "standin/dep (third_party/dep)" in error and "git/standin/dep.git is missing" in error


def test_a_corrupted_artifact_is_named(synced_mirror, tmp_path):
    mirror = synced_mirror.copy_to(tmp_path / "m")
    name, sha = synced_mirror.upstream.files["runfile"]
    path = mirror / "files" / sha
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))
    result = _check(synced_mirror, mirror)
    assert result.exit_code == 81
    assert f"file {name}: files/{sha} has sha256" in _one_line_error(result)


def test_missing_artifacts_and_wheels_are_named(synced_mirror, tmp_path):
    mirror = synced_mirror.copy_to(tmp_path / "m")
    up = synced_mirror.upstream
    (mirror / "files" / up.files["cudnn"][1]).unlink()
    (mirror / "wheelhouse" / "standin-helper" / up.wheel[0]).unlink()
    result = _check(synced_mirror, mirror)
    assert result.exit_code == 80
    error = _one_line_error(result)
    assert f"file {up.files['cudnn'][0]}: files/{up.files['cudnn'][1]} is missing" in error
    assert "pip standin-helper==1.0: no wheel with this sha256 in wheelhouse/standin-helper" in error
    assert "lacks 2 input(s)" in error


def test_a_damaged_image_archive_is_named(synced_mirror, tmp_path):
    mirror = synced_mirror.copy_to(tmp_path / "m")
    archive = next((mirror / "images").glob("*.tar"))
    members = []
    with tarfile.open(archive) as tar:
        for member in tar:
            data = tar.extractfile(member).read()
            if member.name.startswith("blobs/") and len(data) > 100 and b"schemaVersion" not in data:
                data = data[:-1] + bytes([data[-1] ^ 1])  # one bit of a layer or config
            members.append((member, data))
    with tarfile.open(archive, "w") as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(data))
    result = _check(synced_mirror, mirror)
    assert result.exit_code == 81
    assert "image mirror-tiny: blob sha256:" in _one_line_error(result)
