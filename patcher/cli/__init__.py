"""The `patcher` command line: argument parsing and rendering only.

Each command module parses its flags, calls one stage function and prints the result.
Errors: a PatcherError prints one line and exits with its class's code; no traceback.
"""

from __future__ import annotations

import re
import sys

import click

from patcher import __version__
from patcher.cli.common import MIRROR_LOCATION
from patcher.errors import (
    BadOptionValueError,
    CommandUsageError,
    InterruptedByUser,
    MissingOptionError,
    PatcherError,
    UnknownOptionError,
)
from patcher.setting_rules import SHOWN_LIMIT


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="patcher")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Config file (default: $PATCHER_CONFIG, then ~/.config/patcher/config.toml).")
@click.option("--catalog", type=click.Path(file_okay=False), default=None,
              help="Catalog root holding patches/ and dockerfiles/ (default: $PATCHER_CATALOG or the checkout).")
@click.option("--matrix", "matrix_file", type=click.Path(dir_okay=False), default=None,
              help="Version matrix TOML (default: $PATCHER_MATRIX or the packaged one).")
@click.option("--mirror", default=None, type=MIRROR_LOCATION,
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
        _fail(str(exc), exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _fail("interrupted", InterruptedByUser.exit_code)
    except click.UsageError as exc:
        error = usage_error(exc)
        _fail(str(error), error.exit_code)
    except click.ClickException as exc:
        _fail(exc.format_message(), CommandUsageError.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(0)


def usage_error(exc: click.UsageError) -> CommandUsageError:
    """click's usage errors (3-4 lines of Usage/Try/Error) as one of patcher's, with its own code."""
    kind: type[CommandUsageError] = CommandUsageError
    if isinstance(exc, click.NoSuchOption):
        kind = UnknownOptionError
    elif isinstance(exc, click.MissingParameter):
        kind = MissingOptionError
    elif isinstance(exc, (click.BadParameter, click.BadOptionUsage, click.BadArgumentUsage)):
        kind = BadOptionValueError
    command = exc.ctx.command_path if exc.ctx else "patcher"
    return kind(exc.format_message(), hint=f"see '{command} --help'")


def _fail(message: str, code: int) -> None:
    click.echo(f"patcher: error: {one_line(message)}", err=True)
    sys.exit(code)


_LONG_WORD = re.compile(r"\S{" + str(SHOWN_LIMIT + 1) + ",}")


def one_line(message: str) -> str:
    """Whatever a message echoes (a 20,000-character flag, a value with a newline), it stays one
    readable line: control characters escaped, any run of over SHOWN_LIMIT characters cut."""
    flat = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in message)
    return _LONG_WORD.sub(lambda m: f"{m.group()[:SHOWN_LIMIT]}… ({len(m.group()):,} characters)", flat)
