"""A publish recycles the oldest kept generation: it changes only the links that differ, keeps
readers consistent, and a publish that fails midway leaves the index as readers saw it."""

from __future__ import annotations

import json
import os
import random
import time

import pytest
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from patcher import index
from patcher.errors import PublishError
from tests.fixtures.index_env import write_minimal_wheel
from tests.test_index_atomic import _assert_complete
from tests.test_index_static import _tree_state


def _generations(idx):
    return sorted((g for g in os.listdir(idx / ".generations") if g.startswith("g")), key=lambda g: int(g[1:]))


def _links(idx, generation):
    gdir = idx / ".generations" / generation
    return {p: os.readlink(gdir / p) for p in os.listdir(gdir) if (gdir / p).is_symlink()}


def _assert_consistent(idx, expected_projects=None):
    """Every kept generation is complete; every stored page is linked by one; records chain up."""
    gens = _generations(idx)
    assert len(gens) <= index.KEEP_GENERATIONS
    assert not [n for n in os.listdir(idx / ".generations") if not n.startswith("g")]
    linked = set()
    for g in gens:
        _assert_complete(idx, f".generations/{g}")
        links = _links(idx, g)
        root = [a["name"] for a in json.loads((idx / ".generations" / g / "index.json").read_text())["projects"]]
        assert root == sorted(links)
        assert (idx / ".generations" / g / "index.html").read_text() == index.render_root_html(sorted(links))
        linked |= {(p, os.path.basename(t)) for p, t in links.items()}
    stored = {(p, v) for p in os.listdir(idx / ".projects") for v in os.listdir(idx / ".projects" / p)}
    assert stored == linked
    records = [json.loads((idx / ".generations" / g / ".manifest.json").read_text()) for g in gens]
    for before, after in zip(gens, records[1:]):
        if after.get("_format") == 2:  # (an older patcher's records say nothing of their order)
            assert after["base"] == before
    current = os.path.basename(os.readlink(idx / "simple"))
    assert current == gens[-1]
    if expected_projects is not None:
        assert sorted(_links(idx, current)) == sorted(expected_projects)


def _seed(tmp_path, projects=12):
    idx, src = tmp_path / "index", tmp_path / "wheels"
    src.mkdir()
    index.publish(idx, [write_minimal_wheel(src, f"pkg-{i}", "1.0") for i in range(projects)],
                  require_evidence=False)
    return idx, src


def test_a_publish_recycles_the_oldest_generation_and_touches_only_differing_links(tmp_path):
    idx, src = _seed(tmp_path)
    for i in range(index.KEEP_GENERATIONS - 1):  # fill the kept generations (these are built whole)
        index.publish(idx, [write_minimal_wheel(src, f"pkg-{i}", "2.0")], require_evidence=False)
    gens = _generations(idx)
    assert len(gens) == index.KEEP_GENERATIONS
    oldest = idx / ".generations" / gens[0]
    inode = os.stat(oldest).st_ino
    before = _links(idx, gens[-1])
    time.sleep(0.05)  # past the file system's timestamp granularity
    marker = tmp_path / "marker"
    marker.touch()
    since = os.stat(marker).st_ctime_ns

    result = index.publish(idx, [write_minimal_wheel(src, "pkg-9", "2.0")], require_evidence=False)
    new = idx / ".generations" / result.generation
    assert os.stat(new).st_ino == inode and not oldest.exists()  # the oldest one, renamed and patched
    after = _links(idx, result.generation)
    assert after == {**before, "pkg-9": f"../../.projects/pkg-9/{result.generation}"}
    # the projects changed since the oldest generation (pkg-0, pkg-1) and now (pkg-9) got new links;
    # every other link is the very one the oldest generation had
    relinked = {p for p in after if os.lstat(new / p).st_ctime_ns >= since}
    assert relinked == {"pkg-0", "pkg-1", "pkg-9"}
    record = json.loads((new / ".manifest.json").read_text())
    assert record == {"_format": 2, "generation": result.generation, "base": gens[-1], "changed": ["pkg-9"]}
    _assert_consistent(idx)


