"""A corpus of hostile and malformed values for every flag, environment variable and config key
that reaches git, a container, a Dockerfile, a file path or the index.

Each case asserts: the exit code, exactly one line on stderr (``patcher: error: ...``, no
traceback) naming the setting and where it came from, nothing on stdout, that the payload did
nothing (every payload tries to create MARKER; it must not exist) and that nothing was left
behind (the output, cache and work folders the command was given were never created).

Most cases run the real CLI in-process (``patcher.cli.main``: the same code as the console
script, a few milliseconds a case); the ones that would reach git or the Docker engine also run
through the real entry point in a child process, with the engine's containers counted before
and after.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest

from patcher.cli import main as patcher_main
from tests.fixtures.common import run_patcher

EXPECTED_SETTING_CODE = 19
MIRROR_HOST = "mirror.example.internal"   # a placeholder name; nothing resolves it

# Every payload tries to create MARKER ({M}); a location value that reached git, a shell or a
# Dockerfile as code would run it.
LOCATION_PAYLOADS = {
    "git-upload-pack": "--upload-pack=touch {M}",
    "git-ext-transport": "ext::sh -c touch% {M}",
    "git-fd-transport": "fd::3",
    "ssh-proxycommand": "-oProxyCommand=touch {M}",
    "newline-run": f"https://{MIRROR_HOST}/x\nRUN touch {{M}}",
    "crlf-run": "file:///srv/mirror\r\nRUN touch {M}",
    "continuation": f"https://{MIRROR_HOST}/x\\\nRUN touch {{M}}",
    "quote-breakout": f"https://{MIRROR_HOST}/x'; touch {{M}}; '",
    "double-quote-breakout": f'https://{MIRROR_HOST}/x"; touch {{M}}; "',
    "command-substitution": f"https://{MIRROR_HOST}/$(touch {{M}})",
    "backticks": f"https://{MIRROR_HOST}/`touch {{M}}`",
    "nul-byte": f"https://{MIRROR_HOST}/x\x00touch {{M}}",
    "scheme-javascript": "javascript:touch {M}",
    "relative-path": "mirror/relative",
    "huge": "https://" + "x" * 20000,
}
URL_SETTINGS = ["mirror", "git_mirror", "files_mirror", "pypi_index", "debian_mirror"]
REGISTRY_PAYLOADS = {
    "newline-run": "registry.example.internal:5000\nRUN touch {M}",
    "command-substitution": "registry.example.internal/$(touch {M})",
    "quote": "registry.example.internal/x'y",
    "scheme": "https://registry.example.internal",
    "leading-dash": "--add-host=x:1.2.3.4",
    "port-out-of-range": "registry.example.internal:99999",
    "upper-case-path": "registry.example.internal/Images",
    "space": "registry.example.internal images",
}


def _command_for(setting: str, tmp: Path) -> list[str]:
    """A command that would take the setting somewhere: git for git mirrors, a Dockerfile for the
    others; every output it could write is under ``tmp/out`` or ``tmp/cache``."""
    if setting in ("mirror", "git_mirror"):
        return ["fetch", "--torch", "1.4.0", "--cache", str(tmp / "cache"), "-o", str(tmp / "out")]
    return ["render", "--torch", "1.4.0", "--cuda", "10.1", "-o", str(tmp / "out")]


def _flag_for(setting: str) -> list[str]:
    return ["--" + setting.replace("_", "-")]


def _call(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        patcher_main(argv)
    out, err = capsys.readouterr()
    return int(ended.value.code or 0), out, err


def _assert_refused(code: int, out: str, err: str, tmp: Path, *, expected_code: int = EXPECTED_SETTING_CODE,
                    names: tuple[str, ...] = ()) -> None:
    assert code == expected_code, err
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert err.startswith("patcher: error: ") and "Traceback" not in err
    assert len(err) < 1000, len(err)
    for name in names:
        assert name in err, (name, err)
    assert out == ""
    assert not (tmp / "MARKER").exists(), "the payload ran"
    for left in ("out", "cache", "work", "index"):
        assert not (tmp / left).exists(), f"{left} was created"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No site configuration from the machine: only what the case sets."""
    for name in ["CONFIG", "MIRROR", "GIT_MIRROR", "FILES_MIRROR", "PYPI_INDEX", "DEBIAN_MIRROR", "REGISTRY",
                 "WORK_DIR", "CACHE_DIR", "CATALOG", "KEY_PATH", "DOCKER_HOST", "MATRIX", "ADVISORIES"]:
        monkeypatch.delenv("PATCHER_" + name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def _toml_string(value: str) -> str:
    # TOML basic string with every control character escaped, so the file parses and the value
    # arrives exactly as the payload is written.
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in escaped)
    return f'"{escaped}"'


