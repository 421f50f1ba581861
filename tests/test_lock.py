"""`patcher lock` against a real registry on loopback (Debian's docker-registry)."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest

from patcher.config import DEFAULT_MATRIX
from patcher.lock import ImageRef, set_digest

pytestmark = pytest.mark.docker


def matrix_copy(tmp_path: Path, bullseye_ref: str, digest: str = "unknown") -> Path:
    """The packaged matrix with debian-bullseye pointed at the loopback registry."""
    path = tmp_path / "matrix.toml"
    text = DEFAULT_MATRIX.read_text()
    text = text.replace('ref = "docker.io/library/debian:bullseye-slim"', f'ref = "{bullseye_ref}"')
    text = set_digest(text, "debian-bullseye", digest)
    path.write_text(text)
    return path


def changed_lines(before: str, after: str) -> list[str]:
    return [ln for ln in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def test_lock_writes_the_pushed_digest_in_place(patcher_cli, tmp_path, pushed_bullseye_base):
    matrix = matrix_copy(tmp_path, pushed_bullseye_base.ref)
    before = matrix.read_text()
    res = patcher_cli("--matrix", matrix, "lock", "--image", "debian-bullseye")
    assert res.exit_code == 0, res.stderr
    after = matrix.read_text()
    assert changed_lines(before, after) == ['-digest = "unknown"', f'+digest = "{pushed_bullseye_base.digest}"']
    assert "1 digest(s) written" in res.stdout
    # Locked: a second run changes nothing, and the spec now pins the pushed image.
    res2 = patcher_cli("--matrix", matrix, "lock", "--image", "debian-bullseye", "--json")
    assert res2.exit_code == 0 and '"changed": false' in res2.stdout
    assert matrix.read_text() == after
    spec = patcher_cli("--matrix", matrix, "matrix", "--torch", "1.13.1", "--cuda", "none")
    assert f"base image    {pushed_bullseye_base.pinned}" in spec.stdout


def test_lock_asks_a_mirror_registry(patcher_cli, tmp_path, docker_client, local_registry, bullseye_base_image):
    # The site mirrors Docker Hub's debian:bullseye-slim into its own registry.
    mirrored = f"{local_registry.url}/library/debian"
    api = docker_client.api
    api.tag(bullseye_base_image.tag, mirrored, tag="bullseye-slim")
    try:
        digest = None
        for item in api.push(mirrored, tag="bullseye-slim", stream=True, decode=True):
            assert "error" not in item, item
            digest = (item.get("aux") or {}).get("Digest", digest)
    finally:
        api.remove_image(f"{mirrored}:bullseye-slim", noprune=True)
    matrix = tmp_path / "matrix.toml"
    shutil.copy(DEFAULT_MATRIX, matrix)
    before = matrix.read_text()
    res = patcher_cli("--matrix", matrix, "lock", "--image", "debian-bullseye", "--registry", local_registry.url)
    assert res.exit_code == 0, res.stderr
    old = next(ln for ln in before.splitlines() if ln.startswith('digest = "sha256:f313b4bd'))
    assert changed_lines(before, matrix.read_text()) == [f"-{old}", f'+digest = "{digest}"']
    # --dry-run resolves but writes nothing.
    shutil.copy(DEFAULT_MATRIX, matrix)
    res = patcher_cli("--matrix", matrix, "lock", "--image", "debian-bullseye", "--registry", local_registry.url,
                      "--dry-run")
    assert res.exit_code == 0 and "would change" in res.stdout
    assert matrix.read_text() == before


def test_unknown_tag_fails_and_leaves_the_matrix(patcher_cli, tmp_path, local_registry, pushed_bullseye_base):
    matrix = matrix_copy(tmp_path, f"{local_registry.url}/no/such-image:v1")
    before = matrix.read_text()
    res = patcher_cli("--matrix", matrix, "lock", "--image", "debian-bullseye")
    assert res.exit_code == 14, res.stderr
    assert "does not exist in the registry" in res.stderr and "Traceback" not in res.stderr
    assert matrix.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.toml"]


def test_unreachable_registry_fails_and_leaves_the_matrix(patcher_cli, tmp_path, local_registry,
                                                        pushed_bullseye_base):
    from tests.fixtures.docker_env import free_port

    # Two images: the first resolves, the second cannot; nothing may be written.
    matrix = matrix_copy(tmp_path, pushed_bullseye_base.ref)
    text = matrix.read_text().replace('ref = "docker.io/library/ubuntu:18.04"',
                                      f'ref = "127.0.0.1:{free_port()}/library/ubuntu:18.04"')
    matrix.write_text(text)
    res = patcher_cli("--matrix", matrix, "lock", "--image", "debian-bullseye", "--image", "ubuntu-18_04",
                      "--timeout", "5")
    assert res.exit_code == 14 and "unreachable" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1
    assert matrix.read_text() == text


def test_unknown_image_name(patcher_cli, tmp_path):
    res = patcher_cli("lock", "--image", "no-such-image")
    assert res.exit_code == 10 and "no-such-image" in res.stderr and "debian-bullseye" in res.stderr


# --- pure logic -------------------------------------------------------------------------------
@pytest.mark.parametrize("ref,expected", [
    ("docker.io/library/ubuntu:18.04", (None, "library/ubuntu", "18.04")),
    ("debian:bullseye", (None, "library/debian", "bullseye")),
    ("nvidia/cuda", (None, "nvidia/cuda", "latest")),
    ("127.0.0.1:5000/a/b:t@sha256:" + "0" * 64, ("127.0.0.1:5000", "a/b", "t")),
    ("localhost/x:1", ("localhost", "x", "1")),
    ("registry.site:443/library/debian:bullseye-slim", ("registry.site:443", "library/debian", "bullseye-slim")),
])
def test_image_ref_parse(ref, expected):
    parsed = ImageRef.parse(ref)
    assert (parsed.registry if parsed.registry != "docker.io" else None, parsed.path, parsed.tag) == expected


def test_set_digest_keeps_comments_and_adds_a_missing_line():
    text = ('# top\n[images.a]\nref = "x:1"  # the ref\ndigest = "unknown"   # pinned by lock\n'
            '[images."b"]\nref = "y:2"\n\n[other]\ndigest = "keep"\n')
    out = set_digest(set_digest(text, "a", "sha256:" + "1" * 64), "b", "sha256:" + "2" * 64)
    assert out == ('# top\n[images.a]\nref = "x:1"  # the ref\ndigest = "sha256:' + "1" * 64 + '"   # pinned by lock\n'
                   '[images."b"]\nref = "y:2"\ndigest = "sha256:' + "2" * 64 + '"\n\n[other]\ndigest = "keep"\n')
