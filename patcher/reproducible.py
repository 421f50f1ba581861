"""``patcher build --check-reproducible``: the wheel stage twice, each in a fresh container with a
fresh ccache volume; equal wheels are the result, different ones a diffoscope report and an error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patcher.build_container import StageInputs, StageOutcome, run_stage
from patcher.container import ContainerError, Engine
from patcher.errors import ReproducibilityError
from patcher.record import Reproducibility, WheelFile
from patcher.util import meaningful_line, sha256_file

REPRO_DIR = "reproducibility"
DIFFOSCOPE_TIMEOUT = 1800


@dataclass(frozen=True)
class ReproducibleWheel:
    reproducibility: Reproducibility
    wheel_name: str
    stage: StageOutcome | None  # equal wheels: the first build's, its wheel moved to dist/
    diffoscope_report: Path | None = None  # different wheels: what differs

    def raise_if_different(self) -> None:
        if self.reproducibility.reproducible:
            return
        sha1, sha2 = self.reproducibility.sha256
        raise ReproducibilityError(
            f"two builds of {self.wheel_name} from the same inputs differ: sha256 {sha1} vs {sha2}; "
            f"diffoscope report: {self.diffoscope_report}",
            hint="make the build deterministic (timestamps, paths, ordering)")


def build_twice(engine: Engine, what: StageInputs, volume_prefix: str, dist: Path, on_text: Callable[[str], None],
                log_path: Path) -> ReproducibleWheel:
    repro = what.work_dir / REPRO_DIR
    if repro.exists():
        shutil.rmtree(repro)
    repro.mkdir()
    token = uuid.uuid4().hex[:8]
    volumes = [f"{volume_prefix}-repro-{token}-{n}" for n in (1, 2)]
    outcomes: list[StageOutcome] = []
    try:
        for n, volume in enumerate(volumes, 1):
            on_text(f"reproducibility build {n} of 2 (fresh container, fresh ccache volume {volume})\n")
            outcomes.append(run_stage(engine, "wheel", what, volume, on_text, log_path, collect_to=repro / f"build{n}"))
    finally:
        for volume in volumes:
            try:
                engine.remove_volume(volume)
            except ContainerError as exc:
                on_text(f"could not remove volume {volume}: {exc}\n")
    first, second = (what.work_dir / o.wheel.path for o in outcomes)
    sha1, sha2 = outcomes[0].wheel.sha256, outcomes[1].wheel.sha256
    result = Reproducibility(builds=2, sha256=(sha1, sha2), reproducible=sha1 == sha2)
    if sha1 != sha2:
        report = diffoscope(first, second, repro / "diffoscope.txt", on_text)
        return ReproducibleWheel(reproducibility=result, wheel_name=first.name, stage=None, diffoscope_report=report)
    dist.mkdir(exist_ok=True)
    target = dist / first.name
    os.replace(first, target)
    shutil.rmtree(repro / "build2", ignore_errors=True)
    wheel = WheelFile(name=target.name, sha256=sha1, path=str(target.relative_to(what.work_dir)))
    stage = StageOutcome(container_env=outcomes[0].container_env, toolchain=outcomes[0].toolchain, wheel=wheel)
    return ReproducibleWheel(reproducibility=result, wheel_name=target.name, stage=stage)


def diffoscope(first: Path, second: Path, report: Path, on_text: Callable[[str], None]) -> Path:
    exe = shutil.which("diffoscope") or str(Path(sys.executable).with_name("diffoscope"))
    if not Path(exe).is_file():
        raise ReproducibilityError(
            f"two builds of {first.name} differ ({sha256_file(first)} vs {sha256_file(second)}) and "
            "diffoscope is not installed, so no report was written",
            hint="pip install diffoscope (it is in patcher's test extras) and build again")
    tmp = report.with_name(report.name + ".part")
    on_text(f"running diffoscope on the two wheels -> {report}\n")
    try:
        proc = subprocess.run([exe, "--no-progress", "--text", str(tmp), str(first), str(second)],
                              capture_output=True, text=True, timeout=DIFFOSCOPE_TIMEOUT)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise ReproducibilityError(f"two builds of {first.name} differ, and diffoscope ran past 30 minutes") from None
    if proc.returncode not in (0, 1) or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise ReproducibilityError(f"two builds of {first.name} differ, and diffoscope failed "
                                   f"(exit {proc.returncode}): {meaningful_line(proc.stderr)}")
    os.replace(tmp, report)
    return report
