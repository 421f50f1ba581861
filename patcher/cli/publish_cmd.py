"""Commands of the publish stage: `patcher publish` (static index or upload) and `patcher yank`."""

from __future__ import annotations

import os
from pathlib import Path

import click

from patcher import index
from patcher.cli import cli
from patcher.cli.common import ENV_NAME, UPLOAD_URL, echo_json
from patcher.errors import UploadError

_DIR = click.Path(file_okay=False, path_type=Path)


@cli.command("publish")
@click.argument("wheels", nargs=-1, required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--index", "index_dir", type=_DIR, default=None,
              help="Static index directory to publish into (served as is; see below).")
@click.option("--url", default=None, type=UPLOAD_URL, help="Upload to this index server instead (legacy upload API, as twine).")
@click.option("--user", default=None, help="User name for --url.")
@click.option("--password-env", default=None, type=ENV_NAME, metavar="VAR",
              help="Name of the environment variable holding the password for --url (never a flag).")
@click.option("--rebuild", is_flag=True, help="With --index: regenerate every page from files/ (repair).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def publish_cmd(wheels, index_dir, url, user, password_env, rebuild, as_json) -> None:
    """Publish certified wheels with their evidence.

    \b
    --index DIR: a static index: DIR/simple/ (PEP 503 HTML, PEP 691 JSON in index.json,
    PEP 658/714 metadata, PEP 592 yanks) and DIR/files/ (wheels + .metadata + evidence).
    Serve DIR with any static server (it must follow symlinks); pip reads
    --index-url http://HOST/simple/. Each publish switches one symlink: readers never see a
    half-written index, and a publish that dies leaves the old one intact.

    \b
    --url URL --user U --password-env VAR: upload through the legacy upload API (twine's).
    """
    if (index_dir is None) == (url is None):
        raise click.UsageError("give exactly one of --index DIR or --url URL")
    if not wheels and not rebuild:
        raise click.UsageError("give the wheels to publish")
    if index_dir is not None:
        if rebuild:
            result = index.regenerate(index_dir)
        else:
            result = index.publish(index_dir, wheels)
        if as_json:
            echo_json(result.__dict__)
            return
        for name in result.published:
            click.echo(f"published {name}")
        for name in result.unchanged:
            click.echo(f"unchanged {name} (already in the index)")
        if rebuild:
            click.echo(f"regenerated {len(result.projects)} project(s)")
        click.echo(f"index {result.index} at generation {result.generation}")
        return
    if not user or not password_env:
        raise click.UsageError("--url needs --user and --password-env")
    password = os.environ.get(password_env)
    if not password:
        raise UploadError(f"environment variable {password_env} is not set or empty",
                          hint=f"export {password_env}=... (the password is read from the environment only)")
    result = index.upload(url, wheels, user, password)
    if as_json:
        echo_json(result.__dict__)
        return
    for name in result.uploaded:
        click.echo(f"uploaded {name} to {result.url}")
    click.echo("note: the upload API carries wheels only; the evidence is published with --index")


@cli.command("yank")
@click.argument("filename")
@click.option("--index", "index_dir", type=_DIR, required=True, help="Static index directory.")
@click.option("--reason", default="", help="Why (shown by pip when it installs a pinned yanked file).")
@click.option("--undo", is_flag=True, help="Un-yank the file.")
def yank_cmd(filename, index_dir, reason, undo) -> None:
    """Mark a published file yanked (PEP 592): pip skips it unless pinned exactly."""
    result = index.yank(index_dir, Path(filename).name, reason=reason, undo=undo)
    state = f"yanked ({result.reason})" if result.yanked and result.reason else "yanked" if result.yanked else "un-yanked"
    click.echo(f"{result.filename} {state}; index at generation {result.generation}")
