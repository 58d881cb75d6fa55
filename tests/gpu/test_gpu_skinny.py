"""Tall-skinny float32 products on one GPU (hybridblas/devices/cuda_skinny.py): k along the operands'
leading dimension, C at most 64 wide, summed in double.

Every real routine and trans, k from 0 to 1e5, C from 1 to 64 (65 must fall back), row-major, strided and
stepped device views, C poisoned, both triangles; float32 rounds once; results are bitwise reproducible;
float64 keeps the cuBLAS path (the same cases check it).
"""
import numpy as np
import pytest

import hybridblas as hb
from blas_cases import call_routine, make_case, triangle_mask
from test_gpu import check, to_device

pytestmark = pytest.mark.gpu

REAL_TRANS = {"syrk": [("T",), ("N",)], "syr2k": [("T",), ("N",)], "gemmt": [("T", "N"), ("N", "T"), ("T", "T")],
              "gemm": [("T", "N"), ("N", "N"), ("T", "T")]}


@pytest.fixture
def skinny_calls(monkeypatch):
    from hybridblas.devices import cuda_skinny
    calls = []
    real = cuda_skinny.run

    def counted(problem):
        calls.append(problem.kind)
        return real(problem)
    monkeypatch.setattr(cuda_skinny, "run", counted)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(REAL_TRANS))
def test_skinny_matches_double_reference(name, dtype, rng, skinny_calls):
    ctx = hb.Context(devices=["cuda:0"])
    for trans in REAL_TRANS[name]:
        for n, k in ((1, 1), (3, 0), (8, 7), (24, 1000), (13, 100_003), (64, 517), (65, 300)):
            for how in ("C", "C-ld", "step", "F"):
                m = n + 2 if (name == "gemm" and n < 64) else n
                lower = None if name == "gemm" else bool(rng.integers(2))
                alpha, beta = (0.7, -1.3) if rng.integers(2) else (0.7, 0.0)
                values, c0, expected, tol = make_case(rng, name, dtype, trans, lower, n, k, alpha, beta, m)
                ops = [to_device(v, how) for v in values]
                c = to_device(c0, ("F", "C", "ld")[rng.integers(3)])
                before = len(skinny_calls)
                out = call_routine(name, alpha, ops, beta, c, trans, lower, ctx)
                where = f"{name} {''.join(trans)} n={n} k={k} {how} beta={beta}"
                check(name, out, expected, c0, lower, tol, where, alpha, beta, k)
                for o, v in zip(ops, values):
                    np.testing.assert_array_equal(o.get(), v, err_msg="operand modified: " + where)
                took = len(skinny_calls) > before
                if max(m, n) > 64 or dtype == np.float64:
                    assert not took, "float64, or C wider than 64, must not take the skinny path: " + where
    assert bool(skinny_calls) == (dtype == np.float32), f"{name}: skinny calls {skinny_calls}"


def test_row_major_gram_takes_the_skinny_path(rng, skinny_calls):
    import cupy
    s = cupy.asarray(rng.standard_normal((5000, 24)).astype(np.float32))
    hb.syrk(1.0, s, trans="T", context=hb.Context(devices=["cuda:0"]))
    hb.gemmt(1.0, s[:, :16], s[:, 8:], transa="T", context=hb.Context(devices=["cuda:0"]))
    assert skinny_calls == ["syrk", "gemmt"]


def test_float32_gram_rounds_once(rng):
    """Positive-mean float32 data, k = 1.96e6 (48Cr): each entry is the double sum rounded once."""
    import cupy
    x = (rng.standard_normal((1_963_461, 24)) + 1.0).astype(np.float32)
    xd = cupy.asarray(x)
    ours = hb.syrk(1.0, xd, trans="T", context=hb.Context(devices=["cuda:0"])).get()
    ref = (xd.astype(np.float64).T @ xd.astype(np.float64)).get()
    low = triangle_mask(24, True)
    rel = np.abs(ours[low] - ref[low]) / np.abs(ref[low])
    print(f"max relative error {rel.max():.2e} (float32 half ulp {np.finfo(np.float32).eps / 2:.2e})")
    assert rel.max() <= 0.6 * np.finfo(np.float32).eps


def test_skinny_results_are_reproducible(rng):
    import cupy
    a = cupy.asarray(rng.standard_normal((300_001, 24)).astype(np.float32))
    b = cupy.asarray(rng.standard_normal((300_001, 24)).astype(np.float32))
    ctx = hb.Context(devices=["cuda:0"])
    first = hb.gemmt(1.0, a, b, transa="T", context=ctx).get()
    for _ in range(3):
        np.testing.assert_array_equal(hb.gemmt(1.0, a, b, transa="T", context=ctx).get(), first)
