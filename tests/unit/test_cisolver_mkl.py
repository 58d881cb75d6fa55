"""cisolver.mkl_sparse: MKL's sparse block product against a dense float64 reference (skipped without
MKL), and SymmetricOperator's backend argument (runs everywhere)."""
import numpy as np
import pytest
import scipy.sparse as sp

from cisolver import mkl_sparse
from cisolver.operators import SymmetricOperator

needs_mkl = pytest.mark.skipif(not mkl_sparse.available(), reason="Intel MKL (libmkl_rt) not installed")


def _random_symmetric(n, rng, density=0.05):
    """Symmetric sparse with a nonzero diagonal and off-diagonal values away from zero."""
    a = sp.random(n, n, density=density, random_state=rng, format="csr",
                  data_rvs=lambda m: rng.uniform(0.5, 2.0, m) * rng.choice([-1, 1], m))
    return (a + a.T + sp.diags(rng.uniform(1.0, 3.0, n))).tocsr()


def _stored(full, storage, dtype):
    return (sp.triu(full, format="csr") if storage == "upper" else full).astype(dtype)


@needs_mkl
@pytest.mark.parametrize("storage", ["full", "upper"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [1, 2, 301])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("via", ["MklCsr", "operator"])
def test_mkl_spmm_equals_dense(storage, dtype, n, k, via, rng):
    full = _random_symmetric(n, rng)
    h = _stored(full, storage, dtype)
    if via == "MklCsr":
        op = mkl_sparse.MklCsr(h, symmetric_upper=storage == "upper")
    else:
        op = SymmetricOperator(h, storage=storage, backend="mkl")
        assert op.backend == "mkl"
    x = rng.standard_normal((n, k)).astype(dtype)
    x_before = x.copy()
    got = op.matmat(x)
    want = full.toarray().astype(np.float64) @ x.astype(np.float64)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert got.dtype == dtype and got.shape == (n, k) and got.flags.c_contiguous
    assert np.abs(got - want).max() <= tol * np.abs(want).max()
    assert np.array_equal(x, x_before)
    if via == "MklCsr":
        op.close()
        op.close()                       # a second close is harmless
        with pytest.raises(RuntimeError, match="after close"):
            op.matmat(x)


@needs_mkl
def test_mkl_unsorted_duplicates_and_int64_indices(rng):
    """Non-canonical CSR (unsorted, duplicate entries, int64 indices) gives the same product."""
    full = _random_symmetric(57, rng)
    coo = sp.triu(full, format="coo")
    order = rng.permutation(coo.nnz)
    rows, cols, vals = coo.row[order], coo.col[order], coo.data[order]
    h = sp.csr_matrix((np.r_[vals / 2, vals / 2], (np.r_[rows, rows], np.r_[cols, cols])), shape=full.shape)
    h.indices, h.indptr = h.indices.astype(np.int64), h.indptr.astype(np.int64)
    x = rng.standard_normal((57, 4))
    got = mkl_sparse.MklCsr(h, symmetric_upper=True).matmat(x)
    np.testing.assert_allclose(got, full.toarray() @ x, rtol=1e-12, atol=1e-12)


@needs_mkl
def test_auto_picks_mkl_and_other_x_dtypes_fall_back(rng):
    full = _random_symmetric(120, rng)
    op = SymmetricOperator(_stored(full, "upper", np.float32), storage="upper")
    assert op.backend == "mkl"
    x = rng.standard_normal((120, 3))                    # float64 x on a float32 matrix: scipy's product
    got = op.matmat(x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, full.astype(np.float32).toarray().astype(np.float64) @ x, rtol=1e-10)
    assert SymmetricOperator(full, threads=2).backend == "scipy"      # threads asks for the scipy path
    with pytest.raises(ValueError, match="threads applies to backend='scipy'"):
        SymmetricOperator(full, backend="mkl", threads=2)


def test_backend_mkl_without_mkl_raises(monkeypatch, rng):
    monkeypatch.setattr(mkl_sparse, "available", lambda: False)
    h = _random_symmetric(30, rng)
    with pytest.raises(RuntimeError, match="backend='mkl' needs Intel MKL"):
        SymmetricOperator(h, backend="mkl")
    op = SymmetricOperator(h, storage="full")              # auto without MKL: the scipy path
    assert op.backend == "scipy" and op.mkl is None
    x = rng.standard_normal((30, 3))
    np.testing.assert_allclose(op.matmat(x), h.toarray() @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["MKL", "cuda", "", None])
def test_bad_backend_raises(backend, rng):
    h = _random_symmetric(10, rng)
    with pytest.raises(ValueError, match="backend must be 'auto', 'scipy' or 'mkl'"):
        SymmetricOperator(h, backend=backend)
    assert SymmetricOperator(h, backend="scipy").backend == "scipy"
