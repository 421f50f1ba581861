"""Benchmarks: each bench_<area>.py has run() -> dict; `python -m benchmarks` prints them all."""
