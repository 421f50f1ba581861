"""Unit tests of the probe's pure logic: versions, gating, outcomes, coverage, fatbin reading,
report rendering.  A stand-in torch object is used only where the logic under test never
touches torch itself; everything that runs torch is in test_probe_debian.py."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from patcher.probe import all_check_ids, describe_checks
from patcher.probe import framework as fw
from patcher.probe import report as rep
from patcher.probe.checks import env

REPO = Path(__file__).resolve().parent.parent
EXPECTED_IDS = {
    "env.fingerprint", "env.arch_coverage",
    "maxpool2d.sweep", "maxpool2d.nhwc_large_channels", "maxpool2d.error_message",
    "determinism.adaptive_max_pool2d", "determinism.grid_sampler_2d", "determinism.grid_sampler_3d",
    "determinism.avg_pool3d",
    "determinism.adaptive_avg_pool2d", "determinism.adaptive_avg_pool3d", "determinism.fractional_max_pool2d",
    "determinism.max_unpool2d", "determinism.interpolate_bilinear", "determinism.reflection_pad2d",
    "determinism.reflection_pad1d", "determinism.reflection_pad3d", "determinism.replication_pad1d",
    "determinism.replication_pad2d", "determinism.replication_pad3d", "determinism.interpolate_linear",
    "determinism.interpolate_bicubic", "determinism.interpolate_trilinear", "determinism.max_pool3d",
    "determinism.fractional_max_pool3d", "determinism.max_unpool3d",
    "determinism.nll_loss2d", "determinism.ctc_loss", "determinism.embedding_bag_max", "determinism.histc",
    "determinism.nll_loss", "determinism.put_accumulate", "determinism.put",
    "determinism.bincount", "determinism.cumsum",
    "determinism.bincount_unweighted", "determinism.kthvalue", "determinism.median_indices",
    "determinism.cumsum_complex", "determinism.scatter_reduce_prod", "determinism.index_reduce_prod",
    "determinism.scatter_multiply", "determinism.interpolate_bilinear_aa", "determinism.interpolate_bicubic_aa",
    "security.cve_2022_45907", "security.cve_2022_45907_bypass", "security.cve_2025_3730",
    "security.cve_2025_2953", "security.cve_2024_31580", "security.cve_2024_31583",
    "security.cve_2025_32434", "security.cve_2026_24747", "security.cve_2025_2148",
    "security.cve_2025_55553", "security.cve_2025_2998", "security.cve_2025_3001",
}


def test_all_check_ids_on_a_host_without_torch():
    # a child where importing torch fails: the registry must not need it
    code = ("import sys; sys.modules['torch'] = None\n"
            "from patcher.probe import all_check_ids; print(' '.join(all_check_ids()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == all_check_ids()
    ids = all_check_ids()
    assert set(ids) == EXPECTED_IDS
    assert len(ids) == len(set(ids))
    described = {d["id"]: d for d in describe_checks()}
    assert described["determinism.adaptive_max_pool2d"]["patches"] == ["PT-0201"]
    assert described["determinism.grid_sampler_2d"]["patches"] == ["PT-0202"]
    assert described["determinism.histc"]["required"] is False
    assert described["security.cve_2025_2953"]["isolate"] is True


@pytest.mark.parametrize("text, expected", [
    ("1.13.0a0", (1, 13, 0)), ("2.11.0+cu130", (2, 11, 0)), ("1.4.0", (1, 4, 0)), ("1.4", (1, 4, 0)),
    ("1.7.1+debian", (1, 7, 1)), ("2.0.0.dev20230101", (2, 0, 0)),
])
def test_parse_torch_version(text, expected):
    assert fw.parse_torch_version(text) == expected


@pytest.mark.parametrize("version, spec, inside", [
    ((1, 4, 0), ">=1.4", True), ((1, 3, 1), ">=1.4", False), ((1, 13, 0), ">=1.7,<2.0", True),
    ((2, 0, 0), ">=1.7,<2.0", False), ((1, 13, 1), "==1.13", True), ((1, 12, 0), "==1.13", False),
    ((1, 13, 1), "!=1.13", False), ((1, 4, 0), "<=1.4", True), ((1, 4, 1), ">1.4", True),
])
def test_version_ranges(version, spec, inside):
    assert fw.version_in_range(version, fw.parse_range(spec)) is inside


def test_bad_ranges_and_ids_are_refused():
    with pytest.raises(ValueError):
        fw.parse_range("~=1.4")
    with pytest.raises(ValueError):
        fw.check("NoDots")(lambda ctx: None)
    with pytest.raises(ValueError):
        fw.check("a.b", device="tpu")(lambda ctx: None)
    with pytest.raises(ValueError):
        fw.check("env.fingerprint")(lambda ctx: None)  # already registered


# --- one check through the framework, with a stand-in torch (the framework never calls it) ------
def fake_torch(version="1.13.0", cuda=False):
    return SimpleNamespace(__version__=version, version=SimpleNamespace(cuda="11.7" if cuda else None),
                           cuda=SimpleNamespace(is_available=lambda: cuda))


def spec_of(fn, **kw):
    kw.setdefault("torch_range", ">=1.4")
    kw.setdefault("device", "cpu")
    kw.setdefault("patches", ())
    kw.setdefault("required", True)
    kw.setdefault("isolate", False)
    kw.setdefault("timeout", 30)
    return fw.CheckSpec("test.one", fn, kw["torch_range"], kw["device"], kw["patches"], kw["required"],
                        kw["isolate"], kw["timeout"])


def run_one(fn, patched=(), torch=None, budget=None, **kw):
    ctx = fw.Context(torch or fake_torch(), patched)
    return fw.run_spec(spec_of(fn, **kw), ctx, budget)


def raise_(exc):
    def fn(ctx):
        raise exc
    return fn


def test_outcomes_map_to_statuses():
    assert run_one(lambda ctx: {"a": 1})["status"] == "pass"
    assert run_one(lambda ctx: None)["details"] is None
    skipped = run_one(raise_(fw.Skip("not here")))
    assert (skipped["status"], skipped["message"]) == ("skip", "not here")
    failed = run_one(raise_(fw.Fail("broken", {"x": 1})))
    assert (failed["status"], failed["finding"], failed["details"]) == ("fail", False, {"x": 1})
    found = run_one(raise_(fw.Finding("known gap")), required=False)
    assert (found["status"], found["finding"], found["required"]) == ("fail", True, False)
    errored = run_one(raise_(ZeroDivisionError("boom")))
    assert errored["status"] == "error" and errored["message"] == "ZeroDivisionError: boom"
    assert "traceback" in errored["details"]


def test_log_lines_are_kept_and_details_made_jsonable():
    def fn(ctx):
        ctx.log("first note")
        return {"path": object.__new__(object), "n": 1}

    entry = run_one(fn)
    assert entry["details"]["log"] == ["first note"]
    assert isinstance(entry["details"]["path"], str)
    json.dumps(entry)


def test_gates_version_device_and_budget():
    old = run_one(lambda ctx: None, torch=fake_torch("1.4.0"), torch_range=">=1.7")
    assert old["status"] == "skip" and "needs torch >=1.7; this is 1.4.0" in old["message"]
    cpu_build = run_one(lambda ctx: None, device="cuda")
    assert cpu_build["message"] == "needs CUDA; this torch is built without CUDA"
    no_gpu = run_one(lambda ctx: None, device="cuda", torch=SimpleNamespace(
        __version__="2.1.0", version=SimpleNamespace(cuda="12.1"), cuda=SimpleNamespace(is_available=lambda: False)))
    assert "torch.cuda.is_available() is False" in no_gpu["message"]
    assert run_one(lambda ctx: ctx.device, device="any")["details"] == {"result": "cpu"}
    spent = run_one(lambda ctx: None, budget=0)
    assert spent["status"] == "skip" and "budget" in spent["message"]


def test_a_carried_patch_makes_its_check_required():
    finding = raise_(fw.Finding("raises"))
    assert run_one(finding, required=False, patches=("PT-0201",))["required"] is False
    entry = run_one(finding, patched=("PT-0201",), required=False, patches=("PT-0201",))
    assert entry["required"] is True and entry["status"] == "fail"
    report = rep.build_report([entry], {}, ["PT-0201"], __import__("datetime").datetime(2026, 1, 1), 1.0)
    assert report["passed"] is False


def test_in_process_timeout():
    def slow(ctx):
        import time
        time.sleep(5)

    entry = run_one(slow, timeout=0.3)
    assert entry["status"] == "fail" and entry["message"] == "timed out after 0.3 s"


# --- reports -------------------------------------------------------------------------------------
def sample_report():
    checks = [
        {"id": "env.fingerprint", "status": "pass", "required": True, "message": "", "details": {},
         "patches": [], "duration_s": 0.01, "finding": False},
        {"id": "determinism.histc", "status": "fail", "required": False, "message": "raises", "details": {},
         "patches": [], "duration_s": 0.2, "finding": True},
        {"id": "maxpool2d.sweep", "status": "skip", "required": True, "message": "needs CUDA", "details": None,
         "patches": [], "duration_s": 0.0, "finding": False},
        {"id": "security.cve_2025_2953", "status": "fail", "required": True, "message": "killed by SIGFPE (exit -8)",
         "details": None, "patches": ["PT-0103"], "duration_s": 1.5, "finding": False},
    ]
    import datetime
    return rep.build_report(checks, {"torch": {"version": "1.13.0a0"}}, ["PT-0103"],
                            datetime.datetime(2026, 1, 2, 3, 4, 5), 1.71)


def test_report_summary_and_passed():
    report = sample_report()
    assert report["summary"] == {"pass": 1, "fail": 2, "skip": 1, "error": 0}
    assert report["passed"] is False  # the required SIGFPE check failed; the optional finding does not count
    assert report["started"] == "2026-01-02T03:04:05Z" and report["schema"] == 1


def test_junit_gates_like_passed():
    root = ET.fromstring(rep.to_junit(sample_report()))
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["security.cve_2025_2953"].find("failure").get("message") == "killed by SIGFPE (exit -8)"
    assert cases["determinism.histc"].find("failure") is None
    assert "finding (not required): raises" in cases["determinism.histc"].find("system-out").text
    assert cases["maxpool2d.sweep"].find("skipped") is not None


def test_table_is_readable():
    table = rep.to_table(sample_report())
    assert "determinism.histc" in table and "FAIL (optional) finding" in table
    assert table.rstrip().endswith("-> FAILED")


def test_select_by_prefix_and_glob():
    specs = [spec_of(lambda c: None)]
    specs[0].id = "maxpool2d.sweep"
    assert rep.select(specs, "maxpool2d") == specs
    assert rep.select(specs, "maxpool2d.*") == specs
    assert rep.select(specs, "env") == []


# --- arch coverage ----------------------------------------------------------------------------------
OFFICIAL_14 = ["sm_37", "sm_50", "sm_60", "sm_61", "sm_70", "sm_75", "compute_37"]
BUILDER_17_CU102 = ["sm_37", "sm_50", "sm_60", "sm_70", "sm_75"]


@pytest.mark.parametrize("arches, capability, covered, by", [
    (["sm_90"], (9, 0), True, "sass"),
    (["sm_80"], (8, 6), True, "sass"),  # same major, lower minor
    (["sm_86"], (8, 0), False, None),  # a newer minor does not run on an older GPU
    (OFFICIAL_14, (9, 0), True, "ptx"),  # 1.4's compute_37 PTX is JIT-compiled on an H200
    (BUILDER_17_CU102, (8, 6), False, None),  # #52736: no kernel image on RTX 30xx
    (["sm_90a"], (9, 0), True, "sass"),
    (["sm_90a"], (10, 0), False, None),
    (["compute_90a"], (10, 0), False, None),
    (["sm_100", "sm_120", "compute_120"], (9, 0), False, None),
])
def test_arch_coverage(arches, capability, covered, by):
    result = env.arch_coverage(arches, capability)
    assert (result["covered"], result["by"]) == (covered, by)


def test_arch_list_from_build_flags():
    flags = "NVCC architecture flags: -gencode;arch=compute_37,code=sm_37;-gencode;arch=compute_75,code=sm_75;" \
            "-gencode;arch=compute_75,code=compute_75"
    assert env.arch_list_from_flags(flags) == ["sm_37", "sm_75", "compute_75"]
    assert env.arch_list_from_flags('TORCH_CUDA_ARCH_LIST="3.7+PTX;5.0;7.5"') == \
        ["sm_37", "compute_37", "sm_50", "sm_75"]
    assert env.arch_list_from_flags("USE_CUDA=OFF") == []


def fatbin_blob(entries):
    """A .nv_fatbin section: two containers (the second 8-byte aligned after padding), each
    entry a 64-byte header (kind, header size, payload size, arch at byte 28) and a payload."""
    blob = b""
    for group in entries:
        body = b""
        for kind, arch, payload in group:
            header = struct.pack("<HHIQII", kind, 0x101, 64, len(payload), 0, 0) + struct.pack("<HHI", 0, 0, arch)
            body += header.ljust(64, b"\0") + payload
        blob += struct.pack("<IHHQ", env.FATBIN_MAGIC, 1, 16, len(body)) + body
        blob += b"\0" * ((-len(blob)) % 8 + 8)
    return blob


def test_fatbin_headers_of_a_real_elf_library(tmp_path):
    source = tmp_path / "lib.c"
    source.write_text("int answer(void) { return 42; }\n")
    library = tmp_path / "libfake_cuda.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    blob = tmp_path / "fatbin.bin"
    blob.write_bytes(fatbin_blob([[(2, 70, b"S" * 100), (2, 90, b"T" * 13), (1, 90, b"ptx\0")],
                                  [(2, 80, b"U" * 7)]]))
    subprocess.run(["objcopy", "--add-section", f".nv_fatbin={blob}", str(library)], check=True)
    assert env.elf_section(str(library), ".nv_fatbin")[1] == blob.stat().st_size
    assert env.fatbin_arches(str(library)) == ["sm_70", "sm_80", "sm_90", "compute_90"]
    assert env.fatbin_arches(str(source)) == []  # not an ELF file
    plain = tmp_path / "libplain.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(plain), str(source)], check=True)
    assert env.fatbin_arches(str(plain)) == []
