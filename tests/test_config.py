"""Settings resolution and every config error, through the real CLI (exit 10, one line)."""

from __future__ import annotations

import pytest

from patcher.config import Settings


def test_flag_beats_environment_beats_file(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('mirror = "file:///from-file"\ngit_mirror = "file:///git-from-file"\n')
    monkeypatch.setenv("PATCHER_CONFIG", str(cfg))
    assert Settings.load().mirror == "file:///from-file"
    monkeypatch.setenv("PATCHER_MIRROR", "file:///from-env")
    assert Settings.load().mirror == "file:///from-env"
    assert Settings.load(mirror="file:///from-flag").mirror == "file:///from-flag"
    # finer settings override the one mirror setting per kind of input
    s = Settings.load()
    assert s.git_base() == "file:///git-from-file"
    assert s.files_base() == "file:///from-env/files"
    assert s.pypi_base() == "file:///from-env/wheelhouse"


def test_overrides_are_read(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[overrides]\ntag_commits = { "1.13.1" = "' + "a" * 40 + '" }\n')
    s = Settings.load(config_file=str(cfg))
    assert s.overrides.tag_commits == {"1.13.1": "a" * 40}


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("mirror = [", "is not valid TOML"),
        ('mirorr = "x"\n', "unknown setting(s) mirorr"),
        ('[overrides]\ncommits = {}\n', "unknown override(s) commits"),
        ('overrides = 3\n', "[overrides] must be a table"),
        ("DIR", "cannot be read"),
    ],
    ids=["missing", "bad-toml", "unknown-setting", "unknown-override", "overrides-not-table", "unreadable"],
)
def test_config_errors(tmp_path, patcher_cli, content, message):
    cfg = tmp_path / "config.toml"
    if content == "DIR":
        cfg.mkdir()
    elif content is not None:
        cfg.write_text(content)
    result = patcher_cli("matrix", env={"PATCHER_CONFIG": str(cfg)})
    assert result.exit_code == 10, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        ('tag_commits = { "1.13.1" = "not-a-sha" }', "is not a 40-digit SHA"),
        ('images = { "debian-bullseye" = "debian:bullseye" }', "must be REF@sha256:DIGEST"),
        ('artifacts = { "cuda_10.1.243_418.87.00_linux.run" = "abc" }', "must be a 64-digit sha256"),
    ],
)
def test_malformed_overrides_are_refused(tmp_path, patcher_cli, override, message):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[overrides]\n" + override + "\n")
    torch = "1.13.1" if "1.13.1" in override or "bullseye" in override else "1.4.0"
    result = patcher_cli("--config", str(cfg), "matrix", "--torch", torch)
    assert result.exit_code == 10, result.stderr
    assert message in result.stderr


def test_missing_matrix_file(tmp_path, patcher_cli):
    result = patcher_cli("--matrix", str(tmp_path / "nope.toml"), "matrix")
    assert result.exit_code == 10
    assert "matrix file" in result.stderr and "does not exist" in result.stderr


def test_every_command_is_documented(patcher_cli):
    result = patcher_cli("--help")
    assert result.exit_code == 0
    for command in ["matrix", "render", "lock", "base-image", "fetch", "patches", "build", "probe",
                    "certify", "verify", "keys", "publish", "yank", "mirror", "check"]:
        assert f"\n  {command} " in result.stdout, command
