"""cutecc benchmarks: `python -m benchmarks` runs every group this machine can run.

Kept free of imports on purpose: the child processes started as `python -m benchmarks.X`
import this package first, and their timings must not pay for anything here.
"""
