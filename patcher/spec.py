"""Resolve stage: torch/cuda/python/arch/gcc flags + the matrix -> one validated BuildSpec.

Every refusal happens here, before any work starts, and names the rule and the way out
(Spack's ``conflicts``).  The matrix is data (``patcher/data/matrix.toml``).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from patcher.config import Settings
from patcher.errors import (
    ConfigError,
    MatrixFormatError,
    UnknownVersionError,
    UnpinnedInputError,
    UnsupportedCombinationError,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

UNKNOWN = "unknown"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
CPU = "none"


def is_known(value: str | None) -> bool:
    return bool(value) and value != UNKNOWN


@dataclass(frozen=True)
class Artifact:
    """A downloadable input pinned by sha256 (CUDA runfile, cuDNN archive, third-party tarball)."""

    name: str
    url: str
    sha256: str
    overridden: bool = False  # True when the site pinned the checksum, not the matrix
    # Third-party source inputs: the file inside the archive (None: the download itself) and
    # where it goes in the source tree (None: not part of the tree, e.g. a CUDA runfile).
    member: str | None = None
    dest: str | None = None


@dataclass(frozen=True)
class BaseImage:
    name: str
    ref: str
    digest: str
    family: str
    codename: str
    overridden: bool = False

    @property
    def pinned(self) -> str:
        return f"{self.ref}@{self.digest}"


@dataclass(frozen=True)
class BuildSpec:
    torch: str
    tag: str
    commit: str
    repo: str
    python: str
    cuda: str  # "none" for CPU
    cuda_full: str | None
    cudnn: str | None
    gcc: int
    arch_list: str | None
    nvcc_flags: str | None
    image: BaseImage
    cuda_runfile: Artifact | None
    cudnn_archive: Artifact | None
    local_label: str  # e.g. "cu101.pt1" / "cpu.pt1"
    build_number: int = 1
    build_env: dict[str, str] = field(default_factory=dict)
    inputs: tuple[Artifact, ...] = ()
    commit_overridden: bool = False

    @property
    def is_cpu(self) -> bool:
        return self.cuda == CPU

    @property
    def wheel_version(self) -> str:
        return f"{self.torch}+{self.local_label}"

    @property
    def build_id(self) -> str:
        return f"torch-{self.torch}-{self.local_label}-py{self.python}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildSpec:
        data = dict(data)
        data["image"] = BaseImage(**data["image"])
        for key in ("cuda_runfile", "cudnn_archive"):
            if data.get(key):
                data[key] = Artifact(**data[key])
        data["inputs"] = tuple(Artifact(**a) for a in data.get("inputs", ()))
        return cls(**data)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)

    def unpinned_inputs(self) -> list[str]:
        """Names of inputs whose pin is unknown; a build refuses to start while any remain."""
        missing = []
        if not is_known(self.commit):
            missing.append(f"commit of tag {self.tag} (override: [overrides.tag_commits] \"{self.torch}\")")
        if not is_known(self.image.digest):
            missing.append(f"digest of image {self.image.ref} (run `patcher lock` or [overrides.images] \"{self.image.name}\")")
        for art in (self.cuda_runfile, self.cudnn_archive, *self.inputs):
            if art is not None and not is_known(art.sha256):
                missing.append(f"sha256 of {art.name} ([overrides.artifacts] \"{art.name}\")")
        return missing

    def require_pinned(self) -> None:
        missing = self.unpinned_inputs()
        if missing:
            raise UnpinnedInputError(
                f"refusing to build {self.build_id}: unpinned input(s): " + "; ".join(missing),
                hint="pin them in the matrix or in the config file's [overrides]",
            )


# --------------------------------------------------------------------------------------------
# The shape every reader of the matrix relies on: table -> required key -> type.
_STR, _INT, _STRS, _INTS, _TABLE = "a string", "an integer", "a list of strings", "a list of integers", "a table"
MATRIX_SHAPE = {
    "torch": {"tag": _STR, "repo": _STR, "pythons": _STRS, "default_python": _STR, "gcc_min": _INT,
              "gcc_max": _INT, "default_gcc": _INT, "image": _STR},
    "images": {"ref": _STR, "family": _STR, "codename": _STR, "pythons": _STRS, "gcc": _INTS},
    "cuda": {"version": _STR, "runfile": _STR, "url": _STR, "sha256": _STR, "max_gcc": _INT, "max_compute": _STR,
             "default_arch_list": _STR},
    "cudnn": {"version": _STR, "archive": _STR, "url": _STR, "sha256": _STR},
}


def _is(value: Any, kind: str) -> bool:
    return {_STR: lambda v: isinstance(v, str), _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
            _STRS: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
            _INTS: lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v),
            _TABLE: lambda v: isinstance(v, dict)}[kind](value)


def check_matrix_shape(m: dict[str, Any], path: Path) -> None:
    """Refuse a matrix that lacks a table or key the readers need, or has a value of another
    type, naming the first place (``torch."1.13.1".pythons must be a list of strings``)."""
    def bad(where: str, what: str) -> MatrixFormatError:
        return MatrixFormatError(f"matrix file {path} is malformed: {where} {what}",
                                 hint="compare it with patcher/data/matrix.toml")

    for table, keys in MATRIX_SHAPE.items():
        entries = m.get(table, {} if table in ("cuda", "cudnn") else None)
        if not _is(entries, _TABLE):
            raise bad(table, "must be a table")
        for name, entry in entries.items():
            where = f'{table}."{name}"'
            if not _is(entry, _TABLE):
                raise bad(where, "must be a table")
            for key, kind in keys.items():
                if key not in entry:
                    raise bad(where, f"lacks the key {key!r}")
                if not _is(entry[key], kind):
                    raise bad(f"{where}.{key}", f"must be {kind}")
    for name, rel in m["torch"].items():
        if rel["image"] not in m["images"]:
            raise bad(f'torch."{name}".image', f"names the image {rel['image']!r}, which images does not define")
        cuda = rel.get("cuda", {})
        if not _is(cuda, _TABLE):
            raise bad(f'torch."{name}".cuda', "must be a table")
        for version, cudnn in cuda.items():
            if version not in m.get("cuda", {}) or cudnn not in m.get("cudnn", {}):
                raise bad(f'torch."{name}".cuda."{version}"', "names a CUDA or cuDNN the matrix does not define")


def load_matrix(path: Path) -> dict[str, Any]:
    try:
        matrix = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"matrix file {path} does not exist", hint="check PATCHER_MATRIX") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"matrix file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"matrix file {path} cannot be read: {exc.strerror}") from None
    check_matrix_shape(matrix, Path(path))
    return matrix


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v))


def parse_arch_list(arch_list: str) -> list[tuple[str, bool]]:
    """'3.7+PTX;5.0 6.0' -> [('3.7', True), ('5.0', False), ('6.0', False)]."""
    out = []
    for item in re.split(r"[;\s]+", arch_list.strip()):
        if not item:
            continue
        m = re.fullmatch(r"(\d+\.\d+)(\+PTX)?", item)
        if not m:
            raise UnsupportedCombinationError(
                f"arch list entry {item!r} is not a compute capability like 7.5 or 7.5+PTX")
        out.append((m.group(1), bool(m.group(2))))
    return out


def arch_needs_cuda() -> UnsupportedCombinationError:
    """The refusal of an arch list without CUDA, the same wherever it is given."""
    return UnsupportedCombinationError("--arch needs a CUDA build", hint="drop --arch or give --cuda")


@contextmanager
def _reading_matrix(path: Path) -> Iterator[None]:
    """A table or key the matrix lacks, or a value of the wrong type, is one line naming it."""
    try:
        yield
    except KeyError as exc:
        raise MatrixFormatError(f"matrix file {path} is malformed: it lacks the key {exc.args[0]!r}",
                                hint="compare it with patcher/data/matrix.toml") from None
    except (TypeError, AttributeError, ValueError) as exc:
        raise MatrixFormatError(f"matrix file {path} is malformed: {exc}",
                                hint="compare it with patcher/data/matrix.toml") from None


def resolve(settings: Settings, torch: str, cuda: str | None = None, python: str | None = None,
            arch: str | None = None, gcc: int | None = None, build_number: int = 1,
            matrix: dict[str, Any] | None = None) -> BuildSpec:
    """Validate a request against the matrix and return the fully pinned BuildSpec.

    Unknown pins are kept as "unknown" here (so `patcher matrix` can show them); the build
    calls ``require_pinned()`` before it starts.
    """
    m = matrix if matrix is not None else load_matrix(settings.matrix)
    with _reading_matrix(settings.matrix):
        return _resolve(m, settings, torch, cuda, python, arch, gcc, build_number)


def _resolve(m: dict[str, Any], settings: Settings, torch: str, cuda: str | None, python: str | None,
             arch: str | None, gcc: int | None, build_number: int) -> BuildSpec:
    releases = m.get("torch", {})
    if torch not in releases:
        known = ", ".join(sorted(releases, key=_version_key))
        raise UnknownVersionError(f"torch {torch} is not in the version matrix", hint=f"known versions: {known}")
    rel = releases[torch]
    ov = settings.overrides

    # --- python ---------------------------------------------------------------------------
    python = python or rel["default_python"]
    if python not in rel["pythons"]:
        raise UnsupportedCombinationError(
            f"torch {torch} supports Python {rel['pythons'][0]}-{rel['pythons'][-1]}, not {python}",
            hint=f"use --python {rel['default_python']}")

    # --- cuda -----------------------------------------------------------------------------
    cuda = cuda or rel.get("default_cuda") or CPU
    cuda = CPU if cuda.lower() in {"none", "cpu"} else cuda
    cuda_table = m.get("cuda", {})
    runfile = cudnn_art = None
    cuda_full = cudnn_version = None
    if cuda != CPU:
        if cuda not in rel.get("cuda", {}):
            offered = ", ".join(sorted(rel.get("cuda", {}), key=_version_key)) or "none"
            raise UnsupportedCombinationError(
                f"torch {torch} is not built with CUDA {cuda}",
                hint=f"supported CUDA versions: {offered}, or --cuda none")
        c = cuda_table[cuda]
        cuda_full = c["version"]
        runfile = _artifact(c["runfile"], c["url"], c["sha256"], ov)
        cudnn_entry = m["cudnn"][rel["cuda"][cuda]]
        cudnn_version = cudnn_entry["version"]
        cudnn_art = _artifact(cudnn_entry["archive"], cudnn_entry["url"], cudnn_entry["sha256"], ov)

    # --- image and compiler ---------------------------------------------------------------
    image_name = rel["image"]
    img = m["images"][image_name]
    if python not in img["pythons"]:
        raise UnsupportedCombinationError(
            f"Python {python} is not packaged in base image {image_name} ({', '.join(img['pythons'])} are)",
            hint="pick one of those with --python, or point the matrix at another image")
    gcc = gcc if gcc is not None else rel["default_gcc"]
    if gcc > rel["gcc_max"] or gcc < rel["gcc_min"]:
        raise UnsupportedCombinationError(
            f"torch {torch} compiles with gcc {rel['gcc_min']}-{rel['gcc_max']}, not gcc {gcc}",
            hint=f"use --gcc {rel['default_gcc']}")
    if cuda != CPU and gcc > cuda_table[cuda]["max_gcc"]:
        raise UnsupportedCombinationError(
            f"CUDA {cuda} accepts gcc up to {cuda_table[cuda]['max_gcc']}, not gcc {gcc} (nvcc's host_config.h refuses newer)",
            hint=f"use --gcc {min(rel['default_gcc'], cuda_table[cuda]['max_gcc'])}")
    if gcc not in img["gcc"]:
        raise UnsupportedCombinationError(
            f"gcc {gcc} is not packaged in base image {image_name} (gcc {', '.join(map(str, img['gcc']))} are)",
            hint="pick one of those with --gcc")

    # --- arch list ------------------------------------------------------------------------
    arch_list = None
    if cuda != CPU:
        arch_list = arch or cuda_table[cuda]["default_arch_list"]
        newest = cuda_table[cuda]["max_compute"]
        oldest = cuda_table[cuda].get("min_compute")
        entries = parse_arch_list(arch_list)
        if not entries:
            raise UnsupportedCombinationError("--arch lists no compute capability",
                                              hint="give e.g. --arch '7.0;7.5+PTX', or leave it out")
        for cc, _ptx in entries:
            if _version_key(cc) > _version_key(newest):
                raise UnsupportedCombinationError(
                    f"CUDA {cuda} can compile for compute capability up to {newest}, not {cc}: "
                    f"such a wheel cannot run CUDA kernels on that GPU",
                    hint=f"drop {cc} from --arch, or pick a newer CUDA for this torch")
            if oldest and _version_key(cc) < _version_key(oldest):
                raise UnsupportedCombinationError(
                    f"CUDA {cuda} can compile for compute capability {oldest} and newer, not {cc} "
                    f"(nvcc dropped that architecture)",
                    hint=f"drop {cc} from --arch, or pick an older CUDA for this torch")
    elif arch:
        raise arch_needs_cuda()

    # --- pins and overrides ---------------------------------------------------------------
    commit = rel.get("commit", UNKNOWN)
    commit_overridden = False
    if torch in ov.tag_commits:
        commit, commit_overridden = ov.tag_commits[torch], True
    if is_known(commit) and not COMMIT_RE.match(commit):
        raise ConfigError(f"commit pin {commit!r} for torch {torch} is not a 40-digit SHA")
    base = BaseImage(name=image_name, ref=img["ref"], digest=img.get("digest", UNKNOWN),
                     family=img["family"], codename=img["codename"])
    if image_name in ov.images:
        ref, _, digest = ov.images[image_name].partition("@")
        if not digest.startswith("sha256:"):
            raise ConfigError(f"[overrides.images] {image_name} must be REF@sha256:DIGEST")
        base = BaseImage(name=image_name, ref=ref, digest=digest, family=img["family"],
                         codename=img["codename"], overridden=True)

    cpu_or_cu = "cpu" if cuda == CPU else "cu" + cuda.replace(".", "")
    build_env = dict(rel.get("build_env", {}))
    if cuda == CPU:
        build_env.update(rel.get("cpu_build_env", {}))
    inputs = tuple(_artifact(i["name"], i["url"], i["sha256"], ov, member=i.get("member"), dest=i.get("dest"))
                   for i in rel.get("inputs", ()))
    return BuildSpec(
        torch=torch, tag=rel["tag"], commit=commit, repo=rel["repo"], python=python, cuda=cuda,
        cuda_full=cuda_full, cudnn=cudnn_version, gcc=gcc, arch_list=arch_list,
        nvcc_flags=rel.get("nvcc_flags") if cuda != CPU else None, image=base,
        cuda_runfile=runfile, cudnn_archive=cudnn_art,
        local_label=f"{cpu_or_cu}.pt{build_number}", build_number=build_number,
        build_env=build_env, inputs=inputs, commit_overridden=commit_overridden)


def _artifact(name: str, url: str, sha256: str, ov: Any, member: str | None = None,
              dest: str | None = None) -> Artifact:
    if name in ov.artifacts:
        pinned = ov.artifacts[name]
        if not SHA256_RE.match(pinned):
            raise ConfigError(f"[overrides.artifacts] {name} must be a 64-digit sha256")
        return Artifact(name=name, url=url, sha256=pinned, overridden=True, member=member, dest=dest)
    return Artifact(name=name, url=url, sha256=sha256, member=member, dest=dest)


def matrix_rows(settings: Settings) -> list[dict[str, Any]]:
    """One row per (torch, CUDA) pair, for `patcher matrix`."""
    m = load_matrix(settings.matrix)
    with _reading_matrix(settings.matrix):
        return _matrix_rows(m)


def _matrix_rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for torch in sorted(m["torch"], key=_version_key):
        rel = m["torch"][torch]
        for cuda in [*sorted(rel.get("cuda", {}), key=_version_key), CPU]:
            c = m["cuda"].get(cuda, {})
            cudnn = m["cudnn"][rel["cuda"][cuda]] if cuda != CPU else {}
            rows.append({
                "torch": torch, "tag": rel["tag"], "commit": rel.get("commit", UNKNOWN),
                "pythons": rel["pythons"], "cuda": cuda, "cuda_full": c.get("version"),
                "cudnn": cudnn.get("version"), "gcc": f"{rel['gcc_min']}-{min(rel['gcc_max'], c.get('max_gcc', 99))}",
                "arch_list": c.get("default_arch_list"), "max_compute": c.get("max_compute"),
                "image": rel["image"],
                "runfile_sha256": c.get("sha256"), "cudnn_sha256": cudnn.get("sha256"),
            })
    return rows
