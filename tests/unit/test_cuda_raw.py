"""devices.cuda_raw without a GPU: a factor's element addresses (op(base)[r, c] for every op, on column-major
bases and column-major views inside larger arrays) are the ones numpy gives, and Calls.make refuses a base that
is not column-major, or sizes past 32 bits, before it reaches the library."""
from types import SimpleNamespace

import numpy as np
import pytest

from hybridblas.devices import cuda_raw
from hybridblas.problem import C, N, T, Operand


class _Base:
    """A numpy array seen as cuda_raw sees a CuPy one (data.ptr)."""

    def __init__(self, x):
        self.x = x
        self.shape, self.strides, self.dtype, self.ndim = x.shape, x.strides, x.dtype, x.ndim
        self.data = SimpleNamespace(ptr=x.ctypes.data)


def _address(x, i, j):
    return x.ctypes.data + i * x.strides[0] + j * x.strides[1]


@pytest.mark.parametrize("op", [N, T, C])
@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_element_addresses_follow_the_op(op, dtype):
    big = np.asfortranarray(np.zeros((37, 29), dtype))
    for x in (big, big[3:30, 5:26]):              # a view keeps its parent's leading dimension
        f = cuda_raw._Factor(Operand(_Base(x), op))
        rows, cols = (x.shape[1], x.shape[0]) if op & T else x.shape
        for r in (0, 1, rows - 1):
            for c in (0, 2, cols - 1):
                want = _address(x, c, r) if op & T else _address(x, r, c)
                assert f.at(r, c) == want
        assert f.ld == 37 and f.code == {N: 0, T: 1, C: 2}[op]


def test_a_base_that_is_not_column_major_gets_no_calls():
    rows_apart = np.zeros((40, 8))[::2]
    problem = SimpleNamespace(m=20, n=20, k=8)
    assert cuda_raw.Calls.make(0, problem, [Operand(_Base(rows_apart), N)]) is None
    row_major = np.zeros((20, 8))
    assert cuda_raw.Calls.make(0, problem, [Operand(_Base(row_major), N)]) is None


def test_sizes_past_32_bits_get_no_calls():
    """A size of C or of k past cuBLAS's 32-bit ints leaves the products to kernels.compute_block, which cuts them
    (int_limits); checked before the library is reached."""
    base = _Base(np.asfortranarray(np.zeros((20, 8))))
    for m, n, k in ((2**31, 20, 8), (20, 2**31, 8), (20, 20, 2**31)):
        assert cuda_raw.Calls.make(0, SimpleNamespace(m=m, n=n, k=k), [Operand(base, N)]) is None
