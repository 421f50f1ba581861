"""The one way patcher runs git, and the checks a value from outside passes before git sees it.

Every git command of every stage goes through :func:`run_git`:

* a fixed configuration, so our runs do not depend on the user's git config (no hooks, no
  autocrlf, no signing; ``git am`` applies patches exactly as written);
* transports restricted on every call: ``protocol.allow=never`` and only the transports a mirror
  may use allowed (:data:`ALLOWED_TRANSPORTS`); ``GIT_ALLOW_PROTOCOL`` is set to the same list,
  since git lets that variable override the configuration, and ``GIT_PROTOCOL_FROM_USER=0``;
* values from outside (a mirror URL, a ``.gitmodules`` URL or path, a refspec naming one) are
  passed as ``operands``: git gets them after ``--end-of-options`` (or ``--`` for commands that
  take paths), so a value such as ``--upload-pack=CMD`` can never be read as an option.

A URL from outside is checked by :func:`validate_remote_url` before any git command gets it:
the settings edge, the fetch stage and every submodule URL of a tree's ``.gitmodules``.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, TypeVar
from urllib.parse import urlsplit

from git.cmd import Git

from patcher.errors import FetchError, PatcherError, RemoteURLError, SubmodulePathError, SubmoduleURLError
from patcher.setting_rules import shown

F = TypeVar("F", bound=Callable[..., Any])

# file: local mirrors and the object cache (a plain path is the file transport too); https: a
# hosted mirror; http: an internal mirror served as static files (`git update-server-info`),
# acceptable because every commit patcher takes is checked against its pinned SHA, so the
# transport carries no trust; ssh: internal git servers reached with keys.  Not `git://`
# (unauthenticated daemon, nothing a mirror needs), and never `ext::` / `fd::`, which run
# commands or read descriptors.
ALLOWED_TRANSPORTS = ("file", "https", "http", "ssh")

GIT_CONFIG = (
    "-c", "core.autocrlf=false", "-c", "core.hooksPath=/dev/null",
    "-c", "advice.detachedHead=false", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false",
    # git am must apply and record patches exactly as written
    "-c", "apply.whitespace=nowarn", "-c", "am.messageid=false",
    "-c", "protocol.allow=never",
    *(item for name in ALLOWED_TRANSPORTS for item in ("-c", f"protocol.{name}.allow=always")),
)
GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PROTOCOL_FROM_USER": "0",
    "GIT_ALLOW_PROTOCOL": ":".join(ALLOWED_TRANSPORTS),
}


@dataclass(frozen=True)
class GitResult:
    returncode: int
    stdout: str
    stderr: str


class GitCommandFailed(Exception):
    """A git command failed; callers turn it into a PatcherError that says what it was for."""

    def __init__(self, args: Sequence[str], stderr: str):
        super().__init__(f"git {' '.join(args)}: {last_line(stderr)}")
        self.stderr = stderr


def run_git(*args: str, operands: Sequence[str] = (), end_of_options: str = "--end-of-options",
            cwd: Path | None = None, env: dict[str, str] | None = None, check: bool = True,
            stdin: IO[bytes] | None = None) -> GitResult:
    """``git <args> [end_of_options <operands>]`` with the fixed config and transports.

    ``args`` are patcher's own words (subcommand, options, refs and paths it made); every value
    that came from outside goes in ``operands``.  ``end_of_options`` is ``--`` for commands whose
    operands are paths (``submodule update``).  Raises GitCommandFailed when ``check``."""
    extra = dict(env or {})
    extra.update(GIT_ENV)  # last: neither a caller nor the user's environment widens transports
    command = [*args, end_of_options, *operands] if operands else list(args)
    status, out, err = Git(str(cwd) if cwd else None).execute(
        ["git", *GIT_CONFIG, *command], with_extended_output=True, with_exceptions=False,
        env=extra, strip_newline_in_stdout=False, istream=stdin)
    if check and status != 0:
        raise GitCommandFailed(command, err)
    return GitResult(status, out, err)


def last_line(text: str) -> str:
    """The most telling line of git's stderr (its 'fatal:' line when there is one)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    return (fatal or lines or ["(no message)"])[0]


