"""Check modules, imported in this order (the order checks run and are reported in)."""

import importlib

MODULES = ("env", "maxpool", "determinism", "security")


def load_all():
    for name in MODULES:
        importlib.import_module("." + name, __name__)
