"""Shared test plumbing: GPU items skip cleanly where no GPU is present; the helper modules here (ci_data,
blas_cases) import from every test folder (unit/, gpu/, mpi/)."""
import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


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


@pytest.fixture(autouse=True)
def _logging_as_before():
    """A CLI run in-process configures loggers (hybridblas.console.configure_logging: own handlers, no
    propagation, levels); put every logger back afterwards so later tests' caplog sees their records."""
    import logging
    import warnings

    def loggers():
        return {n: lg for n, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    before = {n: (lg.handlers[:], lg.level, lg.propagate) for n, lg in loggers().items()}
    show = warnings.showwarning
    yield
    for name, lg in loggers().items():
        handlers, level, propagate = before.get(name, ([], logging.NOTSET, True))
        lg.handlers[:], lg.propagate = handlers, propagate
        if lg.level != level:
            lg.setLevel(level)
    if warnings.showwarning is not show:
        logging.captureWarnings(False)
        warnings.showwarning = show


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng(12345)


@pytest.fixture
def profile_dir(tmp_path, monkeypatch):
    """An empty profile directory as the only place hybridblas looks; notices reset around the test."""
    from hybridblas.profile.search import ENV_DIR, ENV_FILE
    from hybridblas.profile.store import reset_notices
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.delenv(ENV_FILE, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))    # a profile of the machine stays out
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    reset_notices()
    yield tmp_path
    reset_notices()


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


@pytest.fixture
def count_calls(monkeypatch):
    """count_calls(owner, name): replace owner.name by a wrapper that calls it and appends 1 to the returned
    list at each call (for this test)."""
    def count(owner, name):
        calls, real = [], getattr(owner, name)

        def counted(*args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)
        return calls
    return count
