"""Build stage: ``patcher build`` runs the whole pipeline, one stage after another::

    resolve  fetch  patch  render  image  configure  wheel  probe  certify

Each stage is a function of the build so far (:class:`Build`) that returns a typed outcome;
the runner folds it into the one typed record (:class:`patcher.record.BuildRecord`) and saves
that after every stage in the work directory (patcher.workdir), so running the same command
again continues after the last completed stage and ``--until STAGE`` stops after it.
Containers go through patcher.container; configure and wheel run in fresh containers of the
builder image (patcher.build_container); the probe installs the wheel into a venv in a fresh
container of the builder image as its own user (or ``--probe-image``), with the engine's GPUs
when it has any.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TextIO

from patcher.build_container import StageInputs, run_stage
from patcher.buildenv import LABEL_BUILD, LABEL_STAGE, LABEL_WORK_DIR
from patcher.config import Settings
from patcher.container import ContainerError, Engine
from patcher.errors import (
    BaseImageUnavailableError,
    ImageBuildError,
    InterruptedByUser,
    PatcherError,
    WorkDirError,
)
from patcher.progress import Progress
from patcher.record import (
    AppliedPatch,
    BuildRecord,
    BuildTreeUse,
    EvidenceFiles,
    PatchedState,
    PinnedInput,
    PipRequirement,
    Reproducibility,
    SourceManifest,
    Submodule,
    UnprovenPatch,
    WheelFile,
)
from patcher.spec import BuildSpec, resolve
from patcher.util import Terminated, interrupts_as_exceptions, meaningful_line, utc_now
from patcher.workdir import IMAGE_DIR, WorkDir

STAGES = ("resolve", "fetch", "patch", "render", "image", "configure", "wheel", "probe", "certify")
CONTAINER_STAGES = ("image", "configure", "wheel", "probe")
DEFAULT_TIMEOUT = 8 * 3600.0
PROBE_SUFFIX = ".probe.json"  # the name certify and verify expect beside the wheel
# A fetch from a host that does not answer must fail in seconds, not hang: git's curl gives up
# when fewer than LIMIT bytes/s arrive for TIME seconds (connecting included).
GIT_STALL_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_HTTP_LOW_SPEED_LIMIT": "1000", "GIT_HTTP_LOW_SPEED_TIME": "30"}


@dataclass(frozen=True)
class BuildOptions:
    torch: str
    cuda: str | None = None
    python: str | None = None
    arch: str | None = None
    gcc: int | None = None
    jobs: int | None = None  # None: the engine's CPU count
    until: str | None = None
    resume: bool = False  # continuing is the default; with this flag a missing record is an error
    fresh: bool = False
    check_reproducible: bool = False
    timeout: float = DEFAULT_TIMEOUT  # per container stage, seconds
    ccache_volume: str | None = None  # None: patcher-ccache-<torch>-<cuda>
    probe_image: str | None = None  # None: the builder image
    probe_wheelhouse: str | None = None  # wheels of the wheel's dependencies (offline install)
    gpus: str = "auto"  # for the probe container: auto | all | none
    upstream_tests: bool = False  # run upstream's tests (the series' Upstream-Tests + smoke) in the probe stage
    keep_build_tree: bool = False  # /src in the spec's build-tree volume: rebuilds compile only what changed


@dataclass(frozen=True)
class BuildResult:
    build_id: str
    work_dir: Path
    record: Path
    log: Path
    completed_stages: tuple[str, ...]
    wheel: Path | None = None
    wheel_sha256: str | None = None
    image_reused: bool | None = None
    stage_durations: dict[str, float] = field(default_factory=dict)
    unproven_patches: tuple[UnprovenPatch, ...] = ()

    @property
    def last_stage(self) -> str | None:
        return self.completed_stages[-1] if self.completed_stages else None


def ccache_volume_name(spec: BuildSpec) -> str:
    return f"patcher-ccache-{spec.torch}-{spec.cuda}"


# --- stage outcomes: the record fields each stage sets ---------------------------------------------
@dataclass(frozen=True)
class FetchOutcome:
    source: SourceManifest
    source_date_epoch: int
    inputs: tuple[PinnedInput, ...]


@dataclass(frozen=True)
class PatchOutcome:
    patches: tuple[AppliedPatch, ...]
    patched_tree: PatchedState


@dataclass(frozen=True)
class RenderOutcome:
    dockerfile_sha256: str
    image_tag: str
    build_requirements: tuple[PipRequirement, ...]


@dataclass(frozen=True)
class ImageOutcome:
    image_id: str
    image_reused: bool


@dataclass(frozen=True)
class ContainerOutcome:
    container_env: dict[str, str]
    toolchain: dict[str, str]
    build_tree: BuildTreeUse | None = None


@dataclass(frozen=True)
class WheelOutcome(ContainerOutcome):
    wheel: WheelFile | None = None
    reproducibility: Reproducibility | None = None


@dataclass(frozen=True)
class ProbeOutcome:
    probe_report: str
    unproven_patches: tuple[UnprovenPatch, ...]


@dataclass(frozen=True)
class CertifyOutcome:
    evidence: EvidenceFiles


def apply_outcome(record: BuildRecord, outcome: Any) -> BuildRecord:
    return replace(record, **{f.name: getattr(outcome, f.name) for f in fields(outcome)})


# --- the build so far ------------------------------------------------------------------------------
@dataclass
class Build:
    settings: Settings
    options: BuildOptions
    spec: BuildSpec
    workdir: WorkDir
    progress: Progress
    record: BuildRecord
    _engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine.connect(self.settings.docker_host)
        return self._engine

    @property
    def dir(self) -> Path:
        return self.workdir.path

    def stage_inputs(self) -> StageInputs:
        from patcher.inputs import tree_inputs

        jobs = self.options.jobs or self.engine.cpu_count()
        return StageInputs(spec=self.spec, image_id=self.record.image_id, tree=self.workdir.tree,
                           inputs=tree_inputs(self.spec.inputs, self.settings),
                           source_date_epoch=self.record.source_date_epoch, jobs=jobs, work_dir=self.dir,
                           timeout=self.options.timeout, keep_tree=self.options.keep_build_tree)

    @property
    def ccache_volume(self) -> str:
        return self.options.ccache_volume or ccache_volume_name(self.spec)


# --- the stages ------------------------------------------------------------------------------------
def stage_resolve(b: Build) -> tuple[None, str]:
    spec = b.spec
    return None, f"torch {spec.wheel_version}, Python {spec.python}, gcc {spec.gcc}, base {spec.image.pinned}"


def stage_fetch(b: Build) -> tuple[FetchOutcome, str]:
    from patcher import gitrun, source
    from patcher.inputs import fetch_input, input_content, input_url

    spec, tree_dir = b.spec, b.workdir.tree
    if tree_dir.exists():  # left by a fetch that did not complete: start it again
        shutil.rmtree(tree_dir)
    b.progress.log(f"fetching {spec.tag} ({spec.commit}) from {gitrun.mirror_url(spec.repo, b.settings.git_base())}\n")
    with _env_overlay(GIT_STALL_ENV):
        tree = source.fetch(spec, b.settings, tree_dir)
    epoch = int(gitrun.run_git("log", "-1", "--format=%ct", spec.commit, cwd=tree_dir).stdout.strip())
    inputs = []
    for art in spec.inputs:
        b.progress.log(f"input {art.name} ({art.sha256}) from {input_url(art, b.settings)}\n")
        content = input_content(art, fetch_input(art, b.settings))
        inputs.append(PinnedInput(name=art.name, sha256=art.sha256, member=art.member, dest=art.dest,
                                  content_sha256=hashlib.sha256(content).hexdigest()))
    manifest = SourceManifest(repo=tree.repo, tag=tree.tag, commit=tree.commit, tree_hash=tree.tree_hash,
                              submodules=tuple(_flat_submodules(tree.submodules)))
    return (FetchOutcome(manifest, epoch, tuple(inputs)),
            f"{tree.commit[:12]}, {len(tree.submodules)} submodule(s), {len(spec.inputs)} pinned input(s)")


def _flat_submodules(subs) -> Iterator[Submodule]:
    for sub in subs:
        yield Submodule(path=sub.path, url=sub.url, commit=sub.commit)
        yield from _flat_submodules(sub.submodules)


def stage_patch(b: Build) -> tuple[PatchOutcome, str]:
    from patcher import patches

    series = patches.load_series(b.settings.patches_dir, b.spec.torch)
    b.progress.log(f"series of torch {b.spec.torch}: {', '.join(series.ids) or '(empty)'}\n")
    patched = patches.apply_series(series, b.workdir.tree)
    files = {p.id: p.file for p in series.patches}
    applied = tuple(AppliedPatch(id=p.id, file=files[p.id], sha256=p.sha256, commit=p.commit or "")
                    for p in patched.patches)
    state = PatchedState(base=patched.base, head=patched.head, tree_hash=patched.tree_hash)
    return PatchOutcome(applied, state), f"{len(applied)} patch(es), head {patched.head[:12]}"


def stage_render(b: Build) -> tuple[RenderOutcome, str]:
    import patcher.dockerfile as dockerfile

    rendered = dockerfile.render(b.spec, b.settings)
    out = b.dir / IMAGE_DIR
    if out.exists():
        shutil.rmtree(out)
    rendered.write(out)
    reqs = []
    for p in dockerfile.build_packages(b.spec, b.settings).pip:
        name, _, version = p.requirement.partition("==")
        reqs.append(PipRequirement(name=name, version=version, sha256=p.sha256))
    return (RenderOutcome(rendered.sha256, rendered.image_tag, tuple(reqs)),
            f"{rendered.image_tag} (Dockerfile sha256 {rendered.sha256[:16]})")


def stage_image(b: Build) -> tuple[ImageOutcome, str]:
    import patcher.dockerfile as dockerfile

    rendered = dockerfile.render(b.spec, b.settings)
    if rendered.sha256 != b.record.dockerfile_sha256:
        raise WorkDirError("the rendered Dockerfile changed since the render stage", hint="pass --fresh to start over")
    try:
        image_id = b.engine.image_id(rendered.image_tag)
    except ContainerError as exc:
        raise ImageBuildError(str(exc)) from None
    if image_id:
        b.progress.log(f"image {rendered.image_tag} exists ({image_id}); not building it again\n")
        return ImageOutcome(image_id, True), f"{rendered.image_tag} reused"
    base_ref = dockerfile.image_from(b.spec, b.settings)
    base_present = b.engine.image_id(base_ref) is not None
    lines: list[str] = []

    def on_log(text: str) -> None:
        b.progress.log(text)
        lines.extend(ln for ln in text.splitlines() if ln.strip())
        del lines[:-200]

    try:
        image_id = dockerfile.build_image(b.engine, rendered, on_log=on_log)
    except ImageBuildError as exc:
        from patcher.build_container import mentions_disk_full

        # The step's own error line (apt's "E: ...", a compiler's) says more than the last
        # line docker printed ("Removing intermediate container ...").
        reason = meaningful_line([ln for ln in lines if not ln.lstrip().startswith(
            ("Removing intermediate container", "---> "))])
        message = exc.message.split(" (last output:", 1)[0] + (f"; {reason}" if lines else "")
        if mentions_disk_full(exc.message) or any(mentions_disk_full(ln) for ln in lines):
            from patcher.errors import DiskFullError

            raise DiskFullError(f"the image build of {b.spec.build_id} ran out of disk space: {message}",
                                hint="free space on the engine's disk (docker system df)") from None
        if not base_present and b.engine.image_id(base_ref) is None:
            pull_failure = exc.message.split(" (last output:", 1)[0].split(": ", 1)[-1]
            raise BaseImageUnavailableError(
                f"the builder's base image {base_ref} cannot be had here: it is not in the Docker engine and "
                f"pulling it failed ({pull_failure})", hint=base_image_way_out(b.spec)) from None
        raise ImageBuildError(message, hint=f"full log: {b.workdir.log_path}") from None
    return ImageOutcome(image_id, False), f"{rendered.image_tag} built"


def base_image_way_out(spec: BuildSpec) -> str:
    """How a site provides a base image when nothing can be pulled (an air gap, this CI)."""
    image = spec.image
    make = (f"make it with `patcher base-image --suite {image.codename}` and name it in "
            if image.family == "debian" else "`docker load` a copy you trust into the engine, or name a rebuilt one in ")
    return (f"a site provides it: {make}[overrides.images] \"{image.name}\" = \"REF@sha256:DIGEST\"; or point "
            "--registry / the `registry` setting at a registry that holds it (`patcher mirror sync --registry` "
            f"fills one); `patcher mirror check --torch {spec.torch} --cuda {spec.cuda}` lists every input still "
            "missing")


def stage_configure(b: Build) -> tuple[ContainerOutcome, str]:
    done = run_stage(b.engine, "configure", b.stage_inputs(), b.ccache_volume, b.progress.log, b.workdir.log_path)
    return ContainerOutcome(done.container_env, done.toolchain, done.build_tree), ""


def _tree_use_of_build(before: BuildTreeUse | None, stage: BuildTreeUse | None) -> BuildTreeUse | None:
    """The kept tree's use over the whole build: configure synced first, the wheel stage after it."""
    if stage is None or before is None or before.volume != stage.volume:
        return stage
    return replace(before, written=before.written + stage.written, removed=before.removed + stage.removed)


