"""`patcher fetch` and `patcher patches ...`: parse flags, call the stage, print."""

from __future__ import annotations

from pathlib import Path

import click

from patcher import patches as patches_mod
from patcher import source as source_mod
from patcher.cli import cli
from patcher.cli.common import GIT_LOCATION, REVISION_RANGE, echo_json, load_settings, table
from patcher.spec import resolve

_dry_run = click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
_json = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
_torch = click.option("--torch", "torch", required=True, help="Torch version, e.g. 1.13.1.")
_source = click.option("--source", "source", required=True, type=click.Path(file_okay=False),
                       help="The git working tree (from `patcher fetch`).")


# --- fetch -----------------------------------------------------------------------------------
@cli.command("fetch")
@_torch
@click.option("--git-mirror", default=None, type=GIT_LOCATION, help="Base URL of the git mirror (ORG/REPO.git below it).")
@click.option("--cache", "cache_dir", default=None, type=click.Path(file_okay=False),
              help="Cache directory (bare git caches live in <cache>/git).")
@click.option("-o", "--output", default=None, type=click.Path(file_okay=False),
              help="Where the tree goes (default: <work_dir>/pytorch-<version>); must not exist.")
@_dry_run
@_json
def fetch_cmd(torch, git_mirror, cache_dir, output, dry_run, as_json):
    """Clone the tag at its verified commit, with submodules, and write source-manifest.json."""
    settings = load_settings(git_mirror=git_mirror, cache_dir=cache_dir)
    spec = resolve(settings, torch)
    dest = Path(output) if output else Path(settings.work_dir) / f"pytorch-{torch}"
    result = source_mod.fetch(spec, settings, dest, dry_run=dry_run)
    if as_json:
        echo_json(result.to_json())
        return
    verb = "would fetch" if dry_run else "fetched"
    override = " (commit pinned by a site override)" if result.commit_overridden else ""
    click.echo(f"{verb} {result.tag} at {result.commit}{override} from {result.fetched_from}")
    if not dry_run:
        for sub in _flatten(result.submodules):
            click.echo(f"  submodule {sub.path} {sub.commit} from {sub.fetched_from}")
        click.echo(f"tree {result.path}  {result.tree_hash}")


def _flatten(subs):
    for sub in subs:
        yield sub
        yield from _flatten(sub.submodules)


# --- patches ---------------------------------------------------------------------------------
@cli.group("patches")
def patches_group():
    """The patch series: list, show, check, apply, new, refresh."""


@patches_group.command("list")
@click.option("--torch", "torch", default=None, help="Only this version's series.")
@_json
def list_cmd(torch, as_json):
    """List the patches of one or every version's series, in order."""
    settings = load_settings()
    series = patches_mod.list_series(settings.patches_dir, torch)
    if as_json:
        echo_json([s.to_json() for s in series])
        return
    rows = [{"torch": s.version, "id": p.id, "category": p.category, "probes": ",".join(p.probes),
             "upstream tests": str(len(p.upstream_tests)), "file": p.file, "subject": p.subject}
            for s in series for p in s.patches]
    click.echo(table(rows, ["torch", "id", "category", "probes", "upstream tests", "file", "subject"]))


@patches_group.command("show")
@click.argument("patch_id")
@click.option("--torch", "torch", default=None, help="Only this version's series.")
@_json
def show_cmd(patch_id, torch, as_json):
    """Show one patch: its trailers, files and text."""
    settings = load_settings()
    found = patches_mod.find_patch(settings.patches_dir, patch_id, torch)
    if as_json:
        echo_json([{"torch": v, **p.to_json()} for v, p in found])
        return
    for version, patch in found:
        click.echo(f"{patch.id}  torch {version}  {patch.file}")
        click.echo(f"subject: {patch.subject}")
        click.echo(f"author:  {patch.author}")
        click.echo(f"date:    {patch.date}")
        click.echo(f"sha256:  {patch.sha256}")
        for key, value in patch.trailers.items():
            click.echo(f"{key}: {value}")
        click.echo("upstream tests (relative to the tree's test/):")
        for selection in patch.upstream_tests:
            click.echo(f"  {selection}")
        click.echo("files:   " + ", ".join(patch.files))
        click.echo("")
        click.echo(patch.text, nl=False)


@patches_group.command("check")
@_torch
@_source
@_dry_run
@_json
def check_cmd(torch, source, dry_run, as_json):
    """Check that every patch applies in order, exactly (no fuzz, no offsets)."""
    settings = load_settings()
    series = patches_mod.load_series(settings.patches_dir, torch)
    result = patches_mod.check_series(series, Path(source))
    _print_check(result, as_json)


def _print_check(result, as_json):
    if as_json:
        echo_json(result.to_json())
    elif result.already_applied:
        click.echo(f"already applied: all {result.count} patches of torch {result.version} are in the tree")
    else:
        click.echo(f"ok: all {result.count} patches of torch {result.version} apply exactly")


@patches_group.command("apply")
@_torch
@_source
@_dry_run
@_json
def apply_cmd(torch, source, dry_run, as_json):
    """Apply the series as one commit per patch (reproducible: fixed identities and dates)."""
    settings = load_settings()
    series = patches_mod.load_series(settings.patches_dir, torch)
    if dry_run:
        _print_check(patches_mod.check_series(series, Path(source)), as_json)
        return
    result = patches_mod.apply_series(series, Path(source))
    if as_json:
        echo_json(result.to_json())
        return
    if result.already_applied:
        click.echo(f"already applied: the series of torch {torch} is in the tree (HEAD {result.head})")
    else:
        for item in result.patches:
            click.echo(f"applied {item.id} as {item.commit}")
        click.echo(f"patched {result.base} -> {result.head}")
    click.echo(f"tree {result.tree_hash}")


@patches_group.command("new")
@_torch
@click.option("--from-commits", "revrange", required=True, type=REVISION_RANGE, help="Commit range A..B to export.")
@_source
@_dry_run
def new_cmd(torch, revrange, source, dry_run):
    """Export commits (with trailers) as catalog patches and append them to the series."""
    settings = load_settings()
    written = patches_mod.new_patches(settings.patches_dir, torch, Path(source), revrange, dry_run=dry_run)
    verb = "would add" if dry_run else "added"
    for patch in written:
        click.echo(f"{verb} {patch.id} {patch.file}")


@patches_group.command("refresh")
@_torch
@_source
@_dry_run
def refresh_cmd(torch, source, dry_run):
    """Re-export the series from the applied commits (after editing them)."""
    settings = load_settings()
    changes = patches_mod.refresh_series(settings.patches_dir, torch, Path(source), dry_run=dry_run)
    for change in changes:
        if change.changed:
            verb = "would update" if dry_run else "updated"
            click.echo(f"{verb} {change.id} {change.file}")
        else:
            click.echo(f"unchanged {change.id} {change.file}")
