"""The static index: pages per PEP 503/691/658/714/592, evidence beside wheels, incremental updates."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import zipfile
from html.parser import HTMLParser

import pytest

from patcher import index
from patcher.errors import AlreadyPublishedError, IndexLockedError, PublishError
from tests.fixtures.index_env import write_minimal_wheel


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.anchors = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.anchors.append(dict(attrs))


def anchors(path):
    parser = _Anchors()
    parser.feed(path.read_text())
    return parser.anchors


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_publish_certified_wheel_writes_every_page_and_the_evidence(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    idx = tmp_path / "index"
    res = patcher_cli("publish", "--index", idx, b.wheel)
    assert res.exit_code == 0, res.stderr
    assert f"published {b.wheel.name}" in res.stdout
    assert (idx / "simple").is_symlink()
    files = idx / "files"
    for suffix in ("", ".metadata", ".intoto.jsonl", ".cdx.json", ".probe.json", ".vex.json"):
        assert (files / (b.wheel.name + suffix)).is_file(), suffix
    for suffix in ("", ".intoto.jsonl", ".cdx.json", ".probe.json", ".vex.json"):
        assert (files / (b.wheel.name + suffix)).read_bytes() == (b.dist / (b.wheel.name + suffix)).read_bytes()
    with zipfile.ZipFile(b.wheel) as zf:
        metadata = zf.read("torch-1.4.0+cu101.pt1.dist-info/METADATA")
    assert (files / (b.wheel.name + ".metadata")).read_bytes() == metadata
    meta_sha = hashlib.sha256(metadata).hexdigest()

    assert anchors(idx / "simple" / "index.html") == [{"href": "torch/"}]
    root = json.loads((idx / "simple" / "index.json").read_text())
    assert root == {"meta": {"api-version": "1.1"}, "projects": [{"name": "torch"}]}

    page = idx / "simple" / "torch" / "index.html"
    assert '<meta name="pypi:repository-version" content="1.1">' in page.read_text()
    assert 'data-requires-python="&gt;=3.6"' in page.read_text()
    [a] = anchors(page)
    assert a["href"] == f"../../files/{b.wheel.name}#sha256={_sha(b.wheel)}"
    assert a["data-requires-python"] == ">=3.6"
    assert a["data-core-metadata"] == a["data-dist-info-metadata"] == f"sha256={meta_sha}"
    assert "data-yanked" not in a

    doc = json.loads((idx / "simple" / "torch" / "index.json").read_text())
    assert doc["meta"] == {"api-version": "1.1"} and doc["name"] == "torch"
    assert doc["versions"] == ["1.4.0+cu101.pt1"]
    [f] = doc["files"]
    assert f["filename"] == b.wheel.name and f["url"] == f"../../files/{b.wheel.name}"
    assert f["hashes"] == {"sha256": _sha(b.wheel)} and f["size"] == b.wheel.stat().st_size
    assert f["requires-python"] == ">=3.6" and f["yanked"] is False
    assert f["core-metadata"] == f["dist-info-metadata"] == {"sha256": meta_sha}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", f["upload-time"])
    assert f["_patcher_evidence"] == {"intoto.jsonl": f"../../files/{b.wheel.name}.intoto.jsonl",
                                      "cdx.json": f"../../files/{b.wheel.name}.cdx.json",
                                      "probe.json": f"../../files/{b.wheel.name}.probe.json",
                                      "vex.json": f"../../files/{b.wheel.name}.vex.json"}
    # the published copy still verifies
    res = patcher_cli("verify", files / b.wheel.name, "--key", b.public_key, "--catalog", b.catalog)
    assert res.exit_code == 0, res.stderr


def test_yank_and_unyank(tmp_path, patcher_cli):
    idx = tmp_path / "index"
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cu101.pt1", evidence=True)
    assert patcher_cli("publish", "--index", idx, wheel).exit_code == 0
    res = patcher_cli("yank", "--index", idx, wheel.name, "--reason", "probe regression <PT-0001>")
    assert res.exit_code == 0, res.stderr
    [a] = anchors(idx / "simple" / "torch" / "index.html")
    assert a["data-yanked"] == "probe regression <PT-0001>"
    assert "&lt;PT-0001&gt;" in (idx / "simple" / "torch" / "index.html").read_text()
    [f] = json.loads((idx / "simple" / "torch" / "index.json").read_text())["files"]
    assert f["yanked"] == "probe regression <PT-0001>"
    assert patcher_cli("yank", "--index", idx, wheel.name).exit_code == 0
    [f] = json.loads((idx / "simple" / "torch" / "index.json").read_text())["files"]
    assert f["yanked"] is True  # yanked without a reason
    assert patcher_cli("yank", "--index", idx, wheel.name, "--undo").exit_code == 0
    assert "data-yanked" not in anchors(idx / "simple" / "torch" / "index.html")[0]
    res = patcher_cli("yank", "--index", idx, "torch-9.9.9-py3-none-any.whl", "--reason", "x")
    assert res.exit_code == 70 and "is not in the index" in res.stderr
    res = patcher_cli("yank", "--index", tmp_path / "empty", wheel.name)
    assert res.exit_code == 70 and "holds no index" in res.stderr
    assert not (tmp_path / "empty").exists()


def test_publish_errors(tmp_path, patcher_cli):
    idx = tmp_path / "index"
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1", evidence=True)
    assert patcher_cli("publish", "--index", idx, wheel).exit_code == 0
    before = sorted(str(p.relative_to(idx)) for p in idx.rglob("*"))

    again = patcher_cli("publish", "--index", idx, wheel)
    assert again.exit_code == 0 and "unchanged" in again.stdout

    other = tmp_path / "other"
    other.mkdir()
    changed = write_minimal_wheel(other, "torch", "1.4.0+cpu.pt1", requires_python=">=3.7", evidence=True)
    res = patcher_cli("publish", "--index", idx, changed)
    assert res.exit_code == AlreadyPublishedError.exit_code and "already in the index" in res.stderr

    bare = tmp_path / "bare"
    bare.mkdir()
    unsigned = write_minimal_wheel(bare, "torch", "1.5.0+cpu.pt1")
    res = patcher_cli("publish", "--index", idx, unsigned)
    assert res.exit_code == 70 and "patcher certify" in res.stderr

    not_zip = tmp_path / "torch-2.0.0-py3-none-any.whl"
    not_zip.write_text("nope")
    res = patcher_cli("publish", "--index", idx, not_zip)
    assert res.exit_code == 70 and "not a readable wheel" in res.stderr
    res = patcher_cli("publish", "--index", idx, tmp_path / "torch.tar.gz")
    assert res.exit_code == 70 and "not a wheel file name" in res.stderr

    for res in (again,):
        assert "Traceback" not in res.stderr
    after = sorted(str(p.relative_to(idx)) for p in idx.rglob("*"))
    # failed publishes changed nothing (the successful no-op republish made no new generation)
    assert after == before


def test_second_publish_waits_for_no_one_it_fails_fast_on_the_lock(tmp_path):
    idx = tmp_path / "index"
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1", evidence=True)
    idx.mkdir()
    with open(idx / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        with pytest.raises(IndexLockedError):
            index.publish(idx, [wheel])
    assert index.publish(idx, [wheel]).published == [wheel.name]


def test_not_a_patcher_index(tmp_path):
    idx = tmp_path / "index"
    (idx / "simple").mkdir(parents=True)
    wheel = write_minimal_wheel(tmp_path, "torch", "1.4.0+cpu.pt1", evidence=True)
    with pytest.raises(PublishError, match="not a link made by patcher publish"):
        index.publish(idx, [wheel])


def _tree_state(idx):
    """Every page a reader can reach through simple/, with its bytes."""
    state = {}
    for dirpath, _dirs, names in os.walk(idx / "simple", followlinks=True):
        for name in names:
            if name.startswith("."):
                continue  # the generation's own bookkeeping
            path = os.path.join(dirpath, name)
            state[os.path.relpath(path, idx)] = open(path, "rb").read()
    return state


def test_incremental_publish_rewrites_only_the_touched_project_and_the_root(tmp_path):
    idx = tmp_path / "index"
    src = tmp_path / "wheels"
    src.mkdir()
    wheels = [write_minimal_wheel(src, f"pkg-{i}", f"1.{v}", evidence=True) for i in range(20) for v in range(3)]
    index.publish(idx, wheels)
    gen_before = os.readlink(idx / "simple")
    links_before = {p: os.readlink(idx / "simple" / p) for p in os.listdir(idx / "simple") if p.startswith("pkg")}
    pages_before = {p: os.stat(idx / "simple" / p / "index.html").st_ino for p in links_before}

    new = write_minimal_wheel(src, "pkg-7", "2.0", evidence=True)
    result = index.publish(idx, [new])
    assert result.projects == ["pkg-7"] and result.published == [new.name]
    assert os.readlink(idx / "simple") != gen_before
    links_after = {p: os.readlink(idx / "simple" / p) for p in links_before}
    assert [p for p in links_before if links_after[p] != links_before[p]] == ["pkg-7"]
    for project, inode in pages_before.items():
        if project != "pkg-7":
            assert os.stat(idx / "simple" / project / "index.html").st_ino == inode
    assert [a["href"].split("#")[0] for a in anchors(idx / "simple" / "pkg-7" / "index.html")][-1] == \
        "../../files/pkg_7-2.0-py3-none-any.whl"

    # a full regeneration gives the same pages (yanks and upload times carried over)
    index.yank(idx, "pkg_3-1.1-py3-none-any.whl", reason="bad")
    incremental = _tree_state(idx)
    index.regenerate(idx)
    assert _tree_state(idx) == incremental
    # old generations are dropped beyond the few kept for readers in flight, and with them every
    # page version no kept generation links to (also of projects the last publishes did not touch)
    for i in range(index.KEEP_GENERATIONS + 1):
        index.publish(idx, [write_minimal_wheel(src, "pkg-0", f"3.{i}", evidence=True)])
    gens = [g for g in os.listdir(idx / ".generations") if g.startswith("g")]
    assert len(gens) == index.KEEP_GENERATIONS
    linked = {(p, os.path.basename(os.readlink(idx / ".generations" / g / p)))
              for g in gens for p in os.listdir(idx / ".generations" / g) if not p.endswith((".html", ".json"))}
    stored = {(p, v) for p in os.listdir(idx / ".projects") for v in os.listdir(idx / ".projects" / p)}
    assert stored == linked