# --- URL settings: flag, environment variable, config file --------------------------------------
@pytest.mark.parametrize("setting, origin, payload_id", [
    (s, o, p) for s, o, p in itertools.product(URL_SETTINGS, ["flag", "env", "file"], LOCATION_PAYLOADS)
    # a flag of its own exists for these; the config and environment forms for all
    if o != "flag" or s in ("mirror", "git_mirror", "files_mirror", "pypi_index", "debian_mirror")
])
def test_location_settings_refuse_hostile_values(setting, origin, payload_id, tmp_path, clean_env, capsys):
    value = LOCATION_PAYLOADS[payload_id].format(M=tmp_path / "MARKER")
    command = _command_for(setting, tmp_path)
    if origin == "flag":
        argv = (["--mirror", value] + command) if setting == "mirror" else (command + _flag_for(setting) + [value])
        where = "--" + setting.replace("_", "-")
    elif origin == "env":
        if "\x00" in value:  # the environment cannot carry NUL; the flag and file forms test it
            value = value.replace("\x00", "\x01")
        clean_env.setenv("PATCHER_" + setting.upper(), value)
        argv, where = command, "$PATCHER_" + setting.upper()
    else:
        config = tmp_path / "config.toml"
        config.write_text(f"# site settings\n{setting} = {_toml_string(value)}\n")
        argv, where = ["--config", str(config)] + command, f"{config}:2"
    if origin == "flag" and setting not in ("mirror", "git_mirror") and command[0] != "render":
        pytest.fail("every flag case must reach a command that uses it")
    code, out, err = _call(argv, capsys)
    _assert_refused(code, out, err, tmp_path, names=(f"setting {setting}", where))


# --- registries -------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["render-flag", "lock-flag", "env", "file", "mirror-sync-flag", "base-image-push"])
@pytest.mark.parametrize("payload_id", list(REGISTRY_PAYLOADS))
def test_registry_values_are_refused(route, payload_id, tmp_path, clean_env, capsys):
    value = REGISTRY_PAYLOADS[payload_id].format(M=tmp_path / "MARKER")
    render = ["render", "--torch", "1.4.0", "--cuda", "10.1", "-o", str(tmp_path / "out")]
    if route == "render-flag":
        argv = render + ["--registry", value]
    elif route == "lock-flag":
        argv = ["lock", "--registry", value]
    elif route == "mirror-sync-flag":
        argv = ["mirror", "sync", "--torch", "1.4.0", "--to", str(tmp_path / "out"), "--registry", value]
    elif route == "base-image-push":
        argv = ["base-image", "--suite", "bullseye", "--push", value]
    elif route == "env":
        clean_env.setenv("PATCHER_REGISTRY", value)
        argv = render
    else:
        config = tmp_path / "config.toml"
        config.write_text(f"registry = {_toml_string(value)}\n")
        argv = ["--config", str(config)] + render
    code, out, err = _call(argv, capsys)
    _assert_refused(code, out, err, tmp_path, names=("registry",))


