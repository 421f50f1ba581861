"""The remaining error paths of certify/verify/keys, called as library functions (fast)."""

from __future__ import annotations

import base64
import json
import os

import pytest

from patcher import evidence, keys
from patcher.errors import (
    EvidenceFormatError,
    KeyMismatchError,
    PatchSeriesMismatchError,
    SignatureError,
    SigningKeyError,
)
from patcher.record import load_record, save_record


def _edit_record(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("changes, message", [
    ({"schema": 2}, "schema 2 is not supported"),
    ({"source": "not an object"}, "malformed"),
    ({"started": "yesterday"}, "not an ISO 8601 time"),
    ({"log_path": "gone.log"}, "does not exist and the record has no log_sha256"),
    ({"log_sha256": "0" * 64}, "the record says"),
])
def test_certify_refuses_bad_records(certified_bundle, tmp_path, changes, message):
    b = certified_bundle
    _edit_record(b.record, **changes)
    with pytest.raises(EvidenceFormatError, match=message):
        evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_certify_wheel_path_problems(certified_bundle, tmp_path):
    b = certified_bundle
    record = load_record(b.record)
    data = record.to_json()
    data["wheel"]["path"] = str(b.wheel.with_name("other.whl"))
    b.record.write_text(json.dumps(data))
    with pytest.raises(EvidenceFormatError, match="but its path is"):
        evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path / "out")
    save_record(record, b.record)
    b.wheel.unlink()
    with pytest.raises(EvidenceFormatError, match="does not exist"):
        evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path / "out")


def test_certify_log_digest_from_the_record_when_the_log_is_gone(certified_bundle, tmp_path):
    b = certified_bundle
    log = b.record.parent / "build.log"
    sha = evidence.sha256_file(log)
    log.unlink()
    _edit_record(b.record, log_sha256=sha)
    evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path / "out")
    assert (tmp_path / "out" / (b.wheel.name + ".intoto.jsonl")).is_file()


def test_certify_bad_probe_reports_and_epoch(certified_bundle, tmp_path, monkeypatch):
    b = certified_bundle
    with pytest.raises(EvidenceFormatError, match="does not exist"):
        evidence.certify(b.record, tmp_path / "none.json", b.key, out_dir=tmp_path / "out")
    broken = tmp_path / "broken.json"
    broken.write_text("[1, 2")
    with pytest.raises(EvidenceFormatError, match="not valid JSON"):
        evidence.certify(b.record, broken, b.key, out_dir=tmp_path / "out")
    broken.write_text('{"schema": 7, "passed": true, "checks": []}')
    with pytest.raises(EvidenceFormatError, match="not a schema 1 probe report"):
        evidence.certify(b.record, broken, b.key, out_dir=tmp_path / "out")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "soon")
    with pytest.raises(EvidenceFormatError, match="SOURCE_DATE_EPOCH"):
        evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_certify_output_directory_unusable(certified_bundle, tmp_path):
    b = certified_bundle
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(EvidenceFormatError, match="cannot create output directory"):
        evidence.certify(b.record, b.probe_report, b.key, out_dir=blocker / "out")


def _rewrite_envelope(b, mutate):
    prov = b.dist / (b.wheel.name + ".intoto.jsonl")
    env = json.loads(prov.read_text())
    mutate(env)
    prov.write_text(json.dumps(env) + "\n")


def _resign(b, statement_mutation):
    """A statement changed and signed again with the right key: only the content checks can catch it."""
    prov = b.dist / (b.wheel.name + ".intoto.jsonl")
    env = json.loads(prov.read_text())
    statement = json.loads(base64.b64decode(env["payload"]))
    statement_mutation(statement)
    new = evidence.sign_envelope(evidence.canonical_json(statement), keys.load_private_key(b.key))
    prov.write_text(json.dumps(new) + "\n")


@pytest.mark.parametrize("mutate, error, message", [
    (lambda e: e.update(payloadType="text/plain"), EvidenceFormatError, "payloadType"),
    (lambda e: e.update(payload="%%%"), EvidenceFormatError, "not valid base64"),
    (lambda e: e.update(signatures=["x"]), EvidenceFormatError, "not an object"),
    (lambda e: e.pop("signatures"), EvidenceFormatError, "no signatures"),
    (lambda e: e["signatures"][0].update(sig=base64.b64encode(b"\0" * 64).decode()), SignatureError,
     "was altered after signing"),
])
def test_verify_envelope_problems(certified_bundle, mutate, error, message):
    b = certified_bundle
    _rewrite_envelope(b, mutate)
    with pytest.raises(error, match=message):
        evidence.verify(b.wheel, b.public_key, b.catalog)


def test_keyid_is_only_a_hint(certified_bundle):
    """DSSE keyids are not signed: a changed keyid neither breaks nor fakes a valid signature."""
    b = certified_bundle
    _rewrite_envelope(b, lambda e: e["signatures"][0].update(keyid="f" * 64))
    assert evidence.verify(b.wheel, b.public_key, b.catalog).wheel == b.wheel.name


def test_keyid_mismatch_is_its_own_class(certified_bundle, tmp_path):
    b = certified_bundle
    other = tmp_path / "other.pem"
    keys.generate_key(other)
    with pytest.raises(KeyMismatchError):
        evidence.verify(b.wheel, other, b.catalog)


@pytest.mark.parametrize("mutation, error, message", [
    (lambda s: s.update(_type="https://in-toto.io/Statement/v0.1"), EvidenceFormatError, "not an in-toto"),
    (lambda s: s.update(predicateType="https://example.com/other"), EvidenceFormatError, "no SLSA provenance"),
    (lambda s: s["predicate"].pop("buildDefinition"), EvidenceFormatError, "lacks the SLSA provenance fields"),
    (lambda s: s["predicate"]["runDetails"].update(byproducts=[]), EvidenceFormatError, "no sbom byproduct"),
    (lambda s: s["predicate"]["runDetails"]["byproducts"][0].update(name="../x"), EvidenceFormatError,
     "not a plain file name"),
])
def test_verify_statement_content_problems(certified_bundle, mutation, error, message):
    b = certified_bundle
    _resign(b, mutation)
    with pytest.raises(error, match=message):
        evidence.verify(b.wheel, b.public_key, b.catalog)


def test_verify_empty_provenance_and_missing_wheel(certified_bundle, tmp_path):
    b = certified_bundle
    (b.dist / (b.wheel.name + ".intoto.jsonl")).write_text("\n")
    with pytest.raises(EvidenceFormatError, match="is empty"):
        evidence.verify(b.wheel, b.public_key, b.catalog)
    with pytest.raises(EvidenceFormatError, match="no wheel at"):
        evidence.verify(tmp_path / "torch-1.0-py3-none-any.whl", b.public_key, b.catalog)


def test_verify_series_names_a_missing_patch(certified_bundle):
    b = certified_bundle
    series = b.catalog / "patches" / "1.4.0" / "series"
    first = series.read_text().split()[0]
    os.unlink(series.parent / first)
    with pytest.raises(PatchSeriesMismatchError, match="which does not exist"):
        evidence.verify(b.wheel, b.public_key, b.catalog)


def test_key_file_errors(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SigningKeyError, match="cannot create directory"):
        keys.generate_key(blocker / "sub" / "k.pem")
    key = tmp_path / "k.pem"
    keys.generate_key(key)
    with pytest.raises(SigningKeyError, match="cannot write public key"):
        keys.export_public(key, out=blocker / "sub" / "pub.pem")
