"""The public helpers keep their contracts at the edges: host_gemm never writes into a read-only array; a
worker's interrupt reaches the caller of workers.map; a Group of no threads or a closed one refuses work; a
profile with a rate beyond a float is ignored with a warning; exact_entries and memory.require name bad
arguments."""
import warnings

import numpy as np
import pytest
import yaml

import hybridblas as hb
from hybridblas import lowlevel, memory, reference, workers
from hybridblas.profile.node import profile_filename
from test_profile import make_profile


def test_host_blas_refuses_read_only_outputs():
    a, b = np.ones((4, 3)), np.ones((3, 5))
    out = np.frombuffer(bytes(160)).reshape(4, 5)            # read-only memory of an immutable bytes object
    with pytest.raises(ValueError, match="out must be writeable, got a read-only array"):
        lowlevel.host_gemm(out, a, b)
    v = np.ones((4, 3))
    v.flags.writeable = False
    with pytest.raises(ValueError, match="v must be writeable"):
        lowlevel.host_trmm_right(v, np.eye(3))
    assert not np.frombuffer(bytes(160)).any() and (v == 1).all()


class Abort(BaseException):
    pass


def test_an_interrupt_on_a_worker_reaches_the_caller():
    def fn(x):
        if x == 3:
            raise Abort()
        return x
    for _ in range(5):                                       # whichever thread runs item 3
        with pytest.raises(Abort):
            workers.map(fn, range(8), 4)

    def progress(done, total):
        raise RuntimeError("progress failed")
    with pytest.raises(RuntimeError, match="progress failed"):
        workers.map(lambda x: x, range(8), 4, progress=progress)


def test_groups_of_no_threads_or_closed_refuse_work():
    for threads in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads must be a positive integer"):
            workers.Group(threads)
    g = workers.Group(2)
    assert g.map(lambda x: 2 * x, [1, 2]) == [2, 4]
    g.close()
    g.close()
    with pytest.raises(ValueError, match="this Group is closed"):
        g.map(lambda x: x, [1])


def test_a_rate_beyond_a_float_is_a_bad_profile_not_a_crash(profile_dir):
    data = make_profile({"cpu": 1e11})
    data["devices"]["cpu"]["rates"]["herk"]["complex128"][64] = 10 ** 400
    path = profile_dir / profile_filename()
    path.write_text(yaml.safe_dump(data))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert hb.load_profile(path) is None
    assert any("herk" in str(w.message) for w in seen)


def test_exact_entries_and_require_name_bad_arguments():
    a, b = np.ones((2, 3)), np.ones((3, 2))
    for rows, cols, match in (([0, 1], [0], "rows and cols must have one length"),
                              ([2], [0], r"rows must be a sequence of integers in 0..1"),
                              (0, [0], "rows must be a sequence of integers"),
                              ([0], [0.5], "cols must be a sequence of integers")):
        with pytest.raises(ValueError, match=match):
            reference.exact_entries(a, b, rows, cols)
    assert reference.exact_entries(a, b, [1], [0]).tolist() == [3.0]
    for kw, match in ((dict(nbytes=float("nan")), "nbytes must be a number of bytes >= 0"),
                      (dict(nbytes=-1), "nbytes must be"),
                      (dict(nbytes=1, fraction="0.5"), r"fraction must be a number in \(0, 1\]"),
                      (dict(nbytes=1, fraction=-1), "fraction must be"),
                      (dict(nbytes=1, where="HOST"), "where must be 'host' or a GPU id")):
        with pytest.raises(ValueError, match=match):
            memory.require(kw.pop("nbytes"), **kw)
    assert memory.require(1) > 0


def test_device_words_digits_and_numpy_thread_counts():
    with pytest.raises(ValueError, match="unknown device '²'"):
        hb.parse_devices("²")
    from hybridblas import blas_threads
    with blas_threads.limit(np.int64(1)):
        assert blas_threads.current() == 1
