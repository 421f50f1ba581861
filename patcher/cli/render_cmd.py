"""Commands of this stage are registered here (see patcher/cli/__init__.py)."""

from patcher.cli import cli  # noqa: F401
