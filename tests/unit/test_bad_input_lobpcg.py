"""cisolver.lobpcg with bad arguments: each is refused before any work with a ValueError or TypeError naming
the argument and its value, and the caller's matrix and start block are left as they were, byte for byte.
A good call leaves them untouched too (the start used to be made orthonormal in the caller's x0)."""
import numpy as np
import pytest
import scipy.sparse as sp

from cisolver import lobpcg
from cisolver.operators import SymmetricOperator

N = 61          # odd, and 3 * (nev + 3) <= N for the nev used here


def _symmetric(n, rng):
    a = rng.standard_normal((n, n))
    return a + a.T + np.diag(np.arange(n, dtype=float))


@pytest.fixture
def h(rng):
    return _symmetric(N, rng)


def _refused(exc, match, h, *args, **kwargs):
    """Call lobpcg(h, *args, **kwargs), expect ``exc`` matching ``match``, and check h and x0 unchanged."""
    arrays = [a for a in (h, kwargs.get("x0")) if isinstance(a, np.ndarray)]
    arrays += [a.data for a in (h,) if sp.issparse(a)]
    before = [a.tobytes() for a in arrays]
    with pytest.raises(exc, match=match):
        lobpcg(h, *args, **kwargs)
    assert [a.tobytes() for a in arrays] == before


# ---- the matrix ----------------------------------------------------------------------------------------
def test_matrix_of_the_wrong_kind_or_shape(h, rng):
    _refused(TypeError, r"h must be a symmetric matrix .* got list", [[1.0, 0.0], [0.0, 1.0]], 1)
    _refused(TypeError, r"h must be a symmetric matrix .* got ndarray of shape \(61,\)", h[0].copy(), 1)
    _refused(ValueError, r"h must be square, got shape \(61, 60\)", h[:, :60].copy(), 2)
    _refused(ValueError, r"h must be square, got shape \(61, 60\)", sp.csr_matrix(h[:, :60]), 2)
    _refused(ValueError, r"h is empty \(0 x 0\)", np.zeros((0, 0)), 1)
    _refused(TypeError, "h must hold real floating numbers .* got dtype complex128", h + 1j * h, 2)
    _refused(TypeError, "h must hold real floating numbers .* got dtype int64",
             np.rint(h).astype(np.int64), 2)


def test_matrix_with_nan_or_inf(h):
    for poison in (np.nan, np.inf, -np.inf):
        bad = h.copy()
        bad[3, 5] = bad[5, 3] = poison
        _refused(ValueError, "h holds NaN or infinite entries", bad, 2)
        _refused(ValueError, "h holds NaN or infinite entries", sp.csr_matrix(bad), 2)


def test_matrix_not_symmetric(h, rng):
    bad = h.copy()
    bad[2, 7] += 1e-6 * np.abs(h).max()
    _refused(ValueError, r"h must be symmetric: max \|h - h\^T\| = ", bad, 2)
    # the upper triangle alone is not H: it goes through SymmetricOperator(storage="upper")
    upper = sp.triu(sp.csr_matrix(h)).tocsr()
    _refused(ValueError, "SymmetricOperator", upper, 2)
    got = lobpcg(SymmetricOperator(upper, storage="upper"), 2, tol=1e-9, seed=1)
    np.testing.assert_allclose(got.eigenvalues, np.linalg.eigvalsh(h)[:2], rtol=1e-8, atol=1e-8)


def test_operator_of_the_wrong_shape_or_dtype(h):
    class Op:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, np.dtype(dtype)

        def matmat(self, x):
            raise AssertionError("no product may run")
    _refused(ValueError, r"h \(an operator\) must have a square shape \(n, n\), got \(61, 60\)", Op((61, 60), float), 2)
    _refused(ValueError, r"got \(61,\)", Op((61,), float), 2)
    _refused(TypeError, r"h \(an operator\) must have dtype float32 or float64 .* got complex128",
             Op((61, 61), complex), 2)
    no_dtype = Op((61, 61), float)
    del no_dtype.dtype
    _refused(TypeError, r"h \(an operator\) must have dtype float32 or float64 \(or give dtype\), got None",
             no_dtype, 2)


# ---- the scalars ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("nev", [0, -1, N + 1, 2.5, True, "3", None])
def test_bad_nev(h, nev):
    _refused(ValueError, rf"nev must be an integer in 1\.\.{N}, got {type(nev).__name__} {nev!r}", h, nev)


@pytest.mark.parametrize("block_size", [0, 2, N + 1, 4.5, True])
def test_bad_block_size(h, block_size):
    _refused(ValueError, rf"block_size must be an integer in 3\.\.{N} \(>= nev\), got "
                         rf"{type(block_size).__name__} {block_size!r}", h, 3, block_size=block_size)


def test_block_too_large_for_the_matrix(h):
    _refused(ValueError, r"matrix too small for LOBPCG with block_size=21 \(n=61\)", h, 3, block_size=21)
    _refused(ValueError, r"matrix too small for LOBPCG with block_size=1 \(n=1\)", np.ones((1, 1)), 1)


@pytest.mark.parametrize("tol", [0, -1e-8, float("nan"), float("inf"), "1e-8", True])
def test_bad_tol(h, tol):
    _refused(ValueError, rf"tol must be a finite number > 0 \(or None\), got {type(tol).__name__}", h, 2, tol=tol)


