"""``python -m patcher.probe`` (or ``python -m probe`` from a copied folder).

Exit status: 0 every required check passed; 1 a required check failed or errored;
2 bad arguments; 3 torch cannot be imported.  The table goes to stdout, progress to stderr.
"""

import argparse
import json
import sys

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NO_TORCH = 0, 1, 2, 3


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m patcher.probe",
                                     description="Prove a torch build: run the probe checks that apply here.")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON ('-' for stdout)")
    parser.add_argument("--junit", metavar="PATH", help="write the report as JUnit XML")
    parser.add_argument("--budget", metavar="SECONDS", type=float,
                        help="stop starting checks after this many seconds (the rest are skipped)")
    parser.add_argument("--patched-ids", default="", metavar="IDS",
                        help="comma-separated patch ids the wheel carries (their checks become required)")
    parser.add_argument("--only", default="", metavar="PATTERNS",
                        help="comma-separated check ids, prefixes or globs (e.g. 'env,maxpool2d.*')")
    parser.add_argument("--list", action="store_true", help="print the registered checks as JSON and exit")
    parser.add_argument("--quiet", action="store_true", help="no table, no progress")
    parser.add_argument("--jobs", metavar="N", type=int,
                        help="run checks in up to N worker processes at once (default: the CPU count, "
                             "2 to 8); PATCHER_PROBE_ISOLATION=spawn runs them one by one, without workers")
    parser.add_argument("--child", metavar="ID", help=argparse.SUPPRESS)
    parser.add_argument("--fork-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-result", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        parser.error("--budget must be positive")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def patched_ids_from(text):
    return sorted(set(part.strip() for part in text.split(",") if part.strip()))


def run_child(args, torch):
    """One isolated check, in this (child) interpreter; the parent reads the result file."""
    from . import framework, load_checks
    from .report import write_atomic

    load_checks()
    spec = framework.get(args.child)
    ctx = framework.Context(torch, patched_ids_from(args.patched_ids)).for_check(spec)
    outcome = framework.call_check(spec, ctx, timeout=None)
    write_atomic(args.child_result, json.dumps(outcome))
    return 0


def serve_forks(args):
    """The worker server (``workers.py``): torch and the checks imported once, CUDA untouched."""
    from .workers import default_jobs, fatal, serve

    try:
        import torch
    except Exception as exc:
        fatal("torch cannot be imported by %s: %s: %s" % (sys.executable, type(exc).__name__, exc))
        return EXIT_NO_TORCH
    from . import load_checks

    try:
        load_checks()
    except Exception as exc:
        fatal("the checks cannot be loaded: %s: %s" % (type(exc).__name__, exc))
        return EXIT_FAILED
    return serve(torch, args.jobs or default_jobs())


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        from . import describe_checks

        print(json.dumps(describe_checks(), indent=2))
        return EXIT_PASSED
    if args.fork_server:
        return serve_forks(args)
    server = None
    if not args.child:
        # started before this process imports torch: the server's import runs meanwhile
        from .workers import start_server

        server = start_server(args.only or None, args.jobs)
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken native library (OSError)
        if server is not None:
            server.close()
        sys.stderr.write("probe: torch cannot be imported by %s: %s: %s\n"
                         % (sys.executable, type(exc).__name__, " ".join(str(exc).split())))
        return EXIT_NO_TORCH
    if args.child:
        return run_child(args, torch)
    if server is not None:
        server.mark("torch imported")

    from .report import run_all, to_json, to_junit, to_table, write_atomic

    def progress(entry):
        if not args.quiet:
            sys.stderr.write("probe: %-40s %s\n" % (entry["id"], entry["status"]))
            sys.stderr.flush()

    report = run_all(torch, patched_ids_from(args.patched_ids), budget=args.budget,
                     only=args.only or None, progress=progress, server=server)
    if args.json == "-":
        sys.stdout.write(to_json(report))
    elif args.json:
        write_atomic(args.json, to_json(report))
    if args.junit:
        write_atomic(args.junit, to_junit(report))
    if not args.quiet and args.json != "-":
        sys.stdout.write(to_table(report))
    return EXIT_PASSED if report["passed"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
