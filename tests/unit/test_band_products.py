"""devices.cuda_bands.queue_product on the host backend: a block's rectangle in calls of about ``columns``
columns each gives the same product as one call (float64 references on random data, C poisoned, odd sizes, a
block inside a larger C), and the number of calls follows the width. CPU only."""
from types import SimpleNamespace

import numpy as np
import pytest

from hybridblas import plan
from hybridblas.devices import cuda_bands
from hybridblas.devices.cpu import _HostBackend
from hybridblas.problem import C, N, build_problem


class _Counting(_HostBackend):
    calls = 0

    @classmethod
    def gemm(cls, *args):
        cls.calls += 1
        return _HostBackend.gemm(*args)


@pytest.mark.parametrize("columns,calls", [(0, 1), (40, 5), (64, 5), (100, 3), (160, 2), (200, 1)])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_a_rectangle_in_column_calls_is_the_one_product(columns, calls, beta, rng):
    n, k = 379, 53
    a = np.asfortranarray(rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n)))
    b = np.asfortranarray(rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n)))
    c = np.asfortranarray(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    prob = build_problem("gemmt", 1.5 - 0.5j, [a, b], beta, c, [C, N], True, None)
    task = plan.make_task(prob, 301, 377, 9, 330, 0, k)            # 76 x 321: odd edges, inside C
    out = c[301:377, 9:330]
    old = out.copy()
    if beta == 0:
        out[...] = np.nan                                          # poisoned: beta = 0 never reads it
    _Counting.calls = 0
    cuda_bands.queue_product(_Counting, prob, prob.factors, None, task, out, beta, columns=columns)
    want = (1.5 - 0.5j) * (a[:, 301:377].conj().T @ b[:, 9:330]) + (beta * old if beta else 0)
    np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-12)
    assert _Counting.calls == calls


@pytest.mark.parametrize("corner,order,cut", [(True, "outer", True), (True, "k", False), (False, "outer", False),
                                               (False, "k", False)])
def test_only_the_corner_order_cuts_its_rectangles(corner, order, cut):
    """RECT_COLUMNS serves gemmt's corner order (two factors, outer order); other layouts make one call each."""
    layout = SimpleNamespace(corner=corner, order=order)
    assert cuda_bands.rect_columns(layout) == (cuda_bands.RECT_COLUMNS if cut else 0)
    assert cuda_bands.RECT_COLUMNS > 0
