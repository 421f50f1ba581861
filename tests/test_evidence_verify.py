"""verify: a certified wheel passes; each kind of tampering fails with its own message and code."""

from __future__ import annotations

import base64
import json
import shutil

from patcher import evidence, keys
from tests.fixtures.index_env import make_probe_report


def _flip_byte(path, offset=-40):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _verify(cli, b, *extra, key=None):
    return cli("verify", b.wheel, "--key", key or b.public_key, "--catalog", b.catalog, *extra)


def _assert_fails(res, code, message):
    assert res.exit_code == code, (res.exit_code, res.stderr)
    assert message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_certified_wheel_verifies(certified_bundle, patcher_cli):
    b = certified_bundle
    res = _verify(patcher_cli, b)
    assert res.exit_code == 0, res.stderr
    assert f"verified {b.wheel.name}" in res.stdout
    series = (b.catalog / "patches" / "1.4.0" / "series").read_text().split()
    assert series and series[0] in res.stdout
    res = _verify(patcher_cli, b, "--json")
    assert json.loads(res.stdout)["patches"] == series


def test_verify_uses_the_configured_key_when_none_is_given(certified_bundle, patcher_cli):
    b = certified_bundle
    res = patcher_cli("verify", b.wheel, "--catalog", b.catalog, env={"PATCHER_KEY_PATH": str(b.key)})
    assert res.exit_code == 0, res.stderr


def test_one_byte_in_the_wheel(certified_bundle, patcher_cli):
    b = certified_bundle
    _flip_byte(b.wheel)
    _assert_fails(_verify(patcher_cli, b), 61, "the signed statement says")


def test_one_byte_in_the_statement(certified_bundle, patcher_cli):
    b = certified_bundle
    prov = b.dist / (b.wheel.name + ".intoto.jsonl")
    env = json.loads(prov.read_text())
    payload = bytearray(base64.b64decode(env["payload"]))
    at = payload.index(b'"invocationId":"') + len(b'"invocationId":"')
    payload[at] ^= 0x01  # still valid JSON, one byte differs
    env["payload"] = base64.b64encode(bytes(payload)).decode()
    prov.write_text(json.dumps(env) + "\n")
    _assert_fails(_verify(patcher_cli, b), 62, "was altered after signing")


def test_one_byte_in_a_catalog_patch(certified_bundle, patcher_cli):
    b = certified_bundle
    series_dir = b.catalog / "patches" / "1.4.0"
    patch = series_dir / (series_dir / "series").read_text().split()[-1]
    _flip_byte(patch, offset=200)
    _assert_fails(_verify(patcher_cli, b), 63, "has sha256")


def test_catalog_series_differs(certified_bundle, patcher_cli):
    b = certified_bundle
    series_dir = b.catalog / "patches" / "1.4.0"
    (series_dir / "9999-extra.patch").write_text("extra\n")
    with open(series_dir / "series", "a") as fh:
        fh.write("9999-extra.patch\n")
    _assert_fails(_verify(patcher_cli, b), 63, "the catalog's series for torch 1.4.0 is")


def test_wrong_key(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    other = tmp_path / "other.pem"
    keys.generate_key(other)
    _assert_fails(_verify(patcher_cli, b, key=other), 66, "not by the trusted key")


def test_failed_probe_report(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    failed = make_probe_report(tmp_path / "failed.json", passed=False)
    evidence.certify(b.record, failed, b.key, allow_failed_probe=True)
    _assert_fails(_verify(patcher_cli, b), 64, "did not pass")


def test_probe_report_replaced_after_signing(certified_bundle, patcher_cli):
    b = certified_bundle
    report = b.dist / (b.wheel.name + ".probe.json")
    data = json.loads(report.read_text())
    data["summary"]["skipped"] = 1
    report.write_text(json.dumps(data))
    _assert_fails(_verify(patcher_cli, b), 65, "probe report")


def test_sbom_replaced_after_signing(certified_bundle, patcher_cli):
    b = certified_bundle
    _flip_byte(b.dist / (b.wheel.name + ".cdx.json"), offset=100)
    _assert_fails(_verify(patcher_cli, b), 65, "SBOM")


def test_missing_or_broken_evidence(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    prov = b.dist / (b.wheel.name + ".intoto.jsonl")
    saved = prov.read_bytes()
    prov.write_text("not json\n")
    _assert_fails(_verify(patcher_cli, b), 65, "not JSON")
    prov.unlink()
    _assert_fails(_verify(patcher_cli, b), 65, "no provenance")
    prov.write_bytes(saved)
    renamed = b.wheel.with_name(b.wheel.name.replace("py3-none-any", "py2.py3-none-any"))
    shutil.copy(b.wheel, renamed)
    shutil.copy(prov, renamed.with_name(renamed.name + ".intoto.jsonl"))
    res = patcher_cli("verify", renamed, "--key", b.public_key, "--catalog", b.catalog)
    _assert_fails(res, 61, "the statement is about")
    _assert_fails(_verify(patcher_cli, b, key=tmp_path / "absent.pem"), 60, "no key at")
