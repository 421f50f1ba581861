"""`patcher mirror bundle` / `unbundle`: one tar, every member checked before anything lands."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from tests.fixtures.common import run_patcher


@pytest.fixture(scope="module")
def bundled(synced_mirror, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "mirror.tar"
    result = run_patcher("mirror", "bundle", "--from", str(synced_mirror.path), "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    return out, json.loads(result.stdout)


def _unbundle(archive, dest):
    return run_patcher("mirror", "unbundle", str(archive), "--to", str(dest))


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if ".unbundle-" in p.name or p.name.endswith(".part"))


def test_bundle_round_trip_gives_a_complete_mirror(bundled, synced_mirror, tmp_path):
    archive, info = bundled
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile(names[0]).read())
    assert names[0] == "BUNDLE-MANIFEST.json"
    assert set(manifest["files"]) == {n[len("mirror/"):] for n in names[1:]}
    assert "mirror-manifest.json" in manifest["files"] and info["files"] == len(names) - 1
    assert all(len(e["sha256"]) == 64 for e in manifest["files"].values())

    result = _unbundle(archive, tmp_path / "site")
    assert result.exit_code == 0, result.stderr
    assert "all checksums match" in result.stdout
    check = run_patcher(*synced_mirror.check_args(tmp_path / "site"), env=synced_mirror.upstream.env())
    assert check.exit_code == 0, check.stdout + check.stderr


def _rewrite(archive, dest, change):
    """Copy a bundle member by member, letting ``change(name, data)`` alter or drop members."""
    with tarfile.open(archive) as src, tarfile.open(dest, "w") as out:
        for member in src:
            data = src.extractfile(member).read()
            data = change(member.name, data)
            if data is None:
                continue
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    return dest


def test_a_damaged_member_is_refused_and_nothing_is_left(bundled, tmp_path):
    archive, _ = bundled

    def flip(name, data):
        return data[:-1] + bytes([data[-1] ^ 1]) if name.startswith("mirror/files/") and data else data

    damaged = _rewrite(archive, tmp_path / "damaged.tar", flip)
    result = _unbundle(damaged, tmp_path / "site")
    assert result.exit_code == 82
    assert "files/" in result.stderr and "the bundle manifest says" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "site").exists() and _leftovers(tmp_path) == []


def test_truncated_foreign_and_hostile_bundles_are_refused(bundled, tmp_path):
    archive, _ = bundled
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    dropped = _rewrite(archive, tmp_path / "dropped.tar",
                       lambda name, data: None if name.startswith("mirror/wheelhouse/") else data)

    foreign = tmp_path / "foreign.tar"
    with tarfile.open(foreign, "w") as tar:
        tar.addfile(tarfile.TarInfo("README"), io.BytesIO(b""))

    hostile = tmp_path / "hostile.tar"
    with tarfile.open(archive) as src, tarfile.open(hostile, "w") as out:
        first = src.next()
        manifest = json.loads(src.extractfile(first).read())
        manifest["files"]["../escaped"] = {"sha256": "0" * 64, "size": 1}
        body = json.dumps(manifest).encode()
        first.size = len(body)
        out.addfile(first, io.BytesIO(body))
        evil = tarfile.TarInfo("mirror/../escaped")
        evil.size = 1
        out.addfile(evil, io.BytesIO(b"x"))

    for bad, words in ((truncated, "truncated"), (dropped, "lacks"), (foreign, "not a patcher bundle"),
                       (hostile, "not a plain file inside mirror/")):
        dest = tmp_path / f"site-{bad.stem}"
        result = _unbundle(bad, dest)
        assert result.exit_code == 82, (bad, result.stderr)
        assert words in result.stderr, result.stderr
        assert not dest.exists()
    assert not (tmp_path / "escaped").exists() and _leftovers(tmp_path) == []


def test_unbundle_refuses_a_non_empty_destination(bundled, tmp_path):
    archive, _ = bundled
    dest = tmp_path / "site"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine\n")
    result = _unbundle(archive, dest)
    assert result.exit_code == 82 and "not empty" in result.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["keep.txt"]


def test_bundle_of_a_directory_that_is_not_a_mirror(tmp_path):
    (tmp_path / "plain").mkdir()
    result = run_patcher("mirror", "bundle", "--from", str(tmp_path / "plain"), "-o", str(tmp_path / "x.tar"))
    assert result.exit_code == 82 and "is not a mirror" in result.stderr
    assert not (tmp_path / "x.tar").exists() and not (tmp_path / "x.tar.part").exists()