def test_a_sequence_of_publishes_yanks_and_rewrites_matches_a_model(tmp_path):
    idx, src = _seed(tmp_path, projects=6)
    rng = random.Random(22)
    model = {f"pkg-{i}": {f"pkg_{i}-1.0-py3-none-any.whl"} for i in range(6)}
    yanked: set[str] = set()
    for step in range(40):
        op = rng.choice(["existing", "existing", "existing", "new", "yank", "regenerate"])
        if op == "new":
            name = f"new-{step}"
            index.publish(idx, [write_minimal_wheel(src, name, "0.1")], require_evidence=False)
            model[name] = {f"new_{step}-0.1-py3-none-any.whl"}
        elif op == "existing":
            name = rng.choice(sorted(model))
            wheel = write_minimal_wheel(src, name, f"3.{step}")
            index.publish(idx, [wheel], require_evidence=False)
            model[name].add(wheel.name)
        elif op == "yank":
            filename = rng.choice(sorted(f for files in model.values() for f in files))
            index.yank(idx, filename, reason=f"step {step}")
            yanked.add(filename)
        else:
            index.regenerate(idx)
        _assert_consistent(idx, expected_projects=model)
        seen = index.read_index(idx)
        assert {p: {f.filename for f in files} for p, files in seen.items()} == model
        assert {f.filename for files in seen.values() for f in files if f.yanked} == yanked


def test_a_publish_that_fails_while_recycling_leaves_the_index_as_it_was(tmp_path, monkeypatch):
    idx, src = _seed(tmp_path)
    for i in range(index.KEEP_GENERATIONS):
        index.publish(idx, [write_minimal_wheel(src, f"pkg-{i}", "2.0")], require_evidence=False)
    seen = _tree_state(idx)
    current = os.readlink(idx / "simple")
    real_symlink = os.symlink

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index.os, "symlink", full_disk)
    wheel = write_minimal_wheel(src, "pkg-5", "2.0")
    with pytest.raises(PublishError, match="No space left on device"):
        index.publish(idx, [wheel], require_evidence=False)
    monkeypatch.setattr(index.os, "symlink", real_symlink)
    assert os.readlink(idx / "simple") == current
    assert _tree_state(idx) == seen
    _assert_complete(idx)

    # the next publish clears the half-recycled directory and the pages only it used
    result = index.publish(idx, [wheel], require_evidence=False)
    assert result.published == [wheel.name]
    assert not (idx / ".pending.json").exists()
    _assert_consistent(idx)
    # and, the kept generations refilled, publishes recycle again
    for i in range(index.KEEP_GENERATIONS):
        index.publish(idx, [write_minimal_wheel(src, f"pkg-{i}", "4.0")], require_evidence=False)
    _assert_consistent(idx)


def test_an_index_written_by_an_older_patcher_is_taken_over(tmp_path):
    idx, src = _seed(tmp_path)
    index.publish(idx, [write_minimal_wheel(src, "pkg-1", "2.0")], require_evidence=False)
    for g in _generations(idx):  # format 1: the record was a project -> page version map
        links = {p: os.path.basename(t) for p, t in _links(idx, g).items()}
        (idx / ".generations" / g / ".manifest.json").write_text(json.dumps(links))
    expected = {p: {f.filename for f in files} for p, files in index.read_index(idx).items()}
    for i in range(index.KEEP_GENERATIONS + 1):
        index.publish(idx, [write_minimal_wheel(src, "pkg-2", f"5.{i}")], require_evidence=False)
        expected["pkg-2"].add(f"pkg_2-5.{i}-py3-none-any.whl")
        _assert_consistent(idx)
    assert {p: {f.filename for f in files} for p, files in index.read_index(idx).items()} == expected


