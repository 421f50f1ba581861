"""The rules every outside value must meet before patcher uses it.

A setting chooses *where* (a mirror, an index, a registry, a directory); it never becomes code.
Each rule takes the raw value and a :class:`Origin` (flag, environment variable or config file
line) and returns the typed value or raises :class:`InvalidSettingError`, whose one line names the
setting, where it came from, the value (cut to :data:`SHOWN_LIMIT` characters) and the rule.

The rules are deliberately narrow: a URL may not contain whitespace, quotes, ``$``, a backslash
or a control character even where RFC 3986 would tolerate them percent-decoded, because every one
of them means something to a shell, git or a Dockerfile; a site's real URL can percent-encode them.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from patcher.errors import InvalidSettingError

SHOWN_LIMIT = 200          # characters of a refused value echoed back
MAX_URL_LENGTH = 2048
MAX_PATH_LENGTH = 4096

# Characters a location never needs and that mean something to a shell, git or a Dockerfile.
_FORBIDDEN_IN_LOCATION = set(" \t'\"`$\\;|&<>(){}*?!#^")
_SCHEMES_FOR = {
    # git may reach a mirror over ssh; the other kinds are fetched by curl, pip, apt or a registry.
    "git_mirror": ("file", "http", "https", "ssh"),
    "mirror": ("file", "http", "https"),
    "files_mirror": ("file", "http", "https"),
    "pypi_index": ("file", "http", "https"),
    "debian_mirror": ("file", "http", "https"),
}
_DOCKER_HOST_SCHEMES = ("unix", "tcp", "ssh")
_SCP_STYLE = re.compile(r"[A-Za-z0-9._-]+@[A-Za-z0-9][A-Za-z0-9.-]*:[^:]")
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})*|\[[0-9A-Fa-f:.]+\])"
_REGISTRY = re.compile(rf"{_HOST}(?::(?P<port>[0-9]{{1,5}}))?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_IMAGE_REF = re.compile(
    rf"(?:{_HOST}(?::[0-9]{{1,5}})?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?")


@dataclass(frozen=True)
class Origin:
    """Where a value came from, as the user would look for it."""

    kind: str              # "flag", "env", "file", "default"
    name: str              # --git-mirror, PATCHER_GIT_MIRROR, /etc/patcher/config.toml
    line: int | None = None

    def __str__(self) -> str:
        if self.kind == "file":
            return f"{self.name}:{self.line}" if self.line else self.name
        if self.kind == "flag":
            return self.name
        if self.kind == "env":
            return f"${self.name}"
        return "the default"


def shown(value: object, limit: int = SHOWN_LIMIT) -> str:
    """A value as it may appear in a one-line error: control characters escaped, cut to ``limit``."""
    if not isinstance(value, str):
        return repr(value)[:limit]
    escaped = value.encode("unicode_escape").decode("ascii") if _has_control(value) else value
    if len(escaped) <= limit:
        return repr(escaped) if escaped == value else f"'{escaped}'"
    return f"'{escaped[:limit]}…' ({len(value):,} characters)"


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in text)


def _refuse(setting: str, origin: Origin, value: object, rule: str) -> InvalidSettingError:
    return InvalidSettingError(f"setting {setting} (from {origin}) = {shown(value)}: {rule}")


def _as_text(setting: str, origin: Origin, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise _refuse(setting, origin, value, f"must be a string, not {_type_name(value)}")
    if not value:
        raise _refuse(setting, origin, value, "must not be empty")
    if _has_control(value):
        raise _refuse(setting, origin, value, "must not contain control characters (newline, tab, NUL …)")
    if len(value) > limit:
        raise _refuse(setting, origin, value, f"is longer than {limit} characters")
    return value


def _type_name(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)


def location(setting: str, origin: Origin, value: object, relative_ok: bool = False) -> str:
    """A mirror or index: an absolute host path or a URL with a scheme this kind of input may use.
    With ``relative_ok`` (a folder named on the command line) a relative path is made absolute."""
    text = _as_text(setting, origin, value, MAX_URL_LENGTH)
    if relative_ok and "://" not in text and not text.startswith(("/", "-")):
        text = os.path.abspath(text)
    schemes = _SCHEMES_FOR[setting]
    allowed = ", ".join(f"{s}://" for s in schemes) + " or an absolute path"
    if text.startswith("-"):
        raise _refuse(setting, origin, value, f"must not start with '-' (it must be {allowed})")
    bad = sorted(set(text) & _FORBIDDEN_IN_LOCATION)
    if bad:
        raise _refuse(setting, origin, value, f"must not contain {' '.join(repr(c) for c in bad)}"
                      " (percent-encode them in a URL)")
    if "://" not in text:
        if setting == "git_mirror" and _SCP_STYLE.match(text):
            return text  # git's ssh shorthand, user@host:path
        if not text.startswith("/"):
            raise _refuse(setting, origin, value, f"must be {allowed}")
        return text
    parts = urlsplit(text)
    if parts.scheme not in schemes:
        raise _refuse(setting, origin, value, f"scheme {parts.scheme or '(none)'}:// is not allowed here; use {allowed}")
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/"):
            raise _refuse(setting, origin, value, "a file:// URL must be file:///ABSOLUTE/PATH")
    elif not parts.hostname:
        raise _refuse(setting, origin, value, f"a {parts.scheme}:// URL needs a host")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        raise _refuse(setting, origin, value, "has a port that is not a number from 0 to 65535") from None
    return text


def registry(setting: str, origin: Origin, value: object) -> str:
    """An OCI registry: HOST[:PORT][/PATH], lower-case path components, no scheme."""
    text = _as_text(setting, origin, value, 255)
    match = _REGISTRY.fullmatch(text)
    if not match or (match.group("port") and not 0 < int(match.group("port")) < 65536):
        raise _refuse(setting, origin, value, "must be HOST[:PORT][/PATH] (no scheme; path in lower case)")
    return text


def docker_host(setting: str, origin: Origin, value: object) -> str:
    text = _as_text(setting, origin, value, MAX_URL_LENGTH)
    parts = urlsplit(text)
    if parts.scheme not in _DOCKER_HOST_SCHEMES or set(text) & _FORBIDDEN_IN_LOCATION or text.startswith("-"):
        raise _refuse(setting, origin, value, "must be unix:///PATH, tcp://HOST:PORT or ssh://[USER@]HOST")
    if parts.scheme == "unix" and not parts.path.startswith("/"):
        raise _refuse(setting, origin, value, "a unix:// Docker host must name an absolute socket path")
    if parts.scheme != "unix" and not parts.hostname:
        raise _refuse(setting, origin, value, f"a {parts.scheme}:// Docker host needs a host")
    return text


def path(setting: str, origin: Origin, value: object) -> Path:
    """Any path (a file patcher writes later, a key): text without control characters."""
    text = _as_text(setting, origin, value, MAX_PATH_LENGTH)
    if text.startswith("-"):
        raise _refuse(setting, origin, value, "must not start with '-' (write ./ in front of such a name)")
    return Path(text).expanduser()


def existing_dir(setting: str, origin: Origin, value: object, must_hold_one_of: tuple[str, ...] = ()) -> Path:
    result = path(setting, origin, value)
    if not result.is_dir():
        what = "does not exist" if not result.exists() else "is not a directory"
        raise _refuse(setting, origin, value, f"the directory {what}")
    if must_hold_one_of and not any((result / name).is_dir() for name in must_hold_one_of):
        held = " or ".join(f"{name}/" for name in must_hold_one_of)
        raise _refuse(setting, origin, value, f"holds no {held} directory (is it a patcher catalog?)")
    return result


def writable_dir(setting: str, origin: Origin, value: object) -> Path:
    """A directory patcher creates or writes into: it, or its nearest existing parent, is a
    writable directory.  Nothing is created here."""
    result = path(setting, origin, value)
    probe = result.absolute()
    while not probe.exists():
        if probe.is_symlink():
            raise _refuse(setting, origin, value, f"{probe} is a dangling symbolic link")
        probe = probe.parent
    if not probe.is_dir():
        raise _refuse(setting, origin, value, f"{probe} exists and is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise _refuse(setting, origin, value, f"{probe} is not writable by this user")
    return result


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+:*,/=-]*")


def word_list(setting: str, origin: Origin, value: object) -> str:
    """Names and patterns (package names, check ids, Patch-Ids): letters, digits and _.+:*,/=-, no
    leading '-', so they stay arguments wherever they land.  Empty means none."""
    if value == "":
        return ""
    text = _as_text(setting, origin, value, MAX_URL_LENGTH)
    if not _WORD.fullmatch(text):
        raise _refuse(setting, origin, value, "may hold only letters, digits and _ . + : * , / = - (not first)")
    return text


_REV_RANGE = re.compile(r"[A-Za-z0-9_./^~@{}-]+\.\.[A-Za-z0-9_./^~@{}-]+")


def revision_range(setting: str, origin: Origin, value: object) -> str:
    text = _as_text(setting, origin, value, 512)
    if not _REV_RANGE.fullmatch(text) or text.startswith("-"):
        raise _refuse(setting, origin, value, "must be a git range A..B of names or commit ids")
    return text


def url(setting: str, origin: Origin, value: object) -> str:
    """An index server's upload URL: http(s) only."""
    text = _as_text(setting, origin, value, MAX_URL_LENGTH)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or set(text) & (_FORBIDDEN_IN_LOCATION - {"&", "?"}):
        raise _refuse(setting, origin, value, "must be an http:// or https:// URL with a host and no quotes, spaces or $")
    return text


Rule = Callable[[str, Origin, object], str]


def _matching(pattern: re.Pattern[str], limit: int, rule: str) -> Rule:
    """A rule for a name that must match ``pattern`` as a whole (and be at most ``limit`` long)."""
    def check(setting: str, origin: Origin, value: object) -> str:
        text = _as_text(setting, origin, value, limit)
        if not pattern.fullmatch(text):
            raise _refuse(setting, origin, value, rule)
        return text

    return check


volume_name = _matching(_VOLUME_NAME, 128, "must be a Docker volume name: [A-Za-z0-9][A-Za-z0-9_.-]*")
image_ref = _matching(_IMAGE_REF, 512, "must be an image reference [REGISTRY/]NAME[:TAG][@sha256:DIGEST]")
env_name = _matching(re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}"), 128,
                     "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
suite_name = _matching(re.compile(r"[a-z][a-z0-9-]{1,31}"), 32, "must be a Debian suite name such as bullseye")
