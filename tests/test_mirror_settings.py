"""One `mirror` setting for every stage: what a host directory can serve, and what it cannot."""

from __future__ import annotations

from tests.fixtures.common import run_patcher


def test_a_directory_mirror_keeps_apt_on_the_images_own_sources(tmp_path):
    result = run_patcher("--mirror", str(tmp_path / "mirror"), "render", "--torch", "1.13.1", "--cuda", "none")
    assert result.exit_code == 0, result.stderr
    assert "deb " not in result.stdout  # no `deb <dir>/debian`: apt in a container cannot read it


def test_a_directory_mirror_cannot_feed_downloads_inside_the_image_build(tmp_path):
    mirror = tmp_path / "mirror"
    result = run_patcher("--mirror", str(mirror), "render", "--torch", "1.4.0", "--cuda", "10.1")
    assert result.exit_code == 10
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"{mirror}/files" in result.stderr and f"{mirror}/wheelhouse" in result.stderr
    assert "serve the mirror over HTTP" in result.stderr
    served = run_patcher("--mirror", "http://127.0.0.1:9/m", "render", "--torch", "1.4.0", "--cuda", "10.1")
    assert served.exit_code == 0, served.stderr
    assert "'http://127.0.0.1:9/m/files/e7c22dc21278eb1b82f34a60ad7640b41ad3943d929bebda3008b72536855d31'" in served.stdout
