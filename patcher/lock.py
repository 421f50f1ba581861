"""`patcher lock`: resolve the matrix's image tags to digests and write them back in place.

Talks the registry HTTP API v2 directly (a HEAD on the manifest, with the anonymous bearer
token dance Docker Hub wants), so no engine and no pull is needed.  The matrix file is edited
line by line: only the ``digest = "..."`` line of each image changes, comments and layout stay.
All tags are resolved before the file is touched, and it is replaced atomically, so a failed
lock leaves the matrix as it was.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from patcher.config import Settings
from patcher.errors import ConfigError, OutputWriteError, RegistryError
from patcher.spec import load_matrix
from patcher.util import write_atomic

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
DOCKER_HUB = "registry-1.docker.io"
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageRef:
    registry: str | None  # None: Docker Hub
    path: str  # "library/debian"
    tag: str

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        """'host:5000/a/b:tag' -> registry 'host:5000'; a first part without '.', ':' or
        'localhost' is a Docker Hub path.  A digest suffix is dropped."""
        name = ref.split("@", 1)[0]
        tag = "latest"
        if ":" in name.rsplit("/", 1)[-1]:
            name, tag = name.rsplit(":", 1)
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = None, name
        if registry in (None, "docker.io", "index.docker.io") and "/" not in path:
            path = f"library/{path}"
        return cls(registry=registry, path=path, tag=tag)

    @property
    def host(self) -> str:
        return DOCKER_HUB if self.registry in (None, "docker.io", "index.docker.io") else self.registry

    def on(self, registry: str | None) -> ImageRef:
        return ImageRef(registry=registry, path=self.path, tag=self.tag) if registry else self


@dataclass(frozen=True)
class LockResult:
    image: str  # matrix name, e.g. "debian-bullseye"
    ref: str
    looked_up: str  # host/path:tag actually asked
    old_digest: str
    digest: str

    @property
    def changed(self) -> bool:
        return self.old_digest != self.digest

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "changed": self.changed}


def _scheme(host: str) -> str:
    bare = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    loopback = bare in ("localhost", "[::1]") or bare.startswith("127.")
    return "http" if loopback else "https"


def _bearer_token(challenge: str, session: requests.Session, timeout: float) -> str | None:
    """Anonymous token for a `Bearer realm=...,service=...,scope=...` challenge."""
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    resp = session.get(realm, params=params, timeout=timeout)
    if resp.status_code != 200:
        return None
    body = resp.json()
    return body.get("token") or body.get("access_token")


def resolve_digest(ref: ImageRef, timeout: float = 30.0) -> str:
    """The manifest digest the registry serves for ``ref``'s tag."""
    url = f"{_scheme(ref.host)}://{ref.host}/v2/{ref.path}/manifests/{ref.tag}"
    shown = f"{ref.host}/{ref.path}:{ref.tag}"
    headers = {"Accept": MANIFEST_TYPES}
    with requests.Session() as session:
        try:
            resp = session.head(url, headers=headers, timeout=timeout)
            if resp.status_code == 401:
                token = _bearer_token(resp.headers.get("WWW-Authenticate", ""), session, timeout)
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                    resp = session.head(url, headers=headers, timeout=timeout)
            digest = resp.headers.get("Docker-Content-Digest")
            if resp.status_code == 200 and not digest:
                # Some registries answer HEAD without the header: hash the manifest itself.
                import hashlib

                got = session.get(url, headers=headers, timeout=timeout)
                got.raise_for_status()
                digest = "sha256:" + hashlib.sha256(got.content).hexdigest()
        except requests.RequestException as exc:
            raise RegistryError(f"registry {ref.host} is unreachable for {shown}: {type(exc).__name__}",
                                hint="check the registry setting (--registry / PATCHER_REGISTRY) and the network") from None
    if resp.status_code == 404:
        raise RegistryError(f"{shown} does not exist in the registry",
                            hint="push it first, or fix the image's ref in the matrix")
    if resp.status_code in (401, 403):
        raise RegistryError(f"registry {ref.host} refused access to {shown} (HTTP {resp.status_code})",
                            hint="log in or use a mirror registry with --registry")
    if resp.status_code != 200:
        raise RegistryError(f"registry {ref.host} answered HTTP {resp.status_code} for {shown}")
    if not digest or not DIGEST_RE.match(digest):
        raise RegistryError(f"registry {ref.host} gave no usable digest for {shown} ({digest!r})")
    return digest


# ----------------------------------------------------------------------------------------------
def _section_bounds(lines: list[str], name: str) -> tuple[int, int] | None:
    header = re.compile(r'^\s*\[\s*images\s*\.\s*(?:"' + re.escape(name) + r'"|' + re.escape(name) + r')\s*\]\s*(#.*)?$')
    start = next((i for i, ln in enumerate(lines) if header.match(ln)), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^\s*\[", lines[i])), len(lines))
    return start, end


def set_digest(text: str, name: str, digest: str) -> str:
    """``text`` with the ``digest = "..."`` line of [images.<name>] set; everything else kept."""
    lines = text.splitlines(keepends=True)
    bounds = _section_bounds(lines, name)
    if bounds is None:
        raise ConfigError(f"matrix has no [images.{name}] table")
    start, end = bounds
    digest_line = re.compile(r'^(\s*digest\s*=\s*)"[^"]*"(.*)$', re.S)
    for i in range(start + 1, end):
        m = digest_line.match(lines[i])
        if m:
            lines[i] = f'{m.group(1)}"{digest}"{m.group(2)}'
            return "".join(lines)
    # No digest line yet: put it right after `ref = ...`.
    ref_at = next((i for i in range(start + 1, end) if re.match(r"^\s*ref\s*=", lines[i])), start)
    newline = "\n" if not lines[ref_at].endswith("\n") else ""
    lines.insert(ref_at + 1, f'{newline}digest = "{digest}"\n')
    return "".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Rewrite the matrix file in place, keeping its permissions."""
    try:
        write_atomic(path, text, mode=path.stat().st_mode & 0o7777)
    except OSError as exc:
        raise OutputWriteError(f"cannot write {path}: {exc.strerror or exc}",
                               hint="the matrix file's directory must be writable") from None


def lock(settings: Settings, images: list[str] | None = None, registry: str | None = None,
         dry_run: bool = False, timeout: float = 30.0) -> list[LockResult]:
    """Resolve every (or the named) matrix image and write changed digests into settings.matrix."""
    path = Path(settings.matrix)
    matrix = load_matrix(path)
    table = matrix.get("images", {})
    names = images or sorted(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ConfigError(f"matrix has no image(s) {', '.join(unknown)}", hint=f"known: {', '.join(sorted(table))}")
    registry = registry or settings.registry
    results = []
    for name in names:
        ref = ImageRef.parse(table[name]["ref"])
        asked = ref.on(registry)
        digest = resolve_digest(asked, timeout=timeout)
        results.append(LockResult(image=name, ref=table[name]["ref"], looked_up=f"{asked.host}/{asked.path}:{asked.tag}",
                                  old_digest=table[name].get("digest", "unknown"), digest=digest))
    if not dry_run and any(r.changed for r in results):
        text = path.read_text(encoding="utf-8")
        for r in results:
            if r.changed:
                text = set_digest(text, r.image, r.digest)
        write_atomically(path, text)
    return results