def stage_wheel(b: Build) -> tuple[WheelOutcome, str]:
    what = b.stage_inputs()
    if b.options.check_reproducible:
        from patcher import reproducible

        twice = reproducible.build_twice(b.engine, replace(what, keep_tree=False), ccache_volume_name(b.spec), b.workdir.dist, b.progress.log,
                                         b.workdir.log_path)
        b.record = replace(b.record, reproducibility=twice.reproducibility, wheel=None)
        twice.raise_if_different()
        done = twice.stage
        outcome = WheelOutcome(done.container_env, done.toolchain, wheel=done.wheel, reproducibility=twice.reproducibility)
        detail = f"reproducible: two builds gave sha256 {done.wheel.sha256[:16]}"
    else:
        done = run_stage(b.engine, "wheel", what, b.ccache_volume, b.progress.log, b.workdir.log_path,
                         collect_to=b.workdir.dist)
        tree_use = _tree_use_of_build(b.record.build_tree, done.build_tree)
        outcome = WheelOutcome(done.container_env, done.toolchain, tree_use, wheel=done.wheel)
        detail = f"{done.wheel.name} sha256 {done.wheel.sha256[:16]}"
        if tree_use and tree_use.reused:
            detail += f" (kept build tree: {tree_use.written} files changed)"
    _scan_builder_image(b, b.dir / done.wheel.path)
    return outcome, detail


