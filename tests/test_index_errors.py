"""Error paths of the publish stage that the end-to-end tests do not reach, called as functions."""

from __future__ import annotations

import http.server
import json
import os
import threading
import zipfile

import pytest

from patcher import index
from patcher.errors import PublishError, UploadError
from tests.fixtures.index_env import write_minimal_wheel


def _rewrite_metadata(wheel, text, extra_member=None):
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    for name in members:
        if name.endswith(".dist-info/METADATA"):
            members[name] = text.encode()
    if extra_member:
        members[extra_member] = text.encode()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def test_metadata_must_match_the_file_name(tmp_path):
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1", evidence=True)
    _rewrite_metadata(wheel, "Metadata-Version: 2.1\nName: torch\nVersion: 1.5.0\n")
    with pytest.raises(PublishError, match="its METADATA says torch 1.5.0"):
        index.publish(tmp_path / "index", [wheel])
    assert not (tmp_path / "index" / "simple").exists()


def test_wheel_with_two_metadata_files(tmp_path):
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1", evidence=True)
    _rewrite_metadata(wheel, "Metadata-Version: 2.1\nName: torch\nVersion: 1.4.0+cpu.pt1\n",
                      extra_member="other-1.0.dist-info/METADATA")
    with pytest.raises(PublishError, match="2 .dist-info/METADATA files"):
        index.publish(tmp_path / "index", [wheel])


def test_same_file_twice_and_nothing_given(tmp_path):
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1", evidence=True)
    with pytest.raises(PublishError, match="given twice"):
        index.publish(tmp_path / "index", [wheel, wheel])
    with pytest.raises(PublishError, match="no wheels given"):
        index.publish(tmp_path / "index", [])


def test_damaged_index_is_reported_not_overwritten(tmp_path):
    idx = tmp_path / "index"
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1", evidence=True)
    index.publish(idx, [wheel])
    generation = idx / os.readlink(idx / "simple")
    page = idx / ".projects" / "torch" / os.path.basename(os.readlink(generation / "torch")) / "index.json"
    page.write_text("{")
    other = write_minimal_wheel(tmp_path, "torch", "1.4.0+cu101.pt1", evidence=True)
    with pytest.raises(PublishError, match="is damaged"):
        index.publish(idx, [other])
    (generation / ".manifest.json").write_text("[")
    with pytest.raises(PublishError, match="generation .* is damaged"):
        index.publish(idx, [other])
    os.unlink(idx / "simple")
    os.symlink("elsewhere", idx / "simple")
    with pytest.raises(PublishError, match="not at a patcher index generation"):
        index.publish(idx, [other])


def test_unwritable_index_leaves_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1", evidence=True)
    with pytest.raises(PublishError, match="cannot use index directory"):
        index.publish(blocker / "index", [wheel])


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 500
    headers_out: dict = {}

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(self.status)
        for key, value in self.headers_out.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "21")
        self.end_headers()
        self.wfile.write(b"storage backend down\n")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, headers, message", [
    (500, {}, "HTTP 500 storage backend down"),
    (308, {"Location": "https://elsewhere/legacy/"}, "redirects to https://elsewhere/legacy/"),
])
def test_upload_server_answers(tmp_path, status, headers, message):
    handler = type("Handler", (_Answer,), {"status": status, "headers_out": headers})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1")
        with pytest.raises(UploadError, match=message):
            index.upload(f"http://127.0.0.1:{server.server_port}/", [wheel], "u", "p")
    finally:
        server.shutdown()
        server.server_close()


def test_yank_needs_a_wheel_name(tmp_path):
    with pytest.raises(PublishError, match="not a wheel file name"):
        index.yank(tmp_path, "torch-1.0.tar.gz", reason="x")


def test_read_index_lists_what_readers_see(tmp_path):
    idx = tmp_path / "index"
    wheels = [write_minimal_wheel(tmp_path, n, "1.0", evidence=True) for n in ("b-pkg", "a_pkg")]
    index.publish(idx, wheels)
    seen = index.read_index(idx)
    assert list(seen) == ["a-pkg", "b-pkg"]
    assert json.loads((idx / "simple" / "index.json").read_text())["projects"] == [{"name": "a-pkg"},
                                                                                    {"name": "b-pkg"}]
