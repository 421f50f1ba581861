"""Render stage: BuildSpec -> a digest-pinned builder Dockerfile (+ the files its context needs).

The template (``dockerfiles/builder.Dockerfile.j2``, jinja2 with StrictUndefined) gets plain
values computed here, so every location a build downloads from passes through one place:

* the base image: pinned by digest; ``registry`` (or ``<mirror>/images``) moves it to a
  site registry (the digest still names the same content);
* CUDA runfile and cuDNN archive: sha256-checked in the build; ``files_base()`` serves them
  as ``<files_base>/<sha256>``;
* pip wheels: ``--require-hashes`` from a requirements file in the context; ``pypi_base()``
  is the index;
* apt: the image's own sources, or ``debian_mirror`` / ``<mirror>/<family>`` when set.

The output is a pure function of (spec, settings, template, matrix): byte-for-byte the same on
every run, so its sha256 names the image (``patcher-builder:<16 hex>``).

Rendering cannot be steered by a value (issue 28): settings reach here from flags, environment
and config files, and through the Python API unvalidated. So, independently of any check at the
edge: download URLs are checked as URLs; every ``{{ }}`` of a template goes through a filter that
quotes or validates for the spot it lands in (``TEMPLATE_FILTERS``; a template with an unfiltered
value is refused before it renders); and the rendered text is parsed back and its instructions
compared with the same template rendered with placeholder values. Any difference is
``DockerfileInjectionError`` (exit 18) naming the setting; nothing is written.

Contract with the build stage (builder.py): the image has a user ``builder`` (uid 1000, home
/home/builder) owning ``/src`` (the patched tree is copied there), ``/ccache`` (CCACHE_DIR) and
``/out`` (wheels); ``PATCHER_PYTHON`` is the interpreter to build with; the spec's build
environment (compiler, arch list, wheel version) is set as ENV.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from dockerfile_parse import DockerfileParser
from jinja2 import nodes

from patcher.config import Settings
from patcher.errors import (
    ConfigError,
    DockerfileInjectionError,
    InvalidSettingError,
    OutputWriteError,
    TemplateError,
    UnpinnedInputError,
)
from patcher.spec import BuildSpec, is_known, load_matrix

TEMPLATE_NAME = "builder.Dockerfile.j2"
REQUIREMENTS_NAME = "requirements.txt"
BUILDER_UID = 1000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A fixed mtime for context archives, so equal inputs give equal build contexts.
CONTEXT_MTIME = 0


@dataclass(frozen=True)
class PipRequirement:
    requirement: str  # "numpy==1.17.5"
    sha256: str

    @property
    def line(self) -> str:
        return f"{self.requirement} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class BuildPackages:
    """What the builder image installs; `patcher mirror plan` lists the same."""

    apt: tuple[str, ...]
    pip: tuple[PipRequirement, ...]
    python_mode: str  # "debian": the base image's own Python + Debian modules; "venv": pip into a venv


@dataclass(frozen=True)
class RenderedDockerfile:
    text: str
    sha256: str
    image_tag: str
    build_id: str
    labels: dict[str, str] = field(default_factory=dict)
    context_files: dict[str, bytes] = field(default_factory=dict)

    def context_tar(self) -> bytes:
        return build_context_tar(self.text, self.context_files)

    def write(self, out_dir: Path) -> list[Path]:
        """Write the Dockerfile and its context files into out_dir (each via temp + rename)."""
        written = []
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            for name, data in [("Dockerfile", self.text.encode()), *sorted(self.context_files.items())]:
                path = out_dir / name
                tmp = path.with_name(f".{name}.part")
                try:
                    tmp.write_bytes(data)
                    tmp.replace(path)
                finally:
                    tmp.unlink(missing_ok=True)
                written.append(path)
        except OSError as exc:
            raise OutputWriteError(f"cannot write into {out_dir}: {exc.strerror or exc}",
                                   hint="pick a writable directory with -o") from None
        return written


# ----------------------------------------------------------------------------------------------
def build_context_tar(dockerfile_text: str, files: dict[str, bytes]) -> bytes:
    """A deterministic build context: Dockerfile + files, fixed owner, mode and mtime."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [("Dockerfile", dockerfile_text.encode()), *sorted(files.items())]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), CONTEXT_MTIME, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build_packages(spec: BuildSpec, settings: Settings, matrix: dict[str, Any] | None = None) -> BuildPackages:
    """The apt packages and hashed pip requirements of this spec's builder image."""
    m = matrix if matrix is not None else load_matrix(settings.matrix)
    rel = m["torch"][spec.torch]
    img = m["images"][spec.image.name]
    apt: list[str] = list(img.get("build_packages", ()))
    apt += [f"gcc-{spec.gcc}", f"g++-{spec.gcc}"]
    debian = rel.get("debian_packages", {})
    python_mode = "debian" if ("python" in debian and spec.python == img.get("system_python")) else "venv"
    pip: list[PipRequirement] = []
    if python_mode == "debian":
        # python3-venv: the build's probe stage installs the wheel into a venv in this image.
        apt += ["python3", "python3-dev", "python3-venv", *debian["python"]]
    else:
        apt += [f"python{spec.python}", f"python{spec.python}-dev", f"python{spec.python}-venv"]
        wheels = m.get("pip", {}).get("wheels", {})
        for req in rel.get("pip", ()):
            hashes = wheels.get(req, {})
            pinned = settings.overrides.artifacts.get(pip_artifact_name(req, spec.python))
            pip.append(PipRequirement(req, pinned or hashes.get(spec.python) or hashes.get("any") or "unknown"))
    if spec.is_cpu:
        apt += debian.get("cpu", ())
    else:
        # cuda-installer (11.x runfiles) links libxml2; minimal images lack it.
        apt += ["libxml2"]
    return BuildPackages(apt=tuple(sorted(set(apt))), pip=tuple(pip), python_mode=python_mode)


