"""`patcher mirror sync`: the closure fetched into the mirror layout, resumable, only what is new."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import requests

from tests.fixtures.common import run_patcher
from tests.fixtures.index_env import serve_directory
from tests.fixtures.mirror_env import git, start_registry


def _sync(up, mirror: Path, *more: str, torch: str = "1.4.0", env: dict | None = None):
    return run_patcher("mirror", "sync", "--torch", torch, "--cuda", "10.1", "--to", str(mirror), "--json", *more,
                       env=env or up.env())


def _items(result) -> dict[str, dict]:
    return {i["name"]: i for i in json.loads(result.stdout)["items"]}


def _no_part_files(root: Path) -> None:
    assert not [p for p in root.rglob("*") if p.name.endswith(".part") or ".init-" in p.name]


def test_sync_fills_the_layout_and_a_second_sync_transfers_nothing(mirror_upstream, tmp_path):
    up, mirror = mirror_upstream, tmp_path / "mirror"
    first = _sync(up, mirror)
    assert first.exit_code == 0, first.stderr
    # git: the pinned commits under refs/patcher/pins, the tag, the submodule's own tag at its pin.
    for name, key in (("pytorch/pytorch", "pytorch"), ("standin/dep", "dep"), ("standin/nested", "nested"),
                      ("standin/big", "big")):
        repo = mirror / "git" / f"{name}.git"
        assert git("rev-parse", f"refs/patcher/pins/{up.commits[key]}", cwd=repo) == up.commits[key]
        assert (repo / "info" / "refs").is_file()  # servable by a plain web server
    top = mirror / "git" / "pytorch" / "pytorch.git"
    assert git("rev-parse", "v1.4.0^{commit}", cwd=top) == up.commits["pytorch"]
    assert git("tag", "--list", cwd=top) == "v1.4.0"  # not v1.5.0: pinned refs only, no --mirror
    assert git("tag", "--list", cwd=mirror / "git" / "standin" / "dep.git") == "dep-v1"
    for _name, sha in up.files.values():
        assert hashlib.sha256((mirror / "files" / sha).read_bytes()).hexdigest() == sha
    wheel = mirror / "wheelhouse" / "standin-helper" / up.wheel[0]
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == up.wheel[1]
    assert f"#sha256={up.wheel[1]}" in (mirror / "wheelhouse" / "standin-helper" / "index.html").read_text()
    assert (mirror / "images" / f"mirror-tiny@{up.image_digest.replace(':', '_')}.tar").is_file()
    manifest = json.loads((mirror / "mirror-manifest.json").read_text())
    assert "torch-1.4.0-cu101.pt1-py3.9" in manifest["builds"]
    assert manifest["files"][up.files["runfile"][1]]["bytes"] == 96 * 1024
    assert manifest["git"]["standin/nested"]["commits"] == {up.commits["nested"]: "third_party/dep/nested"}
    assert manifest["syncs"][-1]["transferred"] == json.loads(first.stdout)["transferred"] > 96 * 1024
    _no_part_files(mirror)

    again = _sync(up, mirror)
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout)["transferred"] == 0
    assert {i["action"] for i in json.loads(again.stdout)["items"]} == {"present"}


def test_a_second_version_transfers_only_what_is_new(mirror_upstream, tmp_path):
    up, mirror = mirror_upstream, tmp_path / "mirror"
    first = _sync(up, mirror)
    second = _sync(up, mirror, torch="1.5.0")
    assert first.exit_code == 0 and second.exit_code == 0, first.stderr + second.stderr
    items = _items(second)
    assert items["standin/big (third_party/big)"]["transferred"] == 0
    assert items["standin/nested (third_party/dep/nested)"]["transferred"] == 0
    assert items["standin/dep (third_party/dep)"]["action"] == "fetched"
    assert json.loads(second.stdout)["transferred"] < 0.05 * json.loads(first.stdout)["transferred"]
    top = mirror / "git" / "pytorch" / "pytorch.git"
    assert git("tag", "--list", cwd=top).split() == ["v1.4.0", "v1.5.0"]


def test_the_wheelhouse_is_an_index_pip_reads_with_hashes(synced_mirror, tmp_path):
    up = synced_mirror.upstream
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"standin-helper==1.0 --hash=sha256:{up.wheel[1]}\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "--require-hashes", "-r", str(requirements), "--index-url",
                           f"file://{synced_mirror.path}/wheelhouse", "-d", str(tmp_path / "got")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "got" / up.wheel[0]).is_file()


def test_fetch_reads_the_mirror_by_one_setting_also_over_http(synced_mirror, tmp_path):
    """After the upstream is gone, `mirror = DIR` (or a web server in front of DIR) serves `patcher fetch`."""
    up = synced_mirror.upstream
    config = tmp_path / "config.toml"
    config.write_text(f'mirror = "{synced_mirror.path}"\n')
    env = up.env(PATCHER_CONFIG=str(config), PATCHER_CACHE_DIR=str(tmp_path / "cache"))
    result = run_patcher("fetch", "--torch", "1.4.0", "-o", str(tmp_path / "tree"), "--json", env=env)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "tree" / "third_party" / "dep" / "nested" / "nested.h").is_file()
    assert json.loads(result.stdout)["submodules"][1]["submodules"][0]["commit"] == up.commits["nested"]

    with serve_directory(synced_mirror.path) as url:  # dumb HTTP: info/refs written by the sync
        env = up.env(PATCHER_MIRROR=url, PATCHER_CONFIG="/dev/null", PATCHER_CACHE_DIR=str(tmp_path / "cache2"))
        result = run_patcher("fetch", "--torch", "1.4.0", "-o", str(tmp_path / "tree2"), env=env)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "tree2" / "third_party" / "dep" / "nested" / "nested.h").is_file()


def test_sync_from_another_mirror_directory_or_url(synced_mirror, tmp_path):
    up = synced_mirror.upstream  # taken away: only the mirror can serve
    from_dir = _sync(up, tmp_path / "b", "--from", str(synced_mirror.path))
    assert from_dir.exit_code == 0, from_dir.stderr
    with serve_directory(synced_mirror.path) as url:
        from_url = _sync(up, tmp_path / "c", "--from", url)
    assert from_url.exit_code == 0, from_url.stderr
    for mirror in (tmp_path / "b", tmp_path / "c"):
        check = run_patcher(*synced_mirror.check_args(mirror), env=up.env())
        assert check.exit_code == 0, check.stdout + check.stderr


def test_an_interrupted_download_resumes_and_a_bad_part_never_becomes_a_file(synced_mirror, tmp_path):
    up = synced_mirror.upstream
    name, sha = up.files["runfile"]
    content = (synced_mirror.path / "files" / sha).read_bytes()
    mirror = tmp_path / "mirror"
    (mirror / "files").mkdir(parents=True)
    (mirror / "files" / f"{sha}.part").write_bytes(content[: len(content) // 2])
    resumed = _sync(up, mirror, "--from", str(synced_mirror.path))
    assert resumed.exit_code == 0, resumed.stderr
    assert _items(resumed)[name]["transferred"] == len(content) - len(content) // 2
    assert (mirror / "files" / sha).read_bytes() == content

    # A part with wrong bytes: refused by its checksum and removed, never renamed into place.
    other = tmp_path / "other"
    (other / "files").mkdir(parents=True)
    (other / "files" / f"{sha}.part").write_bytes(b"x" * 100)
    bad = _sync(up, other, "--from", str(synced_mirror.path))
    assert bad.exit_code == 24, bad.stderr
    assert name in bad.stderr and bad.stderr.count("\n") == 1
    assert not (other / "files" / sha).exists()
    _no_part_files(other)
    good = _sync(up, other, "--from", str(synced_mirror.path))
    assert good.exit_code == 0, good.stderr


def test_a_changed_upstream_file_is_refused_and_leaves_nothing(mirror_upstream, tmp_path):
    up = mirror_upstream
    name, sha = up.files["input"]
    (up.root / "http" / "files" / name).write_text("#define STANDIN_INPUT 2\n")
    result = _sync(up, tmp_path / "mirror")
    assert result.exit_code == 24, result.stderr
    assert f"input {name}" in result.stderr and sha in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "mirror" / "files" / sha).exists()
    _no_part_files(tmp_path / "mirror")


def test_a_moved_tag_is_refused_and_not_mirrored(mirror_upstream, tmp_path):
    up = mirror_upstream
    top = up.git_root / "pytorch" / "pytorch.git"
    git("tag", "-f", "-a", "v1.4.0", "-m", "moved", up.commits["pytorch-1.5.0"], cwd=top)
    result = _sync(up, tmp_path / "mirror")
    assert result.exit_code == 21, result.stderr
    assert "supply-chain" in result.stderr
    repo = tmp_path / "mirror" / "git" / "pytorch" / "pytorch.git"
    assert git("tag", "--list", cwd=repo) == ""
    assert git("for-each-ref", cwd=repo) == ""


def test_an_unreachable_upstream_names_the_input(mirror_upstream, tmp_path):
    up = mirror_upstream
    git_root = up.git_root
    up.take_away()
    result = _sync(up, tmp_path / "mirror")
    assert result.exit_code == 23, result.stderr
    assert f"{git_root}/pytorch/pytorch.git" in result.stderr and "--from" in result.stderr


def test_unpinned_inputs_are_refused_before_anything_is_fetched(mirror_upstream, tmp_path):
    up = mirror_upstream
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(up.matrix.read_text().replace(up.wheel[1], "unknown"))
    result = _sync(up, tmp_path / "mirror", env=up.env(PATCHER_MATRIX=str(matrix)))
    assert result.exit_code == 13, result.stderr
    assert "standin-helper==1.0" in result.stderr
    assert not (tmp_path / "mirror").exists()


def test_sync_pushes_the_image_to_a_registry_with_its_digest(synced_mirror, tmp_path):
    up = synced_mirror.upstream
    site = start_registry(tmp_path / "site-registry")
    try:
        result = _sync(up, tmp_path / "mirror", "--from", str(synced_mirror.path), "--registry", site.url)
        assert result.exit_code == 0, result.stderr
        pushed = json.loads(result.stdout)["pushed_image"]
        assert pushed == f"{site.url}/patcher-test/mirror-tiny:v1@{up.image_digest}"
        resp = requests.get(f"{site.http}/v2/patcher-test/mirror-tiny/manifests/{up.image_digest}", timeout=10,
                            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        assert resp.status_code == 200
        assert "sha256:" + hashlib.sha256(resp.content).hexdigest() == up.image_digest
    finally:
        site.stop()


def test_download_resumes_over_http_with_range_requests(tmp_path):
    """A server that honours Range gets asked only for the missing tail; a complete part gets 416."""
    import http.server
    import threading

    from patcher.mirror import download

    content = bytes(range(256)) * 400
    sha = hashlib.sha256(content).hexdigest()
    ranges: list[str | None] = []

    class RangeHandler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            header = self.headers.get("Range")
            ranges.append(header)
            start = int(header.split("=")[1].rstrip("-")) if header else 0
            if start >= len(content):
                self.send_response(416)
                self.end_headers()
                return
            body = content[start:]
            self.send_response(206 if header else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/blob"
        dest = tmp_path / "files" / sha
        dest.parent.mkdir()
        Path(f"{dest}.part").write_bytes(content[:30000])
        assert download(url, dest, sha, "test blob") == len(content) - 30000
        assert ranges[-1] == "bytes=30000-" and dest.read_bytes() == content

        again = tmp_path / "again" / sha
        again.parent.mkdir()
        Path(f"{again}.part").write_bytes(content)
        assert download(url, again, sha, "test blob") == 0
        assert ranges[-1] == f"bytes={len(content)}-" and again.read_bytes() == content
    finally:
        server.shutdown()
        server.server_close()


def test_two_syncs_never_write_one_mirror_at_once(synced_mirror, tmp_path):
    import fcntl

    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with open(mirror / ".patcher-mirror.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = _sync(synced_mirror.upstream, mirror, "--from", str(synced_mirror.path))
    assert result.exit_code == 20 and "another sync is writing" in result.stderr
    assert sorted(p.name for p in mirror.iterdir()) == [".patcher-mirror.lock"]


@pytest.mark.docker
def test_the_image_archive_loads_into_the_engine(synced_mirror, docker_client):
    """The OCI layout archive also carries manifest.json, so `docker load` (engine 20.10) reads it."""
    archive = next((synced_mirror.path / "images").glob("*.tar"))
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())[0]
    config_digest = "sha256:" + manifest["Config"].rsplit("/", 1)[1]
    with open(archive, "rb") as fh:
        loaded = docker_client.images.load(fh.read())
    try:
        assert [image.id for image in loaded] == [config_digest]
    finally:
        for image in loaded:
            for tag in image.tags:
                docker_client.images.remove(tag)
