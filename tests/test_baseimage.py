"""`patcher base-image`: mmdebstrap -> a reproducible image -> push, and its error paths."""

from __future__ import annotations

import glob
import json
import tempfile

import pytest

from patcher.hostapt import host_debian_mirror
from patcher.lock import ImageRef, resolve_digest
from tests.fixtures.docker_env import free_port

pytestmark = pytest.mark.docker

TEST_TAG = "patcher-test/base-image-cli:bullseye"


def temp_dirs() -> set[str]:
    return set(glob.glob(f"{tempfile.gettempdir()}/patcher-base-image-*"))


@pytest.fixture
def cleanup_test_tag(docker_client):
    yield TEST_TAG
    import docker

    try:
        docker_client.images.remove(TEST_TAG, noprune=False)
    except docker.errors.ImageNotFound:
        pass


def test_base_image_is_reproducible_and_pushes(patcher_cli, docker_client, local_registry, cleanup_test_tag,
                                               no_leaks):
    # A tiny rootfs (busybox only) keeps this quick; the minbase path runs in the shared
    # bullseye_base_image fixture through the same code.
    tiny = ("--variant", "extract", "--include", "busybox-static")
    first = patcher_cli("base-image", "--suite", "bullseye", "--tag", TEST_TAG, *tiny, "--json")
    assert first.exit_code == 0, first.stderr
    one = json.loads(first.stdout)
    image = docker_client.images.get(TEST_TAG)
    assert image.id == one["image_id"]
    assert image.labels["org.patcher.base-image.suite"] == "bullseye"
    assert image.labels["org.patcher.base-image.include"] == "busybox-static"
    assert image.attrs["Created"].startswith("2021-08-14T00:00:00")
    assert one["mirror_url"] == host_debian_mirror()
    # Same inputs, same image: built again (and pushed) it has the same ID.
    second = patcher_cli("base-image", "--suite", "bullseye", "--tag", TEST_TAG, *tiny, "--push", local_registry.url)
    assert second.exit_code == 0, second.stderr
    pushed = second.stdout.strip().splitlines()[-1]
    assert f"image     {TEST_TAG} ({one['image_id']})" in second.stdout
    ref, digest = pushed.split("@")
    assert ref == f"{local_registry.url}/{TEST_TAG}"
    assert resolve_digest(ImageRef.parse(ref)) == digest
    # The registry-qualified tag was only a vehicle for the push.
    assert docker_client.images.get(TEST_TAG).tags == [TEST_TAG]


def test_unknown_suite_fails_cleanly(patcher_cli, docker_client, no_leaks):
    before = temp_dirs()
    res = patcher_cli("base-image", "--suite", "no-such-suite", "--tag", "patcher-test/never:made")
    assert res.exit_code == 42, res.stderr
    assert res.stderr.startswith("patcher: error: mmdebstrap no-such-suite") and res.stderr.count("\n") == 1
    assert temp_dirs() == before
    assert not docker_client.images.list(name="patcher-test/never")


def test_unreachable_mirror_fails_cleanly(patcher_cli, no_leaks, tmp_path):
    # a private TMPDIR: other base-image runs on the machine must not count as leftovers
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    res = patcher_cli("base-image", "--suite", "bullseye", "--tag", "patcher-test/never:made",
                      "--mirror-url", f"http://127.0.0.1:{free_port()}/debian",
                      env={"TMPDIR": str(private_tmp)})
    assert res.exit_code == 42 and "Traceback" not in res.stderr, res.stderr
    assert list(private_tmp.iterdir()) == []


def test_docker_unavailable(patcher_cli, tmp_path):
    res = patcher_cli("base-image", "--suite", "bullseye", env={"PATCHER_DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert res.exit_code == 40 and "not reachable" in res.stderr and "Traceback" not in res.stderr


def test_push_to_unreachable_registry(docker_client, docker_engine, bullseye_base_image, no_leaks):
    from patcher.baseimage import push_image
    from patcher.errors import RegistryError

    registry = f"127.0.0.1:{free_port()}"
    with pytest.raises(RegistryError) as err:
        push_image(docker_engine, bullseye_base_image.tag, registry)
    assert registry in str(err.value)
    assert not [t for t in docker_client.images.get(bullseye_base_image.tag).tags if t.startswith(registry)]


def test_image_archive_is_byte_stable(tmp_path):
    """Equal rootfs -> equal archive and config (the image ID), whatever the clock says."""
    from patcher.baseimage import image_config, write_image_archive

    rootfs = tmp_path / "rootfs.tar"
    rootfs.write_bytes(b"x" * 4096)
    config = image_config("ab" * 32, architecture="amd64", labels={"b": "2", "a": "1"}, epoch=1628899200,
                          created_by="test")
    again = image_config("ab" * 32, architecture="amd64", labels={"a": "1", "b": "2"}, epoch=1628899200,
                         created_by="test")
    assert config == again
    write_image_archive(rootfs, tmp_path / "one.tar", "t:1", config, "ab" * 32, 1628899200)
    write_image_archive(rootfs, tmp_path / "two.tar", "t:1", config, "ab" * 32, 1628899200)
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()


def test_python_image_has_python_venv_and_pip(docker_client, bullseye_python_image, bullseye_base_image, no_leaks):
    image = docker_client.images.get(bullseye_python_image.tag)
    assert image.labels["org.patcher.test-base-id"] == bullseye_base_image.image_id
    out = docker_client.containers.run(
        image.id, ["bash", "-c", "python3 -m venv /tmp/v && /tmp/v/bin/python -m pip --version"], remove=True)
    assert b"python 3.9" in out


def test_leak_check_sees_a_left_container(docker_client, bullseye_base_image):
    from tests.fixtures.docker_env import _docker_state, leaks_since

    before = _docker_state(docker_client)
    container = docker_client.containers.create(bullseye_base_image.tag, ["true"], name="patcher-test-leak-check")
    try:
        containers, _volumes = leaks_since(docker_client, before, settle_s=0)
        assert any(c.startswith("patcher-test-leak-check (") for c in containers)
    finally:
        container.remove(force=True)