def pip_artifact_name(requirement: str, python: str) -> str:
    """The [overrides.artifacts] key that pins a wheel the matrix has no hash for."""
    return f"pip:{requirement}:py{python}"


def image_from(spec: BuildSpec, settings: Settings) -> str:
    """The FROM reference: pinned by digest, moved to the site registry when one is set."""
    registry = settings.registry
    if not registry and settings.mirror and "://" in settings.mirror:
        registry = settings.mirror.split("://", 1)[1].rstrip("/") + "/images"
    ref = spec.image.ref
    if registry and not spec.image.overridden:
        first, _, rest = ref.partition("/")
        path = rest if rest and ("." in first or ":" in first or first == "localhost") else ref
        ref = f"{registry.rstrip('/')}/{path}"
    return f"{ref}@{spec.image.digest}"


def apt_base(spec: BuildSpec, settings: Settings) -> str | None:
    """The archive apt inside the image uses when the site redirects it; None keeps the image's own."""
    # A mirror that is a host directory (what `patcher mirror sync` writes) holds no distribution
    # archive and apt in a container could not read it: the image keeps its own sources then.
    mirror = settings.mirror if settings.mirror and not is_host_path(settings.mirror) else None
    if spec.image.family == "debian":
        base = settings.debian_mirror or (f"{mirror.rstrip('/')}/debian" if mirror else None)
    else:
        base = f"{mirror.rstrip('/')}/{spec.image.family}" if mirror else None
    return base.rstrip("/") if base else None


def apt_sources(spec: BuildSpec, settings: Settings) -> list[str]:
    """sources.list lines when the site redirects apt; empty keeps the base image's own."""
    base = apt_base(spec, settings)
    if not base:
        return []
    components = "main" if spec.image.family == "debian" else "main universe"
    codename = spec.image.codename
    return [f"deb {base} {suite} {components}" for suite in (codename, f"{codename}-updates")]


def is_host_path(base: str | None) -> bool:
    """A location without a scheme (or file://) is a directory on this host: fine for host-side
    steps (fetch, inputs), unreadable for downloads inside the image build."""
    return bool(base) and (base.startswith("file://") or "://" not in base)


