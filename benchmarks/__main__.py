"""Run every benchmarks/bench_*.py module's run() and print the results as JSON.

`python -m benchmarks [NAME ...]` runs only the named modules (e.g. `probe` for bench_probe).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    wanted = {f"bench_{a}" if not a.startswith("bench_") else a for a in argv}
    results, failed = {}, False
    for name in names:
        if wanted and name not in wanted:
            continue
        try:
            results[name] = importlib.import_module(f"benchmarks.{name}").run()
        except Exception as exc:  # one broken benchmark must not hide the others
            failed = True
            results[name] = {"error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc().splitlines()[-5:]}
        print(json.dumps({name: results[name]}, indent=2, sort_keys=True), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
