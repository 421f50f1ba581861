"""`patcher check --compile`: compile the translation units a patch series touches."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from patcher import compilecheck
from patcher.cli import cli
from patcher.cli.common import IMAGE_REF, echo_json, load_settings, table
from patcher.errors import CompileCheckSetupError


@cli.command("check")
@click.option("--compile", "compile_", is_flag=True, required=True,
              help="Compile every translation unit the series touches (the only check so far).")
@click.option("--torch", "torch_version", required=True, help="torch version whose series is checked.")
@click.option("--cuda", help="CUDA version whose arch list the .cu units are compiled for, or 'none' for "
                             "C/C++ only (default: the matrix's).")
@click.option("--arch", help="Arch list for the .cu units instead of the spec's, e.g. '7.0;8.0'.")
@click.option("--source", type=click.Path(file_okay=False, path_type=Path),
              help="A tree that holds the whole series (`patcher patches apply`); default: fetch and patch.")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path),
              help="A build work dir (its source/ and image are reused) or the check's own "
                   "(default: <work_dir>/compile-check-<build-id>).")
@click.option("--image", type=IMAGE_REF, help="Builder image to compile in (default: render the builder and build it if absent).")
@click.option("--patch", "patch_ids", multiple=True, help="Only the units this patch touches (repeatable).")
@click.option("-j", "--jobs", type=int, help="Units compiled at once (default: the engine's CPU count).")
@click.option("--timeout", type=float, default=compilecheck.DEFAULT_TIMEOUT, show_default=True,
              help="Seconds each step (configure, codegen, one unit) may take.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the report as JSON to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(compile_, torch_version, cuda, arch, source, work, image, patch_ids, jobs, timeout, report_path,
          as_json) -> None:
    """Compile each translation unit the series touches, with the real build's flags.

    \b
    In the builder image: PyTorch's configure (compile_commands.json), the code generation the
    units need (ninja's order-only prerequisites), then each unit with its exact command; .cu
    units with Debian's nvcc, flags derived from the CPU configure (see patcher/compilecheck.py).
    Exit 0 when all compile, 90 when one does not (its first error line is shown), 91 when the
    check cannot run.
    """
    if jobs is not None and jobs < 1:
        raise CompileCheckSetupError("--jobs must be at least 1")
    settings = load_settings()
    options = compilecheck.CompileCheckOptions(
        torch=torch_version, cuda=cuda, arch=arch, source=source, work=work, image=image,
        patch_ids=tuple(patch_ids), jobs=jobs, timeout=timeout)
    report = compilecheck.check_compile(settings, options, on_log=_progress)
    if report_path is not None:
        compilecheck.write_report(report, report_path, command=["patcher", *sys.argv[1:]])
    if as_json:
        echo_json(report.to_json())
    else:
        _print(report)
    compilecheck.raise_for_failures(report)


def _progress(text: str) -> None:
    click.echo(f"  {text}", nl=False, err=True)


def _print(report: compilecheck.CompileCheckReport) -> None:
    rows = [{"unit": u.path + (f" (includes {u.via})" if u.via else ""), "lang": u.language, "patches": ",".join(u.patches), "result": u.status,
             "seconds": f"{u.seconds:.1f}", "first error": u.message or None} for u in report.units]
    click.echo(table(rows, ["unit", "lang", "patches", "result", "seconds", "first error"]))
    for other in report.not_compiled:
        click.echo(f"not compiled: {other['path']} ({other['reason']}; {other['patches']})")
    for note in report.notes:
        click.echo(f"note: {note}")
    d, est = report.durations, report.estimate
    steps = " ".join(f"{k} {v:.0f} s" for k, v in d.items() if k != "total")
    click.echo(f"check: {d.get('total', 0):.0f} s ({steps})")
    if est.estimated_seconds is not None:
        ratio = est.estimated_seconds / d["total"] if d.get("total") else 0
        parts = f"C/C++ {est.estimated_seconds_cpp / 60:.0f} min"
        if est.estimated_seconds_cuda is not None:
            parts += f" + CUDA {est.estimated_seconds_cuda / 60:.0f} min"
        click.echo(f"full build, estimated: {est.estimated_seconds / 60:.0f} min ({parts}; {ratio:.1f}x the check): "
                   f"{est.method}")
    for unit in report.failed:
        click.echo(f"\n--- {unit.path}: compiler output ---\n{unit.output.rstrip()}")
