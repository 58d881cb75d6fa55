"""devices.cuda_raw on a GPU, as a band call queues its products (cuda_bands.queue_product with ``raw``): every
kind, dtype, trans and triangle, a rectangle inside C with odd edges over a k range inside k (one call, and in
column calls), the triangle of a diagonal block (herk, her2k, syrk, syr2k), against float64 numpy references on
random data, C poisoned with NaN where beta = 0, the rest of C bit for bit as it was; no call goes through
kernels.compute_block; a factor that is not column-major gets no Calls."""
import numpy as np
import pytest

from blas_cases import ROUTINES, random_matrix, trans_choices
from hybridblas import cublas, plan
from hybridblas.devices import cuda_bands, cuda_raw
from hybridblas.problem import C, N, T, Operand, build_problem

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu
OPS = {"N": N, "T": T, "C": C}
KINDS = ["herk", "her2k", "syrk", "syr2k", "gemmt", "gemm"]
DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def _op(x, t):
    return x if t == "N" else (x.T if t == "T" else x.conj().T)


def _terms(name, alpha, values, trans):
    """[(coef, op(X), op(Y))] in float64 / complex128 of the routine, as numpy arrays."""
    vals = [v.astype(np.complex128 if np.iscomplexobj(v) else np.float64) for v in values]
    if name in ("gemm", "gemmt"):
        return [(alpha, _op(vals[0], trans[0]), _op(vals[1], trans[1]))]
    t = trans[0]
    back = "C" if name.startswith("her") else "T"

    def right(x):
        return _op(_op(x, t), back)
    if name in ("herk", "syrk"):
        return [(alpha, _op(vals[0], t), right(vals[0]))]
    second = np.conj(alpha) if name == "her2k" else alpha
    return [(alpha, _op(vals[0], t), right(vals[1])), (second, _op(vals[1], t), right(vals[0]))]


class _Raw:
    """One problem on device operands, its own cuBLAS handle bound to a stream, and its cuda_raw.Calls."""

    def __init__(self, rng, name, dtype, trans, lower, n, k):
        self.alpha = 0.7 if name == "herk" or np.dtype(dtype).kind != "c" else 0.7 - 0.3j
        if name in ("gemm", "gemmt"):
            shapes = [(n, k) if trans[0] == "N" else (k, n), (k, n) if trans[1] == "N" else (n, k)]
        else:
            shapes = [(n, k) if trans[0] == "N" else (k, n)] * ROUTINES[name][0]
        self.values = [random_matrix(rng, s, dtype) for s in shapes]
        ops = [cupy.asarray(v, order="F" if i == 0 else "C") for i, v in enumerate(self.values)]
        self.c = cupy.asarray(random_matrix(rng, (n, n), dtype), order="F")
        codes = [OPS[t] for t in trans] if name in ("gemm", "gemmt") else [OPS[trans[0]]] * len(ops)
        self.prob = build_problem(name, self.alpha, ops, 0.0, self.c, codes, None if name == "gemm" else lower,
                                  None)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.handle = cublas.new_handle(self.stream.ptr)
        self.backend = cublas.Backend(self.handle, self.stream)
        self.raw = cuda_raw.Calls.make(self.handle, self.prob, list(self.prob.factors))
        self.terms = _terms(name, self.alpha, self.values, trans)
        self.eps = np.finfo(np.dtype(dtype)).eps

    def close(self):
        from cupy.cuda import cublas as cupy_cublas
        self.stream.synchronize()
        cupy_cublas.destroy(self.handle)

    def run(self, task, beta, columns=0):
        out = self.c[task.i0:task.i1, task.j0:task.j1]
        with self.stream:
            cuda_bands.queue_product(self.backend, self.prob, list(self.prob.factors), None, task, out, beta,
                                     columns=columns, raw=self.raw)
        self.stream.synchronize()

    def want(self, task, old, beta):
        got = sum(coef * (x[task.i0:task.i1, task.k0:task.k1] @ y[task.k0:task.k1, task.j0:task.j1])
                  for coef, x, y in self.terms)
        scale = sum(abs(coef) * np.abs(x).max() * np.abs(y).max() for coef, x, y in self.terms)
        tol = 30 * self.eps * ((task.k1 - task.k0 + 2) * scale + abs(beta) * np.nanmax(np.abs(old)))
        return got + (beta * old if beta else 0), tol


def _no_compute_block(*args, **kwargs):
    raise AssertionError("a product went through kernels.compute_block")


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lower", [True, False])
def test_raw_products_equal_the_reference(name, dtype, lower, rng, monkeypatch):
    if name in ("herk", "her2k") and np.dtype(dtype).kind != "c":
        pytest.skip("Hermitian routines: complex data")
    if name == "gemm" and not lower:
        pytest.skip("gemm has no triangle")
    monkeypatch.setattr(cuda_bands, "compute_block", _no_compute_block)
    n, k = 397, 211
    with cupy.cuda.Device(0):
        for trans in trans_choices(name, dtype):
            case = _Raw(rng, name, dtype, trans, lower, n, k)
            try:
                assert case.raw is not None
                rects = [(301, 377, 9, 290, 5, 198, 0), (301, 377, 9, 290, 5, 198, 64), (396, 397, 0, 1, 0, k, 0)]
                if not lower:
                    rects = [(j0, j1, i0, i1, k0, k1, w) for i0, i1, j0, j1, k0, k1, w in rects]
                for beta in (0.0, 0.5):
                    for i0, i1, j0, j1, k0, k1, columns in rects:
                        task = plan.make_task(case.prob, i0, i1, j0, j1, k0, k1)
                        _check(case, task, beta, columns)
                    if name not in ("gemm", "gemmt"):
                        for i0, i1 in ((17, 146), (396, 397)):
                            _check(case, plan.make_task(case.prob, i0, i1, i0, i1, 3, 200, diag=True), beta)
            finally:
                case.close()


def _check(case, task, beta, columns=0):
    """Run ``task`` into a C whose block is poisoned (beta = 0) or random; the block (its triangle, on the
    diagonal) against the reference, everything else in C bit for bit as it was."""
    block = (slice(task.i0, task.i1), slice(task.j0, task.j1))
    if beta == 0:
        case.c[block] = np.nan
    before = cupy.asnumpy(case.c)
    case.run(task, beta, columns)
    after = cupy.asnumpy(case.c)
    want, tol = case.want(task, np.where(np.isnan(before[block]), 0, before[block]), beta)
    done = np.zeros(before.shape, bool)
    if task.diag:
        rows = task.i1 - task.i0
        done[block] = np.tril(np.ones((rows, rows), bool)) if case.prob.lower else np.triu(np.ones((rows, rows), bool))
    else:
        done[block] = True
    got = after[block][done[block]]
    assert np.isfinite(got).all()
    assert np.abs(got - want[done[block]]).max() <= tol
    np.testing.assert_array_equal(after[~done], before[~done])


def test_a_factor_that_is_not_column_major_gets_no_calls(rng):
    with cupy.cuda.Device(0):
        case = _Raw(rng, "syrk", np.float64, ("N",), True, 64, 32)
        try:
            strided = cupy.asarray(random_matrix(rng, (128, 32), np.float64))[::2]      # rows two apart
            assert cuda_raw.Calls.make(case.handle, case.prob, [Operand(strided, N)]) is None
            assert cuda_raw.Calls.make(case.handle, case.prob, list(case.prob.factors)) is not None
        finally:
            case.close()