def _scan_builder_image(b: Build, wheel: Path) -> None:
    """What the wheel's ELF files need, resolved to the builder image's packages: the SBOM's
    library components (certify reads ``image-inventory.json``)."""
    from patcher import sbom

    inventory = sbom.gather_inventory(wheel, image=b.record.image_id, engine=b.engine)
    sbom.save_inventory(inventory, b.dir)
    b.progress.log(f"image scan: {len(inventory.scan['libraries'])} libraries of "
                   f"{wheel.name} resolved in the builder image\n")


def stage_probe(b: Build) -> tuple[ProbeOutcome, str]:
    from patcher import patches, probing
    from patcher.util import write_atomic

    wheel = b.dir / b.record.wheel.path
    in_builder = b.options.probe_image is None
    image = b.options.probe_image or b.record.image_id
    series = patches.load_series(b.settings.patches_dir, b.spec.torch)
    b.progress.log(f"probing {wheel.name} in {'the builder image ' if in_builder else ''}{image}\n")
    options = probing.ProbeOptions(patched_ids=tuple(series.ids))
    with tempfile.TemporaryDirectory(prefix=".upstream-tests-", dir=b.dir) as temp:
        upstream = _upstream_payload(b, series, Path(temp) / "payload") if b.options.upstream_tests else None
        # The builder image's Python with its own modules (Debian's, or the build venv's) is the
        # wheel's natural environment; another image brings its own.
        run = probing.probe_wheel_in_image(
            wheel, image, options, python=f"python{b.spec.python}" if in_builder else "python3",
            wheelhouse=b.options.probe_wheelhouse, gpus=b.options.gpus, engine=b.engine,
            system_site_packages=in_builder, upstream=upstream,
            labels={LABEL_BUILD: b.spec.build_id, LABEL_STAGE: "probe", LABEL_WORK_DIR: str(b.dir)})
    unproven = probing.unproven_patches(run.report, {p.id: p.probes for p in series.patches}, run.gpus_requested)
    path = wheel.with_name(wheel.name + PROBE_SUFFIX)
    data = run.report_json()
    data["unproven_patches"] = [{"id": u.id, "checks": list(u.checks), "reason": u.reason} for u in unproven]
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    for item in unproven:
        b.progress.note(item.line())
    probing.ProbeReport.from_json(data).raise_if_failed()
    counts = run.report.summary
    detail = f"{counts['pass']} pass, {counts['skip']} skip, {counts['fail'] + counts['error']} fail"
    if unproven:
        detail += f"; not proven on this build: {', '.join(u.id for u in unproven)}"
    return ProbeOutcome(str(path.relative_to(b.dir)), unproven), detail


