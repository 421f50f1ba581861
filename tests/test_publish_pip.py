"""pip installs the full local version, with --require-hashes, from both kinds of index we publish to:
the static index (served by `python -m http.server`) and a real pypiserver (uploaded to with auth)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from tests.fixtures.index_env import TORCH_VERSION, serve_directory


@pytest.fixture
def fresh_venv(tmp_path):
    venv = tmp_path / "fresh-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv


def _pip(venv, *args):
    """The project's pip drives the fresh interpreter (pip --python); the machine's pip config
    (find-links and the like) is left out, so the index under test is the only source."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args,
                           "--no-cache-dir", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=300, env=env)


def _pip_install_pinned(venv, index_url, wheel, tmp_path):
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    req = tmp_path / "requirements.txt"
    req.write_text(f"torch=={TORCH_VERSION} --hash=sha256:{sha}\n")
    proc = _pip(venv, "install", "--no-deps", "--require-hashes", "--index-url", index_url, "-r", str(req))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == TORCH_VERSION
    return proc.stdout + proc.stderr


def test_pip_installs_from_the_static_index(certified_bundle, patcher_cli, fresh_venv, tmp_path):
    b = certified_bundle
    idx = tmp_path / "index"
    res = patcher_cli("publish", "--index", idx, b.wheel)
    assert res.exit_code == 0, res.stderr
    with serve_directory(idx) as url:
        log = _pip_install_pinned(fresh_venv, url + "/simple/", b.wheel, tmp_path)
        # resolving alone reads the PEP 658/714 metadata file (pip checks it against data-core-metadata)
        dry = _pip(fresh_venv, "install", "--dry-run", "--force-reinstall", "--no-deps", "--index-url",
                   url + "/simple/", f"torch=={TORCH_VERSION}")
    assert "Successfully installed torch-" + TORCH_VERSION in log
    assert dry.returncode == 0, dry.stderr
    assert f"{b.wheel.name.replace('+', '%2B')}.metadata" in dry.stdout and "Would install" in dry.stdout


def test_upload_to_pypiserver_and_pip_installs_from_it(certified_bundle, patcher_cli, pypiserver_index,
                                                       fresh_venv, tmp_path):
    b = certified_bundle
    srv = pypiserver_index
    env = {"INDEX_PASSWORD": srv.password}
    res = patcher_cli("publish", "--url", srv.url + "/", "--user", srv.user, "--password-env", "INDEX_PASSWORD",
                      b.wheel, env=env)
    assert res.exit_code == 0, res.stderr
    assert f"uploaded {b.wheel.name}" in res.stdout
    assert srv.password not in res.stdout + res.stderr
    assert (srv.packages / b.wheel.name).read_bytes() == b.wheel.read_bytes()
    log = _pip_install_pinned(fresh_venv, srv.url + "/simple/", b.wheel, tmp_path)
    assert "Successfully installed torch-" + TORCH_VERSION in log

    # the same file again: the server keeps published files immutable
    res = patcher_cli("publish", "--url", srv.url + "/", "--user", srv.user, "--password-env", "INDEX_PASSWORD",
                      b.wheel, env=env)
    assert res.exit_code == 73 and "already has" in res.stderr, res.stderr
