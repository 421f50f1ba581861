"""`patcher build`: the whole pipeline into a wheel, in containers (patcher/builder.py)."""

from __future__ import annotations

import click

from patcher.builder import DEFAULT_TIMEOUT, STAGES, BuildOptions, build
from patcher.cli import cli
from patcher.cli.common import GIT_LOCATION, IMAGE_REF, VOLUME_NAME, echo_json, load_settings


@cli.command("build")
@click.option("--torch", "torch_version", required=True, help="torch version to build, e.g. 1.13.1.")
@click.option("--cuda", help="CUDA version, or 'none' for a CPU build (default: the matrix's).")
@click.option("--python", "python_version", help="Python version of the wheel.")
@click.option("--arch", help="TORCH_CUDA_ARCH_LIST, e.g. '7.0;7.5+PTX'.")
@click.option("--gcc", type=int, help="gcc major version.")
@click.option("--jobs", "-j", type=click.IntRange(min=1),
              help="Parallel compile jobs: MAX_JOBS and the container's CPU quota (default: the engine's CPUs).")
@click.option("--work", "work_dir", type=click.Path(file_okay=False),
              help="Work directory; the build lives in <work>/<build-id>/ (default: ./work, $PATCHER_WORK_DIR).")
@click.option("--docker-host", help="Docker engine URL (sets DOCKER_HOST), e.g. ssh://builder@host.")
@click.option("--git-mirror", type=GIT_LOCATION, help="Base URL of a git mirror (<base>/ORG/REPO.git).")
@click.option("--until", type=click.Choice(STAGES), help="Stop after this stage.")
@click.option("--resume", is_flag=True,
              help="Insist on continuing: fail when the work directory holds no build (running the same "
                   "command again continues anyway).")
@click.option("--fresh", is_flag=True, help="Discard what the work directory holds and start over.")
@click.option("--check-reproducible", is_flag=True,
              help="Build the wheel twice in fresh containers (fresh ccache too) and compare; "
                   "a difference writes a diffoscope report and fails.")
@click.option("--timeout", type=click.FloatRange(min=1), default=DEFAULT_TIMEOUT, show_default=True,
              help="Seconds one container stage (configure, wheel) may run.")
@click.option("--keep-build-tree", is_flag=True,
              help="Keep the build tree (CMake and ninja state) in a Docker volume named after the spec and the "
                   "builder image, and write into it only the files that changed: a rebuild after one patch "
                   "changes recompiles only the units it touches.")
@click.option("--ccache-volume", type=VOLUME_NAME, help="Docker volume for ccache (default: patcher-ccache-<torch>-<cuda>).")
@click.option("--probe-image", type=IMAGE_REF, help="Image to probe the wheel in (default: the builder image).")
@click.option("--gpus", type=click.Choice(["auto", "all", "none"]), default="auto", show_default=True,
              help="The engine's GPUs for the probe container (auto: all of them when the engine has a GPU runtime).")
@click.option("--upstream-tests", is_flag=True,
              help="In the probe stage, also run upstream's own tests from the fetched tree against the installed "
                   "wheel: every patch's Upstream-Tests plus a smoke selection (pytest from a pinned wheelhouse).")
@click.option("--probe-wheelhouse", type=click.Path(exists=True, file_okay=False),
              help="Folder of wheels the wheel's dependencies are installed from when probing (offline).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def build_command(torch_version, cuda, python_version, arch, gcc, jobs, work_dir, docker_host, git_mirror, until,
                  resume, fresh, check_reproducible, keep_build_tree, timeout, ccache_volume, probe_image, gpus, upstream_tests,
                  probe_wheelhouse, as_json) -> None:
    """Build a wheel: resolve, fetch, patch, render, image, configure, wheel, probe, certify.

    \b
    Progress goes to stderr (one rewritten line on a terminal); the full log and the build
    record stay in <work>/<build-id>/ (build.log, record.json).
    """
    if resume and fresh:
        raise click.UsageError("--resume and --fresh exclude each other")
    if keep_build_tree and check_reproducible:
        raise click.UsageError("--keep-build-tree and --check-reproducible exclude each other "
                               "(the reproducibility check builds twice from fresh trees)")
    settings = load_settings(work_dir=work_dir, docker_host=docker_host, git_mirror=git_mirror)
    options = BuildOptions(torch=torch_version, cuda=cuda, python=python_version, arch=arch, gcc=gcc, jobs=jobs,
                           until=until, resume=resume, fresh=fresh, check_reproducible=check_reproducible,
                           timeout=timeout, ccache_volume=ccache_volume, probe_image=probe_image,
                           probe_wheelhouse=probe_wheelhouse, gpus=gpus, upstream_tests=upstream_tests,
                           keep_build_tree=keep_build_tree)
    result = build(settings, options)
    if as_json:
        echo_json({"build_id": result.build_id, "work_dir": str(result.work_dir), "record": str(result.record),
                   "log": str(result.log), "completed_stages": list(result.completed_stages),
                   "wheel": str(result.wheel) if result.wheel else None, "wheel_sha256": result.wheel_sha256,
                   "image_reused": result.image_reused, "stage_durations": result.stage_durations,
                   "unproven_patches": [{"id": u.id, "checks": list(u.checks), "reason": u.reason}
                                        for u in result.unproven_patches]})
        return
    if result.wheel:
        click.echo(f"{result.wheel} sha256:{result.wheel_sha256}")
    click.echo(f"record: {result.record}  (stages done: {', '.join(result.completed_stages)})")
    for unproven in result.unproven_patches:
        click.echo(unproven.line())