def _upstream_payload(b: Build, series, dest: Path):
    """Upstream's tests of the fetched tree for the probe container: the series' Upstream-Tests
    and those smoke selections the tree has (a stand-in tree has no test_nn.py)."""
    from patcher import upstream_tests

    wheelhouse = Path(b.settings.cache_dir) / "upstream-tests-wheelhouse"
    upstream_tests.build_wheelhouse(wheelhouse, index_url=b.settings.pypi_base())
    chosen = upstream_tests.plan(series, smoke=True)
    absent = [s for s in chosen if s.patches == (upstream_tests.SMOKE_ID,)
              and not (b.workdir.tree / "test" / s.test.file).is_file()]
    for selection in absent:
        b.progress.note(f"upstream smoke selection {selection.test} left out: the tree has no test/{selection.test.file}")
    selections = [s for s in chosen if s not in absent]
    return upstream_tests.container_payload(b.workdir.tree, series, wheelhouse, dest, selections=selections)


def stage_certify(b: Build) -> tuple[CertifyOutcome, str]:
    from patcher import evidence, keys
    from patcher.config import DEFAULT_KEY_PATH

    if b.settings.key_path == DEFAULT_KEY_PATH and not DEFAULT_KEY_PATH.exists():
        # A first build on a machine signs with a new key rather than failing after hours; a
        # configured key that is missing stays an error (certify says so).
        made = keys.generate_key(DEFAULT_KEY_PATH)
        b.progress.note(f"no signing key yet: made {DEFAULT_KEY_PATH} (key id {made.keyid[:16]}); "
                        f"`patcher keys export` gives its public key to verifiers")
    result = evidence.certify(b.workdir.record_path, b.dir / b.record.probe_report, b.settings.key_path,
                              out_dir=b.workdir.dist, advisories_file=b.settings.advisories,
                              catalog=b.settings.catalog)
    files = EvidenceFiles(provenance=str(Path(result.provenance).relative_to(b.dir)),
                          sbom=str(Path(result.sbom).relative_to(b.dir)), keyid=result.keyid)
    return CertifyOutcome(files), f"signed with key {result.keyid[:16]}"


