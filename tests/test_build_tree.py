"""`patcher build --keep-build-tree`: the build tree in a volume of its own, synced by content.

Unit tests cover the sync plan (pure); the integration test builds the stand-in twice with one
patch changed in between and checks that only the unit the patch touches recompiled, and that
the wheel is the one a build from a fresh tree gives.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from patcher import build_tree
from patcher.buildenv import source_archive
from patcher.record import BuildRecord, BuildTreeUse

TRACKED = [(0o100644, "a" * 40, "csrc/add.cpp"), (0o100644, "b" * 40, "setup.py"),
           (0o160000, "c" * 40, "third_party/dep"), (0o100644, "d" * 40, "third_party/dep/include/dep.h")]


def _manifest(files: dict[str, str], **extra) -> bytes:
    return json.dumps({"format": build_tree.MANIFEST_FORMAT, "files": files, **extra}).encode()


def test_manifest_lists_files_not_submodule_commits_and_inputs_replace_tracked_files():
    manifest = build_tree.source_manifest(TRACKED, [("setup.py", b"pinned"), ("third_party/x.h", b"x")])
    assert "third_party/dep" not in manifest
    assert manifest["csrc/add.cpp"] == "100644 " + "a" * 40
    assert manifest["setup.py"] == "input " + hashlib.sha256(b"pinned").hexdigest()
    assert manifest["third_party/x.h"].startswith("input ")


def test_a_new_volume_gets_every_file():
    current = build_tree.source_manifest(TRACKED, [])
    sync = build_tree.plan_sync(None, current)
    assert sync.everything and sync.reason == "new build tree" and set(sync.write) == set(current)


def test_a_reused_tree_gets_only_what_changed_and_loses_what_is_gone():
    before = {"csrc/add.cpp": "100644 " + "0" * 40, "setup.py": "100644 " + "b" * 40, "csrc/old.cpp": "100644 x"}
    sync = build_tree.plan_sync(_manifest(before), build_tree.source_manifest(TRACKED, []))
    assert sync.reused
    assert sync.write == ("csrc/add.cpp", "third_party/dep/include/dep.h")
    assert sync.remove == ("csrc/old.cpp",)


@pytest.mark.parametrize("found, reason", [
    (_manifest({}, dirty=True), "an earlier sync did not finish"),
    (b"not json", "build tree manifest unreadable"),
    (json.dumps({"format": 99, "files": {}}).encode(), "build tree manifest unreadable"),
])
def test_a_tree_whose_state_is_not_known_is_rewritten_whole(found, reason):
    current = build_tree.source_manifest(TRACKED, [])
    sync = build_tree.plan_sync(found, current)
    assert sync.everything and sync.reason == reason and set(sync.write) == set(current)


def test_the_volume_is_named_by_spec_and_image():
    from patcher.config import Settings
    from patcher.spec import resolve

    spec = resolve(Settings(), "1.13.1", cuda="none")
    name = build_tree.volume_name(spec, "sha256:" + "1" * 64, 1670000000)
    assert name == build_tree.volume_name(spec, "sha256:" + "1" * 64, 1670000000)
    assert name != build_tree.volume_name(spec, "sha256:" + "2" * 64, 1670000000)
    assert name.startswith("patcher-tree-torch-1.13.1-cpu")


def test_the_delta_archive_holds_the_changed_files_and_the_next_manifest(tmp_path):
    import subprocess

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt"):
        (tree / name).write_text(name + "\n")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "add", "."], check=True)
    archive = tmp_path / "delta.tar"
    source_archive(tree, [("pinned.h", b"p")], 1234, archive, only={"sub/c.txt", "pinned.h"},
                   extra_files={".next": b"m"})
    with tarfile.open(archive) as tar:
        files = {m.name: m for m in tar.getmembers() if m.isfile()}
    assert sorted(files) == [".next", "pinned.h", "sub/c.txt"]
    assert files["sub/c.txt"].mtime == 1234


def test_the_record_keeps_how_the_tree_was_used():
    use = BuildTreeUse(volume="patcher-tree-x", reused=True, written=1, removed=0)
    data = {"build_id": "b", "spec": {}, "base_image_digest": "d", "started": "t",
            "build_tree": {"volume": "patcher-tree-x", "reused": True, "written": 1, "removed": 0}}
    assert BuildRecord.from_json(data, partial=True).build_tree == use


def test_keep_build_tree_and_check_reproducible_are_refused_together(patcher_cli):
    res = patcher_cli("build", "--torch", "1.4.0", "--cuda", "none", "--keep-build-tree", "--check-reproducible")
    assert res.exit_code == 2
    assert "--keep-build-tree and --check-reproducible exclude each other" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.docker
def test_a_rebuild_after_one_patch_changed_compiles_one_unit_and_gives_the_fresh_trees_wheel(
        standin_factory, tmp_path, patcher_cli, docker_client, no_leaks, ccache_volume_name):
    variant = standin_factory("reproducible")
    kept = tmp_path / "kept"
    tree_volumes: set[str] = set()
    try:
        first = patcher_cli(*variant.build_args(kept, "--ccache-volume", ccache_volume_name, "--until", "wheel",
                                                "--keep-build-tree"), env=variant.env)
        assert first.exit_code == 0, first.stderr
        record = json.loads((kept / variant.build_id / "record.json").read_text())
        tree_volumes.add(record["build_tree"]["volume"])
        # configure made the tree (every file); the wheel stage found it with nothing changed
        assert (record["build_tree"]["reused"], record["build_tree"]["reason"]) == (False, "new build tree")
        assert record["build_tree"]["written"] > 1
        log = (kept / variant.build_id / "build.log").read_text()
        assert "build tree: new build tree" in log
        assert "stand-in: compiling 6 of 6 units" in log

        # One patch changes one line of one unit.
        patch = next((Path(variant.catalog) / "patches" / "1.4.0").glob("*.patch"))
        text = patch.read_text()
        if patch.is_symlink():
            patch.unlink()
        assert "+  return a + b;" in text
        patch.write_text(text.replace("+  return a + b;", "+  return b + a;", 1))

        again = patcher_cli(*variant.build_args(kept, "--ccache-volume", ccache_volume_name, "--until", "wheel",
                                                "--keep-build-tree"), env=variant.env)
        assert again.exit_code == 0, again.stderr
        record = json.loads((kept / variant.build_id / "record.json").read_text())
        assert record["build_tree"] == {"volume": next(iter(tree_volumes)), "reused": True, "written": 1,
                                        "removed": 0, "reason": ""}
        log = (kept / variant.build_id / "build.log").read_text()
        assert "build tree reused: 1 files changed, 0 removed" in log  # configure's sync
        assert "build tree reused: 0 files changed, 0 removed" in log  # the wheel stage's
        assert "stand-in: compiling 1 of 6 units" in log
        incremental_sha = record["wheel"]["sha256"]

        fresh = tmp_path / "fresh"
        res = patcher_cli(*variant.build_args(fresh, "--ccache-volume", ccache_volume_name, "--until", "wheel"),
                          env=variant.env)
        assert res.exit_code == 0, res.stderr
        fresh_record = json.loads((fresh / variant.build_id / "record.json").read_text())
        assert "build_tree" not in fresh_record
        assert fresh_record["wheel"]["sha256"] == incremental_sha
    finally:
        for name in tree_volumes:
            docker_client.volumes.get(name).remove(force=True)
