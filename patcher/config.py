"""Site settings: where the catalog lives, where every download is redirected, trust overrides.

Resolution order, first wins: command-line flag, environment variable, config file, default.
The config file is ``$PATCHER_CONFIG`` or ``$XDG_CONFIG_HOME/patcher/config.toml``.

One setting, ``mirror``, redirects every external input at once (an air-gapped site sets it and
nothing else changes): git repositories under ``<mirror>/git/ORG/REPO.git``, artifacts under
``<mirror>/files/<sha256>``, pip packages under ``<mirror>/wheelhouse``, OS images under
``<mirror>/images``.  Finer settings (``git_mirror`` ...) override it per kind of input.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from patcher.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

PACKAGE_DIR = Path(__file__).resolve().parent
# The catalog (patches/, dockerfiles/) sits beside the package in a checkout.
DEFAULT_CATALOG = PACKAGE_DIR.parent
DEFAULT_MATRIX = PACKAGE_DIR / "data" / "matrix.toml"

ENV_PREFIX = "PATCHER_"


@dataclass(frozen=True)
class Overrides:
    """Explicit trust decisions a site makes; every one used is recorded in the evidence."""

    # torch version -> commit SHA accepted instead of the matrix's (e.g. a re-imported tree)
    tag_commits: dict[str, str] = field(default_factory=dict)
    # image name in the matrix -> "ref@sha256:..." used instead of the matrix's pin
    images: dict[str, str] = field(default_factory=dict)
    # artifact name (file name) -> sha256 the site pins where the matrix has none
    artifacts: dict[str, str] = field(default_factory=dict)


# The signing key a build makes on first use when none is configured (patcher keys generate makes
# one anywhere).
DEFAULT_KEY_PATH = Path.home() / ".config" / "patcher" / "signing-key.pem"


@dataclass(frozen=True)
class Settings:
    catalog: Path = DEFAULT_CATALOG
    matrix: Path = DEFAULT_MATRIX
    advisories: Path | None = None   # a site's own advisories/assessments, laid over patcher's
    mirror: str | None = None
    git_mirror: str | None = None
    files_mirror: str | None = None
    pypi_index: str | None = None
    debian_mirror: str | None = None
    registry: str | None = None
    work_dir: Path = Path("work")
    cache_dir: Path = Path.home() / ".cache" / "patcher"
    key_path: Path = DEFAULT_KEY_PATH
    docker_host: str | None = None
    overrides: Overrides = field(default_factory=Overrides)
    config_file: Path | None = None

    # -- where each kind of input comes from -------------------------------------------------
    def git_base(self) -> str | None:
        if self.git_mirror:
            return self.git_mirror.rstrip("/")
        return f"{self.mirror.rstrip('/')}/git" if self.mirror else None

    def files_base(self) -> str | None:
        if self.files_mirror:
            return self.files_mirror.rstrip("/")
        return f"{self.mirror.rstrip('/')}/files" if self.mirror else None

    def pypi_base(self) -> str | None:
        if self.pypi_index:
            return self.pypi_index.rstrip("/")
        return f"{self.mirror.rstrip('/')}/wheelhouse" if self.mirror else None

    @property
    def patches_dir(self) -> Path:
        return self.catalog / "patches"

    @property
    def dockerfiles_dir(self) -> Path:
        return self.catalog / "dockerfiles"

    @classmethod
    def load(cls, **flags: Any) -> Settings:
        """Build settings from flags (None = not given), environment and config file."""
        config_path = flags.pop("config_file", None) or os.environ.get(ENV_PREFIX + "CONFIG")
        if config_path is None:
            xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
            candidate = Path(xdg) / "patcher" / "config.toml"
            config_path = str(candidate) if candidate.is_file() else None
        data: dict[str, Any] = {}
        if config_path:
            path = Path(config_path)
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise ConfigError(f"config file {path} does not exist",
                                  hint="unset PATCHER_CONFIG or create the file") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
            except OSError as exc:
                raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
        known = {f.name for f in fields(cls)} - {"overrides", "config_file"}
        unknown = set(data) - known - {"overrides"}
        if unknown:
            raise ConfigError(f"config file {config_path}: unknown setting(s) {', '.join(sorted(unknown))}",
                              hint=f"known settings: {', '.join(sorted(known))}, [overrides]")
        values: dict[str, Any] = {}
        for name in known:
            value = flags.get(name)
            if value is None:
                value = os.environ.get(ENV_PREFIX + name.upper())
            if value is None:
                value = data.get(name)
            if value is None:
                continue
            if name in {"catalog", "matrix", "work_dir", "cache_dir", "key_path", "advisories"}:
                value = Path(str(value)).expanduser()
            values[name] = value
        raw_overrides = data.get("overrides", {})
        if not isinstance(raw_overrides, dict):
            raise ConfigError(f"config file {config_path}: [overrides] must be a table")
        bad = set(raw_overrides) - {"tag_commits", "images", "artifacts"}
        if bad:
            raise ConfigError(f"config file {config_path}: unknown override(s) {', '.join(sorted(bad))}",
                              hint="known: tag_commits, images, artifacts")
        overrides = Overrides(**{k: dict(v) for k, v in raw_overrides.items()})
        return cls(**values, overrides=overrides,
                   config_file=Path(config_path) if config_path else None)
