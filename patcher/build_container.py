"""One build stage (configure or wheel) in a fresh container of the builder image.

Hermetic: the patched tree (git-tracked files plus the pinned inputs, nothing else) goes in
owned by the builder user, the network is off, the CPU quota is the job count, only the ccache
volume is shared between builds, and the wheel leaves through the archive API.  The container
goes whatever happens (patcher.container); the log stays in ``build.log``.
"""

from __future__ import annotations

import re
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patcher import build_tree
from patcher.buildenv import (
    BUILD_USER,
    CONTAINER_CCACHE,
    CONTAINER_OUT,
    CONTAINER_SRC,
    LABEL_BUILD,
    LABEL_CCACHE,
    LABEL_STAGE,
    LABEL_WORK_DIR,
    TOOLCHAIN_FILE,
    TOOLCHAIN_SCRIPT,
    container_environment,
    parse_toolchain,
    source_archive,
)
from patcher.container import Container, ContainerConfig, ContainerError, ContainerTimeout, Engine
from patcher.errors import BuildTimeoutError, DiskFullError, WheelBuildError
from patcher.record import BuildTreeUse, WheelFile
from patcher.spec import BuildSpec
from patcher.util import meaningful_line, sha256_file, write_atomic

# PyTorch's setup.py (and the stand-in's) read the environment; `build --cmake-only` is
# PyTorch's configure-only mode.
STAGE_COMMANDS = {
    "configure": '"${PATCHER_PYTHON:-python3}" setup.py build --cmake-only',
    "wheel": f'"${{PATCHER_PYTHON:-python3}}" setup.py bdist_wheel --dist-dir {CONTAINER_OUT}',
}
DISK_FULL_MARKERS = ("No space left on device", "no space left on device")
KEEP_LINES = 200  # of the output, for the line that says why a stage failed


def mentions_disk_full(text: str) -> bool:
    return any(marker in text for marker in DISK_FULL_MARKERS)


@dataclass(frozen=True)
class StageInputs:
    """What a container stage is made of; the same for both stages of one build."""

    spec: BuildSpec
    image_id: str
    tree: Path
    inputs: list[tuple[str, bytes]]  # (destination in the tree, bytes)
    source_date_epoch: int
    jobs: int
    work_dir: Path  # labels the containers, so a later run finds what a killed one left
    timeout: float
    keep_tree: bool = False  # /src is the spec's build-tree volume (patcher.build_tree)


@dataclass(frozen=True)
class StageOutcome:
    container_env: dict[str, str]
    toolchain: dict[str, str]
    wheel: WheelFile | None = None
    build_tree: BuildTreeUse | None = None


def ccache_volume_labels(spec: BuildSpec) -> dict[str, str]:
    return {LABEL_CCACHE: "1", "org.patcher.torch": spec.torch, "org.patcher.cuda": spec.cuda}


class _OutputTail:
    """The last lines of a container's output, and whether one of them said the disk is full."""

    def __init__(self, on_text: Callable[[str], None]):
        self.on_text, self.lines, self.partial, self.disk_full = on_text, [], "", False

    def __call__(self, text: str) -> None:
        self.on_text(text)
        parts = re.split(r"[\r\n]", self.partial + text)
        self.partial = parts.pop()
        for line in parts:
            self._add(line)
        del self.lines[:-KEEP_LINES]

    def _add(self, line: str) -> None:
        if line.strip():
            self.lines.append(line)
            self.disk_full = self.disk_full or mentions_disk_full(line)

    def finish(self) -> list[str]:
        self._add(self.partial)
        self.partial = ""
        return self.lines


