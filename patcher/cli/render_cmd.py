"""`patcher render`, `patcher lock`, `patcher base-image`: the builder image's inputs."""

from __future__ import annotations

from pathlib import Path

import click

import patcher.dockerfile as dockerfile_mod
from patcher import baseimage as baseimage_mod
from patcher import lock as lock_mod
from patcher import spec as spec_mod
from patcher.cli import cli
from patcher.cli.common import (
    DEBIAN_LOCATION,
    IMAGE_REF,
    REGISTRY,
    SUITE,
    WORD_LIST,
    echo_json,
    load_settings,
    table,
)


@cli.command("render")
@click.option("--torch", "torch_version", required=True, help="torch version from the matrix.")
@click.option("--cuda", help="CUDA version, or 'none' for a CPU build (default: the matrix's).")
@click.option("--python", "python_version", help="Python version of the wheel.")
@click.option("--arch", help="TORCH_CUDA_ARCH_LIST, e.g. '7.0;7.5+PTX'.")
@click.option("--gcc", type=int, help="gcc major version.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write Dockerfile and its context files into this directory (default: Dockerfile to stdout).")
@click.option("--registry", help="Registry that serves the base images (default: the image's own).")
@click.option("--files-mirror", help="Base URL serving CUDA/cuDNN files as <url>/<sha256>.")
@click.option("--pypi-index", help="Python package index for the pinned wheels.")
@click.option("--debian-mirror", help="Debian archive for apt inside the image.")
def render(torch_version, cuda, python_version, arch, gcc, out_dir, registry, files_mirror, pypi_index,
           debian_mirror) -> None:
    """Render the digest-pinned builder Dockerfile of one build spec.

    Refuses (exit 13) while any input is unpinned. The output is byte-for-byte deterministic;
    its sha256 names the image (patcher-builder:<16 hex>).
    """
    settings = load_settings(registry=registry, files_mirror=files_mirror, pypi_index=pypi_index,
                             debian_mirror=debian_mirror)
    spec = spec_mod.resolve(settings, torch_version, cuda=cuda, python=python_version, arch=arch, gcc=gcc)
    rendered = dockerfile_mod.render(spec, settings)
    if out_dir is None:
        click.echo(rendered.text, nl=False)
        return
    for path in rendered.write(out_dir):
        click.echo(f"wrote {path}")
    click.echo(f"image tag {rendered.image_tag}")


@cli.command("lock")
@click.option("--image", "images", multiple=True, type=WORD_LIST, help="Lock only this matrix image (repeatable).")
@click.option("--registry", type=REGISTRY, help="Ask this registry (host[:port]) for every image instead of its own.")
@click.option("--dry-run", is_flag=True, help="Resolve and print; do not write the matrix.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds per registry request.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def lock(images, registry, dry_run, timeout, as_json) -> None:
    """Resolve the matrix's image tags to digests and write them into the matrix file.

    Edits only the `digest = ` lines (comments and layout stay); the file given by --matrix
    (or PATCHER_MATRIX) is replaced atomically, and not at all when any lookup fails.
    """
    settings = load_settings(registry=registry)
    results = lock_mod.lock(settings, images=list(images) or None, dry_run=dry_run, timeout=timeout)
    if as_json:
        echo_json([r.to_json() for r in results])
        return
    rows = [{"image": r.image, "ref": r.ref, "digest": r.digest, "status": "changed" if r.changed else "same"}
            for r in results]
    click.echo(table(rows, ["image", "ref", "digest", "status"]))
    changed = sum(r.changed for r in results)
    if dry_run:
        click.echo(f"{changed} digest(s) would change (dry run, {settings.matrix} untouched)")
    else:
        click.echo(f"{changed} digest(s) written to {settings.matrix}")


@cli.command("base-image")
@click.option("--suite", required=True, type=SUITE, help="Debian suite, e.g. bullseye.")
@click.option("--mirror-url", type=DEBIAN_LOCATION, help="Debian archive (default: debian_mirror, then this machine's apt sources).")
@click.option("--tag", type=IMAGE_REF, help="Local image tag (default: patcher-base/debian:<suite>).")
@click.option("--push", "push_registry", type=REGISTRY, help="Push to this registry (host[:port]) and print ref@digest.")
@click.option("--include", type=WORD_LIST, help="Extra packages, comma-separated.")
@click.option("--variant", default="minbase", show_default=True, help="mmdebstrap variant.")
@click.option("--source-date-epoch", type=int, default=baseimage_mod.DEFAULT_SOURCE_DATE_EPOCH,
              show_default=True, help="Fixed timestamp for file mtimes and the image's created date.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def base_image(suite, mirror_url, tag, push_registry, include, variant, source_date_epoch, as_json) -> None:
    """Make a Debian base image with mmdebstrap (reproducible), optionally push it.

    For images that can no longer be pulled: put the printed ref@digest into the config's
    [overrides.images].
    """
    settings = load_settings()
    request = baseimage_mod.BaseImageRequest(
        suite=suite, mirror_url=mirror_url, tag=tag, push=push_registry, variant=variant,
        include=tuple(p for p in (include or "").split(",") if p), source_date_epoch=source_date_epoch)
    result = baseimage_mod.make_base_image(request, settings)
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(f"image     {result.tag} ({result.image_id})")
    click.echo(f"rootfs    sha256:{result.rootfs_sha256} from {result.mirror_url}")
    if result.pushed:
        click.echo(f"pushed    {result.pushed}")
    click.echo(result.pushed or result.image_id)
