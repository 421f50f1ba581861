"""`patcher report`: one self-contained HTML page (and a PDF) of a wheel's signed evidence."""

from __future__ import annotations

from pathlib import Path

import click

from patcher import report
from patcher.cli import cli
from patcher.cli.common import echo_json, load_settings


@cli.command("report")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the HTML (default: <wheel>.report.html beside the wheel).")
@click.option("--pdf", is_flag=True, help="Also print it to a PDF beside the HTML (needs Chromium).")
@click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Trusted public key PEM (default: the public half of the configured key_path).")
@click.option("--catalog", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Catalog holding patches/<version>/ (default: the configured catalog).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def report_cmd(target, out_path, pdf, key_path, catalog, as_json) -> None:
    """Write an auditor's report of a wheel's evidence: TARGET is a wheel, a build directory
    (work/<build-id>/), a folder holding one wheel's evidence, or a folder with such a sub-folder
    (a recorded run's evidence/; the wheel itself need not be there).

    The verdict on top is the worst of its parts: the signature and every digest, each patch's own
    probe checks, the advisories of the signed VEX. The page is written whatever the verdict (exit
    code 0 either way: read the verdict, or use `patcher verify`)."""
    settings = load_settings(catalog=catalog, key_path=None)
    key = key_path
    if key is None and settings.key_path and Path(settings.key_path).is_file():
        key = Path(settings.key_path)
    result = report.write_report(target, out=out_path, pdf=pdf, public_key=key,
                                 catalog=Path(settings.catalog) if settings.catalog else None)
    if result.wheel_gone:
        # A recorded run keeps no wheel: say so once, and what the page is made from instead.
        click.echo(f"patcher: note: {result.wheel_gone}: the page is made from its signed evidence there, every "
                   "check but the wheel's own sha256; --catalog names the catalog the build used", err=True)
    if as_json:
        echo_json({"html": result.html, "pdf": result.pdf, "verdict": result.verdict,
                   "checks": [c.__dict__ for c in result.checks], "wheel_gone": result.wheel_gone})
        return
    click.echo(f"wrote {result.html}" + (f" and {result.pdf}" if result.pdf else ""))
    click.echo(f"  verdict    {result.verdict}")
    for c in result.checks:
        if c.status != "ok":
            click.echo(f"  {c.name:<10} {c.status}: {c.detail}")