def reports_failures_as(error: type[PatcherError], what: str) -> Callable[[F], F]:
    """Decorator for a stage's entry points: an unexpected git or OS failure becomes ``error``."""

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except GitCommandFailed as exc:
                raise error(f"{what}: {exc}") from None
            except OSError as exc:
                where = f" {exc.filename}" if exc.filename else ""
                raise error(f"{what}: {exc.strerror or exc}{where}") from None

        return inner  # type: ignore[return-value]

    return wrap


# --- URLs ------------------------------------------------------------------------------------
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_TRANSPORT_HELPER = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")  # git's <transport>::<address>
_SCP_STYLE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9][A-Za-z0-9.-]*:")  # user@host:path
ALLOWED_URL_SCHEMES = ("file", "https", "http", "ssh")


def validate_remote_url(value: str) -> str:
    """``value`` if it is a git URL patcher may hand to git; RemoteURLError (a reason) if not.

    Accepted: ``file://``, ``https://``, ``http://``, ``ssh://`` URLs with a host (or, for
    ``file://``, a path), scp-style ``user@host:path`` (git's ssh shorthand), and a local path
    (``mirror sync --from DIR`` takes relative ones).  Refused: anything else, a leading ``-`` (git would read an option), control
    characters (a newline splits git's config and protocol lines), and ``transport::address``
    (``ext::`` runs a command)."""
    if not isinstance(value, str) or not value:
        raise RemoteURLError("a git URL is empty")
    text = shown(value)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise RemoteURLError(f"git URL {text} contains a control character")
    if value.startswith("-"):
        raise RemoteURLError(f"git URL {text} begins with '-', which git would read as an option")
    if _TRANSPORT_HELPER.match(value):
        raise RemoteURLError(f"git URL {text} names a transport helper ('::'); only "
                             f"{', '.join(s + '://' for s in ALLOWED_URL_SCHEMES)} and user@host:path are allowed")
    scheme = _SCHEME.match(value)
    if scheme:
        name = scheme.group(1).lower()
        if name not in ALLOWED_URL_SCHEMES:
            raise RemoteURLError(f"git URL {text} uses the scheme {name}://; only "
                                 f"{', '.join(s + '://' for s in ALLOWED_URL_SCHEMES)} and user@host:path are allowed")
        parts = urlsplit(value)
        if name == "file":
            if not parts.path.startswith("/"):
                raise RemoteURLError(f"git URL {text} has no absolute path")
        elif not parts.hostname or parts.hostname.startswith("-"):
            raise RemoteURLError(f"git URL {text} has no usable host")
        return value
    if ":" not in value.split("/", 1)[0]:
        return value  # a local path (git reads it so when no ':' comes before the first '/')
    if _SCP_STYLE.match(value):
        return value
    raise RemoteURLError(f"git URL {text} is not one patcher accepts: use "
                         f"{', '.join(s + '://' for s in ALLOWED_URL_SCHEMES)}, user@host:path or a local path")


def source_key(url: str) -> str:
    """A short, stable name for a source URL (refs of what came from it are kept under it)."""
    return hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def org_repo(url: str) -> tuple[str, str]:
    """'https://github.com/pytorch/pytorch.git' -> ('pytorch', 'pytorch'); scp-style too."""
    url = url.strip().rstrip("/")
    if re.match(r"^[a-z][a-z0-9+.-]*://", url):
        path = urlsplit(url).path
    else:
        path = re.sub(r"^[^/:]+@[^:]+:", "", url)  # git@github.com:ORG/REPO.git
    parts = [p for p in path.split("/") if p]
    if len(parts) < 2 or any(p in (".", "..") for p in parts[-2:]):
        raise FetchError(f"cannot tell organisation and repository from URL {url!r}")
    repo = parts[-1][:-4] if parts[-1].endswith(".git") else parts[-1]
    return parts[-2], repo


def resolve_relative(url: str, parent_upstream: str) -> str:
    """A .gitmodules URL like '../fmt.git' is relative to the parent's upstream URL."""
    if not url.startswith(("./", "../")):
        return url
    base = parent_upstream.rstrip("/")
    rest = url
    while rest.startswith(("./", "../")):
        if rest.startswith("./"):
            rest = rest[2:]
        else:
            rest = rest[3:]
            base = base.rsplit("/", 1)[0]
    return f"{base}/{rest}"


