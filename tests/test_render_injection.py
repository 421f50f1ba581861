"""`patcher render` cannot be steered by a value (issue 28 item 3).

A location setting with a line break, a quote or shell syntax must not reach the Dockerfile as
written: the render is refused with one line and writes nothing. Through the Python API the
refusal is exactly DockerfileInjectionError (exit 18); through the CLI a check at the edge may
refuse first, so the CLI tests accept any code of RENDER_REFUSAL_CODES.
"""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import jinja2
import pytest
import tomli_w
from dockerfile_parse import DockerfileParser

from patcher import compilecheck
from patcher.config import Overrides, Settings
from patcher.dockerfile import (
    RENDER_REFUSAL_CODES,
    TEMPLATE_FILTERS,
    Interpolation,
    Outside,
    instruction_structure,
    render,
    render_template,
    unfiltered_values,
)
from patcher.errors import DockerfileInjectionError, TemplateError
from patcher.spec import resolve

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = sorted((REPO / "dockerfiles").glob("*.j2"))
MIRROR = "https://mirror.example.internal/patcher"
REGISTRY = "registry.example.internal:5000"
CUDA_SPEC, CPU_SPEC, CPU_VENV_SPEC = ("1.4.0", "10.1"), ("1.13.1", "none"), ("1.4.0", "none")

# Each setting with the matrix entries where its value reaches the Dockerfile (a files mirror
# only moves CUDA downloads, a pypi index only the venv builds, a Debian mirror only Debian images).
SETTING_SPECS = {
    "files_mirror": [CUDA_SPEC],
    "pypi_index": [CUDA_SPEC, CPU_VENV_SPEC],
    "registry": [CUDA_SPEC, CPU_SPEC],
    "mirror": [CUDA_SPEC, CPU_SPEC],
    "debian_mirror": [CPU_SPEC],
}
CLI_FLAGS = {"files_mirror": "--files-mirror", "pypi_index": "--pypi-index", "registry": "--registry",
             "debian_mirror": "--debian-mirror"}


def payloads(marker: str) -> dict[str, str]:
    return {
        "newline-run": f"\nRUN touch {marker}",
        "quote-breakout": f"'; touch {marker}; '",
        "command-substitution": f"$(touch {marker})",
        "backticks": f"`touch {marker}`",
        "carriage-return": f"\rRUN touch {marker}",
        "continuation": f"\\\nRUN touch {marker}",
        "extra-argument": f" --upload-file {marker}",
    }


PAYLOAD_NAMES = list(payloads("M"))


def base_value(setting: str) -> str:
    return REGISTRY if setting == "registry" else MIRROR


def parsed(text: str) -> list[dict]:
    parser = DockerfileParser(fileobj=io.BytesIO())
    parser.content = text
    return parser.structure


# --- the Python API: exactly exit 18, one line naming the setting ------------------------------
API_CASES = [(setting, spec, name) for setting, specs in SETTING_SPECS.items() for spec in specs
             for name in PAYLOAD_NAMES]


@pytest.mark.parametrize("setting,spec,payload", API_CASES,
                         ids=[f"{s}-{t}-{c}-{p}" for s, (t, c), p in API_CASES])
def test_hostile_setting_is_refused_by_render(setting, spec, payload):
    value = base_value(setting) + payloads("/tmp/MARKER")[payload]
    settings = Settings(**{setting: value})
    build_spec = resolve(settings, spec[0], cuda=spec[1])
    with pytest.raises(DockerfileInjectionError) as caught:
        render(build_spec, settings)
    message = str(caught.value)
    assert caught.value.exit_code == 18
    assert "\n" not in message and "\r" not in message
    assert message.startswith(f"refusing to render {build_spec.build_id}: the {setting} setting")
    assert "would put " in message and " chars)" in message


def test_a_long_hostile_value_is_cut_with_its_length():
    value = MIRROR + "\nRUN " + "x" * 5000
    settings = Settings(pypi_index=value)
    with pytest.raises(DockerfileInjectionError) as caught:
        render(resolve(settings, "1.4.0", cuda="10.1"), settings)
    message = str(caught.value)
    assert f"({len(value)} chars)" in message and len(message) < 700


