"""Commands of the certify stage: `patcher certify`, `patcher verify`, `patcher keys ...`."""

from __future__ import annotations

from pathlib import Path

import click

from patcher import evidence, keys
from patcher.cli import cli
from patcher.cli.common import echo_json, load_settings

_PATH = click.Path(dir_okay=False, path_type=Path)


@cli.command("certify")
@click.option("--record", "record_path", type=_PATH, required=True,
              help="The build's record.json (work/<build-id>/record.json).")
@click.option("--probe-report", type=_PATH, required=True, help="The probe's JSON report for this wheel.")
@click.option("--key", "key_path", type=_PATH, default=None,
              help="Private signing key (default: settings key_path / $PATCHER_KEY_PATH).")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the wheel and its evidence (default: beside the wheel).")
@click.option("--allow-failed-probe", is_flag=True,
              help="Sign the evidence even though the probe failed (verify will still refuse the wheel).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def certify_cmd(record_path, probe_report, key_path, out_dir, allow_failed_probe, as_json) -> None:
    """Write signed SLSA provenance (DSSE, in-toto) and a CycloneDX SBOM for a built wheel."""
    settings = load_settings(key_path=key_path)
    result = evidence.certify(record_path, probe_report, settings.key_path, out_dir=out_dir,
                              allow_failed_probe=allow_failed_probe, advisories_file=settings.advisories,
                              catalog=settings.catalog)
    if as_json:
        echo_json(result.__dict__)
        return
    click.echo(f"certified {result.wheel.name} (key {result.keyid[:16]}, probe "
               f"{'passed' if result.probe_passed else 'FAILED'})")
    for path in (result.provenance, result.sbom, result.vex, result.probe_report):
        click.echo(f"  wrote {path}")


@cli.command("verify")
@click.argument("wheel", type=_PATH)
@click.option("--key", "key_path", type=_PATH, default=None,
              help="Trusted public key PEM (default: the public half of the configured key_path).")
@click.option("--catalog", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Catalog holding patches/<version>/series (default: the configured catalog).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def verify_cmd(wheel, key_path, catalog, as_json) -> None:
    """Check a wheel against its evidence: digest, signature, patch series, probe report."""
    settings = load_settings(catalog=catalog)
    result = evidence.verify(wheel, key_path or settings.key_path, settings.catalog)
    if as_json:
        echo_json(result.__dict__)
        return
    click.echo(f"verified {result.wheel}")
    click.echo(f"  sha256     {result.sha256}")
    click.echo(f"  signed by  {result.keyid[:16]}")
    click.echo(f"  build      {result.build_id}")
    click.echo(f"  patches    {', '.join(result.patches) or '(none)'} (match the catalog for torch {result.torch})")
    click.echo(f"  probe      {result.probe_report} passed")
    click.echo(f"  sbom       {result.sbom}")
    click.echo(f"  vex        {result.vex} ({', '.join(f'{n} {s}' for s, n in result.vex_states.items())})")
    for ov in result.trust_overrides:
        click.echo(f"  override   {ov.get('kind')} {ov.get('name')} = {ov.get('value')}")


@cli.group("keys")
def keys_group() -> None:
    """Manage the Ed25519 key that signs evidence."""


@keys_group.command("generate")
@click.option("--out", "out_path", type=_PATH, default=None,
              help="Where to write the private key (default: settings key_path / $PATCHER_KEY_PATH).")
@click.option("--force", is_flag=True, help="Replace an existing key.")
def keys_generate(out_path, force) -> None:
    """Create a signing key (mode 0600). Prints its path and keyid, never the key."""
    settings = load_settings(key_path=out_path)
    info = keys.generate_key(settings.key_path, overwrite=force)
    click.echo(f"wrote private key {info.path} (mode 0600), keyid {info.keyid}")
    click.echo("share the public key with `patcher keys export`")


@keys_group.command("export")
@click.option("--key", "key_path", type=_PATH, default=None,
              help="Key file (default: settings key_path / $PATCHER_KEY_PATH).")
@click.option("-o", "--out", "out_path", type=_PATH, default=None, help="Write the PEM here instead of stdout.")
def keys_export(key_path, out_path) -> None:
    """Print the public key (PEM) that verifiers need."""
    settings = load_settings(key_path=key_path)
    info = keys.export_public(settings.key_path, out=out_path)
    if out_path is None:
        click.echo(info.public_pem, nl=False)
        return
    click.echo(f"wrote public key {out_path}, keyid {info.keyid}")
