"""certify: the in-toto statement, its DSSE envelope, the SBOM, and certify's error paths."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import uuid

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from patcher import evidence
from patcher.record import load_record, save_record
from tests.fixtures.index_env import make_build_record, make_probe_report


def _envelope(dist, wheel_name):
    lines = (dist / (wheel_name + ".intoto.jsonl")).read_text().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def _statement(envelope):
    return json.loads(base64.b64decode(envelope["payload"]))


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pae_matches_the_dsse_spec_example():
    # The example of the DSSE v1 protocol document.
    assert evidence.pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    # lengths are byte lengths, not character counts
    assert evidence.pae("t\u00e9", b"\xc3\xa9") == b"DSSEv1 3 t\xc3\xa9 2 \xc3\xa9"


def test_envelope_signs_the_pae_with_keyid_of_raw_public_key():
    key = Ed25519PrivateKey.generate()
    env = evidence.sign_envelope(b'{"a":1}', key)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert env["signatures"][0]["keyid"] == hashlib.sha256(raw).hexdigest()
    key.public_key().verify(base64.b64decode(env["signatures"][0]["sig"]),
                            evidence.pae(env["payloadType"], b'{"a":1}'))
    assert evidence.open_envelope(env, key.public_key()) == b'{"a":1}'


def test_statement_is_slsa_provenance_of_the_wheel(certified_bundle):
    b = certified_bundle
    record = load_record(b.record)
    st = _statement(_envelope(b.dist, b.wheel.name))
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["subject"] == [{"name": b.wheel.name, "digest": {"sha256": _sha(b.wheel)}}]
    assert st["predicateType"] == "https://slsa.dev/provenance/v1"
    bd = st["predicate"]["buildDefinition"]
    assert bd["buildType"].startswith("urn:patcher:")
    assert bd["externalParameters"] == {"spec": record.spec}
    assert bd["internalParameters"]["dockerfileSha256"] == record.dockerfile_sha256
    assert bd["internalParameters"]["settings"] == record.settings
    deps = {d["name"]: d for d in bd["resolvedDependencies"]}
    assert deps["source"]["digest"] == {"gitCommit": record.source.commit}
    assert deps["submodule:third_party/fmt"]["digest"]["gitCommit"] == record.source.submodules[1].commit
    patch = record.patches[0]
    assert deps[patch.file]["digest"] == {"sha256": _sha(b.catalog / "patches" / "1.4.0" / patch.file)}
    assert deps[patch.file]["annotations"]["patchId"] == "PT-0001"
    assert deps["base-image"]["digest"] == {"sha256": record.base_image_digest.split(":", 1)[1]}
    spec = record.spec
    assert deps[spec["cuda_runfile"]["name"]]["digest"] == {"sha256": spec["cuda_runfile"]["sha256"]}
    assert deps[spec["cudnn_archive"]["name"]]["digest"] == {"sha256": spec["cudnn_archive"]["sha256"]}
    assert deps["numpy==1.17.4"]["uri"] == "pkg:pypi/numpy@1.17.4"
    run = st["predicate"]["runDetails"]
    assert run["builder"]["id"].startswith("urn:patcher:")
    assert run["metadata"] == {"invocationId": record.build_id, "startedOn": "2026-01-02T03:04:05Z",
                               "finishedOn": "2026-01-02T05:06:07Z"}
    by = {p["annotations"]["kind"]: p for p in run["byproducts"]}
    assert by["probe-report"]["name"] == b.wheel.name + ".probe.json"
    assert by["probe-report"]["digest"]["sha256"] == _sha(b.dist / (b.wheel.name + ".probe.json"))
    assert by["build-log"]["digest"]["sha256"] == _sha(b.record.parent / "build.log")
    assert by["sbom"]["digest"]["sha256"] == _sha(b.dist / (b.wheel.name + ".cdx.json"))


def test_every_trust_override_is_recorded(certified_bundle, tmp_path):
    b = certified_bundle
    record = load_record(b.record)
    spec = dict(record.spec, commit="1" * 40, commit_overridden=True)
    spec["image"] = dict(spec["image"], overridden=True, ref="patcher-base/ubuntu:18.04",
                         digest="sha256:" + "2" * 64)
    spec["cudnn_archive"] = dict(spec["cudnn_archive"], overridden=True, sha256="3" * 64)
    from dataclasses import replace
    save_record(replace(record, spec=spec, trust_overrides=({"kind": "tree", "name": "reimported", "value": "x"},)),
                b.record)
    evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path / "out")
    st = _statement(_envelope(tmp_path / "out", b.wheel.name))
    used = st["predicate"]["buildDefinition"]["internalParameters"]["trustOverrides"]
    assert {"kind": "tag_commit", "name": "1.4.0", "value": "1" * 40} in used
    assert {"kind": "image", "name": "ubuntu-18_04", "value": "patcher-base/ubuntu:18.04@sha256:" + "2" * 64} in used
    assert {"kind": "artifact", "name": spec["cudnn_archive"]["name"], "value": "3" * 64} in used
    assert {"kind": "tree", "name": "reimported", "value": "x"} in used


def test_two_certify_runs_give_identical_bytes(certified_bundle, tmp_path):
    b = certified_bundle
    for run in ("one", "two"):
        evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path / run)
    for suffix in (".cdx.json", ".intoto.jsonl", ".probe.json", ".vex.json", ""):
        name = b.wheel.name + suffix
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    # and equal to the first certification, made in another directory, earlier
    assert (tmp_path / "one" / (b.wheel.name + ".cdx.json")).read_bytes() == \
        (b.dist / (b.wheel.name + ".cdx.json")).read_bytes()


def test_sbom_is_valid_cyclonedx_describing_the_inputs(certified_bundle):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    b = certified_bundle
    text = (b.dist / (b.wheel.name + ".cdx.json")).read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    sbom = json.loads(text)
    record = load_record(b.record)
    assert sbom["serialNumber"] == f"urn:uuid:{uuid.uuid5(evidence.SBOM_NAMESPACE, _sha(b.wheel))}"
    assert sbom["metadata"]["timestamp"].startswith("2026-01-02T05:06:07")
    root = sbom["metadata"]["component"]
    assert (root["name"], root["version"]) == ("torch", "1.4.0+cu101.pt1")
    assert root["hashes"] == [{"alg": "SHA-256", "content": _sha(b.wheel)}]
    assert root["pedigree"]["commits"][0]["uid"] == record.source.commit
    refs = {c["bom-ref"]: c for c in sbom["components"]}
    assert set(refs) >= {"source", "submodule:third_party/fmt", "submodule:third_party/pybind11",
                         f"patch:{record.patches[0].file}", "base-image", "pip:numpy", "pip:pyyaml",
                         f"cuda:{record.spec['cuda_runfile']['name']}", f"cudnn:{record.spec['cudnn_archive']['name']}"}
    assert refs[f"patch:{record.patches[0].file}"]["hashes"][0]["content"] == record.patches[0].sha256
    assert refs["base-image"]["type"] == "container"


def test_sbom_timestamp_follows_source_date_epoch(certified_bundle, tmp_path, monkeypatch):
    b = certified_bundle
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1577836800")
    evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path)
    sbom = json.loads((tmp_path / (b.wheel.name + ".cdx.json")).read_text())
    assert sbom["metadata"]["timestamp"].startswith("2020-01-01T00:00:00")


def test_certify_cli_writes_evidence_and_never_prints_the_key(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    out = tmp_path / "out"
    res = patcher_cli("certify", "--record", b.record, "--probe-report", b.probe_report, "-o", out,
                      env={"PATCHER_KEY_PATH": str(b.key)})
    assert res.exit_code == 0, res.stderr
    assert "certified " + b.wheel.name in res.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [b.wheel.name] + [b.wheel.name + s for s in (".cdx.json", ".intoto.jsonl", ".probe.json", ".vex.json")])
    private = b.key.read_text()
    body = "".join(private.strip().splitlines()[1:-1])
    for text in (res.stdout, res.stderr):
        assert "PRIVATE KEY" not in text and body not in text


def test_certify_refuses_a_wheel_that_differs_from_the_record(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    data = bytearray(b.wheel.read_bytes())
    data[-30] ^= 1
    b.wheel.write_bytes(bytes(data))
    out = tmp_path / "out"
    res = patcher_cli("certify", "--record", b.record, "--probe-report", b.probe_report, "--key", b.key, "-o", out)
    assert res.exit_code == 61, res.stderr
    assert "the build record says" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists() or not any(out.iterdir())


def test_certify_refuses_a_failed_probe_unless_asked(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    failed = make_probe_report(tmp_path / "failed.json", passed=False)
    out = tmp_path / "out"
    res = patcher_cli("certify", "--record", b.record, "--probe-report", failed, "--key", b.key, "-o", out)
    assert res.exit_code == 64 and "did not pass" in res.stderr
    assert not out.exists() or not any(out.iterdir())
    res = patcher_cli("certify", "--record", b.record, "--probe-report", failed, "--key", b.key, "-o", out,
                      "--allow-failed-probe")
    assert res.exit_code == 0 and "probe FAILED" in res.stdout


def test_certify_input_errors_are_one_line_with_their_codes(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    cases = []
    cases.append((["--record", tmp_path / "missing.json", "--probe-report", b.probe_report, "--key", b.key],
                  65, "does not exist"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases.append((["--record", bad, "--probe-report", b.probe_report, "--key", b.key], 65, "not valid JSON"))
    partial = tmp_path / "partial.json"
    data = json.loads(b.record.read_text())
    del data["wheel"]
    partial.write_text(json.dumps(data))
    cases.append((["--record", partial, "--probe-report", b.probe_report, "--key", b.key], 65, "lacks field(s): wheel"))
    not_report = tmp_path / "report.json"
    not_report.write_text('{"schema": 1}')
    cases.append((["--record", b.record, "--probe-report", not_report, "--key", b.key], 65, "boolean 'passed'"))
    cases.append((["--record", b.record, "--probe-report", b.probe_report, "--key", tmp_path / "nokey.pem"],
                  60, "no signing key"))
    cases.append((["--record", b.record, "--probe-report", b.probe_report, "--key", b.public_key],
                  60, "holds no private key"))
    loose = tmp_path / "loose.pem"
    shutil.copy(b.key, loose)
    os.chmod(loose, 0o644)
    cases.append((["--record", b.record, "--probe-report", b.probe_report, "--key", loose], 60, "readable by others"))
    for args, code, message in cases:
        res = patcher_cli("certify", *args, "-o", tmp_path / "out")
        assert res.exit_code == code, (args, res.stderr)
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_certify_with_record_written_by_the_fixture_helper_in_place(tmp_path, torch_wheel):
    """Default output directory: beside the wheel; a record's relative paths are from its directory."""
    from patcher import keys

    dist = tmp_path / "work" / "dist"
    dist.mkdir(parents=True)
    wheel = shutil.copy2(torch_wheel, dist / torch_wheel.name)
    record = make_build_record(tmp_path / "work", wheel)
    key = tmp_path / "k.pem"
    keys.generate_key(key)
    result = evidence.certify(record, make_probe_report(tmp_path / "p.json"), key)
    assert result.provenance.parent == dist and result.wheel == dist / torch_wheel.name
    assert not [p for p in dist.iterdir() if p.name.startswith(".")]


def test_build_record_round_trips_and_ignores_keys_it_does_not_know(certified_bundle):
    from patcher.record import BuildRecord

    record = load_record(certified_bundle.record)
    data = record.to_json()
    assert BuildRecord.from_json(json.loads(json.dumps(data))) == record
    superset = json.loads(json.dumps(data))
    superset["written_by"] = "a newer patcher"            # a key this patcher does not know
    superset["wheel"]["size"] = 123
    superset["patches"][0]["category"] = "bugfix"
    assert BuildRecord.from_json(superset) == record