# --- values that are not strings, directories that are not there --------------------------------
@pytest.mark.parametrize("line, setting, rule", [
    ("mirror = 5", "mirror", "must be a string, not an integer"),
    ("work_dir = 5", "work_dir", "must be a string, not an integer"),
    ("registry = true", "registry", "must be a string, not a boolean"),
    ("catalog = []", "catalog", "must be a string, not an array"),
    ("key_path = { a = 1 }", "key_path", "must be a string, not a table"),
    ("cache_dir = 1.5", "cache_dir", "must be a string, not a number"),
    ('git_mirror = ""', "git_mirror", "must not be empty"),
    ('docker_host = "tcp://"', "docker_host", "needs a host"),
    ('docker_host = "unix://relative.sock"', "docker_host", "absolute socket path"),
    ('docker_host = "ftp://engine.example.internal"', "docker_host", "must be unix:///PATH"),
    ('catalog = "/nonexistent/catalog"', "catalog", "the directory does not exist"),
    ('work_dir = "-rf"', "work_dir", "must not start with '-'"),
])
def test_config_values_of_the_wrong_kind_are_refused(line, setting, rule, tmp_path, clean_env, capsys):
    config = tmp_path / "config.toml"
    config.write_text(f"\n{line}\n")
    code, out, err = _call(["--config", str(config), "advisories", "--torch", "1.4.0"], capsys)
    _assert_refused(code, out, err, tmp_path, names=(f"setting {setting}", f"{config}:2", rule))


@pytest.mark.parametrize("override", [
    "images = 3",
    'tag_commits = { "1.4.0" = 7 }',
    'artifacts = ["x"]',
])
def test_overrides_that_are_not_tables_of_strings(override, tmp_path, clean_env, capsys):
    config = tmp_path / "config.toml"
    config.write_text(f"[overrides]\n{override}\n")
    code, out, err = _call(["--config", str(config), "matrix", "--torch", "1.4.0"], capsys)
    _assert_refused(code, out, err, tmp_path, names=("setting overrides.", "must be a table of strings"))


def test_a_missing_catalog_is_refused_not_read_as_empty(tmp_path, clean_env, capsys):
    """An empty catalog once made `advisories` call CVE-2022-45907 exploitable for a series that fixes it."""
    clean_env.setenv("PATCHER_CATALOG", str(tmp_path / "nowhere"))
    code, out, err = _call(["advisories", "--torch", "1.4.0"], capsys)
    _assert_refused(code, out, err, tmp_path, names=("setting catalog", "$PATCHER_CATALOG", "does not exist"))
    (tmp_path / "empty").mkdir()
    code, out, err = _call(["--catalog", str(tmp_path / "empty"), "advisories", "--torch", "1.4.0"], capsys)
    _assert_refused(code, out, err, tmp_path, names=("setting catalog", "--catalog", "holds no patches/ or dockerfiles/"))


@pytest.mark.parametrize("make, rule", [
    ("file", "is not a directory"),
    ("under-file", "is not a directory"),
    ("dangling-link", "dangling symbolic link"),
])
def test_work_and_cache_directories_must_be_writable(make, rule, tmp_path, clean_env, capsys):
    blocker = tmp_path / "blocker"
    if make == "dangling-link":
        blocker.symlink_to(tmp_path / "gone")
        target = blocker
    else:
        blocker.write_text("")
        target = blocker if make == "file" else blocker / "work"
    for argv, setting in ((["fetch", "--torch", "1.4.0", "--cache", str(target), "-o", str(tmp_path / "out")],
                           "cache_dir"),
                          (["build", "--torch", "1.4.0", "--cuda", "none", "--work", str(target)], "work_dir")):
        code, out, err = _call(argv, capsys)
        if code == 5:  # click's own Path(file_okay=False) saw the file first: a usage error, one line too
            _assert_refused(code, out, err, tmp_path, expected_code=5, names=("is a file",))
        else:
            _assert_refused(code, out, err, tmp_path, names=(f"setting {setting}", rule))


