"""flapw.build_hs (and build_hs_with_fallback) with bad arguments: a ValueError or TypeError naming the
argument and its value, raised before any work (no radial functions, T matrices or matching factors)."""
import numpy as np
import pytest

import flapw
import hybridblas as hb
from flapw import hsdla


@pytest.fixture
def cell(monkeypatch):
    """A fresh crystal (nothing computed yet); any start of the k-dependent work fails the test."""
    def refuse(*a, **k):
        raise AssertionError("the build started")
    monkeypatch.setattr(hsdla, "k_only_factors", refuse)
    return flapw.System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1))


def _untouched(cell):
    sh = cell._shared
    return sh.radial is None and sh.tmats is None and sh.classes is None


class _NotABackend:
    def herk(self, *a):
        pass


# (keyword arguments, exception type, pattern the message must match: the name and the value)
BAD = [
    (dict(method="fast"), ValueError, r"method must be one of .* got 'fast'"),
    (dict(method=None), ValueError, r"method must be one of .* got None"),
    (dict(context="cpu"), TypeError, r"context must be a hybridblas.Context or None, got str 'cpu'"),
    (dict(context=hb.Context("cpu"), blas="cublasxt"), ValueError, r"context= .* blas='cublasxt'"),
    (dict(interstitial="yes"), TypeError, r"interstitial must be True or False, got str 'yes'"),
    (dict(interstitial=1), TypeError, r"interstitial must be True or False, got int 1"),
    (dict(lower_only="no"), TypeError, r"lower_only must be True or False, got str 'no'"),
    (dict(return_report=None), TypeError, r"return_report must be True or False, got NoneType None"),
    (dict(wait="no"), TypeError, r"wait must be True or False, got str 'no'"),
    (dict(batch_atoms=0), ValueError, r"batch_atoms must be a positive integer, got 0"),
    (dict(batch_atoms=-2), ValueError, r"batch_atoms must be a positive integer, got -2"),
    (dict(batch_atoms=2.5), ValueError, r"batch_atoms must be a positive integer, got 2.5"),
    (dict(batch_atoms=True), ValueError, r"batch_atoms must be a positive integer, got True"),
    (dict(batch_atoms="4"), ValueError, r"batch_atoms must be a positive integer, got '4'"),
    (dict(max_temp_bytes=0), ValueError, r"max_temp_bytes must be a positive number of bytes, got 0"),
    (dict(max_temp_bytes=-1e9), ValueError, r"max_temp_bytes must be a positive number of bytes, got -1"),
    (dict(max_temp_bytes=float("nan")), ValueError, r"max_temp_bytes must be a positive number of bytes, got nan"),
    (dict(max_temp_bytes=float("inf")), ValueError, r"max_temp_bytes must be a positive number of bytes, got inf"),
    (dict(max_temp_bytes="1e9"), ValueError, r"max_temp_bytes must be a positive number of bytes, got '1e9'"),
    (dict(max_temp_bytes=False), ValueError, r"max_temp_bytes must be a positive number of bytes, got False"),
    (dict(max_temp_bytes=100), ValueError, r"max_temp_bytes=100 is below one atom's buffers"),
    (dict(blas="mkl"), ValueError, r"blas must be one of .* got 'mkl'"),
    (dict(blas=3), TypeError, r"blas must be one of .* got int 3"),
    (dict(blas=_NotABackend()), TypeError, r"blas must be one of .*herk, her2k, herkx and gemm.*_NotABackend"),
    (dict(arrays="disk"), ValueError, r"arrays must be 'host' or 'device', got 'disk'"),
    (dict(arrays=None), ValueError, r"arrays must be 'host' or 'device', got None"),
    (dict(arrays="device", blas="cublasxt"), ValueError, r"arrays='device' needs blas='hybridblas'.*'cublasxt'"),
    (dict(progress=5), TypeError, r"progress must be a function .* got int 5"),
]


@pytest.mark.parametrize("build", [flapw.build_hs, flapw.build_hs_with_fallback], ids=["build_hs", "fallback"])
@pytest.mark.parametrize("kwargs, kind, pattern", BAD, ids=[repr(k) for k, _, _ in BAD])
def test_bad_argument(cell, build, kwargs, kind, pattern):
    with pytest.raises(kind, match=pattern):
        build(cell, **kwargs)
    assert _untouched(cell)


@pytest.mark.parametrize("bad", ["NaCl", None, np.eye(3)])
def test_cell_must_be_a_system(bad):
    for build in (flapw.build_hs, flapw.build_hs_with_fallback):
        with pytest.raises(TypeError, match=r"cell must be a flapw.System, got"):
            build(bad)


def test_device_arrays_without_cupy_name_the_extra(cell, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ValueError, match=r"arrays='device' needs CuPy.*pip install"):
        flapw.build_hs(cell, arrays="device")
    assert _untouched(cell)


def test_out_of_memory_types(cell):
    for bad in ("MemoryError", MemoryError, (MemoryError, "x")):
        with pytest.raises(TypeError, match="out_of_memory must be a tuple of exception types"):
            flapw.build_hs_with_fallback(cell, arrays="host", out_of_memory=bad)
    assert _untouched(cell)


def test_host_memory_refusal_names_the_estimate(cell, monkeypatch):
    monkeypatch.setattr(hb.memory, "host_available", lambda: 1 << 20)
    with pytest.raises(hb.InsufficientMemory, match=r"N_G=118.*H and S .*A/B/X of 8 atoms.*needs about.*batch_atoms="):
        flapw.build_hs(cell)
    assert _untouched(cell)


def test_empty_and_tiny_bases():
    """Kmax below the shortest |k+G|: an empty basis gives 0 x 0 matrices; a one-vector basis 1 x 1."""
    empty = flapw.System.preset("NaCl", kmax=0.2, supercell=(1, 1, 1))
    assert empty.n_g == 0
    for method in flapw.METHODS:
        h, s = flapw.build_hs(empty, method=method, interstitial=True)
        assert h.shape == s.shape == (0, 0)
    one = flapw.System.preset("NaCl", kmax=0.4, supercell=(1, 1, 1), k=(0.0, 0.0, 0.0))
    assert one.n_g == 1                                       # Γ: only G = 0
    from flapw.reference import direct_hs
    h, s = flapw.build_hs(one)
    h_ref, s_ref = direct_hs(one)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12)
    np.testing.assert_allclose(s, s_ref, rtol=1e-12)