def test_regenerate_keeps_unchanged_pages_and_repairs_damaged_ones(tmp_path):
    idx, src = _seed(tmp_path, projects=4)
    current = os.readlink(idx / "simple")
    links = _links(idx, os.path.basename(current))
    page = idx / ".projects" / "pkg-2" / os.path.basename(links["pkg-2"]) / "index.html"
    page.unlink()
    page.write_text("damaged\n")
    result = index.regenerate(idx)
    after = _links(idx, result.generation)
    assert {p for p in after if after[p] != links[p]} == {"pkg-2"}
    assert json.loads((idx / "simple" / ".manifest.json").read_text())["changed"] == ["pkg-2"]
    assert "pkg_2-1.0-py3-none-any.whl" in (idx / "simple" / "pkg-2" / "index.html").read_text()
    _assert_consistent(idx)


@pytest.mark.parametrize("filename", [
    "torch-1.4.0+cu101.pt1-cp36-cp36m-linux_x86_64.whl", "Foo.Bar_baz-1.0-py3-none-any.whl",
    "pkg-1.0-1build-py3-none-any.whl", "pkg-1.0-py2.py3-none-any.whl", "pkg-01.00.0-py3-none-any.whl",
    "pkg-1.0-x-py3-none-any.whl", "pkg-1.0-py3-none.whl", "pkg-not.a.version-py3-none-any.whl",
    "pkg__x-1.0-py3-none-any.whl", "-1.0-py3-none-any.whl", "pkg-1.0-py3-none-any.zip",
    "pkg-1.0-1-2-py3-none-any.whl", "pkg-1.0--none-any.whl",
])
def test_the_fast_wheel_name_reader_agrees_with_packaging(filename):
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        with pytest.raises(InvalidWheelFilename):
            index.wheel_project_version(filename)
    else:
        assert index.wheel_project_version(filename) == (str(name), str(version))


def test_write_index_from_a_package_list(tmp_path):
    listing = tmp_path / "packages.jsonl"
    sha = "ab" * 32
    listing.write_text("\n".join(json.dumps(item) for item in [
        {"filename": "torch-1.4.0+cpu.pt1-cp36-cp36m-linux_x86_64.whl", "hash": f"sha256={sha}",
         "requires_python": ">=3.6", "core_metadata": f"sha256={sha}", "upload_timestamp": 1577836800},
        {"filename": "Torch-1.5.0-py3-none-any.whl", "hash": f"sha256={sha}", "yanked_reason": "bad"},
    ]) + "\n")
    entries = index.read_package_list(listing)
    assert [(e.project, e.version, e.yanked) for e in entries] == [("torch", "1.4.0+cpu.pt1", False),
                                                                   ("torch", "1.5.0", True)]
    assert entries[0].upload_time == "2020-01-01T00:00:00.000000Z" and entries[1].upload_time == ""
    index.write_index(tmp_path / "index", entries)
    page = json.loads((tmp_path / "index" / "simple" / "torch" / "index.json").read_text())
    assert page["versions"] == ["1.4.0+cpu.pt1", "1.5.0"]
    assert page["files"][0]["core-metadata"] == {"sha256": sha} and page["files"][1]["yanked"] == "bad"
    listing.write_text('{"filename": "torch.tar.gz", "hash": "sha256=00"}\n')
    with pytest.raises(PublishError, match="packages.jsonl:1: not a package list entry"):
        index.read_package_list(listing)


def test_damaged_records_and_notes_touch_nothing_outside_the_index(tmp_path):
    idx, src = _seed(tmp_path)
    for i in range(index.KEEP_GENERATIONS):
        index.publish(idx, [write_minimal_wheel(src, f"pkg-{i}", "2.0")], require_evidence=False)
    outside = tmp_path / "outside"
    (outside / "g000001").mkdir(parents=True)
    current = idx / "simple" / ".manifest.json"
    record = json.loads(current.read_text())
    record["changed"] = ["../../../outside"]
    current.unlink()
    current.write_text(json.dumps(record))
    (idx / ".pending.json").write_text(json.dumps({"generation": "g000001", "projects": ["../../outside"],
                                                   "dropped": {"../../outside": "g000001"}}))
    index.publish(idx, [write_minimal_wheel(src, "pkg-7", "2.0")], require_evidence=False)
    assert (outside / "g000001").is_dir()
    _assert_consistent(idx)
