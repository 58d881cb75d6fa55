"""Timing functions shared by the GPU micro-benchmarks (run as scripts: this folder is on sys.path)."""
import json
import time

import cupy as cp


def per_call(fn, reps):
    """Seconds per call of fn() on the current GPU: one warm-up call, then reps calls between syncs."""
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / reps


def save_json(path, record):
    """Write the benchmark's record to ``path`` (nothing when path is None)."""
    if path:
        with open(path, "w") as fh:
            json.dump(record, fh, indent=1)
