"""The probe suite: proves a torch build in the environment it will run in.

Runs inside old interpreters: standard library and torch only, Python 3.6 syntax. Every
import inside this package is relative, so the folder works under two names:

* ``patcher/probe`` (in a checkout, or copied with an empty ``patcher/__init__.py`` beside it):
  ``python -m patcher.probe --json report.json``
* a top-level ``probe`` folder copied on its own: ``python -m probe --json report.json``

Nothing is imported from torch until checks run, so ``all_check_ids()`` works on a host
without torch.
"""

PROBE_VERSION = "1.0"
SCHEMA = 1


EXTRA_CHECKS_ENV = "PATCHER_PROBE_EXTRA_CHECKS"


def load_checks():
    """Import every check module (registration happens at import), then the site's own
    check modules named in $PATCHER_PROBE_EXTRA_CHECKS (comma-separated importable names;
    isolated checks' child interpreters load them the same way)."""
    import importlib
    import os

    from .checks import load_all

    load_all()
    for name in os.environ.get(EXTRA_CHECKS_ENV, "").split(","):
        if name.strip():
            importlib.import_module(name.strip())


def all_check_ids():
    """Every registered check id, in run order (no torch needed)."""
    from . import framework

    load_checks()
    return [spec.id for spec in framework.registry()]


def describe_checks():
    """id, torch range, device, patches, required, isolate and timeout of every check."""
    from . import framework

    load_checks()
    return [spec.describe() for spec in framework.registry()]
