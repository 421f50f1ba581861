"""`patcher advisories`: every published torch advisory and its state for one build spec."""

from __future__ import annotations

from pathlib import Path

import click

from patcher import advisories, spec
from patcher.cli import cli
from patcher.cli.common import echo_json, load_settings, table
from patcher.errors import AdvisoryClaimError


@cli.command("advisories")
@click.option("--torch", "torch_version", required=True, help="Torch release, e.g. 1.13.1.")
@click.option("--cuda", default=None, help="CUDA version or 'none' (default: the matrix's default for the release).")
@click.option("--python", "python_version", default=None, help="Python version (default: the release's default).")
@click.option("--advisories", "site_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A site's own advisories/assessments laid over patcher's (default: setting `advisories`).")
@click.option("--check-tree", type=click.Path(path_type=Path), default=None,
              help="Check the assessments' source claims (code absent, build guards) against this source tree, "
                   "or against the files of this wheel (a .whl: the claims established on that wheel).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def advisories_cmd(torch_version, cuda, python_version, site_file, check_tree, as_json) -> None:
    """The state of every published torch advisory for a build, before any build is made.

    States follow CycloneDX VEX: resolved (a patch of the series fixes it and its probe check
    proves it on the built wheel), not_affected (with the justification), exploitable,
    in_triage (not established), false_positive (withdrawn by its publisher).
    """
    settings = load_settings(advisories=site_file)
    resolved = spec.resolve(settings, torch_version, cuda=cuda, python=python_version)
    data = advisories.load(site=settings.advisories)
    patch_ids = advisories.series_patch_ids(settings.patches_dir, resolved.torch)
    findings = advisories.assess(data, resolved.torch, advisories.build_flags(resolved), patch_ids)
    claims = advisories.check_tree(data, resolved.torch, check_tree) if check_tree is not None else None
    if as_json:
        out = {"torch": resolved.torch, "cuda": resolved.cuda, "patches": patch_ids,
               "counts": advisories.counts(findings), "advisories": [f.row() for f in findings],
               "sources": [{"path": p, "sha256": d} for p, d in data.sources]}
        if claims is not None:
            out["claims"] = [c.__dict__ for c in claims]
        echo_json(out)
    else:
        rows = [{"advisory": f.advisory.id, "cvss": f"{f.advisory.score:.1f}" if f.advisory.score is not None else None,
                 "state": f.state + (f" ({f.justification})" if f.justification else ""),
                 "fix": f.patch, "detail": f.detail} for f in findings]
        click.echo(f"torch {resolved.torch} ({'cpu' if resolved.is_cpu else 'cuda ' + resolved.cuda}), "
                   f"series: {', '.join(patch_ids) or '(none)'}")
        click.echo(table(rows, ["advisory", "cvss", "state", "fix", "detail"]))
        click.echo("counts: " + ", ".join(f"{n} {s}" for s, n in advisories.counts(findings).items()))
        for c in claims or []:
            click.echo(f"claim {'ok  ' if c.ok else 'FAIL'} {c.advisory}: {c.claim} ({c.why})")
    if claims is not None:
        failed = [c for c in claims if not c.ok]
        if failed:
            raise AdvisoryClaimError(f"{len(failed)} of {len(claims)} source claims for torch {resolved.torch} do not "
                                     f"hold in {check_tree}, first: {failed[0].advisory} {failed[0].claim} "
                                     f"({failed[0].why})", hint="fix the assessment in the advisories data")