STAGE_FUNCTIONS = {name: globals()[f"stage_{name}"] for name in STAGES}


# --- the run ---------------------------------------------------------------------------------------
def build(settings: Settings, options: BuildOptions, stream: TextIO | None = None,
          tty: bool | None = None) -> BuildResult:
    """Run ``patcher build``: every stage from resolve to certify (or ``options.until``)."""
    if options.until is not None and options.until not in STAGES:
        raise WorkDirError(f"--until {options.until}: no such stage", hint="stages: " + ", ".join(STAGES))
    spec = resolve(settings, options.torch, cuda=options.cuda, python=options.python, arch=options.arch,
                   gcc=options.gcc)
    spec.require_pinned()
    with WorkDir(settings.work_dir, spec) as workdir:
        opened = workdir.open(options.fresh, options.resume, _settings_record(settings, options))
        progress = Progress(workdir.log_path, stream=stream, tty=tty)
        b = Build(settings, options, spec, workdir, progress, opened.record)
        done = opened.record.completed_stages
        progress.note(f"build {spec.build_id} in {workdir.path}"
                      + (f" (continuing after {done[-1]})" if opened.continued and done else ""))
        try:
            with interrupts_as_exceptions():
                try:
                    _run_stages(b)
                except (KeyboardInterrupt, Terminated):
                    progress.note(f"interrupted; log kept in {workdir.log_path}")
                    raise InterruptedByUser(f"build interrupted; containers removed, log kept in "
                                            f"{workdir.log_path}", hint="run the same command again to continue") from None
                except PatcherError as exc:
                    progress.log_only(f"error: {exc}")
                    workdir.save(b.record)  # what the failed stage learnt stays in the record
                    raise
        finally:
            progress.close()
            if b._engine is not None:
                b._engine.close()
        return _result(b)


def _run_stages(b: Build) -> None:
    if _pending_container_stage(b):
        _ = b.engine  # a bad engine fails now, before minutes of fetching
        _remove_leftover_containers(b)
        _forget_missing_image(b)
    _forget_stale_series(b)
    for stage in STAGES:
        if stage in b.record.completed_stages:
            if stage == b.options.until:  # already there: --until never runs past its stage
                b.progress.note(f"{stage} was already done; stopped there as asked (--until)")
                break
            continue
        b.progress.start(stage)
        started = time.monotonic()
        outcome, detail = STAGE_FUNCTIONS[stage](b)
        seconds = round(time.monotonic() - started, 3)
        record = apply_outcome(b.record, outcome) if outcome is not None else b.record
        b.record = record.with_stage(stage, seconds, utc_now())
        b.workdir.save(b.record)
        b.progress.done(stage, seconds, detail)
        if stage == b.options.until:
            b.progress.note(f"stopped after {stage} as asked (--until); run the same command without --until "
                            f"to go on; record: {b.workdir.record_path}")
            break


