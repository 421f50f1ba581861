"""The `patcher` command line: argument parsing and rendering only.

Each command module parses its flags, calls one stage function and prints the result.
Errors: a PatcherError prints one line and exits with its class's code; no traceback.
"""

from __future__ import annotations

import sys

import click

from patcher import __version__
from patcher.errors import InterruptedByUser, PatcherError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="patcher")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Config file (default: $PATCHER_CONFIG, then ~/.config/patcher/config.toml).")
@click.option("--catalog", type=click.Path(file_okay=False), default=None,
              help="Catalog root holding patches/ and dockerfiles/ (default: $PATCHER_CATALOG or the checkout).")
@click.option("--matrix", "matrix_file", type=click.Path(dir_okay=False), default=None,
              help="Version matrix TOML (default: $PATCHER_MATRIX or the packaged one).")
@click.option("--mirror", default=None,
              help="One base URL/path that redirects every external input (git, files, wheelhouse, images).")
@click.pass_context
def cli(ctx: click.Context, config_file, catalog, matrix_file, mirror) -> None:
    """patcher: rebuild legacy PyTorch releases from source with reviewed patches.

    \b
    Pipeline (each stage is also a command of its own):
      matrix   resolve and validate a build spec         render   digest-pinned Dockerfile
      fetch    tag at a verified commit + submodules     build    wheel in a container
      patches  list/check/apply the patch series         probe    prove the wheel
      certify  signed provenance + SBOM                  verify   check a wheel's evidence
      publish  static index / upload to an index         mirror   stage inputs for air gaps
    """
    ctx.ensure_object(dict)
    ctx.obj["flags"] = {"config_file": config_file, "catalog": catalog, "matrix": matrix_file, "mirror": mirror}


def _register() -> None:
    # Imported here so each module can `from patcher.cli import cli` without a cycle.
    from patcher.cli import (  # noqa: F401
        advisories_cmd,
        build_cmd,
        check_cmd,
        evidence_cmd,
        matrix_cmd,
        mirror_cmd,
        probe_cmd,
        publish_cmd,
        render_cmd,
        report_cmd,
        source_cmd,
    )


def main(argv: list[str] | None = None) -> None:
    try:
        _register()
        cli.main(args=argv, prog_name="patcher", standalone_mode=False)
    except PatcherError as exc:
        click.echo(f"patcher: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("patcher: error: interrupted", err=True)
        sys.exit(InterruptedByUser.exit_code)
    except KeyboardInterrupt:
        click.echo("patcher: error: interrupted", err=True)
        sys.exit(InterruptedByUser.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(0)
