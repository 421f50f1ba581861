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

Contract with the build stage (builder.py): the image has a user ``builder`` (uid 1000, home
/home/builder) owning ``/src`` (the patched tree is copied there), ``/ccache`` (CCACHE_DIR) and
``/out`` (wheels); ``PATCHER_PYTHON`` is the interpreter to build with; the spec's build
environment (compiler, arch list, wheel version) is set as ENV.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from patcher.config import Settings
from patcher.errors import ConfigError, OutputWriteError, TemplateError, UnpinnedInputError
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


def apt_sources(spec: BuildSpec, settings: Settings) -> list[str]:
    """sources.list lines when the site redirects apt; empty keeps the base image's own."""
    family, codename = spec.image.family, spec.image.codename
    # A mirror that is a host directory (what `patcher mirror sync` writes) holds no distribution
    # archive and apt in a container could not read it: the image keeps its own sources then.
    mirror = settings.mirror if settings.mirror and not is_host_path(settings.mirror) else None
    if family == "debian":
        base = settings.debian_mirror or (f"{mirror.rstrip('/')}/debian" if mirror else None)
        components = "main"
    else:
        base = f"{mirror.rstrip('/')}/{family}" if mirror else None
        components = "main universe"
    if not base:
        return []
    base = base.rstrip("/")
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


def _label_value(value: str) -> str:
    """A Dockerfile double-quoted string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


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


def _environment(settings: Settings) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(settings.dockerfiles_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_template(settings: Settings, name: str, values: dict[str, Any]) -> str:
    """Render the catalog's template ``name``; a missing or broken template is a TemplateError."""
    try:
        return _environment(settings).get_template(name).render(**values)
    except jinja2.TemplateNotFound:
        raise TemplateError(f"template {settings.dockerfiles_dir / name} does not exist",
                            hint="check --catalog / PATCHER_CATALOG") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"template {name}: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"template {exc.filename or name}:{exc.lineno}: {exc.message}") from None


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
    values = {
        "spec": spec,
        "from_ref": image_from(spec, settings),
        "apt_sources": apt_sources(spec, settings),
        "apt_packages": packages.apt,
        "python_mode": packages.python_mode,
        "requirements_name": REQUIREMENTS_NAME,
        "requirements_sha256": requirements_sha,
        "pip_index": settings.pypi_base(),
        "cuda": None if spec.is_cpu else {
            "version": spec.cuda,
            "full": spec.cuda_full,
            "runfile_url": artifact_url(spec.cuda_runfile.url, spec.cuda_runfile.sha256, settings),
            "runfile_sha256": spec.cuda_runfile.sha256,
            "runfile_name": spec.cuda_runfile.name,
            "cudnn": spec.cudnn,
            "cudnn_url": artifact_url(spec.cudnn_archive.url, spec.cudnn_archive.sha256, settings),
            "cudnn_sha256": spec.cudnn_archive.sha256,
            "cudnn_name": spec.cudnn_archive.name,
        },
        "uid": BUILDER_UID,
        "path": path,
        "env": {k: _label_value(v) for k, v in build_environment(spec, python_bin).items()},
        "labels": {k: _label_value(v) for k, v in labels.items()},
    }
    text = render_template(settings, TEMPLATE_NAME, values)
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