def _pending_container_stage(b: Build) -> bool:
    last = STAGES.index(b.options.until) if b.options.until else len(STAGES) - 1
    return any(s in CONTAINER_STAGES for s in STAGES[:last + 1] if s not in b.record.completed_stages)


def _drop_stages_from(b: Build, stage: str) -> None:
    keep = STAGES[:STAGES.index(stage)]
    b.record = replace(b.record, completed_stages=tuple(s for s in b.record.completed_stages if s in keep))


def _remove_leftover_containers(b: Build) -> None:
    """Containers labelled with this work directory can only be left by a patcher process that
    died without cleanup (SIGKILL): this one holds the directory's lock.  Those whose maker is
    known to be gone (``container.OWNER_LABEL``) are removed first, running or not, as every
    patcher process's first container does.  Of the rest (made by a patcher without that label),
    a stopped one is removed; a running one may still be building into the ccache volume, so a
    second build beside it is refused."""
    for name in b.engine.reap_orphans_once():
        b.progress.note(f"removed container {name}: the patcher process that made it is gone")
    for found in b.engine.containers_with_label(f"{LABEL_WORK_DIR}={b.dir}"):
        if found.status in ("running", "paused", "restarting"):
            raise WorkDirError(
                f"container {found.name} of an earlier build in {b.dir} is still {found.status} "
                f"(its patcher process is gone)",
                hint=f"wait for it (docker wait {found.name}) or remove it (docker rm -f {found.name}), "
                     f"then run the build again")
        b.progress.note(f"removing container {found.name} left {found.status} by an earlier build in {b.dir}")
        try:
            b.engine.remove_container(found.id)
        except ContainerError as exc:
            b.progress.note(str(exc))


def _forget_missing_image(b: Build) -> None:
    """A continued build whose builder image was removed meanwhile builds it again (from the
    same pinned Dockerfile) instead of failing when its next container cannot be created."""
    record = b.record
    if "image" not in record.completed_stages or not record.image_id:
        return
    try:
        if b.engine.image_id(record.image_id):
            return
    except ContainerError:
        return
    b.progress.note(f"the builder image {record.image_tag} ({record.image_id[:19]}) is gone; building it again")
    b.record = replace(record, completed_stages=tuple(s for s in record.completed_stages if s != "image"),
                       image_id=None, image_reused=None)


def _forget_stale_series(b: Build) -> None:
    """The catalog's series changed since the patch stage (a patch edited, added, removed): the
    tree is fetched and patched again, and everything after it redone."""
    if "patch" not in b.record.completed_stages:
        return
    from patcher import patches

    series = patches.load_series(b.settings.patches_dir, b.spec.torch)
    if [(p.id, p.sha256) for p in series.patches] == [(p.id, p.sha256) for p in b.record.patches]:
        return
    b.progress.note(f"the patch series of torch {b.spec.torch} changed since this build patched its tree; "
                    f"fetching and patching again")
    _drop_stages_from(b, "fetch")


def _settings_record(settings: Settings, options: BuildOptions) -> dict[str, str]:
    out = {name: str(getattr(settings, name)) for name in
           ("mirror", "git_mirror", "files_mirror", "pypi_index", "debian_mirror", "registry", "docker_host")
           if getattr(settings, name)}
    if options.check_reproducible:
        out["check_reproducible"] = "true"
    return out


def _result(b: Build) -> BuildResult:
    r = b.record
    return BuildResult(build_id=r.build_id, work_dir=b.dir, record=b.workdir.record_path, log=b.workdir.log_path,
                       completed_stages=tuple(r.completed_stages), wheel=b.dir / r.wheel.path if r.wheel else None,
                       wheel_sha256=r.wheel.sha256 if r.wheel else None, image_reused=r.image_reused,
                       stage_durations=dict(r.stage_durations), unproven_patches=r.unproven_patches)


@contextmanager
def _env_overlay(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["STAGES", "BuildOptions", "BuildResult", "build", "ccache_volume_name"]
