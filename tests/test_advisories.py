"""Advisory data and its per-build assessment (issue 16): data checks, the logic, the CLI, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from patcher import advisories
from patcher.config import Settings
from patcher.errors import AdvisoryClaimError, AdvisoryDataError
from patcher.probe import all_check_ids
from patcher.spec import resolve

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES = REPO_ROOT / "patches"


@pytest.fixture(scope="module")
def data() -> advisories.AdvisoryData:
    return advisories.load()


def _one_line(res, code, text):
    assert res.exit_code == code, (res.exit_code, res.stderr)
    assert text in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


# --- the data -------------------------------------------------------------------------------
def test_every_record_read_is_listed_with_its_source(data):
    assert len(data.advisories) == 32
    ids = [a.id for a in data.advisories]
    assert len(set(ids)) == len(ids) and all(i.startswith("CVE-") for i in ids)
    for a in data.advisories:
        assert a.records, a.id
        for r in a.records:
            assert r["id"] in a.aliases, (a.id, r["id"])
        for r in a.ranges:
            assert r["source"] in {x["id"] for x in a.records}, (a.id, r)
        for c in a.cvss:
            assert c.source in {x["id"] for x in a.records}, (a.id, c)
    # the PyPA staging copy holds 31 torch records; the 32nd is GitHub's withdrawn GHSA-4vmg-rw8f-92f9
    assert sum(1 for a in data.advisories if a.pysec) == 31
    assert [a.id for a in data.advisories if a.withdrawn] == ["CVE-2024-7804"]


def test_scores_are_the_base_scores_of_the_published_vectors(data):
    cvss = pytest.importorskip("cvss")
    for a in data.advisories:
        for c in a.cvss:
            calc = cvss.CVSS4(c.vector) if c.version == "4.0" else cvss.CVSS3(c.vector)
            assert float(calc.base_score) == c.score, (a.id, c.vector)


def _patch_file(version: str, patch_id: str) -> Path:
    for name in (PATCHES / version / "series").read_text().split():
        if name.startswith("#"):
            continue
        path = PATCHES / version / name
        if path.is_file() and re.search(rf"^Patch-Id: {patch_id}$", path.read_text(), re.M):
            return path
    raise AssertionError(f"{patch_id} is not in the {version} series")


def test_resolved_assessments_name_a_patch_of_the_series_and_its_probe(data):
    known = set(all_check_ids())
    seen = 0
    for a in data.advisories:
        for release, assessment in a.assess.items():
            if assessment.state != "resolved":
                continue
            seen += 1
            text = _patch_file(release, assessment.patch).read_text()
            probe_line = re.search(r"^Probe: (.+)$", text, re.M).group(1)
            assert set(assessment.probes) <= {p.strip() for p in probe_line.split(",")}, (a.id, release)
            assert set(assessment.probes) <= known
            cve = re.search(r"^Upstream-Bug: (.+)$", text, re.M).group(1)
            assert a.id in cve, (a.id, assessment.patch)
    assert seen == 22  # 1.4.0: 7, 1.13.1: 9, 2.6.0: 6


def test_source_claims_are_only_made_where_a_real_tree_checks_them(data):
    # Checked against real trees: Debian's 1.13.1 in tests/test_catalog_advisories.py, 2.6.0 in
    # tests/test_realtree_2_6_0.py, the v1.4.0 tag commit in tests/test_realtree_1_4_0.py; or in the
    # files of the wheel the assessment names (tests/test_advisories_wheel_files.py).
    for a in data.advisories:
        for release, assessment in a.assess.items():
            if assessment.state == "not_affected":
                assert release in ("1.4.0", "1.13.1", "2.6.0") or assessment.wheel is not None, (a.id, release)


# --- the assessment of one build ------------------------------------------------------------
def _findings(data, torch="1.13.1", cuda="none", patch_ids=None, probe=None):
    spec = resolve(Settings(), torch, cuda=cuda)
    ids = advisories.series_patch_ids(PATCHES, torch) if patch_ids is None else patch_ids
    return {f.advisory.id: f for f in advisories.assess(data, torch, advisories.build_flags(spec), ids, probe)}


def test_1_13_1_cpu_leaves_no_high_or_critical_open(data):
    found = _findings(data)
    assert set(found) == {a.id for a in data.advisories}
    open_high = sorted(i for i, f in found.items() if f.state in ("exploitable", "in_triage")
                       and (f.advisory.score or 0) >= 7.0)
    # CVE-2025-55553 (FX writes the keyword `from` into generated code) is resolved by PT-0109
    assert open_high == []
    assert advisories.counts(found.values()) == {"resolved": 9, "not_affected": 12, "exploitable": 0,
                                                 "in_triage": 10, "false_positive": 1}
    for cve in ("CVE-2025-32434", "CVE-2026-24747", "CVE-2025-2148", "CVE-2025-55553"):
        assert found[cve].state == "resolved" and found[cve].patch, cve
    assert found["CVE-2024-48063"].justification == "requires_configuration"
    assert "USE_DISTRIBUTED=0" in found["CVE-2024-48063"].detail


def test_a_cuda_build_has_distributed_and_cuda_on(data):
    found = _findings(data, cuda="11.7")
    assert found["CVE-2024-48063"].state == "exploitable"
    assert found["CVE-2025-3136"].state == "in_triage"
    assert found["CVE-2025-3136"].detail.startswith("built with USE_CUDA on")


def test_a_wheel_without_the_patch_is_exploitable_and_a_failed_probe_is_in_triage(data):
    without = _findings(data, patch_ids=["PT-0101"])
    assert without["CVE-2025-32434"].state == "exploitable"
    assert "does not carry it" in without["CVE-2025-32434"].detail
    probe = {"security.cve_2025_32434": {"status": "fail", "message": "wrote the marker"},
             "security.cve_2026_24747": {"status": "pass"},
             "security.cve_2025_2953": {"status": "skip", "message": "built without MKL-DNN"}}
    found = _findings(data, probe=probe)
    assert found["CVE-2025-32434"].state == "in_triage"
    assert "security.cve_2025_32434: fail" in found["CVE-2025-32434"].detail
    assert found["CVE-2026-24747"].state == "resolved"
    assert found["CVE-2025-2953"].state == "resolved" and "built without MKL-DNN" in found["CVE-2025-2953"].detail
    assert found["CVE-2025-2148"].state == "in_triage"         # its check is not in the report
    assert "not run" in found["CVE-2025-2148"].detail


def test_fx_keyword_codegen_is_assessed_wherever_torch_fx_exists(data):
    # CVE-2025-55553: the defect is in torch.fx's code generator (torch/fx/graph.py), reached by
    # make_fx (proxy_tensor.py, 1.13 on) and by fx.symbolic_trace (1.8 on): 1.8.1 has no
    # proxy_tensor.py but is exploitable all the same; only 1.4.0 (no torch.fx) is not affected
    adv = next(a for a in data.advisories if a.id == "CVE-2025-55553")
    for release, a in adv.assess.items():
        if release == "1.4.0":
            assert (a.state, a.justification, tuple(a.absent)) == ("not_affected", "code_not_present", ("torch/fx",))
        else:
            assert a.state in ("exploitable", "resolved") and list(a.probes) == ["security.cve_2025_55553"], release
    old = adv.assess["1.8.1"]
    assert old.state == "exploitable" and old.wheel is None and not old.absent
    assert "fx.symbolic_trace" in old.detail and "tests/test_probe_legacy_runtimes.py on PyPI's wheel" in old.detail
    found = _findings(data, torch="1.8.1")
    assert found["CVE-2025-55553"].state == "exploitable"
    assert advisories.counts(found.values()) == {"resolved": 0, "not_affected": 14, "exploitable": 6,
                                                 "in_triage": 11, "false_positive": 1}


def test_releases_without_assessments_are_in_triage_or_outside_every_range(data):
    found = _findings(data, torch="2.1.2", cuda="12.1")
    # CVE-2025-3000 (C++, the TorchScript compiler) is not assessed for 2.1.2
    assert found["CVE-2025-3000"].state == "in_triage" and found["CVE-2025-3000"].basis == "none"
    ranged = found["CVE-2025-46149"]
    assert ranged.state == "not_affected" and ranged.basis == "range" and ranged.justification is None
    assert "2.6.0" in ranged.detail
    assert found["CVE-2024-7804"].state == "false_positive"
    assert advisories.counts(found.values())["resolved"] == 0


def test_guard_checker_follows_nesting_and_else_branches():
    lines = ["if(USE_A)", "  if(WIN32)", "    x()", "  else()", "    target()", "  endif()", "endif()",
             "if(USE_B)", "else()", "  other()", "endif()"]
    assert advisories._inside_guard(lines, "if(USE_A)", "target()")[0]
    assert not advisories._inside_guard(lines, "if(WIN32)", "target()")[0]
    assert not advisories._inside_guard(lines, "if(USE_B)", "other()")[0]
    assert advisories._inside_guard(lines, "if(USE_B)", "missing()") == (False, "no line holds 'missing()'")


# --- site files and error paths -----------------------------------------------------------------
SITE = '''schema = 1

[[advisory]]
id = "SITE-2026-0001"
title = "Our own finding"
summary = "Found by the site's review."
cvss = [{ version = "3.1", vector = "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:N/I:N/A:H", score = 5.5, source = "SITE" }]
records = [{ id = "SITE", read = "internal review" }]

[advisory.assess."1.13.1"]
state = "exploitable"
detail = "reachable from our service"
by = "ACME product security"

[assess."CVE-2025-2998"."1.13.1"]
state = "exploitable"
detail = "our RNN service takes packed sequences from users"
by = "ACME product security, 2026-12-05"
'''


def test_a_site_file_adds_advisories_and_overrides_assessments(tmp_path, data):
    site = tmp_path / "site.toml"
    site.write_text(SITE)
    merged = advisories.load(site=site)
    assert len(merged.advisories) == len(data.advisories) + 1
    assert [p for p, _ in merged.sources] == [str(advisories.DATA_FILE), str(site)]
    found = _findings(merged)
    assert found["SITE-2026-0001"].state == "exploitable" and found["SITE-2026-0001"].origin == "site:site.toml"
    assert found["CVE-2025-2998"].state == "exploitable"
    assert found["CVE-2025-2998"].origin == "site:site.toml"


@pytest.mark.parametrize("text,message", [
    ("schema = 2\n", "is not a schema 1 advisories file"),
    ("schema = 1\n[assess.\"CVE-0000-0000\".\"1.13.1\"]\nstate = \"in_triage\"\ndetail = \"x\"\nby = \"me\"\n",
     "assess names CVE-0000-0000, which no advisory has"),
    ("schema = 1\n[assess.\"CVE-2025-2998\".\"1.13.1\"]\nstate = \"exploitable\"\ndetail = \"x\"\n",
     "a site's assessment must say who made it"),
    ("schema = 1\n[assess.\"CVE-2025-2998\".\"1.13.1\"]\nstate = \"fixed\"\nby = \"me\"\n",
     "state 'fixed' is not one of"),
    ("schema = 1\n[assess.\"CVE-2025-2998\".\"1.13.1\"]\nstate = \"not_affected\"\nby = \"me\"\n",
     "not_affected needs a justification"),
    ("schema = 1\n[assess.\"CVE-2025-2998\".\"1.13.1\"]\nstate = \"not_affected\"\n"
     "justification = \"code_not_present\"\nby = \"me\"\n", "code_not_present needs the evidence"),
    ("schema = 1\n[assess.\"CVE-2025-2998\".\"1.13.1\"]\nstate = \"resolved\"\nby = \"me\"\n",
     "a resolved assessment needs the patch"),
    ("schema = 1\nfoo = 1\n", "unknown key(s) foo"),
    ("not toml [", "is not valid TOML"),
])
def test_bad_site_files_are_refused_with_one_line_and_exit_100(tmp_path, patcher_cli, text, message):
    site = tmp_path / "site.toml"
    site.write_text(text)
    with pytest.raises(AdvisoryDataError, match=re.escape(message)):
        advisories.load(site=site)
    res = patcher_cli("advisories", "--torch", "1.13.1", "--cuda", "none", "--advisories", site)
    _one_line(res, 100, message)


def test_missing_site_file_and_bad_cvss(tmp_path, patcher_cli):
    res = patcher_cli("advisories", "--torch", "1.13.1", "--cuda", "none", env={"PATCHER_ADVISORIES": str(tmp_path / "no.toml")})
    _one_line(res, 100, "does not exist")
    site = tmp_path / "site.toml"
    site.write_text(SITE.replace('score = 5.5', 'score = 55'))
    with pytest.raises(AdvisoryDataError, match="is not a number from 0 to 10"):
        advisories.load(site=site)
    site.write_text(SITE.replace('version = "3.1"', 'version = "4.0"'))
    with pytest.raises(AdvisoryDataError, match="is not a CVSS 4.0 vector"):
        advisories.load(site=site)


# --- the command ----------------------------------------------------------------------------------
def test_advisories_command_lists_every_advisory(patcher_cli, data):
    res = patcher_cli("advisories", "--torch", "1.13.1", "--cuda", "none")
    assert res.exit_code == 0, res.stderr
    for a in data.advisories:
        assert a.id in res.stdout
    assert "counts: 9 resolved, 12 not_affected, 0 exploitable, 10 in_triage, 1 false_positive" in res.stdout
    res = patcher_cli("advisories", "--torch", "1.13.1", "--cuda", "none", "--json")
    doc = json.loads(res.stdout)
    assert doc["torch"] == "1.13.1" and doc["cuda"] == "none" and "PT-0106" in doc["patches"]
    assert len(doc["advisories"]) == 32 and doc["counts"]["resolved"] == 9
    row = next(r for r in doc["advisories"] if r["id"] == "CVE-2025-32434")
    assert row["state"] == "resolved" and row["patch"] == "PT-0106" and row["score"] == 9.8


def test_unknown_release_and_failed_claims(patcher_cli, tmp_path):
    _one_line(patcher_cli("advisories", "--torch", "9.9.9"), 11, "9.9.9")
    tree = tmp_path / "tree"
    (tree / "torch" / "_inductor").mkdir(parents=True)
    res = patcher_cli("advisories", "--torch", "1.13.1", "--cuda", "none", "--check-tree", tree)
    _one_line(res, 101, "source claims for torch 1.13.1 do not hold")
    with pytest.raises(AdvisoryClaimError, match="no source tree"):
        advisories.check_tree(advisories.load(), "1.13.1", tmp_path / "absent")