@pytest.mark.parametrize("scale", [1e-200, 1e-160, 1e200])
def test_a_matrix_whose_residuals_under_or_overflow_is_refused_not_answered(scale):
    """Entries so small (large) that the residuals' sums of squares underflow (overflow) float64 gave wrong
    eigenvalues flagged as converged; such a matrix is refused, naming h and the fix."""
    with pytest.raises(ValueError, match=r"h's largest start Ritz value .* is outside 1e-100...1e\+100.*scale h"):
        lobpcg(np.diag(np.arange(1.0, 61)) * scale, 3)
    assert lobpcg(np.diag(np.arange(1.0, 61)) * 1e-90, 3).eigenvalues == pytest.approx([1e-90, 2e-90, 3e-90])
    assert lobpcg(np.zeros((60, 60)), 3).converged                 # the zero matrix: eigenvalues 0


def test_x0_of_dependent_columns_and_dense_precisions(h):
    n = h.shape[0]
    for x0 in (np.zeros((n, 5)), np.ones((n, 5))):
        with pytest.raises(ValueError, match="x0's columns must be linearly independent"):
            lobpcg(h, 2, x0=x0)
    dense = h.toarray() if hasattr(h, "toarray") else np.asarray(h)
    single = lobpcg(dense.astype(np.float32), 2)
    assert single.eigenvectors.dtype == np.float32                 # solved in the matrix's own precision
    with pytest.raises(TypeError, match="h's dtype must be float32 or float64, got float128"):
        lobpcg(dense.astype(np.longdouble), 2)


@pytest.mark.parametrize("maxiter", [-5, 2.5, None, True])
def test_bad_maxiter(h, maxiter):
    _refused(ValueError, rf"maxiter must be an integer >= 0, got {type(maxiter).__name__} {maxiter!r}", h, 2,
             maxiter=maxiter)


@pytest.mark.parametrize("dtype", [np.int32, "float16", np.complex128, "nope"])
def test_bad_dtype(h, dtype):
    _refused(TypeError, "dtype must be float32 or float64, got", h, 2, dtype=dtype)


@pytest.mark.parametrize("seed", [-1, 1.5])
def test_bad_seed(h, seed):
    _refused(ValueError, rf"seed must be an integer >= 0 or None, got {type(seed).__name__} {seed!r}", h, 2,
             seed=seed)


def test_bad_precond_callback_context_comm_and_unknown_keyword(h):
    _refused(TypeError, r"precond must have a method apply\(R, theta\), or be None, got str 'tiles'", h, 2,
             precond="tiles")
    _refused(TypeError, "precond must have a method apply", h, 2, precond=object())
    _refused(TypeError, "callback must be callable or None, got int 5", h, 2, callback=5)
    _refused(TypeError, "context must be a hybridblas.Context or None, got str 'cpu'", h, 2, context="cpu")
    _refused(ValueError, "comm needs h to be an operator whose rows are split over the ranks", h, 2,
             comm=object())
    _refused(TypeError, "unexpected keyword argument 'tolerance'", h, 2, tolerance=1e-8)
    _refused(TypeError, "queued must be True or False, got str 'yes'", h, 2, queued="yes")
    _refused(TypeError, "queued must be True or False, got int 1", h, 2, queued=1)


# ---- the start block -----------------------------------------------------------------------------------
def test_bad_start_block(h, rng):
    x0 = rng.standard_normal((N, 5))
    _refused(ValueError, rf"x0 must have shape \({N}, 5\) \(n, block_size\), got \({N}, 6\)", h, 2,
             x0=rng.standard_normal((N, 6)))
    _refused(ValueError, rf"x0 must have shape \({N}, 5\) .* got \({N - 1}, 5\)", h, 2, x0=x0[:-1].copy())
    _refused(ValueError, rf"got \({N},\)", h, 2, x0=x0[:, 0].copy())
    _refused(TypeError, "x0 must hold real floating numbers, got dtype complex128", h, 2, x0=x0 + 1j)
    _refused(TypeError, "x0 must hold real floating numbers, got dtype int64", h, 2, x0=np.ones((N, 5), np.int64))
    _refused(TypeError, "x0 must be a numpy or cupy array of shape", h, 2, x0=x0.tolist())
    for poison in (np.nan, np.inf):
        bad = x0.copy()
        bad[7, 1] = poison
        _refused(ValueError, "x0 holds NaN or infinite entries", h, 2, x0=bad)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_good_call_leaves_matrix_and_start_untouched(rng, dtype, order):
    """Both memory orders and a strided view of h and x0: the answer matches eigh in float64 and neither
    input changes."""
    a = _symmetric(N, rng)
    x0 = rng.standard_normal((N, 6)).astype(dtype)
    if order == "F":
        a, x0 = np.asfortranarray(a), np.asfortranarray(x0)
    elif order == "strided":
        big = np.zeros((2 * N, 2 * N))
        big[::2, ::2] = a
        a = big[::2, ::2]
        wide = np.zeros((N, 12), dtype=dtype)
        wide[:, ::2] = x0
        x0 = wide[:, ::2]
    a_before, x_before = a.tobytes(), x0.tobytes()
    tol = 1e-5 if dtype == np.float32 else 1e-9
    res = lobpcg(a, 3, x0=x0, tol=tol, maxiter=500, dtype=dtype)
    assert a.tobytes() == a_before and x0.tobytes() == x_before
    assert res.converged
    np.testing.assert_allclose(res.eigenvalues, np.linalg.eigvalsh(np.array(a, dtype=np.float64))[:3],
                               rtol=10 * tol, atol=10 * tol * N)
