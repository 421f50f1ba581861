"""`patcher probe`: prove an interpreter, an image or a wheel with the probe suite."""

from __future__ import annotations

import click

from patcher.cli import cli
from patcher.cli.common import load_settings


@cli.command("probe")
@click.option("--python", "python", metavar="PATH",
              help="Probe this interpreter (it must have torch); with --wheel: the interpreter that makes the venv.")
@click.option("--image", metavar="IMG",
              help="Probe inside a fresh container of this local image (never pulled; removed afterwards).")
@click.option("--wheel", type=click.Path(dir_okay=False), metavar="WHEEL",
              help="Install this wheel offline into a clean venv (on the host, or in --image) and probe it.")
@click.option("--wheelhouse", type=click.Path(file_okay=False), metavar="DIR",
              help="With --wheel: a folder of wheels the wheel's dependencies are installed from.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the report as JSON.")
@click.option("--junit", "junit_out", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the report as JUnit XML.")
@click.option("--patched-ids", default="", metavar="IDS",
              help="Comma-separated patch ids the wheel carries; checks that prove them become required.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Time budget for the checks; those past it are skipped and say so.")
@click.option("--only", default=None, metavar="PATTERNS",
              help="Run only these check ids, prefixes or globs (comma-separated, e.g. 'env,maxpool2d.*').")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=1800.0, show_default=True,
              metavar="SECONDS", help="Stop the whole run (install included) after this long.")
@click.option("--gpus", type=click.Choice(["auto", "all", "none"]), default="auto", show_default=True,
              help="With --image: the engine's GPUs for the container (auto: all of them when the engine has a "
                   "GPU runtime).")
@click.option("--docker-host", default=None, metavar="URL", help="Docker engine (default: settings, DOCKER_HOST).")
def probe(python, image, wheel, wheelhouse, json_out, junit_out, patched_ids, budget, only, timeout, gpus,
          docker_host) -> None:
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
    if image is not None:
        docker_host = docker_host or load_settings().docker_host
    if wheel is not None and image is not None:
        report = probing.probe_wheel_in_image(wheel, image, options, wheelhouse=wheelhouse, gpus=gpus,
                                              docker_host=docker_host).report
    elif wheel is not None:
        report = probing.probe_wheel(wheel, options, python=python or "python3", wheelhouse=wheelhouse)
    elif image is not None:
        report = probing.probe_image(image, options, gpus=gpus, docker_host=docker_host).report
    else:
        report = probing.probe_python(python, options)
    report.write(json_out, junit_out)
    click.echo(report.table(), nl=False)
    report.raise_if_failed()
