"""Index updates are atomic: readers see one complete generation; a killed publish changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from patcher import index
from tests.fixtures.index_env import serve_directory, write_minimal_wheel
from tests.test_index_static import _tree_state, anchors


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, "publish never reached the pause point"
        time.sleep(0.02)


def _assert_complete(idx: Path, simple: str = "simple") -> None:
    """Every project the root lists has pages, and every file a page names is there with its hash.

    ``simple``: the path a reader walks (a generation directory to walk one snapshot)."""
    base = idx / simple
    root = [a["href"].rstrip("/") for a in anchors(base / "index.html")]
    assert root == [p["name"] for p in json.loads((base / "index.json").read_text())["projects"]]
    for project in root:
        for a in anchors(base / project / "index.html"):
            url, _, fragment = a["href"].partition("#sha256=")
            path = idx / os.path.normpath(f"simple/{project}/{url}")  # as a URL resolves, not the fs
            assert hashlib.sha256(path.read_bytes()).hexdigest() == fragment
            meta = Path(str(path) + ".metadata")
            assert a["data-core-metadata"] == "sha256=" + hashlib.sha256(meta.read_bytes()).hexdigest()


def _start_paused_publish(idx, wheel, release):
    env = dict(os.environ, **{index.PAUSE_ENV: str(release)})
    return subprocess.Popen([sys.executable, "-m", "patcher", "publish", "--index", str(idx), str(wheel)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _seed(tmp_path):
    idx = tmp_path / "index"
    src = tmp_path / "wheels"
    src.mkdir()
    index.publish(idx, [write_minimal_wheel(src, "torch", "1.4.0+cpu.pt1", evidence=True),
                        write_minimal_wheel(src, "helper", "1.0", evidence=True)])
    return idx, src


def test_publish_killed_midway_leaves_the_old_index_intact(tmp_path):
    idx, src = _seed(tmp_path)
    old = _tree_state(idx)
    new = write_minimal_wheel(src, "torch", "1.4.0+cu101.pt1", evidence=True)
    release = tmp_path / "release"
    proc = _start_paused_publish(idx, new, release)
    try:
        _wait_for(Path(str(release) + ".waiting"), proc)
        # mid-publish: the new wheel is already in files/, the new pages are written, not switched
        assert (idx / "files" / new.name).is_file()
        assert _tree_state(idx) == old
        with serve_directory(idx) as url:
            with urllib.request.urlopen(url + "/simple/torch/") as resp:
                assert resp.read() == old["simple/torch/index.html"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert _tree_state(idx) == old
    _assert_complete(idx)

    # the next publish clears what the killed one left and succeeds (the lock died with it)
    result = index.publish(idx, [new])
    assert result.published == [new.name]
    assert new.name in (idx / "simple" / "torch" / "index.html").read_text()
    _assert_complete(idx)
    assert not (idx / ".incoming").exists() and not (idx / ".pending.json").exists()
    assert not [n for n in os.listdir(idx / ".generations") if n.startswith(".tmp-")]
    assert not [n for n in os.listdir(idx / ".projects" / "torch") if n.startswith(".tmp-")]
    assert sorted(os.listdir(idx / ".projects" / "torch")) == sorted(
        {os.path.basename(os.readlink(idx / ".generations" / g / "torch"))
         for g in os.listdir(idx / ".generations")})


def test_paused_publish_completes_when_released(tmp_path):
    idx, src = _seed(tmp_path)
    new = write_minimal_wheel(src, "torch", "1.4.0+cu101.pt1", evidence=True)
    release = tmp_path / "release"
    proc = _start_paused_publish(idx, new, release)
    try:
        _wait_for(Path(str(release) + ".waiting"), proc)
        release.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"published {new.name}" in out
    assert new.name in (idx / "simple" / "torch" / "index.html").read_text()
    _assert_complete(idx)


def test_readers_during_publishes_always_see_complete_pages(tmp_path):
    idx, src = _seed(tmp_path)
    wheels = [write_minimal_wheel(src, f"p{i % 3}", f"1.{i}", evidence=True) for i in range(12)]
    errors: list[str] = []
    stop = threading.Event()
    seen = 0

    def reader():
        # Each walk reads one snapshot: the generation `simple` names when the walk starts.
        # A generation stays readable for KEEP_GENERATIONS - 1 further publishes; a walk that
        # outlived that (a starved thread on a loaded machine) is retried, not counted.
        nonlocal seen
        while not stop.is_set():
            generation = os.readlink(idx / "simple")
            try:
                _assert_complete(idx, generation)
                seen += 1
            except Exception as exc:  # noqa: BLE001 - report any inconsistency
                if (idx / generation).exists():
                    errors.append(f"{generation}: {exc!r}")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for wheel in wheels:
            index.publish(idx, [wheel])
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[:3]
    assert seen > 0
    assert len(index.read_index(idx)) == 5
