"""`patcher matrix`: print the version matrix, or resolve one build spec."""

from __future__ import annotations

from pathlib import Path

import click

from patcher import spec as spec_mod
from patcher.cli import cli
from patcher.cli.common import echo_json, load_settings, table


@cli.command("matrix")
@click.option("--torch", "torch_version", help="Resolve one spec for this torch version.")
@click.option("--cuda", help="CUDA version, or 'none' for a CPU build.")
@click.option("--python", "python_version", help="Python version of the wheel.")
@click.option("--arch", help="TORCH_CUDA_ARCH_LIST, e.g. '7.0;7.5+PTX'.")
@click.option("--gcc", type=int, help="gcc major version.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--bake", "bake_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a buildx bake file (JSON) for the builder images of every pair; contexts go beside it.")
def matrix(torch_version, cuda, python_version, arch, gcc, as_json, bake_file) -> None:
    """Print the version matrix, or (with --torch) resolve and validate one build spec.

    Every refused combination exits non-zero with the rule it breaks and the way out.
    """
    settings = load_settings()
    if bake_file is not None:
        from patcher.dockerfile import write_bake_file

        bake = write_bake_file(settings, bake_file)
        click.echo(f"wrote {bake_file} ({len(bake['target'])} targets)")
        return
    if torch_version is None:
        if any(v is not None for v in (cuda, python_version, arch, gcc)):
            raise click.UsageError("--cuda/--python/--arch/--gcc need --torch")
        rows = spec_mod.matrix_rows(settings)
        if as_json:
            echo_json(rows)
        else:
            for r in rows:
                r["pythons"] = ",".join(r["pythons"])
                r["commit"] = r["commit"][:12]
            click.echo(table(rows, ["torch", "cuda", "cuda_full", "cudnn", "pythons", "gcc",
                                    "arch_list", "image", "commit"]))
        return
    spec = spec_mod.resolve(settings, torch_version, cuda=cuda, python=python_version, arch=arch, gcc=gcc)
    if as_json:
        click.echo(spec.dumps())
        return
    click.echo(f"build id      {spec.build_id}")
    click.echo(f"wheel version {spec.wheel_version}")
    click.echo(f"source        {spec.repo} {spec.tag} @ {spec.commit}")
    click.echo(f"python        {spec.python}")
    click.echo(f"compiler      gcc {spec.gcc}")
    click.echo(f"base image    {spec.image.pinned}")
    if not spec.is_cpu:
        click.echo(f"cuda          {spec.cuda_full} ({spec.cuda_runfile.name} sha256 {spec.cuda_runfile.sha256})")
        click.echo(f"cudnn         {spec.cudnn} ({spec.cudnn_archive.name} sha256 {spec.cudnn_archive.sha256})")
        click.echo(f"arch list     {spec.arch_list}")
    else:
        click.echo("cuda          none (CPU build)")
    unpinned = spec.unpinned_inputs()
    if unpinned:
        click.echo("unpinned      " + "\n              ".join(unpinned))
