"""The real thing: `patcher build --torch 1.13.1 --cuda none --until configure` runs PyTorch's own
CMake configure on Debian's real 1.13.1 tree (realtree fixture) in the bullseye builder image."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.realtree, pytest.mark.slow]


def test_real_1131_tree_configures_in_the_builder(realtree_mirror, builder_image_cpu_1131, pushed_bullseye_base,
                                                  tmp_path, patcher_cli, docker_client, no_leaks,
                                                  ccache_volume_name):
    # The realtree mirror (and its commit override) plus the locally made base image.  The
    # builder image differs from the fixture's only in its labels (the spec names the re-imported
    # commit), so the engine's layer cache from builder_image_cpu_1131 makes it quick.
    config = tmp_path / "config.toml"
    realtree_config = realtree_mirror.config_file.read_text()
    config.write_text(realtree_config + "\n" + pushed_bullseye_base.config_toml())
    work = tmp_path / "work"
    res = patcher_cli("--config", config, "build", "--torch", "1.13.1", "--cuda", "none", "--until", "configure",
                      "--jobs", "2", "--work", work, "--ccache-volume", ccache_volume_name, timeout=1800)
    build_dir = work / "torch-1.13.1-cpu.pt1-py3.9"
    record = json.loads((build_dir / "record.json").read_text())
    try:
        assert res.exit_code == 0, res.stderr
        assert record["completed_stages"] == ["resolve", "fetch", "patch", "render", "image", "configure"]
        log = (build_dir / "build.log").read_text()
        assert "-- Configuring done" in log and "-- Generating done" in log
        assert "Finished running cmake." in log
        # the pinned input is in the tree, and the FACTS.md flags reached CMake
        assert "Using pocketfft in directory: /src/third_party/pocketfft/" in log
        cmake_line = next(line for line in log.splitlines() if line.startswith("cmake -GNinja"))
        for flag in ("-DUSE_SYSTEM_LIBS=1", "-DUSE_KINETO=0", "-DUSE_XNNPACK=0", "-DUSE_ITT=0", "-DBUILD_CAFFE2=0",
                     "-DTORCH_BUILD_VERSION=1.13.1+cpu.pt1"):
            assert flag in cmake_line
        assert re.match(r"cmake version 3\.18\.", record["toolchain"]["cmake"])
        assert record["toolchain"]["python"] == "Python 3.9.2"
        assert record["toolchain"]["gcc"].startswith("gcc-10 ")
        assert record["source"]["commit"] == realtree_mirror.commit
        assert [s["path"] for s in record["source"]["submodules"]] == ["third_party/fmt"]
        ids = [p["id"] for p in record["patches"]]
        assert "PT-0901" in ids and "PT-0904" in ids
        assert record["inputs"][0]["dest"] == "third_party/pocketfft/pocketfft_hdronly.h"
        print(f"configure stage: {record['stage_durations']['configure']:.1f} s; "
              f"image stage: {record['stage_durations']['image']:.1f} s")
    finally:
        if record.get("image_tag") and record["image_tag"] != builder_image_cpu_1131.tag:
            try:
                docker_client.images.remove(record["image_tag"])
            except Exception:  # noqa: BLE001 - in use by a concurrent session
                pass