# --- flags that reach the Docker engine, a container or git directly ------------------------------
FLAG_CASES = {
    "build-ccache-volume": (["build", "--torch", "1.4.0", "--cuda", "none", "--ccache-volume",
                             "v --mount type=bind,src=/,dst=/host"], "ccache_volume"),
    "build-ccache-volume-path": (["build", "--torch", "1.4.0", "--cuda", "none", "--ccache-volume", "/etc"],
                                 "ccache_volume"),
    "build-probe-image": (["build", "--torch", "1.4.0", "--cuda", "none", "--probe-image", "img; touch {M}"],
                          "probe_image"),
    "build-docker-host": (["build", "--torch", "1.4.0", "--cuda", "none", "--docker-host",
                           "ssh://-oProxyCommand=touch {M}"], "docker_host"),
    "build-docker-host-newline": (["build", "--torch", "1.4.0", "--cuda", "none", "--docker-host",
                                   "tcp://engine.example.internal:2375\ntouch {M}"], "docker_host"),
    "build-git-mirror": (["build", "--torch", "1.4.0", "--cuda", "none", "--git-mirror",
                          "--upload-pack=touch {M}"], "git_mirror"),
    "build-work-newline": (["build", "--torch", "1.4.0", "--cuda", "none", "--work", "work\nx"], "work_dir"),
    "probe-image": (["probe", "--image", "--entrypoint=touch {M}"], "image"),
    "probe-image-digest": (["probe", "--image", "debian@sha256:xyz"], "image"),
    "probe-docker-host": (["probe", "--image", "debian", "--docker-host", "unix://$(touch {M})"], "docker_host"),
    "probe-only": (["probe", "--python", "python3", "--only", "env;touch {M}"], "only"),
    "probe-patched-ids": (["probe", "--python", "python3", "--patched-ids", "PT-0001 $(touch {M})"],
                          "patched_ids"),
    "check-image": (["check", "--compile", "--torch", "1.4.0", "--image", "x`touch {M}`"], "image"),
    "base-image-suite": (["base-image", "--suite", "bullseye;touch {M}"], "suite"),
    "base-image-mirror-url": (["base-image", "--suite", "bullseye", "--mirror-url",
                               "http://deb.example.internal/debian'$(touch {M})'"], "debian_mirror"),
    "base-image-tag": (["base-image", "--suite", "bullseye", "--tag", "x:y\ntouch {M}"], "tag"),
    "base-image-include": (["base-image", "--suite", "bullseye", "--include", "curl,--hook=touch {M}"], "include"),
    "mirror-sync-from": (["mirror", "sync", "--torch", "1.4.0", "--to", "{T}/out", "--from",
                          "--upload-pack=touch {M}"], "git_mirror"),
    "mirror-plan-from": (["mirror", "plan", "--torch", "1.4.0", "--from", "ext::sh -c touch% {M}"], "git_mirror"),
    "publish-url": (["publish", "--url", "https://index.example.internal/'$(touch {M})'", "w.whl"], "url"),
    "publish-url-scheme": (["publish", "--url", "file:///{T}/index", "w.whl"], "url"),
    "publish-password-env": (["publish", "--url", "https://index.example.internal/", "--password-env",
                              "X;touch {M}", "w.whl"], "password_env"),
    "patches-new-range": (["patches", "new", "--torch", "1.4.0", "--source", "{T}", "--from-commits",
                           "--output=/tmp/x"], "from_commits"),
    "fetch-cache-newline": (["fetch", "--torch", "1.4.0", "--cache", "c\nd", "-o", "{T}/out"], "cache_dir"),
    "global-mirror-dash": (["--mirror", "-x", "matrix"], "mirror"),
}


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_flags_that_reach_engine_git_or_index_are_refused(case, tmp_path, clean_env, capsys):
    argv, setting = FLAG_CASES[case]
    argv = [a.format(M=tmp_path / "MARKER", T=tmp_path) for a in argv]
    code, out, err = _call(argv, capsys)
    # a value click itself cannot parse (an option-like value) is a usage error (3/5); the rest
    # are patcher's setting refusals
    assert code in (EXPECTED_SETTING_CODE, 3, 5), err
    _assert_refused(code, out, err, tmp_path, expected_code=code,
                    names=(setting,) if code == EXPECTED_SETTING_CODE else ())


