"""Advisory claims that rest on the files of PyPI's wheels (1.8.1, 2.0.1, 2.1.2: no tree of those
releases is reachable here): every ``code_not_present`` claim of those releases names the pinned
wheel it was established on, and holds in that wheel's files (fetched by
.ci/fetch-legacy-wheels.sh, `make host`); the VEX says where each was checked.  1.4.0's claims
were moved to its real tree (tests/test_realtree_1_4_0.py): none of them names a wheel any more.
The mechanism itself is tested on small wheels made here."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest

from patcher import advisories
from patcher.errors import AdvisoryClaimError, AdvisoryDataError
from tests.conftest import CI_CACHE

WHEELS = CI_CACHE / "legacy-torch" / "wheels"
SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "fetch-legacy-wheels.sh"
RELEASES = ("1.8.1", "2.0.1", "2.1.2")
# the runtimes .ci/fetch-legacy-wheels.sh pins: 1.4.0's wheel is there for the probe, its claims
# are checked on the real v1.4.0 tree
PINNED = ("1.4.0",) + RELEASES
TREE_CHECKED = ("1.4.0",)
# claims (a path or a text absent) per release: 2.1.2 has torch.compile and torch.export, so every
# advisory of Python code is present there and none rests on absence
CLAIMS = {"1.8.1": 34, "2.0.1": 3, "2.1.2": 0}


def _pinned_torch_wheels() -> dict[str, tuple[str, str]]:
    """release -> (wheel file name, sha256) as .ci/fetch-legacy-wheels.sh pins them."""
    text = SCRIPT.read_text()
    out = {}
    for block in re.findall(r"^runtime (\S+) (\S+) <<'EOF'\n(.*?)^EOF$", text, re.M | re.S):
        name, minor, pins = block
        version, digest = re.search(r"^torch==(\S+) --hash=sha256:([0-9a-f]{64})$", pins, re.M).groups()
        tag = "cp36-cp36m" if minor == "3.6" else f"cp{minor.replace('.', '')}-cp{minor.replace('.', '')}"
        out[version] = (f"torch-{version}-{tag}-manylinux1_x86_64.whl", digest)
    return out


def test_the_assessments_name_the_pinned_wheels():
    pinned = _pinned_torch_wheels()
    assert sorted(pinned) == list(PINNED)
    seen = {r: 0 for r in RELEASES}
    for adv in advisories.load().advisories:
        for release, a in adv.assess.items():
            if a.wheel is None:
                continue
            assert release in RELEASES and release not in TREE_CHECKED, (adv.id, release)
            assert (a.wheel["file"], a.wheel["sha256"]) == pinned[release], (adv.id, release)
            seen[release] += 1
        for release in RELEASES:
            a = adv.assess.get(release)
            if a is not None and a.justification == "code_not_present":
                assert a.wheel is not None, f"{adv.id} {release}: a code_not_present claim without the wheel that checks it"
    assert {r: bool(n) for r, n in seen.items()} == {r: bool(n) for r, n in CLAIMS.items()}, seen


@pytest.mark.parametrize("release", RELEASES)
def test_every_claim_holds_in_the_wheels_files(release):
    name, digest = _pinned_torch_wheels()[release]
    wheel = WHEELS / name
    if not wheel.is_file():
        pytest.fail(f"{wheel} is missing (run `make host`: .ci/fetch-legacy-wheels.sh)", pytrace=False)
    results = advisories.check_tree(advisories.load(), release, wheel)
    failed = [r for r in results if not r.ok]
    assert not failed, failed
    assert len(results) == CLAIMS[release], results


def test_the_vex_detail_says_which_wheel_was_checked():
    data = advisories.load()
    for release in RELEASES:
        findings = advisories.assess(data, release, {"USE_CUDA": "0"}, [])
        claimed = [f for f in findings if f.justification == "code_not_present"]
        assert bool(claimed) is bool(CLAIMS[release]), release
        name, digest = _pinned_torch_wheels()[release]
        for f in claimed:
            assert f.detail.endswith(f"(checked against the files of the wheel {name}, sha256 {digest})"), f.detail


# --- the mechanism, on wheels made here -------------------------------------------------------------
SITE = '''schema = 1
[assess."CVE-2026-24747"."1.13.1"]
state = "not_affected"
justification = "code_not_present"
detail = "no weights_only unpickler here"
by = "site security team"
absent = ["torch/_weights_only_unpickler.py"]
absent_text = [{ file = "torch/serialization.py", text = "weights_only" }]
wheel = { file = "%s", sha256 = "%s" }
'''


def _wheel(tmp_path: Path, name: str, files: dict[str, str]) -> tuple[Path, str]:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in files.items():
            z.writestr(rel, text)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _only(results, advisory="CVE-2026-24747"):
    return [r for r in results if r.advisory == advisory]


def test_a_claim_checked_in_a_wheel(tmp_path):
    wheel, digest = _wheel(tmp_path, "torch-1.13.1-cp38-cp38-linux_x86_64.whl",
                           {"torch/serialization.py": "def load(f):\n    pass\n", "torch/__init__.py": ""})
    site = tmp_path / "site.toml"
    site.write_text(SITE % (wheel.name, digest))
    data = advisories.load(site=site)
    results = _only(advisories.check_tree(data, "1.13.1", wheel))
    assert [(r.claim, r.ok, r.why) for r in results] == [
        ("absent torch/_weights_only_unpickler.py", True, "absent"),
        ("torch/serialization.py lacks 'weights_only'", True, "not found")]
    finding = {f.advisory.id: f for f in advisories.assess(data, "1.13.1", {}, [])}["CVE-2026-24747"]
    assert finding.state == "not_affected" and finding.detail == (
        f"no weights_only unpickler here (checked against the files of the wheel {wheel.name}, sha256 {digest})")


def test_a_claim_that_does_not_hold_in_the_wheel(tmp_path):
    wheel, digest = _wheel(tmp_path, "torch-1.13.1-cp38-cp38-linux_x86_64.whl", {
        "torch/serialization.py": "def load(f, weights_only=False):\n    pass\n",
        "torch/_weights_only_unpickler.py": ""})
    site = tmp_path / "site.toml"
    site.write_text(SITE % (wheel.name, digest))
    results = _only(advisories.check_tree(advisories.load(site=site), "1.13.1", wheel))
    assert [(r.ok, r.why) for r in results] == [(False, "present"), (False, "found")]


def test_a_claim_is_checked_only_in_the_wheel_it_names(tmp_path):
    named, digest = _wheel(tmp_path, "torch-1.13.1-cp38-cp38-linux_x86_64.whl", {"torch/serialization.py": ""})
    other, other_digest = _wheel(tmp_path, "torch-1.13.1-cp39-cp39-linux_x86_64.whl",
                                 {"torch/serialization.py": "", "torch/x.py": ""})
    site = tmp_path / "site.toml"
    site.write_text(SITE % (named.name, digest))
    data = advisories.load(site=site)
    [result] = _only(advisories.check_tree(data, "1.13.1", other))
    assert not result.ok and result.why == f"this is {other.name} sha256 {other_digest}"
    tree = tmp_path / "tree"
    (tree / "torch").mkdir(parents=True)
    [result] = _only(advisories.check_tree(data, "1.13.1", tree))
    assert not result.ok and result.why == "this is a tree, not that wheel"


def test_a_wheel_that_is_not_a_zip(tmp_path):
    bogus = tmp_path / "torch-1.4.0-cp36-cp36m-linux_x86_64.whl"
    bogus.write_text("not a zip")
    with pytest.raises(AdvisoryClaimError, match="cannot be read as a zip archive"):
        advisories.check_tree(advisories.load(), "1.4.0", bogus)


@pytest.mark.parametrize("wheel, message", [
    ('"torch.whl"', "wheel must be a table of file and sha256"),
    ('{ file = "dir/torch.whl", sha256 = "%s" }' % ("0" * 64), "wheel.file must be a wheel's file name"),
    ('{ file = "torch.whl", sha256 = "ABC" }', "wheel.sha256 must be 64 lowercase hex digits"),
])
def test_a_bad_wheel_source_is_refused(tmp_path, wheel, message):
    site = tmp_path / "site.toml"
    text = SITE.replace('wheel = { file = "%s", sha256 = "%s" }', f"wheel = {wheel}")
    site.write_text(text)
    with pytest.raises(AdvisoryDataError, match=re.escape(message)):
        advisories.load(site=site)


def test_a_wheel_backs_only_code_not_present(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text('schema = 1\n[assess."CVE-2026-24747"."1.13.1"]\nstate = "in_triage"\ndetail = "x"\nby = "me"\n'
                    f'wheel = {{ file = "torch.whl", sha256 = "{"0" * 64}" }}\n')
    with pytest.raises(AdvisoryDataError, match="wheel backs code_not_present claims only"):
        advisories.load(site=site)


def test_the_cli_checks_the_claims_in_a_pinned_wheel(patcher_cli):
    name, _digest = _pinned_torch_wheels()["1.8.1"]
    wheel = WHEELS / name
    if not wheel.is_file():
        pytest.fail(f"{wheel} is missing (run `make host`: .ci/fetch-legacy-wheels.sh)", pytrace=False)
    res = patcher_cli("advisories", "--torch", "1.8.1", "--cuda", "none", "--check-tree", str(wheel), "--json")
    assert res.exit_code == 0, res.stderr
    claims = json.loads(res.stdout)["claims"]
    assert len(claims) == CLAIMS["1.8.1"] and all(c["ok"] for c in claims)


def test_the_cli_refuses_a_file_that_is_neither_tree_nor_wheel(patcher_cli, tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("x")
    res = patcher_cli("advisories", "--torch", "1.4.0", "--cuda", "none", "--check-tree", str(other))
    assert res.exit_code == 101, res.stderr
    assert "no source tree or wheel at" in res.stderr and "Traceback" not in res.stderr
