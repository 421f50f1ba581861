"""Upload error paths against the real pypiserver: each a one-line message with its exit code."""

from __future__ import annotations

from tests.fixtures.index_env import free_port, write_minimal_wheel


def _assert_fails(res, code, message):
    assert res.exit_code == code, (res.exit_code, res.stderr)
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr


def test_upload_errors(pypiserver_index, patcher_cli, tmp_path):
    srv = pypiserver_index
    wheel = write_minimal_wheel(tmp_path, "uploadcheck", "1.0")
    args = ["publish", "--url", srv.url + "/", "--user", srv.user, "--password-env", "PW", wheel]

    res = patcher_cli(*args, env={"PW": "wrong-password"})
    _assert_fails(res, 72, "refused the credentials")
    assert "wrong-password" not in res.stderr
    assert not (srv.packages / wheel.name).exists()

    _assert_fails(patcher_cli(*args, env={"PW": ""}), 72, "environment variable PW is not set")

    dead = f"http://127.0.0.1:{free_port()}/"
    res = patcher_cli("publish", "--url", dead, "--user", srv.user, "--password-env", "PW", wheel,
                      env={"PW": srv.password})
    _assert_fails(res, 72, "cannot reach index server")

    res = patcher_cli(*args, env={"PW": srv.password})
    assert res.exit_code == 0, res.stderr
    assert (srv.packages / wheel.name).is_file()