# --- click's own usage errors: one line, a code of their own --------------------------------------
@pytest.mark.parametrize("argv, code, fragment", [
    (["fetch"], 4, "Missing option '--torch'"),
    (["fetch", "--torch", "1.4.0", "--nope"], 3, "No such option '--nope'"),
    (["build", "--torch", "1.4.0", "--gpus", "some"], 5, "'some' is not one of"),
    (["build", "--torch", "1.4.0", "--jobs", "0"], 5, "--jobs"),
    (["nosuchcommand"], 2, "No such command"),
    (["build", "--torch", "1.4.0", "--resume", "--fresh"], 2, "exclude each other"),
    (["matrix", "--gcc", "seven"], 5, "'seven' is not a valid integer"),
])
def test_usage_errors_are_one_line_with_their_own_code(argv, code, fragment, tmp_path, clean_env, capsys):
    got, out, err = _call(argv, capsys)
    _assert_refused(got, out, err, tmp_path, expected_code=code, names=(fragment, "--help"))


def test_a_huge_or_multiline_value_is_echoed_cut_and_on_one_line(tmp_path, clean_env, capsys):
    code, out, err = _call(["matrix", "--torch", "1" * 20000], capsys)
    _assert_refused(code, out, err, tmp_path, expected_code=11, names=("20,000 characters",))
    code, out, err = _call(["matrix", "--torch", "1.4.0\n1.13.1"], capsys)
    _assert_refused(code, out, err, tmp_path, expected_code=11, names=("1.4.0\\n1.13.1",))


# --- the real entry point, with the engine watched ------------------------------------------------
def _containers() -> set[str]:
    return set(subprocess.run(["docker", "ps", "-aq", "--no-trunc"], capture_output=True, text=True,
                              check=True).stdout.split())


@pytest.mark.docker
@pytest.mark.parametrize("argv, env_name", [
    (["fetch", "--torch", "1.4.0", "--cache", "{T}/cache", "-o", "{T}/out", "--git-mirror",
      "--upload-pack=touch {M}"], None),
    (["fetch", "--torch", "1.4.0", "--cache", "{T}/cache", "-o", "{T}/out"], "PATCHER_GIT_MIRROR"),
    (["build", "--torch", "1.4.0", "--cuda", "none", "--work", "{T}/work"], "PATCHER_MIRROR"),
    (["render", "--torch", "1.4.0", "--cuda", "10.1", "-o", "{T}/out"], "PATCHER_FILES_MIRROR"),
    (["build", "--torch", "1.4.0", "--cuda", "none", "--work", "{T}/work", "--ccache-volume",
      "x;touch {M}"], None),
])
def test_the_console_entry_point_refuses_and_leaves_nothing(argv, env_name, tmp_path):
    marker = tmp_path / "MARKER"
    argv = [a.format(M=marker, T=tmp_path) for a in argv]
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PATCHER_CONFIG": ""}
    if env_name:
        env[env_name] = f"https://{MIRROR_HOST}/x\nRUN touch {marker}" if env_name != "PATCHER_GIT_MIRROR" \
            else f"--upload-pack=touch {marker}"
    before = _containers()
    result = run_patcher(*argv, env=env, cwd=tmp_path, timeout=120)
    _assert_refused(result.exit_code, result.stdout, result.stderr, tmp_path)
    assert _containers() == before
