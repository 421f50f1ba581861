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
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from patcher import setting_rules as rules
from patcher.errors import ConfigError, InvalidSettingError
from patcher.setting_rules import Origin

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
        config_path, config_origin = flags.pop("config_file", None), Origin("flag", "--config")
        if config_path is None:
            config_path, config_origin = os.environ.get(ENV_PREFIX + "CONFIG") or None, Origin("env", ENV_PREFIX + "CONFIG")
        if config_path is None:
            xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
            candidate = Path(xdg) / "patcher" / "config.toml"
            config_path = str(candidate) if candidate.is_file() else None
        data: dict[str, Any] = {}
        lines: dict[str, int] = {}
        if config_path:
            path = rules.path("config", config_origin, str(config_path))
            try:
                text = path.read_text(encoding="utf-8")
                data = tomllib.loads(text)
            except FileNotFoundError:
                raise ConfigError(f"config file {path} does not exist",
                                  hint="unset PATCHER_CONFIG or create the file") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
            except UnicodeDecodeError:
                raise ConfigError(f"config file {path} is not UTF-8 text") from None
            except OSError as exc:
                raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
            lines = _top_level_key_lines(text)
        known = {f.name for f in fields(cls)} - {"overrides", "config_file"}
        unknown = set(data) - known - {"overrides"}
        if unknown:
            raise ConfigError(f"config file {config_path}: unknown setting(s) {', '.join(sorted(unknown))}",
                              hint=f"known settings: {', '.join(sorted(known))}, [overrides]")
        values: dict[str, Any] = {}
        for name in sorted(known):
            value, origin = flags.get(name), Origin("flag", _FLAG_NAMES.get(name, "--" + name.replace("_", "-")))
            if value is None:
                # An empty variable counts as unset, as in most Unix tools (PATCHER_MIRROR= patcher ...).
                value, origin = os.environ.get(ENV_PREFIX + name.upper()) or None, Origin("env", ENV_PREFIX + name.upper())
            if value is None:
                value, origin = data.get(name), Origin("file", str(config_path), lines.get(name))
            if value is None:
                continue
            if isinstance(value, Path):
                value = str(value)
            values[name] = _RULES[name](name, origin, value)
        raw_overrides = data.get("overrides", {})
        if not isinstance(raw_overrides, dict):
            raise ConfigError(f"config file {config_path}: [overrides] must be a table")
        bad = set(raw_overrides) - {"tag_commits", "images", "artifacts"}
        if bad:
            raise ConfigError(f"config file {config_path}: unknown override(s) {', '.join(sorted(bad))}",
                              hint="known: tag_commits, images, artifacts")
        for kind, table in raw_overrides.items():
            if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
                raise InvalidSettingError(f"setting overrides.{kind} (from {config_path}): must be a table of "
                                          "strings, e.g. { \"1.13.1\" = \"<value>\" }")
        overrides = Overrides(**{k: dict(v) for k, v in raw_overrides.items()})
        return cls(**values, overrides=overrides,
                   config_file=Path(config_path) if config_path else None)


# Each setting's rule (patcher/setting_rules.py): what kind of value it is and what it may hold.
_RULES: dict[str, Callable[[str, Origin, Any], Any]] = {
    "catalog": lambda n, o, v: rules.existing_dir(n, o, v, must_hold_one_of=("patches", "dockerfiles")),
    "matrix": rules.path,        # read at once by spec.load_matrix, which says when it is missing
    "advisories": rules.path,    # read by advisories.load, which says when it is missing
    "mirror": rules.location,
    "git_mirror": rules.location,
    "files_mirror": rules.location,
    "pypi_index": rules.location,
    "debian_mirror": rules.location,
    "registry": rules.registry,
    "work_dir": rules.writable_dir,
    "cache_dir": rules.writable_dir,
    "key_path": rules.path,
    "docker_host": rules.docker_host,
}
# Flags whose name is not --<setting-name>.
_FLAG_NAMES = {"work_dir": "--work", "cache_dir": "--cache", "key_path": "--key", "config_file": "--config"}


def _top_level_key_lines(text: str) -> dict[str, int]:
    """Line numbers of the config file's top-level keys, for errors that point at the line."""
    found: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("["):
            break
        key = re.match(r"([A-Za-z0-9_-]+)\s*=", stripped)
        if key:
            found.setdefault(key.group(1), number)
    return found
