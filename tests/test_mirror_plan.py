"""`patcher mirror plan`: every external input of a build with its pin."""

from __future__ import annotations

import json

from tests.fixtures.common import run_patcher


def _plan(up, *args: str, env: dict | None = None):
    return run_patcher("mirror", "plan", *args, env=env or up.env())


def test_plan_lists_nested_submodules_files_wheels_image_and_apt(mirror_upstream):
    up = mirror_upstream
    result = _plan(up, "--torch", "1.4.0", "--cuda", "10.1", "--json")
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    git = {(g["org"] + "/" + g["repo"], g["path"]): g["commit"] for g in plan["git"]}
    # The nested submodule is read from dep's own tree, its relative URL resolved against dep's upstream.
    assert git == {
        ("pytorch/pytorch", ""): up.commits["pytorch"],
        ("standin/big", "third_party/big"): up.commits["big"],
        ("standin/dep", "third_party/dep"): up.commits["dep"],
        ("standin/nested", "third_party/dep/nested"): up.commits["nested"],
    }
    assert plan["git"][0]["tag"] == "v1.4.0"
    assert {g["mirror_path"] for g in plan["git"]} >= {"git/standin/nested.git", "git/pytorch/pytorch.git"}
    files = {f["role"]: (f["name"], f["sha256"]) for f in plan["files"]}
    assert files == {"cuda-runfile": up.files["runfile"], "cudnn-archive": up.files["cudnn"],
                     "input": up.files["input"]}
    # The wheel pins come from the rendered requirements file.
    assert plan["wheels"] == [{"requirement": "standin-helper==1.0", "sha256": up.wheel[1],
                               "mirror_path": "wheelhouse/standin-helper"}]
    assert plan["image"]["digest"] == up.image_digest
    assert plan["image"]["ref"] == up.image_ref.rsplit("@", 1)[0]
    assert {"gcc-8", "g++-8", "python3.9-venv", "libxml2"} <= set(plan["apt"])
    assert plan["apt_archive"] == "debian bullseye"
    assert plan["unpinned"] == []

    table = _plan(up, "--torch", "1.4.0", "--cuda", "10.1")
    assert table.exit_code == 0, table.stderr
    assert "standin/nested (third_party/dep/nested)" in table.stdout
    assert f"sha256:{up.files['runfile'][1]}" in table.stdout


def test_plan_of_the_real_matrix_pins(mirror_upstream, tmp_path):
    """The real 1.4.0 spec (CUDA 10.1, Python 3.7): NVIDIA's pinned files, the hashed wheels."""
    up = mirror_upstream
    config = tmp_path / "config.toml"
    config.write_text(f'git_mirror = "file://{up.git_root}"\n[overrides.tag_commits]\n"1.4.0" = "{up.commits["pytorch"]}"\n')
    result = _plan(up, "--torch", "1.4.0", "--cuda", "10.1", "--python", "3.7", "--json",
                   env={"PATCHER_CONFIG": str(config), "PATCHER_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    files = {f["name"]: f["sha256"] for f in plan["files"]}
    assert files["cuda_10.1.243_418.87.00_linux.run"] == "e7c22dc21278eb1b82f34a60ad7640b41ad3943d929bebda3008b72536855d31"
    assert files["cudnn-10.1-linux-x64-v7.6.3.30.tgz"] == "352557346d8111e2f954c494be1a90207103d316b8777c33e62b3a7f7b708961"
    wheels = {w["requirement"]: w["sha256"] for w in plan["wheels"]}
    assert wheels["numpy==1.17.5"] == "31db2f9604afbf897b23478942074bbbb2513467d2b4b4ac573a7b65c63c073c"
    assert set(wheels) == {"numpy==1.17.5", "PyYAML==5.4.1", "setuptools==44.1.1", "wheel==0.34.2"}
    assert plan["image"]["digest"] == "sha256:152dc042452c496007f07ca9127571cb9c29697f42acbfad72324b2bb2e43c98"
    assert plan["apt_archive"] == "ubuntu bionic"
    assert {"gcc-7", "g++-7", "python3.7", "python3.7-venv"} <= set(plan["apt"])


def test_plan_names_unpinned_inputs(mirror_upstream, tmp_path):
    up = mirror_upstream
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(up.matrix.read_text().replace(up.wheel[1], "unknown"))
    result = _plan(up, "--torch", "1.4.0", "--cuda", "none", env=up.env(PATCHER_MATRIX=str(matrix)))
    assert result.exit_code == 0, result.stderr
    assert "UNPINNED: sha256 of pip wheel standin-helper==1.0" in result.stdout


def test_plan_with_an_unreachable_upstream_fails_in_one_line(mirror_upstream, tmp_path):
    up = mirror_upstream
    config = tmp_path / "config.toml"
    config.write_text(f'git_mirror = "file://{tmp_path}/nowhere"\n')
    result = _plan(up, "--torch", "1.4.0", env=up.env(PATCHER_CONFIG=str(config)))
    assert result.exit_code == 23, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "tag v1.4.0" in result.stderr and "nowhere/pytorch/pytorch.git" in result.stderr