def _refuse_host_paths(spec: BuildSpec, settings: Settings, packages: BuildPackages) -> None:
    unreadable = []
    if not spec.is_cpu and is_host_path(settings.files_base()):
        unreadable.append(f"the CUDA runfile and cuDNN archive from {settings.files_base()}")
    if packages.pip and is_host_path(settings.pypi_base()):
        unreadable.append(f"pip wheels from {settings.pypi_base()}")
    if is_host_path(settings.debian_mirror):
        unreadable.append(f"apt packages from {settings.debian_mirror}")
    if unreadable:
        raise ConfigError(f"the image build of {spec.build_id} downloads inside a container, which cannot read "
                          f"host directories: {'; '.join(unreadable)}",
                          hint="serve the mirror over HTTP and set mirror (or files_mirror / pypi_index / "
                               "debian_mirror) to its URL")


def artifact_url(url: str, sha256: str, settings: Settings) -> str:
    base = settings.files_base()
    return f"{base}/{sha256}" if base else url


def setting_origins(spec: BuildSpec, settings: Settings) -> dict[str, str]:
    """Which setting each redirected location comes from, as a refusal names it."""

    def setting(name: str, part: str | None = None) -> str:
        where = f"PATCHER_{name.upper()}, --{name.replace('_', '-')} or the config file"
        return f"the {name} setting ({f'its {part}; ' if part else ''}{where})"

    if spec.image.overridden:
        image = "the [overrides.images] pin"
    elif settings.registry:
        image = setting("registry")
    elif settings.mirror and "://" in settings.mirror:
        image = setting("mirror", "/images registry")
    else:
        image = "the matrix's base image"

    def pick(own: str, own_value: str | None, part: str, default: str) -> str:
        if own_value:
            return setting(own)
        return setting("mirror", part) if settings.mirror else default

    return {
        "image": image,
        "files": pick("files_mirror", settings.files_mirror, "/files", "the matrix's download URL"),
        "pip": pick("pypi_index", settings.pypi_index, "/wheelhouse", "the default index"),
        "apt": pick("debian_mirror", settings.debian_mirror if spec.image.family == "debian" else None,
                    f"/{spec.image.family}", "the image's apt sources"),
    }


def spec_labels(spec: BuildSpec) -> dict[str, str]:
    spec_json = json.dumps(spec.to_json(), sort_keys=True, separators=(",", ":"))
    return {
        "org.opencontainers.image.title": f"patcher builder {spec.build_id}",
        "org.opencontainers.image.description": (
            f"Builds torch {spec.wheel_version} from {spec.tag} with gcc {spec.gcc} and Python {spec.python}"),
        "org.opencontainers.image.base.name": spec.image.ref,
        "org.opencontainers.image.base.digest": spec.image.digest,
        "org.opencontainers.image.source": spec.repo,
        "org.opencontainers.image.revision": spec.commit,
        "org.opencontainers.image.version": spec.wheel_version,
        "org.patcher.build-id": spec.build_id,
        "org.patcher.spec-sha256": hashlib.sha256(spec_json.encode()).hexdigest(),
        "org.patcher.spec": spec_json,
    }


def build_environment(spec: BuildSpec, python_bin: str) -> dict[str, str]:
    env = {
        "CC": f"gcc-{spec.gcc}",
        "CXX": f"g++-{spec.gcc}",
        "CCACHE_DIR": "/ccache",
        "CMAKE_C_COMPILER_LAUNCHER": "ccache",
        "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
        "PATCHER_PYTHON": python_bin,
        "PYTORCH_BUILD_VERSION": spec.wheel_version,
    }
    if spec.is_cpu:
        env["USE_CUDA"] = "0"
    else:
        env.update({
            "USE_CUDA": "1",
            "CUDA_HOME": "/usr/local/cuda",
            "CUDAHOSTCXX": f"g++-{spec.gcc}",
            "CMAKE_CUDA_COMPILER_LAUNCHER": "ccache",
            "TORCH_CUDA_ARCH_LIST": spec.arch_list or "",
        })
        if spec.nvcc_flags:
            env["TORCH_NVCC_FLAGS"] = spec.nvcc_flags
    env.update(spec.build_env)
    return dict(sorted(env.items()))