def run_stage(engine: Engine, stage: str, what: StageInputs, volume: str, on_text: Callable[[str], None],
              log_path: Path, collect_to: Path | None = None) -> StageOutcome:
    """Run ``stage``'s command; with ``collect_to`` the one wheel it leaves in /out goes there."""
    spec = what.spec
    env = container_environment(spec, what.jobs, what.source_date_epoch)
    volumes = {volume: CONTAINER_CCACHE}
    tree_volume = build_tree.volume_name(spec, what.image_id, what.source_date_epoch) if what.keep_tree else None
    try:
        engine.ensure_volume(volume, ccache_volume_labels(spec))
        if tree_volume:
            engine.ensure_volume(tree_volume, build_tree.volume_labels(spec))
            volumes[tree_volume] = CONTAINER_SRC
    except ContainerError as exc:
        raise WheelBuildError(f"{stage}: {exc}") from None
    prepare = build_tree.PREPARE_SCRIPT if tree_volume else ""
    config = ContainerConfig(
        image=what.image_id, command=("bash", "-c", TOOLCHAIN_SCRIPT + f"set -e\ncd {CONTAINER_SRC}\n" + prepare
                                      + STAGE_COMMANDS[stage] + "\n"),
        user=BUILD_USER, env=env, workdir=CONTAINER_SRC, cpus=min(what.jobs, engine.cpu_count()),
        volumes=volumes,
        labels={LABEL_BUILD: spec.build_id, LABEL_STAGE: stage, LABEL_WORK_DIR: str(what.work_dir)},
        name=f"patcher-{spec.build_id.replace('+', '_')}-{stage}-{uuid.uuid4().hex[:8]}")
    output = _OutputTail(on_text)
    tree_use = None
    with tempfile.TemporaryDirectory(prefix=".source-", dir=what.work_dir) as temp:
        archive = Path(temp) / "source.tar"
        try:
            with Container(engine, config) as container:
                try:
                    if tree_volume:
                        tree_use = _sync_kept_tree(container, what, tree_volume, archive)
                        on_text(build_tree.describe(tree_use.sync) + "\n")
                    else:
                        source_archive(what.tree, what.inputs, what.source_date_epoch, archive)
                    with open(archive, "rb") as fh:
                        container.put_archive(CONTAINER_SRC, fh)
                    archive.unlink()
                    container.start()
                except ContainerError as exc:
                    if mentions_disk_full(str(exc)):
                        raise DiskFullError(f"{stage}: the engine ran out of disk space: {exc}",
                                            hint="free space on the engine's disk (docker system df)") from None
                    raise WheelBuildError(f"{stage}: cannot start the build container: {exc}") from None
                container.follow_logs(output)
                status = container.wait(what.timeout)
                container.wait_for_logs()
                toolchain = parse_toolchain((container.read_file(TOOLCHAIN_FILE) or b"").decode("utf-8", "replace"))
                lines = output.finish()
                if status != 0:
                    if output.disk_full:
                        raise DiskFullError(f"{stage} ran out of disk space in the container: {meaningful_line(lines)}",
                                            hint=f"free space on the engine's disk or the ccache volume {volume}; "
                                                 f"log: {log_path}")
                    raise WheelBuildError(f"{stage} failed in the container (exit {status}): "
                                          f"{meaningful_line(lines)}", hint=f"full log: {log_path}")
                wheel = _collect_wheel(container, collect_to, what.work_dir) if collect_to else None
        except ContainerTimeout:
            raise BuildTimeoutError(f"{stage} ran past {what.timeout:g} s and was stopped",
                                    hint=f"raise --timeout; log: {log_path}") from None
        except ContainerError as exc:
            raise WheelBuildError(f"{stage}: {exc}") from None
    record_use = tree_use.record if tree_use else None
    return StageOutcome(container_env=env, toolchain=toolchain, wheel=wheel, build_tree=record_use)


@dataclass(frozen=True)
class _KeptTreeSync:
    sync: build_tree.TreeSync
    record: BuildTreeUse


def _sync_kept_tree(container: Container, what: StageInputs, tree_volume: str, archive: Path) -> _KeptTreeSync:
    """Write the archive of what changed since the tree in the volume was last synced; the
    volume is marked dirty until the stage's script has taken the new manifest."""
    current = build_tree.source_manifest(build_tree.tree_files(what.tree), what.inputs)
    sync = build_tree.plan_sync(container.read_file(build_tree.manifest_path()), current)
    # A new volume takes the fixed epoch like a fresh tree; files written into a tree that was
    # built before must be newer than its outputs, or ninja would not rebuild from them.
    mtime = what.source_date_epoch if sync.reason == "new build tree" else int(time.time())
    source_archive(what.tree, what.inputs, mtime, archive, only=None if sync.everything else sync.write,
                   extra_files={build_tree.MANIFEST_NAME + ".next": build_tree.manifest_bytes(current),
                                build_tree.REMOVE_LIST_NAME: build_tree.remove_list_bytes(sync.remove)})
    container.put_files(CONTAINER_SRC, {build_tree.MANIFEST_NAME: build_tree.DIRTY_MANIFEST})
    return _KeptTreeSync(sync, BuildTreeUse(volume=tree_volume, reused=sync.reused, written=len(sync.write),
                                            removed=len(sync.remove), reason=sync.reason))


def _collect_wheel(container: Container, dest_dir: Path, work_dir: Path) -> WheelFile:
    """The one wheel in /out, into dest_dir (temp file + rename)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=work_dir) as buf:
        container.copy_out(CONTAINER_OUT, buf)
        buf.seek(0)
        with tarfile.open(fileobj=buf) as tar:
            wheels = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".whl")]
            if len(wheels) != 1:
                raise WheelBuildError(f"the build left {len(wheels)} wheels in {CONTAINER_OUT}, expected one: "
                                      + ", ".join(Path(m.name).name for m in wheels))
            name = Path(wheels[0].name).name
            data = tar.extractfile(wheels[0]).read()
    target = dest_dir / name
    write_atomic(target, data)
    return WheelFile(name=name, sha256=sha256_file(target), path=str(target.relative_to(work_dir)))
