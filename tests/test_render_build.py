"""The rendered 1.13.1 CPU builder Dockerfile really builds, from a base the tests make here.

mmdebstrap bullseye -> image -> push to the loopback registry -> `patcher lock` -> render with
[overrides.images] -> APIClient.build (the shared ``builder_image_cpu_1131`` fixture) -> the
image has the toolchain the wheel build needs and runs as ``builder``.
"""

from __future__ import annotations

import pytest

from patcher.config import DEFAULT_MATRIX
from patcher.lock import set_digest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TOOLCHAIN_CHECK = r"""
set -euo pipefail
test "$(id -u):$(id -g)" = 1000:1000 && test "$(whoami)" = builder && test "$HOME" = /home/builder
touch /src/w /ccache/w /out/w
"$CXX" --version | head -1 | grep -q ' 10\.'
"$PATCHER_PYTHON" -c 'import sys, numpy, yaml, typing_extensions, setuptools, wheel; assert sys.version_info[:2] == (3, 9)'
cmake --version | head -1; ninja --version; git --version; ccache --version | head -1
test -f /usr/include/fmt/format.h && test -f /usr/include/sleef.h && test -f /usr/include/onnx/onnx_pb.h
cat > /tmp/t.cpp <<'CPP'
#include <glog/logging.h>
#include <google/protobuf/stubs/common.h>
#include <pybind11/pybind11.h>
int main(int, char** argv) { google::InitGoogleLogging(argv[0]); return GOOGLE_PROTOBUF_VERSION > 3000000 ? 0 : 1; }
CPP
"$CXX" -std=c++14 $("$PATCHER_PYTHON"-config --includes) /tmp/t.cpp -o /tmp/t -lglog -lprotobuf && /tmp/t
echo toolchain-ok
"""


def test_lock_then_render_gives_the_built_image(patcher_cli, tmp_path, pushed_bullseye_base,
                                               builder_image_cpu_1131):
    # patcher lock resolves the pushed tag to the digest the registry serves ...
    matrix = tmp_path / "matrix.toml"
    text = DEFAULT_MATRIX.read_text().replace('ref = "docker.io/library/debian:bullseye-slim"',
                                              f'ref = "{pushed_bullseye_base.ref}"')
    matrix.write_text(set_digest(text, "debian-bullseye", "unknown"))
    res = patcher_cli("--matrix", matrix, "lock", "--image", "debian-bullseye")
    assert res.exit_code == 0, res.stderr
    assert f'digest = "{pushed_bullseye_base.digest}"' in matrix.read_text()
    # ... and rendering with that pin in [overrides.images] gives the Dockerfile that was built.
    config = tmp_path / "config.toml"
    config.write_text(f'[overrides.images]\n"debian-bullseye" = "{pushed_bullseye_base.ref}@{pushed_bullseye_base.digest}"\n')
    res = patcher_cli("--config", config, "render", "--torch", "1.13.1", "--cuda", "none", "--python", "3.9",
                      "-o", tmp_path / "out")
    assert res.exit_code == 0, res.stderr
    rendered = builder_image_cpu_1131.rendered
    assert (tmp_path / "out" / "Dockerfile").read_text() == rendered.text
    assert f"FROM {pushed_bullseye_base.pinned}\n" in rendered.text


def test_builder_image_has_the_toolchain(docker_client, builder_image_cpu_1131, no_leaks):
    image = docker_client.images.get(builder_image_cpu_1131.tag)
    labels = image.labels
    assert labels["org.patcher.build-id"] == "torch-1.13.1-cpu.pt1-py3.9"
    assert labels["org.patcher.spec-sha256"] == builder_image_cpu_1131.rendered.labels["org.patcher.spec-sha256"]
    assert image.attrs["Config"]["User"] == "1000:1000" and image.attrs["Config"]["WorkingDir"] == "/src"
    out = docker_client.containers.run(image.id, ["bash", "-c", TOOLCHAIN_CHECK], remove=True,
                                       stdout=True, stderr=True)
    assert b"toolchain-ok" in out, out.decode(errors="replace")


def test_failed_build_is_one_error_and_leaves_nothing(docker_client, docker_engine, bullseye_base_image, no_leaks):
    from patcher.dockerfile import RenderedDockerfile, build_image
    from patcher.errors import ImageBuildError

    text = f"FROM {bullseye_base_image.tag}\nRUN echo about-to-fail && false\n"
    broken = RenderedDockerfile(text=text, sha256="0" * 64, image_tag="patcher-test/broken:never",
                                build_id="broken-test")
    with pytest.raises(ImageBuildError) as err:
        build_image(docker_engine, broken)
    assert "docker build of broken-test failed" in str(err.value) and "\n" not in str(err.value)
    assert not docker_client.images.list(name="patcher-test/broken")