# --- values that cannot steer the Dockerfile ---------------------------------------------------
# Exit codes a hostile value given to `patcher render` may end in: refused at the edge as a bad
# setting (InvalidSettingError, ConfigError) or here, as an injection.
RENDER_REFUSAL_CODES = frozenset({ConfigError.exit_code, InvalidSettingError.exit_code,
                                  DockerfileInjectionError.exit_code})

SHOWN_VALUE_CHARS = 200
# A word the shell and the Dockerfile parser give no meaning: shlex.quote leaves exactly these bare.
_BARE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# RFC 3986 characters, less the sub-delims a mirror URL never needs and shell syntax is made of
# (' $ ( ) ;): quoting would make them inert, but a location holding them is an attack or an
# accident, and a download from a URL nobody meant is refused rather than made.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[A-Za-z0-9\-._~:/?#\[\]@!&*+,=%]+")
# The distribution reference grammar (docker/distribution reference.go), digest required; an
# image ID (sha256:<hex>) is the other form FROM takes here.
_REF_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REF_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
_IMAGE_REF = re.compile(
    rf"(?:(?:{_REF_DOMAIN})/)?{_REF_COMPONENT}(?:/{_REF_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"@sha256:[0-9a-f]{64}|sha256:[0-9a-f]{64}")

# What a character would do if it reached the Dockerfile or the shell unquoted: the message says it.
_INJECTS = [
    ("\n", "a new Dockerfile line (an instruction of its own)"),
    ("\r", "a carriage return (a line break to the shell)"),
    ("\\", "a backslash (a Dockerfile line continuation or escape)"),
    ("'", "a single quote (a break-out of the shell quoting around it)"),
    ('"', "a double quote (a break-out of the Dockerfile quoting around it)"),
    ("`", "a backtick (a shell command substitution)"),
    ("$", "a dollar sign (a shell or Dockerfile substitution)"),
    (";", "a semicolon (a second shell command)"),
    ("(", "a parenthesis (a shell subshell)"),
    (")", "a parenthesis (a shell subshell)"),
]


def _what_it_injects(value: str) -> str:
    for char, what in _INJECTS:
        if char in value:
            return what
    if _CONTROL.search(value):
        return "a control character"
    if any(c.isspace() for c in value):
        return "whitespace (another word, argument or instruction part)"
    odd = sorted({c for c in value if not _BARE_WORD.fullmatch(c)})
    return f"characters {''.join(odd)!r}" if odd else "a value of the wrong form"


def shown(value: str) -> str:
    """One line, whatever the value holds: its repr cut to SHOWN_VALUE_CHARS, with its length."""
    text = str(value)
    cut = text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS] + "..."
    return f"{cut!r} ({len(text)} chars)"


class Outside(str):
    """A value from outside the template (a setting, the matrix, the spec), tagged with where it
    came from, so a refusal names the setting to fix."""

    origin: str

    def __new__(cls, value: str, origin: str) -> Outside:
        obj = super().__new__(cls, value)
        obj.origin = origin
        return obj


def origin_of(value: Any) -> str:
    return getattr(value, "origin", None) or "a template value"


class UnsafeValue(Exception):
    """Raised inside rendering; ``refusal(subject)`` is the user's DockerfileInjectionError."""

    def __init__(self, value: Any, landing: str, what: str | None = None):
        super().__init__(landing)
        # str() of an Outside is a plain str: take the origin first.
        self.origin, self.value, self.landing = origin_of(value), str(value), landing
        self.what = what or _what_it_injects(self.value)

    def refusal(self, subject: str) -> DockerfileInjectionError:
        return DockerfileInjectionError(
            f"refusing to render {subject}: {self.origin} would put {self.what} into "
            f"{self.landing}: {shown(self.value)}",
            hint="a location setting is one URL (a registry: host[:port][/path], an image: "
                 "name[:tag]@sha256:<64 hex>) without line breaks, quotes, whitespace, $, backticks or backslashes")


