"""Pinned third-party inputs: files the matrix places into the tree (``inputs``), downloaded
once into the cache (``<cache>/files/<sha256>``) from the site's files mirror or their upstream
URL, and checked by sha256 before use."""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
from pathlib import Path

from patcher.config import Settings
from patcher.container import short_reason
from patcher.errors import ChecksumMismatchError, UnreachableInputError
from patcher.spec import Artifact
from patcher.util import sha256_file

MIRROR_FILES_HINT = ("stage it in a files mirror as <base>/<sha256>: --mirror, PATCHER_MIRROR, "
                     "or `files_mirror` / `mirror` in the config file")
DOWNLOAD_CONNECT_TIMEOUT = 30.0


def input_url(art: Artifact, settings: Settings) -> str:
    base = settings.files_base()
    return f"{base}/{art.sha256}" if base else art.url


def fetch_input(art: Artifact, settings: Settings) -> Path:
    """The input in the cache (``<cache>/files/<sha256>``), downloaded and checked when absent."""
    import requests

    cache = Path(settings.cache_dir) / "files"
    path = cache / art.sha256
    if path.is_file() and sha256_file(path) == art.sha256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    url = input_url(art, settings)
    fd, tmp = tempfile.mkstemp(prefix=f".{art.sha256[:16]}.", suffix=".part", dir=cache)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            if url.startswith("file://") or "://" not in url:
                local = Path(url[len("file://"):] if url.startswith("file://") else url)
                try:
                    with open(local, "rb") as src:
                        for chunk in iter(lambda: src.read(1 << 20), b""):
                            digest.update(chunk)
                            out.write(chunk)
                except OSError as exc:
                    raise UnreachableInputError(f"cannot read input {art.name} from {url}: {exc.strerror}",
                                                hint=MIRROR_FILES_HINT) from None
            else:
                try:
                    with requests.get(url, stream=True, timeout=(DOWNLOAD_CONNECT_TIMEOUT, 120)) as resp:
                        resp.raise_for_status()
                        for chunk in resp.iter_content(1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                except requests.RequestException as exc:
                    raise UnreachableInputError(f"cannot download input {art.name} from {url}: {short_reason(exc)}",
                                                hint=MIRROR_FILES_HINT) from None
        if digest.hexdigest() != art.sha256:
            raise ChecksumMismatchError(
                f"input {art.name} from {url} has sha256 {digest.hexdigest()}, pinned is {art.sha256}",
                hint="the download is not the pinned file: check the mirror's copy")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def input_content(art: Artifact, path: Path) -> bytes:
    """The bytes that go into the tree: the archive member, or the file itself."""
    if not art.member:
        return path.read_bytes()
    try:
        with tarfile.open(path) as tar:
            member = tar.extractfile(art.member)
            if member is None:
                raise KeyError(art.member)
            return member.read()
    except (KeyError, tarfile.TarError) as exc:
        raise ChecksumMismatchError(f"input {art.name} has no file {art.member}: {exc}",
                                    hint="check `member` of the input in the matrix") from None


def tree_inputs(spec_inputs: tuple[Artifact, ...] | list[Artifact], settings: Settings) -> list[tuple[str, bytes]]:
    """(destination in the tree, bytes) of every pinned input that goes into the tree."""
    return [(art.dest, input_content(art, fetch_input(art, settings))) for art in spec_inputs if art.dest]
