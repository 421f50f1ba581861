"""The VEX beside every certified wheel: written and signed by certify, checked by verify, published."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil

import pytest

from patcher import evidence
from tests.fixtures.index_env import make_build_record, make_probe_report


def _vex(dist, wheel_name) -> dict:
    return json.loads((dist / (wheel_name + ".vex.json")).read_text())


def _validate(doc: dict) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc))
    assert errors is None, errors


def _assert_fails(res, code, message):
    assert res.exit_code == code, (res.exit_code, res.stderr)
    assert message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_certify_writes_a_valid_vex_signed_as_a_byproduct(certified_bundle):
    b = certified_bundle
    doc = _vex(b.dist, b.wheel.name)
    _validate(doc)
    wheel_sha = hashlib.sha256(b.wheel.read_bytes()).hexdigest()
    assert doc["metadata"]["component"]["hashes"] == [{"alg": "SHA-256", "content": wheel_sha}]
    assert len(doc["vulnerabilities"]) == 32
    env = json.loads((b.dist / (b.wheel.name + ".intoto.jsonl")).read_text())
    statement = json.loads(base64.b64decode(env["payload"]))
    by = {p["annotations"]["kind"]: p for p in statement["predicate"]["runDetails"]["byproducts"]}
    assert by["vex"]["name"] == b.wheel.name + ".vex.json"
    assert by["vex"]["digest"]["sha256"] == hashlib.sha256((b.dist / by["vex"]["name"]).read_bytes()).hexdigest()
    # the bundle is a 1.4.0 build whose probe report has none of the security checks: a patch it
    # carries without the proof is in triage, never resolved
    states = {v["id"]: v["analysis"] for v in doc["vulnerabilities"]}
    assert states["CVE-2022-45907"]["state"] == "in_triage"
    assert "security.cve_2022_45907: not run" in states["CVE-2022-45907"]["detail"]
    assert states["CVE-2024-7804"]["state"] == "false_positive"
    assert all(v["affects"][0]["ref"].startswith("urn:cdx:") for v in doc["vulnerabilities"])


def test_certify_twice_gives_the_same_vex(certified_bundle, tmp_path):
    b = certified_bundle
    evidence.certify(b.record, b.probe_report, b.key, out_dir=tmp_path / "again")
    name = b.wheel.name + ".vex.json"
    assert (tmp_path / "again" / name).read_bytes() == (b.dist / name).read_bytes()


@pytest.fixture
def certified_1_13_1(tmp_path, torch_wheel):
    """A 1.13.1 CPU build record (the real series) with a probe report in which every check passes."""
    from patcher import keys

    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = shutil.copy2(torch_wheel, dist / torch_wheel.name)
    key = tmp_path / "key.pem"
    keys.generate_key(key)
    record = make_build_record(tmp_path / "work", wheel, torch="1.13.1", cuda="none")
    report = make_probe_report(tmp_path / "probe.json")
    data = json.loads(report.read_text())
    data["checks"] += [{"id": i, "status": "pass"} for i in (
        "security.cve_2022_45907", "security.cve_2022_45907_bypass", "security.cve_2025_3730",
        "security.cve_2024_31580", "security.cve_2024_31583", "security.cve_2025_32434",
        "security.cve_2026_24747", "security.cve_2025_2148", "security.cve_2025_55553")]
    data["checks"].append({"id": "security.cve_2025_2953", "status": "skip",
                           "message": "this torch is built without MKL-DNN (oneDNN): the affected kernel is absent"})
    report.write_text(json.dumps(data))
    result = evidence.certify(record, report, key)
    return result


def test_the_1_13_1_cpu_vex_resolves_every_backport_with_pedigree(certified_1_13_1):
    doc = json.loads(certified_1_13_1.vex.read_text())
    _validate(doc)
    states = {v["id"]: v for v in doc["vulnerabilities"]}
    for cve, patch in (("CVE-2025-32434", "PT-0106"), ("CVE-2026-24747", "PT-0107"), ("CVE-2025-2148", "PT-0108"),
                       ("CVE-2022-45907", "PT-0101"), ("CVE-2024-31583", "PT-0105"), ("CVE-2025-55553", "PT-0109")):
        v = states[cve]
        assert v["analysis"]["state"] == "resolved_with_pedigree", cve
        assert {"name": "patcher:patch-id", "value": patch} in v["properties"]
    assert "built without MKL-DNN" in states["CVE-2025-2953"]["analysis"]["detail"]
    distributed = states["CVE-2024-48063"]["analysis"]
    assert distributed == {"state": "not_affected", "justification": "requires_configuration",
                           "detail": distributed["detail"]} and "USE_DISTRIBUTED=0" in distributed["detail"]
    assert states["CVE-2025-55557"]["analysis"]["justification"] == "code_not_present"
    high_open = sorted(v["id"] for v in doc["vulnerabilities"]
                       if v["analysis"]["state"] in ("exploitable", "in_triage")
                       and max((r["score"] for r in v.get("ratings", [])), default=0) >= 7.0)
    assert high_open == []
    counts = {p["name"]: p["value"] for p in doc["metadata"]["properties"] if p["name"].startswith("patcher:count:")}
    assert counts == {"patcher:count:resolved": "9", "patcher:count:not_affected": "12",
                      "patcher:count:exploitable": "0", "patcher:count:in_triage": "10",
                      "patcher:count:false_positive": "1"}


def test_verify_accepts_the_vex_and_reports_its_states(certified_bundle, patcher_cli):
    b = certified_bundle
    res = patcher_cli("verify", b.wheel, "--key", b.public_key, "--catalog", b.catalog)
    assert res.exit_code == 0, res.stderr
    assert f"vex        {b.wheel.name}.vex.json" in res.stdout
    res = patcher_cli("verify", b.wheel, "--key", b.public_key, "--catalog", b.catalog, "--json")
    doc = json.loads(res.stdout)
    assert doc["vex"] == b.wheel.name + ".vex.json" and sum(doc["vex_states"].values()) == 32


def test_a_vex_edited_after_signing_is_refused_with_its_own_code(certified_bundle, patcher_cli):
    b = certified_bundle
    path = b.dist / (b.wheel.name + ".vex.json")
    doc = json.loads(path.read_text())
    v = next(v for v in doc["vulnerabilities"] if v["id"] == "CVE-2025-32434")
    v["analysis"] = {"state": "not_affected", "justification": "code_not_present", "detail": "edited"}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    _assert_fails(patcher_cli("verify", b.wheel, "--key", b.public_key, "--catalog", b.catalog), 67,
                  "the VEX was edited or replaced after certification")
    path.unlink()
    _assert_fails(patcher_cli("verify", b.wheel, "--key", b.public_key, "--catalog", b.catalog), 67,
                  f"no VEX {b.wheel.name}.vex.json beside the wheel")


def test_certify_refuses_a_bad_site_file_before_writing_anything(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    site = tmp_path / "site.toml"
    site.write_text("schema = 1\n[assess.\"CVE-2025-2998\".\"1.4.0\"]\nstate = \"exploitable\"\ndetail = \"x\"\n")
    out = tmp_path / "out"
    res = patcher_cli("certify", "--record", b.record, "--probe-report", b.probe_report, "--key", b.key,
                      "-o", out, env={"PATCHER_ADVISORIES": str(site)})
    _assert_fails(res, 100, "a site's assessment must say who made it")
    assert not out.exists() or not any(out.iterdir())


def test_publish_carries_the_vex(certified_bundle, patcher_cli, tmp_path):
    b = certified_bundle
    idx = tmp_path / "index"
    assert patcher_cli("publish", "--index", idx, b.wheel).exit_code == 0
    name = b.wheel.name + ".vex.json"
    assert (idx / "files" / name).read_bytes() == (b.dist / name).read_bytes()
    res = patcher_cli("verify", idx / "files" / b.wheel.name, "--key", b.public_key, "--catalog", b.catalog)
    assert res.exit_code == 0, res.stderr
