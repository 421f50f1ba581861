"""`patcher mirror plan|sync|check|bundle|unbundle`: stage a build's inputs for an air-gapped site."""

from __future__ import annotations

from pathlib import Path

import click

from patcher import mirror as mirror_mod
from patcher.cli import cli
from patcher.cli.common import echo_json, load_settings, table
from patcher.spec import resolve

_torch = click.option("--torch", "torch_version", required=True, help="torch version from the matrix.")
_cuda = click.option("--cuda", help="CUDA version, or 'none' for a CPU build (default: the matrix's).")
_python = click.option("--python", "python_version", help="Python version of the wheel.")
_json = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@cli.group("mirror")
def mirror_group():
    """Stage every input of a build for an air-gapped site, check it, carry it over.

    \b
    A mirror directory has the layout the `mirror` setting implies: git/ORG/REPO.git,
    files/<sha256>, wheelhouse/ (a PEP 503 index), images/<name>@sha256_<hex>.tar.
    Point every stage at it with `mirror = ...` (config), PATCHER_MIRROR or --mirror.  As a
    directory it serves fetch and the build's pinned inputs; downloads inside the image build
    (CUDA files, pip wheels) need it served over HTTP (mirror = http://...), and the base image
    comes from a registry (`sync --registry HOST`, then the `registry` setting).
    """


@mirror_group.command("plan")
@_torch
@_cuda
@_python
@click.option("--from", "source", help="Read the git trees from this mirror (DIR or URL) instead of the configured locations.")
@_json
def plan_cmd(torch_version, cuda, python_version, source, as_json):
    """List every external input of one build with its pin."""
    settings = load_settings()
    spec = resolve(settings, torch_version, cuda=cuda, python=python_version)
    result = mirror_mod.plan(spec, mirror_mod.source_settings(settings, source))
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(f"inputs of {result.build_id}:")
    click.echo(table(result.rows(), ["kind", "name", "pin", "source"]))
    for item in result.unpinned:
        click.echo(f"UNPINNED: {item}")


@mirror_group.command("sync")
@_torch
@_cuda
@_python
@click.option("--to", "dest", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The mirror directory to fill (created when missing).")
@click.option("--from", "source", help="Fetch from this mirror (DIR or URL) instead of the upstream locations.")
@click.option("--registry", help="Also push the pinned image to this registry (host[:port]), digest unchanged.")
@click.option("--shallow", is_flag=True,
              help="Git repositories hold the pinned commits only, without history (a fraction of the size).")
@_json
def sync_cmd(torch_version, cuda, python_version, dest, source, registry, shallow, as_json):
    """Fetch the closure of one build into a mirror (resumable; only what is new is transferred)."""
    settings = load_settings()
    spec = resolve(settings, torch_version, cuda=cuda, python=python_version)
    result = mirror_mod.sync(spec, settings, dest, source=source, registry=registry, shallow=shallow)
    if as_json:
        echo_json(result.to_json())
        return
    rows = [{"kind": i.kind, "name": i.name, "action": i.action, "transferred": _human(i.transferred),
             "path": i.path} for i in result.items]
    click.echo(table(rows, ["kind", "name", "action", "transferred", "path"]))
    click.echo(f"synced {result.build_id} into {result.mirror} from {result.source}: "
               f"{_human(result.transferred)} transferred")


@mirror_group.command("check")
@_torch
@_cuda
@_python
@click.option("--from", "mirror_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The mirror directory to check.")
@_json
def check_cmd(torch_version, cuda, python_version, mirror_dir, as_json):
    """Verify the mirror holds the whole closure with every checksum right (exit 0, 80 or 81)."""
    settings = load_settings()
    spec = resolve(settings, torch_version, cuda=cuda, python=python_version)
    report = mirror_mod.check(spec, settings, mirror_dir)
    if as_json:
        echo_json(report.to_json())
    else:
        rows = [{"status": i.status, "kind": i.kind, "name": i.name, "path": i.path, "detail": i.detail or None}
                for i in report.items]
        click.echo(table(rows, ["status", "kind", "name", "path", "detail"]))
        if report.complete:
            click.echo(f"mirror {report.mirror} is complete for {report.build_id}")
    report.raise_for_status()


@mirror_group.command("bundle")
@click.option("--from", "mirror_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The mirror directory to pack.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The bundle to write (a .tar).")
@_json
def bundle_cmd(mirror_dir, output, as_json):
    """Pack a mirror into one tar with a manifest of every member's sha256."""
    result = mirror_mod.bundle(mirror_dir, output)
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(f"bundled {result.files} files ({_human(result.bytes)}) of {result.mirror} into {result.archive}")
    click.echo(f"sha256 {result.sha256}")


@mirror_group.command("unbundle")
@click.argument("archive", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--to", "dest", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="A new (or empty) directory to unpack the mirror into.")
@_json
def unbundle_cmd(archive, dest, as_json):
    """Unpack a bundle, verifying every member before anything lands in place (exit 82 if damaged)."""
    result = mirror_mod.unbundle(archive, dest)
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(f"unbundled {result.files} files ({_human(result.bytes)}) into {result.mirror}, all checksums match")