@pytest.mark.parametrize("pin", [
    "registry.example.internal/ubuntu:18.04 AS x\nRUN touch /tmp/MARKER@sha256:" + "0" * 64,
    "registry.example.internal/ubuntu:18.04@sha256:" + "0" * 64 + "\nRUN touch /tmp/MARKER",
])
def test_an_overridden_base_image_is_checked_too(pin):
    settings = Settings(overrides=Overrides(images={"ubuntu-18_04": pin}))
    spec = resolve(settings, "1.4.0", cuda="10.1")
    assert spec.image.overridden
    with pytest.raises(DockerfileInjectionError, match=r"the \[overrides.images\] pin would put a new Dockerfile line"):
        render(spec, settings)


def test_compile_check_image_refuses_a_hostile_builder_ref():
    settings = Settings()
    spec = resolve(settings, "1.13.1", cuda="none")
    with pytest.raises(DockerfileInjectionError) as caught:
        compilecheck.render_cuda_image(spec, "sha256:" + "a" * 64 + "\nRUN touch /tmp/MARKER", settings)
    assert caught.value.exit_code == 18
    assert "the builder image reference would put a new Dockerfile line" in str(caught.value)


# --- the CLI: flag, environment and config file; one line, nothing written ----------------------
def _cli_args(form: str, setting: str, value: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    if form == "env":
        return [], {f"PATCHER_{setting.upper()}": value}
    if form == "config":
        config = tmp_path / "config.toml"
        config.write_text(tomli_w.dumps({setting: value}), encoding="utf-8")
        return ["--config", str(config)], {}
    if setting == "mirror":
        return ["--mirror", value], {}
    return [CLI_FLAGS[setting], value], {}


def _render_args(global_args: list[str], spec: tuple[str, str], out: Path) -> list[str]:
    """`--files-mirror` & co. are options of `render`; `--mirror` and `--config` come before it."""
    own = global_args if global_args and global_args[0] in CLI_FLAGS.values() else []
    before = [] if own else global_args
    return [*before, "render", "--torch", spec[0], "--cuda", spec[1], "-o", str(out), *own]


CLI_CASES = ([(setting, "flag", name) for setting in ("files_mirror", "pypi_index", "registry", "mirror")
              for name in PAYLOAD_NAMES]
             + [(setting, form, name) for setting in ("files_mirror", "pypi_index", "registry", "mirror")
                for form in ("env", "config") for name in ("newline-run", "quote-breakout", "continuation")])


@pytest.mark.parametrize("setting,form,payload", CLI_CASES, ids=[f"{s}-{f}-{p}" for s, f, p in CLI_CASES])
def test_hostile_setting_is_refused_by_the_cli(tmp_path, monkeypatch, capsys, setting, form, payload):
    from patcher.cli import main

    marker = tmp_path / "MARKER"
    value = base_value(setting) + payloads(str(marker))[payload]
    global_args, env = _cli_args(form, setting, value, tmp_path)
    for name, env_value in env.items():
        monkeypatch.setenv(name, env_value)
    out = tmp_path / "out"
    # the console script's own code in this process (a new interpreter per case took 2 minutes)
    with pytest.raises(SystemExit) as ended:
        main([str(a) for a in _render_args(global_args, CUDA_SPEC, out)])
    stdout, stderr = capsys.readouterr()
    assert ended.value.code in RENDER_REFUSAL_CODES, (ended.value.code, stderr)
    assert stderr.startswith("patcher: error: ") and stderr.count("\n") == 1, stderr
    assert "\r" not in stderr and "Traceback" not in stderr
    assert stdout == ""
    assert not out.exists() and not marker.exists()


def test_cli_refusal_through_the_flag_names_the_setting(patcher_cli, tmp_path):
    # the edge refuses the value as a setting (19) before the render would (18, the API tests above)
    res = patcher_cli("render", "--torch", "1.13.1", "--cuda", "none", "--debian-mirror",
                      MIRROR + "\nRUN touch /tmp/MARKER", "-o", tmp_path / "out")
    assert res.exit_code == 19, res.stderr
    assert "setting debian_mirror (from --debian-mirror)" in res.stderr and "control characters" in res.stderr
    assert not (tmp_path / "out").exists()


# --- odd but safe values render, quoted so the shell sees exactly them ---------------------------
def _shell_words(structure: list[dict], needle: str) -> list[str]:
    run = next(i["value"] for i in structure if i["instruction"] == "RUN" and needle in i["value"])
    return shlex.split(run)


@pytest.mark.parametrize("index", [
    "https://mirror.example.internal/simple?token=a%20b&arch=x86_64",
    "https://user@mirror.example.internal:8443/pypi/simple/~site+test,1!*",
    "http://[fd00::1]:8080/simple",
])
def test_odd_but_safe_index_renders_quoted(index):
    settings = Settings(pypi_index=index)
    text = render(resolve(settings, "1.4.0", cuda="10.1"), settings).text
    words = _shell_words(parsed(text), "--index-url")
    assert words[words.index("--index-url") + 1] == index


def test_odd_but_safe_files_mirror_and_registry_render(patcher_cli, tmp_path):
    files = "https://mirror.example.internal/cuda%20files/a,b+c~d=e"
    res = patcher_cli("render", "--torch", "1.4.0", "--cuda", "10.1", "--files-mirror", files,
                      "--registry", "registry.example.internal:5000/site_images/v-1", "-o", tmp_path / "out")
    assert res.exit_code == 0, res.stderr
    structure = parsed((tmp_path / "out" / "Dockerfile").read_text())
    spec = resolve(Settings(), "1.4.0", cuda="10.1")
    words = _shell_words(structure, "/tmp/cuda.run")
    assert f"{files}/{spec.cuda_runfile.sha256}" in words
    assert [i["value"] for i in structure if i["instruction"] == "FROM"] == [
        f"registry.example.internal:5000/site_images/v-1/library/ubuntu:18.04@{spec.image.digest}"]


def test_default_renders_are_the_golden_files():
    """The filters quote exactly as the template did before them: 1.4.0 + CUDA 10.1 and 1.13.1 CPU
    with default settings are the golden files byte for byte."""
    for torch, cuda, golden in [("1.4.0", "10.1", "1.4.0-10.1"), ("1.13.1", "none", "1.13.1-cpu")]:
        settings = Settings()
        text = render(resolve(settings, torch, cuda=cuda), settings).text
        assert text.encode() == (REPO / "tests" / "golden" / "dockerfiles" / f"{golden}.Dockerfile").read_bytes()


# --- the filters ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["plain", "it's", "a b", "'; touch M; '", "$(x) `y` \\ \"z\""])
def test_sh_filter_quotes_one_word(value):
    assert shlex.split(Interpolation().sh(value)) == [value]


@pytest.mark.parametrize("value", ['say "hi" to a=b c=d', "caf\u00e9", "x;y && `z`"])
def test_env_value_round_trips_through_the_parser(value):
    parser = DockerfileParser(fileobj=io.BytesIO())
    parser.content = f"FROM scratch\nENV K={Interpolation().env_value(value)}\n"
    assert parser.envs == {"K": value}


def test_env_value_escapes_substitution_and_backslashes():
    # Docker unescapes \$ \\ \" inside double quotes (dockerfile-parse does not, so compare text).
    assert Interpolation().env_value('$HOME \\ "q"') == '"\\$HOME \\\\ \\"q\\""'


def test_filters_refuse_what_cannot_be_written_where_they_land():
    interp = Interpolation()
    refused = [(interp.sh, "a\nb"), (interp.bare, "a b"), (interp.bare, "a;b"), (interp.bare, ""),
               (interp.sha256, "0" * 63), (interp.env_value, "a\rb"), (interp.key, "A B"),
               (interp.comment, "x\nRUN y"), (interp.image_ref, "ubuntu:18.04"),
               (interp.image_ref, "ubuntu@sha256:" + "0" * 64 + " AS x"),
               (interp.image_ref, "Ubuntu@sha256:" + "0" * 64)]
    for flt, value in refused:
        with pytest.raises(Exception) as caught:
            flt(Outside(value, "the test setting"))
        assert type(caught.value).__name__ == "UnsafeValue", (flt.__name__, value)
        assert "the test setting" in str(caught.value.refusal("x"))
    assert interp.json("a\nb\"") == '"a\\nb\\""'
    assert interp.image_ref("sha256:" + "a" * 64) == "sha256:" + "a" * 64
    assert interp.image_ref("localhost:5000/a/b_c:t1@sha256:" + "a" * 64)


# --- every template prints values only through a filter -------------------------------------------
def test_there_are_templates_to_check():
    assert {p.name for p in TEMPLATES} >= {"builder.Dockerfile.j2", "compile-check-cuda.Dockerfile.j2"}


@pytest.mark.parametrize("template", TEMPLATES, ids=[p.name for p in TEMPLATES])
def test_every_template_filters_every_value(template):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters.update(Interpolation().filters())
    assert unfiltered_values(env, template.read_text(encoding="utf-8"), template.name) == []


@pytest.mark.parametrize("source", [
    "FROM {{ ref }}\n",
    "RUN echo {{ value | upper }}\n",
    "RUN echo {{ (value | sh) ~ other }}\n",
    "RUN echo {{ value | sh | trim }}\n",
    "RUN echo {{ value if flag else 'x' }}\n",
    "{% filter upper %}RUN echo {{ value | sh }}{% endfilter %}\n",
    "{% include 'other.j2' %}\n",
    "{% macro m() %}{{ value | sh }}{% endmacro %}RUN {{ m() }}\n",
])
def test_an_unfiltered_value_is_found(source):
    env = jinja2.Environment()
    env.filters.update(Interpolation().filters())
    assert unfiltered_values(env, source, "t.j2")


def test_a_template_with_an_unfiltered_value_is_refused_before_it_renders(patcher_cli, tmp_path):
    catalog = tmp_path / "catalog" / "dockerfiles"
    catalog.mkdir(parents=True)
    builder = (REPO / "dockerfiles" / "builder.Dockerfile.j2").read_text()
    (catalog / "builder.Dockerfile.j2").write_text(builder.replace("{{ from_ref | image_ref }}", "{{ from_ref }}"))
    res = patcher_cli("--catalog", tmp_path / "catalog", "render", "--torch", "1.13.1", "--cuda", "none",
                      "-o", tmp_path / "out")
    assert res.exit_code == TemplateError.exit_code, res.stderr
    assert res.stderr.count("\n") == 1 and "line 6: a value printed without one of the filters" in res.stderr
    assert not (tmp_path / "out").exists()


# --- parsing back: an approved filter in the wrong spot still cannot add an instruction -----------
def _catalog(tmp_path: Path, template: str) -> Settings:
    (tmp_path / "dockerfiles").mkdir(exist_ok=True)
    (tmp_path / "dockerfiles" / "t.Dockerfile.j2").write_text(template)
    return Settings(catalog=tmp_path)


REF = "registry.example.internal/base@sha256:" + "0" * 64


@pytest.mark.parametrize("template,value,changed", [
    ("FROM {{ ref | image_ref }}\nRUN echo {{ v | comment }}\n", "x && touch /tmp/MARKER", "line 2"),
    ("FROM {{ ref | image_ref }}\nRUN echo {{ v | comment }}\nUSER 1000\n", "x \\", "line 2"),
    ("FROM {{ ref | image_ref }}\nLABEL a={{ v | comment }}\n", '"x" b="y"', "line 2"),
    ("FROM {{ ref | image_ref }}\nUSER {{ v | comment }}\n", "1000 2000", "line 2"),
    ("FROM {{ ref | image_ref }}\nRUN echo '{{ v | bare }}' {{ w | comment }}\n", "x", "line 2"),
])
def test_a_changed_instruction_structure_is_refused(tmp_path, template, value, changed):
    settings = _catalog(tmp_path, template)
    values = {"ref": REF, "v": Outside(value, "the test setting"), "w": Outside("a | sh", "the w setting")}
    with pytest.raises(DockerfileInjectionError) as caught:
        render_template(settings, "t.Dockerfile.j2", values, subject="t")
    message = str(caught.value)
    assert caught.value.exit_code == 18 and "\n" not in message
    assert f"a changed Dockerfile ({changed} would be" in message, message
    assert "the test setting" in message or "the w setting" in message


def test_the_same_structure_renders(tmp_path):
    settings = _catalog(tmp_path, "FROM {{ ref | image_ref }}\nRUN echo {{ v | sh }} && true\n")
    text = render_template(settings, "t.Dockerfile.j2", {"ref": REF, "v": "a && b; `c` $(d)"})
    assert [i["instruction"] for i in parsed(text)] == ["FROM", "RUN"]
    assert instruction_structure(text)[1] == ("RUN", 0, ("w", "w", "&&", "w"))


def test_every_filter_is_approved_and_documented():
    readme = (REPO / "dockerfiles" / "README.md").read_text()
    for name in TEMPLATE_FILTERS:
        assert f"`{name}`" in readme, f"filter {name} is not described in dockerfiles/README.md"
