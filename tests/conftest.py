"""Shared test plumbing: GPU items skip cleanly where no GPU is present."""
import functools

import pytest


@functools.lru_cache(maxsize=None)
def _gpu_count():
    try:
        import cupy
        if not cupy.is_available():
            return 0
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no cupy, no driver, no device
        return 0


def pytest_collection_modifyitems(config, items):
    n = _gpu_count()
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU present")
    skip_multi = pytest.mark.skip(reason=f"needs >= 2 CUDA GPUs, found {n}")
    for item in items:
        if "multi_gpu" in item.keywords and n < 2:
            item.add_marker(skip_multi)
        elif "gpu" in item.keywords and n < 1:
            item.add_marker(skip_gpu)


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng(12345)


@pytest.fixture
def profile_dir(tmp_path, monkeypatch):
    """An empty profile directory as the only place hybridblas looks; notices reset around the test."""
    from hybridblas import profile as pm
    monkeypatch.setenv(pm.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(pm.ENV_FILE, raising=False)
    pm.reset_notices()
    yield tmp_path
    pm.reset_notices()


@pytest.fixture(autouse=True)
def _logging_restored():
    """A CLI's main(argv) run in-process points its loggers at the stderr of that moment (pytest's capture, closed
    after the test) and stops their propagation; put them back after every test, so later tests' log capture
    (caplog) sees the records."""
    import logging
    loggers = [logging.getLogger(name) for name in ("hybridblas", "cisolver", "flapw", "py.warnings")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, (handlers, level, propagate) in zip(loggers, saved):
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
    logging.captureWarnings(False)