def mirror_url(upstream: str, git_base: str | None) -> str:
    """Where to fetch an upstream repository from: ``<git_base>/ORG/REPO.git`` or upstream.

    Both the base and the result are checked (RemoteURLError): this is the URL git gets."""
    if not git_base:
        return validate_remote_url(upstream)
    validate_remote_url(git_base)
    org, repo = org_repo(upstream)
    return validate_remote_url(f"{git_base.rstrip('/')}/{org}/{repo}.git")


# --- reading repositories ----------------------------------------------------------------------
def has_commit(repo: Path, sha: str) -> bool:
    return run_git("cat-file", "-e", f"{sha}^{{commit}}", cwd=repo, check=False).returncode == 0


def is_shallow(repo: Path) -> bool:
    """Whether ``repo`` has commits whose parents it lacks (fetched from a shallow mirror)."""
    return run_git("rev-parse", "--is-shallow-repository", cwd=repo).stdout.strip() == "true"


def gitlinks(repo_dir: Path, commit: str) -> dict[str, str]:
    """path -> pinned SHA of every submodule (gitlink) in ``commit``."""
    out = run_git("ls-tree", "-r", "-z", commit, cwd=repo_dir).stdout
    links = {}
    for entry in out.split("\0"):
        if entry.startswith("160000 commit "):
            meta, path = entry.split("\t", 1)
            links[path] = meta.split()[2]
    return links


def gitmodules_entries(repo_dir: Path, commit: str) -> list[tuple[str, str, str]]:
    """(name, path, url) of every submodule the commit's .gitmodules names ("" where unset)."""
    proc = run_git("config", "-z", "--blob", f"{commit}:.gitmodules", "--get-regexp",
                   r"^submodule\..*\.(path|url)$", cwd=repo_dir, check=False)
    if proc.returncode not in (0, 1):  # 1: no matches / no .gitmodules
        return []
    names: dict[str, dict[str, str]] = {}
    for item in proc.stdout.split("\0"):
        if not item:
            continue
        key, _, value = item.partition("\n")
        name, _, attr = key[len("submodule."):].rpartition(".")
        names.setdefault(name, {})[attr] = value
    return [(n, v.get("path", ""), v.get("url", "")) for n, v in names.items()]


def gitmodules(repo_dir: Path, commit: str) -> dict[str, tuple[str, str]]:
    """path -> (submodule name, url) from the commit's .gitmodules."""
    return {path: (name, url) for name, path, url in gitmodules_entries(repo_dir, commit) if path}


def unsafe_submodule_path(value: str) -> str | None:
    """Why a .gitmodules path or name may not be used as a path inside a repository, or None.

    Both become paths (the work tree's, and ``.git/modules/<name>``): absolute, ``..``, a
    control character or a leading ``-`` would reach outside the tree or into git's options."""
    if not value:
        return "is empty"
    if value.startswith("/") or value.startswith("\\"):
        return "is absolute"
    if ".." in value.replace("\\", "/").split("/"):
        return "has a '..' component"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return "contains a control character"
    if value.startswith("-"):
        return "begins with '-'"
    return None


def check_gitmodules(repo: Path, commit: str, parent_upstream: str, prefix: str = "") -> None:
    """Every entry of the commit's .gitmodules, before git runs on any: its URL (relative ones
    resolved against the parent's) passes validate_remote_url, its path and name stay inside
    the tree.  Refusals name the submodule (SubmoduleURLError, SubmodulePathError)."""
    for name, path, url in gitmodules_entries(repo, commit):
        which = f"submodule {name!r} (path {prefix + path!r})"
        for what, value in (("path", path), ("name", name)):
            why = unsafe_submodule_path(value)
            if why:
                raise SubmodulePathError(f"{which} in .gitmodules of {commit[:12]}: its {what} {why}",
                                         hint="the tree is not one patcher fetches; check the mirror's copy")
        if not url:
            continue
        try:
            validate_remote_url(resolve_relative(url, parent_upstream))
        except RemoteURLError as exc:
            raise SubmoduleURLError(f"{which} in .gitmodules of {commit[:12]}: {exc.message}",
                                    hint="the tree is not one patcher fetches; check the mirror's copy") from None