def checked_url(value: str, origin: str) -> Outside:
    """A download location: one URL of plain characters (see _URL), or an UnsafeValue."""
    if not _URL.fullmatch(value):
        what = None if _what_it_injects(value) != "a value of the wrong form" else "something that is not a URL"
        raise UnsafeValue(Outside(value, origin), "a download URL", what)
    return Outside(value, origin)


class Interpolation:
    """The filters every ``{{ }}`` of a template must end in, one per spot a value lands in.

    With ``placeholders`` each emits a harmless fixed value of its kind instead: the template
    rendered that way is the instruction structure the real rendering must have. ``emitted``
    keeps the real values, to name the one to blame when the structures differ.
    """

    def __init__(self, placeholders: bool = False):
        self.placeholders = placeholders
        self.emitted: list[Any] = []

    def _take(self, value: Any, landing: str, bad: re.Pattern | None = None,
              good: re.Pattern | None = None) -> str:
        text = str(value)
        self.emitted.append(value if isinstance(value, Outside) else text)
        if (bad is not None and bad.search(text)) or (good is not None and not good.fullmatch(text)):
            raise UnsafeValue(value, landing)
        return text

    def sh(self, value: Any) -> str:
        """One shell word, always single-quoted (also when shlex.quote would leave it bare, so
        the output stays what it was before the filters); no control characters."""
        text = self._take(value, "a shell word of a RUN instruction", bad=_CONTROL)
        return "'v'" if self.placeholders else "'" + text.replace("'", "'\"'\"'") + "'"

    def bare(self, value: Any) -> str:
        """A word written as is (package name, path, version, uid): only characters neither the
        shell nor the Dockerfile parser gives a meaning."""
        text = self._take(value, "a bare word of the Dockerfile", good=_BARE_WORD)
        return "v" if self.placeholders else text

    def sha256(self, value: Any) -> str:
        text = self._take(value, "a sha256 checksum", good=_SHA256)
        return "0" * 64 if self.placeholders else text

    def image_ref(self, value: Any) -> str:
        """The FROM reference: name[:tag]@sha256:<64 hex> (or an image ID), nothing else."""
        text = self._take(value, "the FROM image reference (name[:tag]@sha256:<64 hex>)", good=_IMAGE_REF)
        return "placeholder.invalid/image@sha256:" + "0" * 64 if self.placeholders else text

    def env_value(self, value: Any) -> str:
        """A double-quoted ENV, ARG or LABEL value: \\ " $ escaped, no line break possible."""
        text = self._take(value, "a quoted ENV/ARG/LABEL value", bad=_CONTROL)
        if self.placeholders:
            return '"v"'
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'

    def key(self, value: Any) -> str:
        """An ENV, ARG or LABEL key."""
        text = self._take(value, "an ENV/ARG/LABEL key", good=_KEY)
        return "k" if self.placeholders else text

    def comment(self, value: Any) -> str:
        """Text on a comment line: anything but a line break (or another control character)."""
        text = self._take(value, "a comment line", bad=_CONTROL)
        return "v" if self.placeholders else text

    def json(self, value: Any) -> str:
        """An argument of a JSON-form instruction (SHELL, RUN/CMD/ENTRYPOINT exec form): a JSON
        string, which escapes every control character."""
        text = self._take(value, "a JSON-form argument")
        return '"v"' if self.placeholders else json.dumps(text)

    def filters(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in TEMPLATE_FILTERS}


TEMPLATE_FILTERS = ("sh", "bare", "sha256", "image_ref", "env_value", "key", "comment", "json")


