"""`patcher probe`: prove an interpreter, an image or a wheel with the probe suite."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from patcher.cli import cli
from patcher.cli.common import DOCKER_HOST, IMAGE_REF, WORD_LIST, load_settings
from patcher.util import write_atomic


@cli.command("probe")
@click.option("--python", "python", metavar="PATH",
              help="Probe this interpreter (it must have torch); with --wheel: the interpreter that makes the venv.")
@click.option("--image", metavar="IMG", type=IMAGE_REF,
              help="Probe inside a fresh container of this local image (never pulled; removed afterwards).")
@click.option("--wheel", type=click.Path(dir_okay=False), metavar="WHEEL",
              help="Install this wheel offline into a clean venv (on the host, or in --image) and probe it.")
@click.option("--wheelhouse", type=click.Path(file_okay=False), metavar="DIR",
              help="With --wheel: a folder of wheels the wheel's dependencies are installed from.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the report as JSON.")
@click.option("--junit", "junit_out", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the report as JUnit XML.")
@click.option("--patched-ids", default="", metavar="IDS", type=WORD_LIST,
              help="Comma-separated patch ids the wheel carries; checks that prove them become required.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Time budget for the checks; those past it are skipped and say so.")
@click.option("--only", default=None, metavar="PATTERNS", type=WORD_LIST,
              help="Run only these check ids, prefixes or globs (comma-separated, e.g. 'env,maxpool2d.*').")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=1800.0, show_default=True,
              metavar="SECONDS", help="Stop the whole run (install included) after this long.")
@click.option("--gpus", type=click.Choice(["auto", "all", "none"]), default="auto", show_default=True,
              help="With --image: the engine's GPUs for the container (auto: all of them when the engine has a "
                   "GPU runtime).")
@click.option("--docker-host", default=None, metavar="URL", type=DOCKER_HOST, help="Docker engine (default: settings, DOCKER_HOST).")
@click.option("--upstream-tests", is_flag=True,
              help="Also run upstream's own tests from --source against the target: the series' Upstream-Tests "
                   "plus a smoke selection (with --python, --image, or --wheel --image).")
@click.option("--source", type=click.Path(file_okay=False, exists=True), metavar="TREE",
              help="With --upstream-tests: the release's source tree (its test/ holds upstream's tests).")
@click.option("--torch", "torch_version", metavar="V",
              help="With --upstream-tests: the release whose series names the tests (default: the target's torch).")
@click.option("--upstream-smoke/--no-upstream-smoke", default=True, show_default=True,
              help="With --upstream-tests: also the fixed smoke selection (test_torch / test_autograd / test_nn "
                   "core classes), besides the series' own Upstream-Tests.")
@click.option("--baseline-python", metavar="PATH",
              help="With --upstream-tests --python: an interpreter with the unpatched release; a test failing "
                   "there too is reported as a known failure of the release.")
def probe(python, image, wheel, wheelhouse, json_out, junit_out, patched_ids, budget, only, timeout, gpus,
          docker_host, upstream_tests, source, torch_version, upstream_smoke, baseline_python) -> None:
    """Run the probe suite and print its table; exit 0 only when every required check passed.

    \b
    Targets (one of):
      --python PATH              an interpreter that has torch
      --image IMG                a local image with python3 and torch
      --wheel W [--python P]     W in a clean venv made by P (default python3), offline
      --wheel W --image IMG      W in a clean venv inside a fresh container of IMG
    """
    from patcher import probing

    if wheel is None and wheelhouse is not None:
        raise click.UsageError("--wheelhouse only goes with --wheel")
    if wheel is None and (python is None) == (image is None):
        raise click.UsageError("give exactly one target: --python PATH, --image IMG or --wheel WHEEL")
    if wheel is not None and python is not None and image is not None:
        raise click.UsageError("--wheel takes --python (a venv on this machine) or --image, not both")
    ids = tuple(sorted({p.strip() for p in patched_ids.split(",") if p.strip()}))
    options = probing.ProbeOptions(patched_ids=ids, budget=budget, only=only, timeout=timeout)
    if upstream_tests and (source is None or not (python is not None and wheel is None and image is None
                                                  or image is not None)):
        raise click.UsageError("--upstream-tests needs --source TREE and a target of --python, --image, "
                               "or --wheel with --image")
    if (source or torch_version or baseline_python or not upstream_smoke) and not upstream_tests:
        raise click.UsageError("--source, --torch, --no-upstream-smoke and --baseline-python go with --upstream-tests")
    if image is not None:
        docker_host = docker_host or load_settings().docker_host
    with tempfile.TemporaryDirectory(prefix="patcher-upstream-") as temp:
        upstream = None
        if upstream_tests and image is not None:
            upstream = _upstream_payload(Path(source), torch_version, Path(temp) / "payload", upstream_smoke)
        if wheel is not None and image is not None:
            run = probing.probe_wheel_in_image(wheel, image, options, wheelhouse=wheelhouse, gpus=gpus,
                                               docker_host=docker_host, upstream=upstream)
            data = run.report_json()
        elif wheel is not None:
            data = probing.probe_wheel(wheel, options, python=python or "python3", wheelhouse=wheelhouse).to_json()
        elif image is not None:
            data = probing.probe_image(image, options, gpus=gpus, docker_host=docker_host,
                                       upstream=upstream).report_json()
        else:
            data = probing.probe_python(python, options).to_json()
            if upstream_tests:
                data = _upstream_on_host(Path(source), torch_version, python, baseline_python,
                                         Path(temp), upstream_smoke).merge_into(data)
    report = probing.ProbeReport.from_json(data)
    report.write(None, junit_out)
    if json_out:  # the probe's own rendering, upstream's results (when they ran) included
        from patcher.probe import report as render

        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(json_out), render.to_json(data))
    click.echo(report.table(), nl=False)
    report.raise_if_failed()


def _series_and_wheelhouse(tree: Path, torch_version: str | None):
    from patcher import patches, upstream_tests

    settings = load_settings()
    version = torch_version or _tree_version(tree)
    series = patches.load_series(settings.patches_dir, version)
    wheelhouse = Path(settings.cache_dir) / "upstream-tests-wheelhouse"
    upstream_tests.build_wheelhouse(wheelhouse, index_url=settings.pypi_base())
    return series, wheelhouse


def _tree_version(tree: Path) -> str:
    text = (tree / "version.txt").read_text(encoding="utf-8").strip() if (tree / "version.txt").is_file() else ""
    version = text.split("a", 1)[0].split("+", 1)[0]
    if not version:
        raise click.UsageError(f"cannot tell the release of {tree} (no version.txt): pass --torch")
    return version


def _upstream_payload(tree: Path, torch_version: str | None, dest: Path, smoke: bool):
    from patcher import upstream_tests

    series, wheelhouse = _series_and_wheelhouse(tree, torch_version)
    return upstream_tests.container_payload(tree, series, wheelhouse, dest, smoke=smoke)


def _upstream_on_host(tree: Path, torch_version: str | None, python: str, baseline_python: str | None, work: Path,
                      smoke: bool):
    from patcher import upstream_tests

    series, wheelhouse = _series_and_wheelhouse(tree, torch_version)
    return upstream_tests.run_upstream_tests(tree, python, series, wheelhouse, smoke=smoke,
                                             baseline_python=baseline_python, work_dir=work)
