"""Small helpers the stages share: atomic writes, file digests, the line that says why a log
failed, the current time, and signals turned into exceptions.

``patcher/probe/`` keeps its own copies of the few it needs: it runs alone, inside old
interpreters (Python 3.6, standard library only).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path


def utc_now() -> str:
    """The current time as ISO 8601 UTC with a ``Z`` and whole seconds."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path | str, data: bytes | str, mode: int = 0o644) -> None:
    """Write a file so that readers see either the old content or the new, never half of it,
    and the new content is on disk (fsync) before the rename makes it visible."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ERROR_LINE = re.compile(r"(\berror\b|\bError\b|FAILED:|fatal:|No space left)")


def meaningful_line(lines: Iterable[str] | str, limit: int = 300) -> str:
    """The line of a log that says why it failed: CMake's error with its reason, else the last
    error line (compiler, ninja, git, apt), else the last line of output."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    text = [t for t in (_ANSI.sub("", ln).strip() for ln in lines) if t]
    for i in range(len(text) - 1, -1, -1):
        if text[i].startswith("CMake Error"):
            reason = text[i + 1] if i + 1 < len(text) else ""
            return f"{text[i]} {reason}".strip()[:limit]
    for line in reversed(text[-60:]):
        if _ERROR_LINE.search(line):
            return line[:limit]
    return text[-1][:limit] if text else "(no output)"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every ``finally`` and ``__exit__`` runs."""


@contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """Inside: SIGTERM raises :class:`Terminated` and SIGINT KeyboardInterrupt, so containers and
    temp files go on either.  A SIGINT the process inherited as ignored (a background job of a
    script) stays ignored: Ctrl-C meant for the script must not stop it.  Handlers are restored
    on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):  # noqa: ARG001
        raise Terminated()

    def on_int(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt()

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_term)}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_int)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
