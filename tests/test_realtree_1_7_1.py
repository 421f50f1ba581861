"""torch 1.7.1's real runtime: Debian bullseye's python3-torch 1.7.1 (Python 3.9, CPU) in a bullseye
container, probed through the real command line with the expected outcome of every check.

1.7.1 has no real tree here: bullseye's Sources index lists pytorch_1.7.1.orig.tar.gz, but the
archive this machine reaches does not serve it (.ci/fetch-sources.sh), so there is no 1.7.1 series
to apply or compile; this test shows which defects the unpatched runtime has.
"""

from __future__ import annotations

import json
import re

import pytest

from patcher.probe import all_check_ids
from tests.fixtures.common import run_patcher

NO_CUDA = "needs CUDA; this torch is built without CUDA"
CRASH_OR_USE = r"^(killed by SIG(SEGV|BUS|ABRT) \(exit -(11|7|6)\)|.*without checking it.*)$"


def needs(spec: str) -> tuple[str, str, bool]:
    return ("skip", "^" + re.escape(f"needs torch {spec}; this is 1.7.0a0") + "$", False)


# (status, message pattern, finding) of every check on bullseye's python3-torch 1.7.1; None: a
# crash (not a finding) and a detected unchecked use (a finding) both count.
EXPECTED_BULLSEYE = {
    "env.fingerprint": ("pass", r"^$", False),
    # 1.7 evaluates type comments: the call check of 1.13.1 (#89189) is not there
    "security.cve_2022_45907": ("fail", r"CVE-2022-45907", True),
    "security.cve_2022_45907_bypass": ("fail", r"pytorch#151233", True),
    "security.cve_2025_3730": ("pass", r"^$", False),  # CPU kernel: never crashed
    "security.cve_2025_2953": ("fail", r"^killed by SIGFPE \(exit -8\)$", False),
    "security.cve_2024_31580": ("fail", CRASH_OR_USE, None),
    "security.cve_2024_31583": ("fail", CRASH_OR_USE, None),
    "security.cve_2025_32434": needs(">=1.13"),  # weights_only came in 1.13
    "security.cve_2026_24747": needs(">=1.13"),
    "security.cve_2025_2148": ("fail", r"^killed by SIGSEGV \(exit -11\)$", False),
    # torch.fx came in 1.8 (1.7 has only the private prototype torch._fx; no assessment of 1.7.1)
    "security.cve_2025_55553": needs(">=1.8"),
    "security.cve_2025_2998": needs(">=1.4,<1.5"),  # written and proven for 1.4's kernel (PT-0110)
    "security.cve_2025_3001": needs(">=1.4,<1.5"),  # written and proven for 1.4's cells (PT-0111)
}
# The CUDA checks skip: for want of CUDA, or first because their op is newer than 1.7
# (determinism.reflection_pad3d needs 1.10), which they say before they look for CUDA.
CUDA_SKIP = ("skip", "^(" + re.escape(NO_CUDA) + r"|needs torch >=[\d.]+; this is 1\.7\.0a0)$", False)
for _id in all_check_ids():
    if _id.split(".")[0] in ("maxpool2d", "determinism") or _id == "env.arch_coverage":
        EXPECTED_BULLSEYE.setdefault(_id, CUDA_SKIP)
EXPECTED_BULLSEYE["determinism.reflection_pad3d"] = needs(">=1.10")


def test_every_check_has_an_expectation():
    assert set(EXPECTED_BULLSEYE) == set(all_check_ids())


@pytest.mark.docker
def test_the_probe_finds_the_defects_on_debians_1_7_1(bullseye_torch_image, tmp_path):
    out = tmp_path / "report.json"
    result = run_patcher("probe", "--image", bullseye_torch_image.tag, "--json", out, timeout=1200)
    report = json.loads(out.read_text())
    found = {c["id"]: c for c in report["checks"]}
    assert list(found) == all_check_ids()
    wrong = []
    for check_id, (status, pattern, finding) in EXPECTED_BULLSEYE.items():
        entry = found[check_id]
        if entry["status"] != status or not re.search(pattern, entry["message"]) or \
                (finding is not None and entry["finding"] is not finding):
            wrong.append(f"{check_id}: {entry['status']} {entry['finding']} {entry['message']!r}")
    assert wrong == []
    env = report["environment"]
    assert env["torch"]["version"] == "1.7.0a0" and env["python"]["version"].startswith("3.9.")
    required_failures = [c["id"] for c in report["checks"] if c["required"] and c["status"] in ("fail", "error")]
    assert result.exit_code == (0 if not required_failures else 50), result.stderr

