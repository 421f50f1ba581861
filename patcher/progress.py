"""The build's live display and its full log: one rewritten line on a terminal, plain lines
every half minute otherwise, and every byte of output in ``build.log``."""

from __future__ import annotations

import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from patcher.util import utc_now


class Progress:
    """One live display (a rewritten line on a TTY, plain lines otherwise) and the full log."""

    PLAIN_INTERVAL = 30.0
    TTY_INTERVAL = 0.2

    def __init__(self, log_path: Path, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_file = open(log_path, "a", encoding="utf-8", errors="replace")
        self.lock = threading.Lock()
        self.stage: str | None = None
        self.stage_start = time.monotonic()
        self.last_line = ""
        self.last_shown = 0.0
        self.partial = ""

    # -- the log
    def log(self, text: str) -> None:
        """Append output (any number of lines, possibly partial) to the log and the display."""
        with self.lock:
            self.log_file.write(text)
            self.log_file.flush()
            chunk = self.partial + text
            parts = re.split(r"[\r\n]", chunk)
            self.partial = parts.pop()
            for line in parts:
                if line.strip():
                    self.last_line = line.strip()
            self._show(force=False)

    def note(self, message: str) -> None:
        """A line that matters: into the log and onto the display as a line of its own."""
        with self.lock:
            self.log_file.write(f"patcher: {message}\n")
            self.log_file.flush()
            self._clear()
            self.stream.write(f"patcher: {message}\n")
            self.stream.flush()

    def log_only(self, message: str) -> None:
        """A line for the log alone (the CLI prints errors itself)."""
        with self.lock:
            self.log_file.write(f"patcher: {message}\n")
            self.log_file.flush()
            self._clear()

    # -- stages
    def start(self, stage: str) -> None:
        with self.lock:
            self.stage, self.stage_start, self.last_line = stage, time.monotonic(), ""
            self.log_file.write(f"==> {stage} ({utc_now()})\n")
            self.log_file.flush()
            if not self.tty:
                self.stream.write(f"patcher: [{stage}] started\n")
                self.stream.flush()
            self._show(force=True)

    def done(self, stage: str, seconds: float, detail: str = "") -> None:
        with self.lock:
            suffix = f": {detail}" if detail else ""
            self.log_file.write(f"==> {stage} done in {seconds:.1f} s{suffix}\n")
            self.log_file.flush()
            self._clear()
            self.stream.write(f"patcher: [{stage}] done in {seconds:.1f} s{suffix}\n")
            self.stream.flush()
            self.stage = None

    def close(self) -> None:
        with self.lock:
            self._clear()
            if self.partial:
                self.log_file.write("\n")
            self.log_file.close()

    # -- display
    def _status(self) -> str:
        elapsed = int(time.monotonic() - self.stage_start)
        return f"[{self.stage} {elapsed // 60:02d}:{elapsed % 60:02d}] {self.last_line}"

    def _show(self, force: bool) -> None:
        if self.stage is None:
            return
        now = time.monotonic()
        interval = self.TTY_INTERVAL if self.tty else self.PLAIN_INTERVAL
        if not force and now - self.last_shown < interval:
            return
        self.last_shown = now
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\x1b[K" + self._status()[:width])
        elif not force:
            self.stream.write("patcher: " + self._status()[:200] + "\n")
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