def unfiltered_values(env: jinja2.Environment, source: str, name: str) -> list[str]:
    """Every ``{{ }}`` of a template that does not end in one of TEMPLATE_FILTERS.

    A check of the parsed template rather than a runtime hook (jinja2's finalize): finalize sees
    only the value, so it cannot tell the template's own literal text (``{{ " \\\\" if not
    loop.last }}``) from a setting; the syntax tree can, and a bad template fails before it
    renders anything. Literals (and conditionals between literals) are the template's own text.
    """
    tree = env.parse(source, name)
    problems = [f"line {node.lineno}: {{% {type(node).__name__.lower()} %}} (templates are self-contained and "
                f"every value is filtered where it is printed)"
                for node in tree.find_all((nodes.FilterBlock, nodes.Include, nodes.Import, nodes.FromImport,
                                           nodes.Extends, nodes.Macro, nodes.CallBlock))]
    for output in tree.find_all(nodes.Output):
        for child in output.nodes:
            if not isinstance(child, nodes.TemplateData) and not _is_filtered(child):
                problems.append(f"line {child.lineno}: a value printed without one of the filters "
                                f"{', '.join(TEMPLATE_FILTERS)}")
    return problems


def _is_filtered(expr: nodes.Expr | None) -> bool:
    if expr is None or isinstance(expr, nodes.Const):
        return True
    if isinstance(expr, nodes.CondExpr):
        return _is_filtered(expr.expr1) and _is_filtered(expr.expr2)
    return isinstance(expr, nodes.Filter) and expr.name in TEMPLATE_FILTERS


def instruction_structure(text: str) -> list[tuple[Any, ...]]:
    """What a rendering's instructions are, without the values in them: per instruction (and
    comment) its kind, how many lines it spans, and its shape (the shell's operators and words of
    RUN, the number of KEY=VALUE pairs of ENV/LABEL/ARG, the argument count of JSON forms and of
    the rest)."""
    parser = DockerfileParser(fileobj=io.BytesIO())
    parser.content = text
    return [(item["instruction"], item["endline"] - item["startline"], _shape(item["instruction"], item["value"]))
            for item in parser.structure]


