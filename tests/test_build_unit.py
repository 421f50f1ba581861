"""patcher.builder: the pure logic (environment, toolchain parsing, source archive, record, progress,
work directory rules, pinned inputs).  No Docker here; the container path is in test_build_standin.py."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from patcher import builder
from patcher.buildenv import container_environment, parse_toolchain, source_archive
from patcher.builder import BuildOptions
from patcher.config import Settings
from patcher.errors import ChecksumMismatchError, UnreachableInputError, WorkDirError
from patcher.inputs import fetch_input, input_content
from patcher.progress import Progress
from patcher.spec import Artifact, resolve


def test_container_environment_carries_pytorch_variables_and_reproducibility_settings():
    spec = resolve(Settings(), "1.13.1", cuda="none")
    env = container_environment(spec, jobs=3, source_date_epoch=1671062400)
    assert env["PYTORCH_BUILD_VERSION"] == "1.13.1+cpu.pt1" == spec.wheel_version
    assert env["PYTORCH_BUILD_NUMBER"] == "1"
    assert env["MAX_JOBS"] == "3"
    assert env["USE_CUDA"] == "0"
    assert env["SOURCE_DATE_EPOCH"] == "1671062400"
    assert env["PYTHONHASHSEED"] == "0"
    assert env["CFLAGS"] == env["CXXFLAGS"] == "-ffile-prefix-map=/src=."
    assert "TORCH_CUDA_ARCH_LIST" not in env
    # setup.py's extension link uses the image's compiler, not sysconfig's x86_64-linux-gnu-gcc
    assert env["LDSHARED"] == f"gcc-{spec.gcc} -pthread -shared" == "gcc-10 -pthread -shared"
    # the matrix's CPU flags (FACTS.md) arrive through spec.build_env
    assert env["USE_SYSTEM_LIBS"] == "1" and env["USE_KINETO"] == "0" and env["BUILD_TEST"] == "0"


def test_cuda_environment_has_arch_list_and_gcc7_uses_debug_prefix_map():
    spec = resolve(Settings(), "1.4.0", cuda="10.1")
    env = container_environment(spec, jobs=2, source_date_epoch=0)
    assert env["TORCH_CUDA_ARCH_LIST"] == "3.7+PTX;5.0;6.0;6.1;7.0;7.5"
    assert env["TORCH_NVCC_FLAGS"] == "-Xfatbin -compress-all"
    assert env["USE_CUDA"] == "1"
    assert env["PYTORCH_BUILD_VERSION"] == "1.4.0+cu101.pt1"
    assert env["CFLAGS"] == "-fdebug-prefix-map=/src=."  # gcc 7 has no -ffile-prefix-map


def test_parse_toolchain_takes_the_first_line_of_each_section():
    text = ("== gcc\ngcc-10 (Debian 10.2.1-6) 10.2.1 20210110\n== g++\ng++-10 (Debian 10.2.1-6) 10.2.1\n"
            "== python\nPython 3.9.2\n== cmake\ncmake version 3.18.4\n== nvcc\nBuild cuda_11.7\n")
    assert parse_toolchain(text) == {"gcc": "gcc-10 (Debian 10.2.1-6) 10.2.1 20210110",
                                     "g++": "g++-10 (Debian 10.2.1-6) 10.2.1", "python": "Python 3.9.2",
                                     "cmake": "cmake version 3.18.4", "nvcc": "Build cuda_11.7"}


def _git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_source_archive_holds_tracked_files_and_inputs_owned_by_the_builder(tmp_path):
    tree = tmp_path / "tree"
    (tree / "pkg" / "deep").mkdir(parents=True)
    (tree / "setup.py").write_text("print('x')\n")
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "pkg" / "deep" / "a.py").write_text("a = 1\n")
    (tree / "link").symlink_to("setup.py")
    _git("init", "-q", ".", cwd=tree)
    _git("add", "--all", cwd=tree)
    _git("commit", "-q", "-m", "x", cwd=tree)
    (tree / "untracked.txt").write_text("build output\n")
    archive = tmp_path / "src.tar"
    source_archive(tree, [("third_party/x/x.h", b"#pragma once\n")], 1234, archive)
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"link", "pkg", "pkg/deep", "pkg/deep/a.py", "run.sh", "setup.py", "third_party",
                                "third_party/x", "third_party/x/x.h"}
        assert all(m.uid == 1000 and m.gid == 1000 and m.mtime == 1234 for m in members.values())
        assert members["pkg"].isdir() and members["link"].issym() and members["link"].linkname == "setup.py"
        assert members["run.sh"].mode == 0o755 and members["setup.py"].mode == 0o644
        assert tar.extractfile("third_party/x/x.h").read() == b"#pragma once\n"
    again = tmp_path / "again.tar"
    source_archive(tree, [("third_party/x/x.h", b"#pragma once\n")], 1234, again)
    assert archive.read_bytes() == again.read_bytes()  # deterministic


def test_partial_record_lacks_the_fields_certify_needs(tmp_path):
    from dataclasses import replace

    from patcher.errors import EvidenceFormatError
    from patcher.record import AppliedPatch, BuildRecord, SourceManifest, Submodule, WheelFile

    spec = resolve(Settings(), "1.13.1", cuda="none")
    started = BuildRecord(build_id=spec.build_id, spec=json.loads(json.dumps(spec.to_json())),
                          base_image_digest=spec.image.digest,
                          started="2026-11-30T00:00:00Z")
    data = started.to_json()
    for absent in ("wheel", "image_id", "dockerfile_sha256", "finished", "source", "toolchain"):
        assert absent not in data
    with pytest.raises(EvidenceFormatError, match="lacks field"):
        BuildRecord.from_json(data)
    assert BuildRecord.from_json(data, partial=True) == started  # the builder reads it back as it is
    assert started.missing_for_certify() == ["source", "dockerfile_sha256", "image_id", "toolchain", "wheel",
                                             "finished"]
    done = replace(started, source=SourceManifest("r", "t", "c", "sha256:x", (Submodule("a", "u", "1"),
                                                                               Submodule("a/b", "u2", "2"))),
                   dockerfile_sha256="d" * 64, image_id="sha256:i", finished="2026-11-30T01:00:00Z",
                   toolchain={"gcc": "gcc-10"}, wheel=WheelFile("w.whl", "0" * 64, "dist/w.whl"),
                   patches=(AppliedPatch("PT-0001", "0001-x.patch", "1" * 64, "abc"),),
                   completed_stages=("resolve", "fetch"))
    record = BuildRecord.from_json(json.loads(done.dumps()))
    assert record == done and not record.missing_for_certify()
    assert [s.path for s in record.source.submodules] == ["a", "a/b"]
    assert record.log_path == "build.log" and record.wheel.path == "dist/w.whl"


def test_progress_rewrites_one_line_on_a_tty_and_keeps_the_full_log(tmp_path):
    out = io.StringIO()
    progress = Progress(tmp_path / "build.log", stream=out, tty=True)
    progress.TTY_INTERVAL = 0
    progress.start("wheel")
    progress.log("[1/3] compiling a.cpp\n[2/3] compil")
    progress.log("ing b.cpp\n")
    progress.done("wheel", 1.5)
    progress.close()
    screen = out.getvalue()
    assert "\r\x1b[K[wheel 00:00] [2/3] compiling b.cpp" in screen
    assert "patcher: [wheel] done in 1.5 s" in screen
    assert "\n[1/3]" not in screen  # log lines are not printed one by one
    log = (tmp_path / "build.log").read_text()
    assert "[1/3] compiling a.cpp\n[2/3] compiling b.cpp\n" in log and "==> wheel done in 1.5 s" in log


def test_progress_prints_plain_lines_without_a_tty(tmp_path):
    out = io.StringIO()
    progress = Progress(tmp_path / "build.log", stream=out, tty=False)
    progress.PLAIN_INTERVAL = 0
    progress.start("configure")
    progress.log("-- Configuring done\n")
    progress.done("configure", 2.0)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "patcher: [configure] started"
    assert lines[1].startswith("patcher: [configure 00:00] -- Configuring done")
    assert lines[-1] == "patcher: [configure] done in 2.0 s"
    assert "\r" not in out.getvalue()


# --- work directory rules (they fail before any Docker or git work) ----------------------------------
def _settings(tmp_path) -> Settings:
    return Settings(work_dir=tmp_path / "work", cache_dir=tmp_path / "cache")


def test_resume_without_a_record_is_refused(tmp_path):
    with pytest.raises(WorkDirError, match="nothing to resume"):
        builder.build(_settings(tmp_path), BuildOptions(torch="1.13.1", cuda="none", resume=True, until="resolve"),
                      stream=io.StringIO())
    assert not list((tmp_path / "work").glob("*/.*.tmp"))


def test_the_same_command_again_continues_and_fresh_starts_over(tmp_path):
    settings = _settings(tmp_path)
    first = builder.build(settings, BuildOptions(torch="1.13.1", cuda="none", until="resolve"), stream=io.StringIO())
    assert first.completed_stages == ("resolve",)
    record = json.loads(first.record.read_text())
    assert record["completed_stages"] == ["resolve"] and record["stage_durations"]["resolve"] >= 0
    out = io.StringIO()
    again = builder.build(settings, BuildOptions(torch="1.13.1", cuda="none", until="resolve"), stream=out)
    assert again.completed_stages == ("resolve",)
    assert json.loads(again.record.read_text())["started"] == record["started"]  # the same build, continued
    assert "resolve was already done" in out.getvalue()
    fresh = builder.build(settings, BuildOptions(torch="1.13.1", cuda="none", until="resolve", fresh=True),
                          stream=io.StringIO())
    assert fresh.completed_stages == ("resolve",)


def test_resume_refuses_a_record_of_another_spec(tmp_path):
    settings = _settings(tmp_path)
    result = builder.build(settings, BuildOptions(torch="1.13.1", cuda="none", until="resolve"), stream=io.StringIO())
    data = json.loads(result.record.read_text())
    data["spec"]["build_env"]["USE_SYSTEM_LIBS"] = "0"
    result.record.write_text(json.dumps(data))
    with pytest.raises(WorkDirError, match="another build's record"):
        builder.build(settings, BuildOptions(torch="1.13.1", cuda="none", resume=True), stream=io.StringIO())


def test_work_dir_errors_through_the_cli(tmp_path, patcher_cli):
    work = tmp_path / "work"
    res = patcher_cli("build", "--torch", "1.13.1", "--cuda", "none", "--work", work, "--resume")
    assert res.exit_code == WorkDirError.exit_code
    assert res.stderr.strip().splitlines()[-1].startswith("patcher: error: nothing to resume")
    assert "Traceback" not in res.stderr


# --- pinned inputs -------------------------------------------------------------------------------------
def _tarball(path: Path, member: str, data: bytes) -> str:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pinned_input_from_the_files_mirror_is_checked_and_cached(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    src = tmp_path / "numpy.tar.gz"
    sha = _tarball(src, "numpy/pocketfft_hdronly.h", b"// header\n")
    (files / sha).write_bytes(src.read_bytes())
    art = Artifact(name="numpy.tar.gz", url="https://pypi.invalid/numpy.tar.gz", sha256=sha,
                   member="numpy/pocketfft_hdronly.h", dest="third_party/pocketfft/pocketfft_hdronly.h")
    settings = Settings(files_mirror=f"file://{files}", cache_dir=tmp_path / "cache")
    path = fetch_input(art, settings)
    assert path == tmp_path / "cache" / "files" / sha
    assert input_content(art, path) == b"// header\n"
    (files / sha).unlink()
    assert fetch_input(art, settings) == path  # from the cache now


def test_pinned_input_with_a_wrong_checksum_leaves_nothing(tmp_path):
    src = tmp_path / "x.tar.gz"
    _tarball(src, "x.h", b"x")
    art = Artifact(name="x.tar.gz", url=f"file://{src}", sha256="0" * 64)
    settings = Settings(cache_dir=tmp_path / "cache")
    with pytest.raises(ChecksumMismatchError, match="x.tar.gz .* has sha256"):
        fetch_input(art, settings)
    assert list((tmp_path / "cache" / "files").iterdir()) == []


def test_unreachable_input_names_it_and_the_mirror_setting(tmp_path):
    art = Artifact(name="numpy-2.0.0.tar.gz", url=f"file://{tmp_path}/absent.tar.gz", sha256="1" * 64)
    with pytest.raises(UnreachableInputError) as info:
        fetch_input(art, Settings(cache_dir=tmp_path / "cache"))
    assert "numpy-2.0.0.tar.gz" in str(info.value)
    assert "PATCHER_MIRROR" in str(info.value) and "files_mirror" in str(info.value)
    assert list((tmp_path / "cache" / "files").iterdir()) == []


def test_matrix_pins_pocketfft_for_1131():
    spec = resolve(Settings(), "1.13.1", cuda="none")
    (art,) = spec.inputs
    assert art.name == "numpy-2.0.0.tar.gz" and len(art.sha256) == 64
    assert art.url.startswith("https://files.pythonhosted.org/") and art.url.endswith("/numpy-2.0.0.tar.gz")
    assert art.dest == "third_party/pocketfft/pocketfft_hdronly.h"
    assert art.member == "numpy-2.0.0/numpy/fft/pocketfft/pocketfft_hdronly.h"
    assert spec.unpinned_inputs() == []


# --- a patch whose proof was skipped is named, with why ---------------------------------------------
def _report(checks: list[dict]):
    from patcher.probing import ProbeReport

    return ProbeReport.from_json({
        "schema": 1, "probe_version": "1", "started": "2026-12-01T00:00:00Z", "duration_s": 1.0, "environment": {},
        "patched_ids": [], "passed": True, "summary": {"pass": 1, "fail": 0, "skip": 2, "error": 0},
        "checks": [{"required": False, "duration_s": 0.1, "patches": [], **c} for c in checks]})


def test_patches_whose_checks_all_skipped_are_unproven_with_the_reason():
    from patcher.probing import unproven_patches

    report = _report([
        {"id": "security.cve_2025_3730", "status": "pass", "message": "refused"},
        {"id": "determinism.adaptive_max_pool2d", "status": "skip", "message": "needs CUDA (none available)"},
        {"id": "security.cve_2025_2953", "status": "skip", "message": "oneDNN is not built into this torch"},
    ])
    probes = {"PT-0102": ("security.cve_2025_3730",), "PT-0201": ("determinism.adaptive_max_pool2d",),
              "PT-0103": ("security.cve_2025_2953",), "PT-0999": ("security.not_in_this_probe",)}
    found = {u.id: u for u in unproven_patches(report, probes, gpus_requested=False)}
    assert set(found) == {"PT-0201", "PT-0103", "PT-0999"}  # PT-0102 was proven
    assert found["PT-0201"].line() == ("PT-0201: not proven on this build: no GPU in the probe container "
                                       "(needs CUDA (none available))")
    assert found["PT-0103"].reason == "oneDNN is not built into this torch"
    assert found["PT-0999"].reason == "check(s) security.not_in_this_probe not in this probe"
    with_gpus = {u.id: u for u in unproven_patches(report, probes, gpus_requested=True)}
    assert with_gpus["PT-0201"].reason == "needs CUDA (none available)"


def test_the_provenance_names_the_unproven_patches(certified_bundle):
    from dataclasses import replace

    from patcher.evidence import build_statement
    from patcher.record import UnprovenPatch, load_record
    from patcher.spec import BuildSpec

    record = load_record(certified_bundle.record)
    record = replace(record, unproven_patches=(UnprovenPatch("PT-0001", ("maxpool2d.nhwc_large_channels",),
                                                             "no GPU in the probe container"),))
    statement = build_statement(record, BuildSpec.from_json(record.spec), [])
    assert statement["predicate"]["buildDefinition"]["internalParameters"]["unprovenPatches"] == [
        {"id": "PT-0001", "checks": ["maxpool2d.nhwc_large_channels"], "reason": "no GPU in the probe container"}]