def _shape(kind: str, value: str) -> tuple[Any, ...]:
    if kind == "COMMENT":
        return ()
    try:
        if value.lstrip().startswith("[") and kind in {"RUN", "CMD", "ENTRYPOINT", "SHELL", "COPY", "ADD"}:
            parsed = json.loads(value)
            return ("json", len(parsed) if isinstance(parsed, list) else -1)
        if kind in {"RUN", "CMD", "ENTRYPOINT"}:
            lexer = shlex.shlex(value, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            return tuple(tok if tok and all(c in "();<>|&" for c in tok) else "w" for tok in lexer)
        if kind in {"ENV", "LABEL", "ARG"}:
            return tuple("k=v" if "=" in word else "w" for word in shlex.split(value))
        return ("words", len(value.split()))
    except ValueError:  # unbalanced quotes: a shape no placeholder rendering has
        return ("unparseable",)


def _describe(entry: tuple[Any, ...] | None) -> str:
    return "nothing" if entry is None else f"{entry[0]} spanning {entry[1] + 1} line(s)"


def compare_structure(expected: str, rendered: str, emitted: list[Any]) -> UnsafeValue | None:
    """None when ``rendered`` has the instructions ``expected`` (the placeholder rendering) has;
    else the refusal, blaming the first emitted value that holds Dockerfile or shell syntax."""
    want, got = instruction_structure(expected), instruction_structure(rendered)
    if want == got:
        return None
    index = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    parser = DockerfileParser(fileobj=io.BytesIO())
    parser.content = rendered
    items = parser.structure
    if index < len(items):
        where = f"line {items[index]['startline'] + 1}"
        actual = shown(f"{items[index]['instruction']} {items[index]['value']}".strip())
    else:
        where, actual = "the end", "nothing"
    what = (f"a changed Dockerfile ({where} would be {actual} where the template "
            f"has {_describe(want[index] if index < len(want) else None)})")
    suspects = [v for v in emitted if not _BARE_WORD.fullmatch(str(v))]
    suspects.sort(key=lambda v: 0 if _CONTROL.search(v) or "\\" in v else 1)
    return UnsafeValue(suspects[0] if suspects else Outside("", "the template"), "the Dockerfile", what)


def _environment(settings: Settings, interpolation: Interpolation) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(settings.dockerfiles_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(interpolation.filters())
    return env


def render_template(settings: Settings, name: str, values: dict[str, Any], subject: str | None = None) -> str:
    """Render the catalog's template ``name``, safely: a missing, broken or unfiltered template is a
    TemplateError; a value that would change the Dockerfile's instructions a DockerfileInjectionError."""
    subject = subject or name
    real, placeholder = Interpolation(), Interpolation(placeholders=True)
    env = _environment(settings, real)
    try:
        source, filename, _ = env.loader.get_source(env, name)
        problems = unfiltered_values(env, source, name)
        if problems:
            raise TemplateError(f"template {filename}: {problems[0]}"
                                + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                                hint="print every value through the filter for where it lands; "
                                     "see dockerfiles/README.md")
        text = env.get_template(name).render(**values)
        expected = _environment(settings, placeholder).get_template(name).render(**values)
    except jinja2.TemplateNotFound:
        raise TemplateError(f"template {settings.dockerfiles_dir / name} does not exist",
                            hint="check --catalog / PATCHER_CATALOG") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"template {name}: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"template {exc.filename or name}:{exc.lineno}: {exc.message}") from None
    except UnsafeValue as exc:
        raise exc.refusal(subject) from None
    changed = compare_structure(expected, text, real.emitted)
    if changed is not None:
        raise changed.refusal(subject)
    return text


def _template_values(spec: BuildSpec, settings: Settings, packages: BuildPackages, origins: dict[str, str],
                     python_bin: str, path: str, requirements_sha: str | None) -> dict[str, Any]:
    """The builder template's values; every location a setting can move is checked as a URL and
    tagged with the setting it came from."""
    apt = apt_base(spec, settings)
    if apt:
        checked_url(apt, origins["apt"])
    pip_index = settings.pypi_base()
    cuda = None
    if not spec.is_cpu:
        cuda = {
            "version": spec.cuda,
            "full": spec.cuda_full,
            "runfile_url": checked_url(artifact_url(spec.cuda_runfile.url, spec.cuda_runfile.sha256, settings),
                                       origins["files"]),
            "runfile_sha256": spec.cuda_runfile.sha256,
            "runfile_name": spec.cuda_runfile.name,
            "cudnn": spec.cudnn,
            "cudnn_url": checked_url(artifact_url(spec.cudnn_archive.url, spec.cudnn_archive.sha256, settings),
                                     origins["files"]),
            "cudnn_sha256": spec.cudnn_archive.sha256,
            "cudnn_name": spec.cudnn_archive.name,
        }
    return {
        "spec": spec,
        "from_ref": Outside(image_from(spec, settings), origins["image"]),
        "apt_sources": [Outside(line, origins["apt"]) for line in apt_sources(spec, settings)],
        "apt_packages": packages.apt,
        "python_mode": packages.python_mode,
        "requirements_name": REQUIREMENTS_NAME,
        "requirements_sha256": requirements_sha,
        "pip_index": checked_url(pip_index, origins["pip"]) if pip_index and packages.pip else pip_index,
        "cuda": cuda,
        "uid": BUILDER_UID,
        "path": path,
        "env": {k: Outside(v, f"the build environment's {k} (the spec: --arch, the matrix)")
                for k, v in build_environment(spec, python_bin).items()},
    }


def render(spec: BuildSpec, settings: Settings) -> RenderedDockerfile:
    """Render the builder Dockerfile for ``spec``; refuses any unpinned input (exit 13)."""
    matrix = load_matrix(settings.matrix)
    packages = build_packages(spec, settings, matrix)
    missing = spec.unpinned_inputs()
    missing += [f"sha256 of pip wheel {p.requirement} for Python {spec.python} "
                f"([overrides.artifacts] \"{pip_artifact_name(p.requirement, spec.python)}\")"
                for p in packages.pip if not is_known(p.sha256)]
    if missing:
        raise UnpinnedInputError(f"refusing to render {spec.build_id}: unpinned input(s): " + "; ".join(missing),
                                 hint="pin them in the matrix or in the config file's [overrides]")
    _refuse_host_paths(spec, settings, packages)

    context_files: dict[str, bytes] = {}
    requirements_sha = None
    if packages.pip:
        body = "".join(p.line + "\n" for p in packages.pip).encode()
        context_files[REQUIREMENTS_NAME] = body
        requirements_sha = hashlib.sha256(body).hexdigest()
    python_bin = "/usr/bin/python3" if packages.python_mode == "debian" else "/opt/venv/bin/python"
    path = DEFAULT_PATH
    if packages.python_mode == "venv":
        path = "/opt/venv/bin:" + path
    if not spec.is_cpu:
        path = "/usr/local/cuda/bin:" + path
    labels = spec_labels(spec)
    origins = setting_origins(spec, settings)
    try:
        values = _template_values(spec, settings, packages, origins, python_bin, path, requirements_sha)
    except UnsafeValue as exc:
        raise exc.refusal(spec.build_id) from None
    values["labels"] = {k: Outside(v, f"the build spec's LABEL {k}") for k, v in labels.items()}
    text = render_template(settings, TEMPLATE_NAME, values, subject=spec.build_id)
    sha = hashlib.sha256(text.encode()).hexdigest()
    return RenderedDockerfile(text=text, sha256=sha, image_tag=f"patcher-builder:{sha[:16]}",
                              build_id=spec.build_id, labels=labels, context_files=context_files)


def build_image(engine, rendered: RenderedDockerfile, tag: str | None = None,
                extra_labels: dict[str, str] | None = None, on_log=None) -> str:
    """Build the rendered Dockerfile on ``engine`` (patcher.container.Engine); the image ID.

    The spec's labels are already LABEL lines of the Dockerfile; ``extra_labels`` are added by
    the engine (the classic builder commits one layer per label, so keep them few).
    """
    return engine.build_image(rendered.context_tar(), tag or rendered.image_tag, rendered.build_id,
                              labels=extra_labels, on_log=on_log)


# ----------------------------------------------------------------------------------------------
def bake_target_name(build_id: str) -> str:
    """Bake target names allow [A-Za-z0-9_-] only: dots of the build id become underscores."""
    return build_id.replace(".", "_")


def write_bake_file(settings: Settings, bake_path: Path) -> dict[str, Any]:
    """A buildx bake file (JSON) with one target per (torch, CUDA) pair of the matrix.

    Each target's Dockerfile and context files go to ``<bake dir>/<target>/``; the tag is the
    Dockerfile hash.  Every pair must render: unpinned inputs are refused for all pairs at once.
    """
    from patcher.spec import matrix_rows, resolve

    rendered: list[RenderedDockerfile] = []
    refused: list[str] = []
    for row in matrix_rows(settings):
        spec = resolve(settings, row["torch"], cuda=row["cuda"])
        try:
            rendered.append(render(spec, settings))
        except UnpinnedInputError as exc:
            refused.append(f"{spec.build_id}: {exc.message.split(': unpinned input(s): ', 1)[-1]}")
    if refused:
        raise UnpinnedInputError("refusing to write a bake file, unpinned inputs in " + " | ".join(refused),
                                 hint="pin them in the matrix or in the config file's [overrides]")
    bake_dir = bake_path.parent
    targets: dict[str, Any] = {}
    for r in rendered:
        name = bake_target_name(r.build_id)
        r.write(bake_dir / name)
        targets[name] = {
            "context": name,
            "dockerfile": "Dockerfile",
            "tags": [r.image_tag],
            "labels": r.labels,
        }
    bake = {"group": {"default": {"targets": sorted(targets)}}, "target": dict(sorted(targets.items()))}
    tmp = bake_path.with_name(f".{bake_path.name}.part")
    try:
        tmp.write_text(json.dumps(bake, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(bake_path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputWriteError(f"cannot write {bake_path}: {exc.strerror or exc}") from None
    return bake
