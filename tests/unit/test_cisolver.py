"""cisolver: shell-model Hamiltonians against the README reference spectra, LOBPCG against eigsh/eigh."""
import json
import os

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from cisolver import dense, lobpcg
from cisolver.operators import SymmetricOperator
from cisolver.preconditioner import TilePreconditioner, configuration_labels
from cisolver.shellmodel import angmom, hamiltonian, snt
from ci_data import DATA, needs_data


REF = {  # README reference spectra (KSHELL + dense check), MeV, and J
    "20Ne": ("usdb.snt", 2, 2, 640, [-40.472331, -38.725641, -36.297059, -33.774153, -32.929372], [0, 2, 4, 0, 2]),
    "12C": ("ckpot.snt", 4, 4, 51, [-71.044671, -66.397028, -58.595516, -57.577954, -57.541429], [0, 2, 1, 0, 4]),
}


def _problem(name, z, n, m=None):
    return hamiltonian.ShellModelProblem(snt.read_snt(DATA / name), z, n, m)


def _full(h_upper):
    return (h_upper + h_upper.T - sp.diags(h_upper.diagonal())).tocsr()


@needs_data
@pytest.mark.parametrize("nucleus", sorted(REF))
def test_reference_spectrum_dense(nucleus):
    name, z, n, dim, energies, js = REF[nucleus]
    prob = _problem(name, z, n)
    h, info = prob.build()
    assert info.dimension == dim
    hd = h.toarray()
    assert np.abs(hd - hd.T).max() < 1e-12
    w, v = np.linalg.eigh(hd)
    np.testing.assert_allclose(w[:5], energies, atol=2e-5, rtol=0)
    assert list(angmom.j_from_j2(angmom.expectation_j2(prob, v[:, :5]))) == js


@needs_data
def test_20ne_lobpcg_matches_reference_and_upper_storage():
    name, z, n, dim, energies, js = REF["20Ne"]
    prob = _problem(name, z, n)
    hu, _ = prob.build(storage="upper")
    hf, _ = prob.build(storage="full")
    assert abs(_full(hu) - hf).max() < 1e-14
    res = lobpcg(SymmetricOperator(hu, storage="upper"), 5, tol=1e-9, seed=3)
    assert res.converged
    np.testing.assert_allclose(res.eigenvalues, energies, atol=2e-5, rtol=0)
    assert list(angmom.j_from_j2(angmom.expectation_j2(prob, res.eigenvectors))) == js


@needs_data
def test_odd_mass_twice_m_and_bad_input():
    prob = _problem("usdb.snt", 2, 3)             # 21Ne, 2M = 1 by default
    assert prob.basis.twice_m == 1
    w, v = np.linalg.eigh(prob.build()[0].toarray())
    assert angmom.j_from_j2(angmom.expectation_j2(prob, v[:, :1]))[0] == 1.5
    with pytest.raises(ValueError, match="twice_m"):
        _problem("usdb.snt", 2, 3, 0)
    with pytest.raises(ValueError, match="n_protons"):
        _problem("usdb.snt", 13, 2)


@needs_data
@pytest.mark.parametrize("name,z,n", [("usdb.snt", 2, 3), ("usdb.snt", 1, 4), ("ckpot.snt", 3, 4),
                                      ("gxpf1a.snt", 1, 2), ("kb3g.snt", 2, 1)])
def test_mirror_nuclei_have_the_same_spectrum(name, z, n):
    """These interactions conserve isospin and carry no Coulomb term, so swapping the valence protons and
    neutrons (21Ne <-> 21Na, ...) must leave the spectrum unchanged: the proton and neutron code paths
    (jumps, spectators, the p-n factorisation) have to agree."""
    spectra = []
    for zz, nn in ((z, n), (n, z)):
        h, info = _problem(name, zz, nn).build()
        spectra.append(np.linalg.eigh(h.toarray())[0])
    assert spectra[0].shape == spectra[1].shape
    np.testing.assert_allclose(spectra[0], spectra[1], atol=1e-10, rtol=0)


@needs_data
def test_spectrum_does_not_depend_on_m():
    """20Ne with 2M = 0, 2 and 4: each M-scheme space holds exactly the states with J >= M, with the
    same energies (rotational invariance of H), and the J labels count them."""
    spectra, labels = {}, {}
    for m in (0, 2, 4):
        prob = _problem("usdb.snt", 2, 2, m)
        w, v = np.linalg.eigh(prob.build()[0].toarray())
        spectra[m], labels[m] = w, angmom.j_from_j2(angmom.expectation_j2(prob, v))
    for low, high in ((0, 2), (2, 4)):
        assert (labels[low] >= high // 2).sum() == len(spectra[high])
        np.testing.assert_allclose(spectra[low][labels[low] >= high // 2], spectra[high], atol=1e-10, rtol=0)


def test_bad_snt_file(tmp_path):
    f = tmp_path / "bad.snt"
    f.write_text("! comment\n 1 1 8 8\n 1 0 2 3 -1\n")
    with pytest.raises(snt.InteractionFileError, match="orbit 2"):
        snt.read_snt(f)


def _random_symmetric(n, rng, density=0.02):
    a = sp.random(n, n, density=density, random_state=rng, format="csr")
    a = a + a.T + sp.diags(rng.uniform(-5, 5, n))
    return a.tocsr()


@pytest.mark.parametrize("storage", ["full", "upper"])
def test_lobpcg_agrees_with_eigsh_and_eigh(storage, rng):
    a = _random_symmetric(600, rng)
    h = sp.triu(a).tocsr() if storage == "upper" else a
    res = lobpcg(SymmetricOperator(h, storage=storage), 5, tol=1e-10, maxiter=500, seed=1)
    assert res.converged
    w, v = np.linalg.eigh(a.toarray())
    ws = np.sort(spla.eigsh(a, k=5, which="SA", tol=1e-12)[0])
    np.testing.assert_allclose(res.eigenvalues, w[:5], rtol=1e-8, atol=0)
    np.testing.assert_allclose(res.eigenvalues, ws, rtol=1e-8, atol=0)
    overlap = np.abs(v[:, :5].T @ res.eigenvectors)        # phase-invariant eigenvector check
    np.testing.assert_allclose(overlap, np.eye(5), atol=1e-5)
    parts = {k: v for k, v in res.seconds.items() if k.startswith("dense:")}   # the dense time, split
    assert {"dense:start", "dense:orthonormalise", "dense:rayleigh_ritz", "dense:update"} <= set(parts)
    assert sum(parts.values()) == pytest.approx(res.seconds["dense"], rel=1e-9)


def test_lobpcg_float32_and_reproducible(rng):
    a = _random_symmetric(500, rng)
    r1 = lobpcg(a, 4, tol=1e-5, dtype=np.float32, seed=7)
    r2 = lobpcg(a, 4, tol=1e-5, dtype=np.float32, seed=7)
    assert r1.eigenvectors.dtype == np.float32
    np.testing.assert_array_equal(r1.eigenvalues, r2.eigenvalues)
    np.testing.assert_allclose(r1.eigenvalues, np.linalg.eigh(a.toarray())[0][:4], rtol=1e-5)


def test_lobpcg_bad_arguments(rng):
    a = _random_symmetric(100, rng)
    with pytest.raises(ValueError, match="nev"):
        lobpcg(a, 0)
    with pytest.raises(ValueError, match="block_size"):
        lobpcg(a, 5, block_size=3)
    with pytest.raises(ValueError, match="tol"):
        lobpcg(a, 2, tol=-1)
    with pytest.raises(TypeError, match="dtype"):
        lobpcg(a, 2, dtype=np.int32)


def test_cholqr2_and_rank_deficiency(rng):
    w = rng.standard_normal((3000, 6))
    w0 = w.copy()
    r = dense.cholqr2(w)
    np.testing.assert_allclose(w.T @ w, np.eye(6), atol=1e-13)
    np.testing.assert_allclose(w @ r, w0, atol=1e-12)
    bad = np.repeat(rng.standard_normal((100, 1)), 3, axis=1)
    with pytest.raises(dense.NotPositiveDefinite):
        dense.cholqr2(bad)


def _against(x, w, p=None, hp=None, hx=None):
    """[X | P | W] in one row-major buffer (as the solver keeps it), then orthonormalise_tail on it."""
    blocks_ = [x] + ([p] if p is not None else []) + [w]
    s = np.ascontiguousarray(np.hstack(blocks_))
    hs = np.full_like(s, np.nan)
    n_p = 0 if p is None else p.shape[1]
    if hp is not None:
        hs[:, :x.shape[1] + n_p] = np.hstack([hx, hp])
    dense.orthonormalise_tail(s, hs, x.shape[1], n_p)
    return s, hs


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_orthonormalise_tail_against_x(dtype, tol, rng):
    """BCGS-PIP2: W loses its X part, becomes orthonormal, and spans what (I - X X^T) W spanned."""
    x = np.linalg.qr(rng.standard_normal((4000, 8)))[0].astype(dtype)
    w0 = (rng.standard_normal((4000, 5)) + 3.0 * x[:, :5] + 0.01 * x[:, 5:6]).astype(dtype)
    s, _ = _against(x, w0)
    np.testing.assert_array_equal(s[:, :8], x)                  # X untouched
    w = s[:, 8:]
    assert np.abs(x.T @ w).max() <= tol
    np.testing.assert_allclose(w.T @ w, np.eye(5), atol=tol)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    target = w0 - x64 @ (x64.T @ w0)                      # what the projection should keep
    coef = np.linalg.lstsq(w64, target, rcond=None)[0]
    assert np.abs(w64 @ coef - target).max() <= 50 * tol * np.abs(target).max()


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 3e-6)])
def test_orthonormalise_tail_takes_p_along_with_hp(dtype, tol, rng):
    """V = [P W] orthonormal and orthogonal to X; H P follows P by the same coefficients (P's new columns
    combine X and P only), so H P stays H times P; a W of very different length is no obstacle."""
    n = 3000
    a = _random_symmetric(n, rng).toarray()
    x = np.linalg.qr(rng.standard_normal((n, 6)))[0]
    p = rng.standard_normal((n, 3)) + 0.5 * x[:, :3]
    w = 1e-6 * rng.standard_normal((n, 4))
    s, hs = _against(x.astype(dtype), w.astype(dtype), p.astype(dtype), (a @ p).astype(dtype), (a @ x).astype(dtype))
    s64 = s.astype(np.float64)
    np.testing.assert_allclose(s64.T @ s64, np.eye(13), atol=tol)
    p_new = s64[:, 6:9]
    scale = np.abs(a).max() * np.sqrt(n)
    assert np.abs(hs[:, 6:9] - (a @ p_new)).max() <= 200 * tol * scale
    coef = np.linalg.lstsq(np.hstack([x, p_new]), p, rcond=None)[0]   # span([X P]) unchanged
    assert np.abs(np.hstack([x, p_new]) @ coef - p).max() <= 100 * tol * np.abs(p).max()


@pytest.mark.parametrize("dtype,outside,tol", [(np.float32, 1e-3, 2e-6), (np.float64, 1e-5, 1e-12)])
def test_orthonormalise_tail_w_mostly_inside_span_x(dtype, outside, tol, rng):
    """A preconditioned W can lie mostly in span(X): W^T W - (X^T W)^T X^T W would cancel, so the pass
    projects explicitly first (without it the Cholesky failed here)."""
    x = np.linalg.qr(rng.standard_normal((20000, 8)))[0]
    perp = rng.standard_normal((20000, 5))
    perp -= x @ (x.T @ perp)
    perp /= np.linalg.norm(perp, axis=0)
    w = (x[:, :5] @ rng.standard_normal((5, 5)) + outside * perp).astype(dtype)
    x = x.astype(dtype)
    s, _ = _against(x, w)
    w = s[:, 8:]
    assert np.abs(x.T @ w).max() <= tol
    np.testing.assert_allclose(w.T @ w, np.eye(5), atol=tol)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_orthonormalise_tail_adaptive_stops_after_one_pass_only_when_it_may(dtype, tol, rng):
    """adaptive: a well-conditioned W needs one pass, and [X W] is then orthonormal to the predicted
    loss; W with two nearly parallel columns (kappa ~ 1e4 in float32, 1e7 in float64) gets the second pass
    and full orthonormality."""
    x = np.linalg.qr(rng.standard_normal((4000, 8)))[0]
    good = rng.standard_normal((4000, 5)) + 2.0 * x[:, :5]
    near = good.copy()
    near[:, 4] = near[:, 3] + (1e-4 if dtype == np.float32 else 1e-7) * rng.standard_normal(4000)
    for w0, passes in ((good, 1), (near, 2)):
        s = np.ascontiguousarray(np.hstack([x, w0]).astype(dtype))
        assert dense.orthonormalise_tail(s, np.zeros_like(s), 8, 0, adaptive=True) == passes
        s64 = s.astype(np.float64)
        loss = np.abs(s64.T @ s64 - np.eye(13)).max()
        assert loss <= (max(tol, 10 * dense.SINGLE_PASS_LOSS) if passes == 1 else tol), (passes, loss)
        s = np.ascontiguousarray(np.hstack([x, w0]).astype(dtype))
        assert dense.orthonormalise_tail(s, np.zeros_like(s), 8, 0) == 2          # not adaptive: always two


def test_orthonormalise_tail_rejects_w_inside_span_x(rng):
    x = np.linalg.qr(rng.standard_normal((500, 6)))[0]
    with pytest.raises(dense.NotPositiveDefinite):
        _against(x, x[:, :2] @ rng.standard_normal((2, 3)))
    with pytest.raises(dense.NotPositiveDefinite):              # P and W the same directions
        p = rng.standard_normal((500, 2))
        _against(x, p @ rng.standard_normal((2, 2)), p, p, x)


def test_orthonormalise_tail_keeps_hp_with_p_when_a_later_pass_fails(rng, monkeypatch):
    """A failure in the second pass (after the first changed P) still leaves H P equal to H times P:
    the solver then orthonormalises P alone from there."""
    n = 2000
    a = _random_symmetric(n, rng).toarray()
    x = np.linalg.qr(rng.standard_normal((n, 6)))[0]
    p = rng.standard_normal((n, 3)) + 0.5 * x[:, :3]
    w = rng.standard_normal((n, 4))
    calls = []
    real = dense.scaled_cholesky

    def second_fails(g, what):
        calls.append(what)
        if len(calls) == 2:
            raise dense.NotPositiveDefinite("forced in the second pass")
        return real(g, what)
    monkeypatch.setattr(dense, "scaled_cholesky", second_fails)
    with pytest.raises(dense.NotPositiveDefinite, match="forced"):
        _against(x, w, p, a @ p, a @ x)
    s = np.ascontiguousarray(np.hstack([x, p, w]))
    hs = np.hstack([a @ x, a @ p, np.full_like(w, np.nan)])
    calls.clear()
    with pytest.raises(dense.NotPositiveDefinite):
        dense.orthonormalise_tail(s, hs, 6, 3)
    assert not np.allclose(s[:, 6:9], p)                           # the first pass did change P
    np.testing.assert_allclose(hs[:, 6:9], a @ s[:, 6:9], atol=1e-10 * np.abs(a).max() * np.sqrt(n))


def _lowest(a, k):
    return np.linalg.eigh(a.toarray())[0][:k]


def test_lobpcg_keeps_p_when_the_preconditioner_gives_a_rank_deficient_w(rng):
    """Two equal columns of W: the W part is at fault, so W gets the host QR and P stays (dropping
    P in every such iteration took 4x the iterations)."""
    class Duplicating:
        def apply(self, r, theta):
            w = np.array(r)
            if w.shape[1] >= 2:
                w[:, -1] = w[:, 0]
            return w
    a = _random_symmetric(600, rng)
    plain = lobpcg(a, 4, tol=1e-9, maxiter=500, seed=3)
    res = lobpcg(a, 4, tol=1e-9, maxiter=500, seed=3, precond=Duplicating())
    assert res.converged and res.restarts == 0
    assert res.iterations <= 2 * plain.iterations
    np.testing.assert_allclose(res.eigenvalues, _lowest(a, 4), rtol=1e-8)


def test_lobpcg_recovers_when_p_must_be_dropped(rng, monkeypatch):
    """Forced failures of every [P W] orthonormalisation with P, and of the first Rayleigh-Ritz calls with
    P: P is dropped (counted as restarts), W is orthonormalised alone, and the eigenpairs are still right."""
    a = _random_symmetric(600, rng)
    real_tail, real_rr = dense.orthonormalise_tail, dense.rayleigh_ritz
    rr_failures = []

    def tail_fails_with_p(s, hs, b, n_p, **kw):
        if n_p:
            raise dense.NotPositiveDefinite("forced: P")
        return real_tail(s, hs, b, n_p, **kw)

    def rr_fails_with_p(s, hs, n_keep, **kw):
        if s.shape[1] == 3 * n_keep and len(rr_failures) < 3:
            rr_failures.append(s.shape)
            raise dense.NotPositiveDefinite("forced: S^T S")
        return real_rr(s, hs, n_keep, **kw)

    monkeypatch.setattr(dense, "orthonormalise_tail", tail_fails_with_p)
    res = lobpcg(a, 4, tol=1e-9, maxiter=800, seed=3)
    assert res.converged and res.restarts > 0
    np.testing.assert_allclose(res.eigenvalues, _lowest(a, 4), rtol=1e-8)
    monkeypatch.setattr(dense, "orthonormalise_tail", real_tail)
    monkeypatch.setattr(dense, "rayleigh_ritz", rr_fails_with_p)
    res = lobpcg(a, 4, tol=1e-9, maxiter=800, seed=3)
    assert len(rr_failures) == 3 and res.converged and res.restarts >= 3
    np.testing.assert_allclose(res.eigenvalues, _lowest(a, 4), rtol=1e-8)


def test_lobpcg_with_unusable_p_columns(rng, monkeypatch):
    """A P column marked unusable is left out of S (the others keep theirs)."""
    a = _random_symmetric(600, rng)
    real = dense.next_p_coefficients

    def first_unusable(c_x, g, b):
        z, usable = real(c_x, g, b)
        z[:, 0], usable[0] = 0.0, False
        return z, usable
    monkeypatch.setattr(dense, "next_p_coefficients", first_unusable)
    res = lobpcg(a, 4, tol=1e-9, maxiter=800, seed=3)
    assert res.converged
    np.testing.assert_allclose(res.eigenvalues, _lowest(a, 4), rtol=1e-8)


def test_next_p_is_orthogonal_to_the_new_x_and_unit(rng):
    """P = S Z from next_p_coefficients: orthogonal to X = S C, unit columns, and span([X P]) is that of
    LOBPCG's usual [X, S C with X's rows zeroed]; a column with no P part is marked unusable."""
    n, b = 2000, 4
    a = _random_symmetric(n, rng).toarray()
    s = rng.standard_normal((n, 3 * b)) * np.linspace(0.5, 2.0, 3 * b)      # not orthonormal
    theta, c, _, g = dense.rayleigh_ritz(s, a @ s, b, with_gram=True)
    z, usable = dense.next_p_coefficients(c, g, b)
    assert usable.all()
    x_new, p_new = s @ c, s @ z
    np.testing.assert_allclose(x_new.T @ p_new, 0.0, atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(p_new, axis=0), 1.0, rtol=1e-10)
    p_std = s[:, b:] @ c[b:]
    coef = np.linalg.lstsq(np.hstack([x_new, p_new]), p_std, rcond=None)[0]
    assert np.abs(np.hstack([x_new, p_new]) @ coef - p_std).max() <= 1e-9 * np.abs(p_std).max()
    # an orthonormal S (g = I) and a new X whose first column is X's own first column: no P there
    start = rng.standard_normal((3 * b, b))
    start[:, 0] = np.eye(3 * b)[0]
    c_x = np.linalg.qr(start)[0]
    z, usable = dense.next_p_coefficients(c_x, np.eye(3 * b), b)
    assert list(usable) == [False, True, True, True]
    assert (z[:, 0] == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_updates_on_column_ranges_of_a_row_major_buffer(dtype, rng):
    from cisolver.blocks import (product_into, product_into_both, replace_with_product, residual_into,
                                 subtract_product, times_upper)
    buf = rng.standard_normal((301, 24)).astype(dtype)
    other = np.full((301, 24), np.nan, dtype=dtype)
    ref = buf.astype(np.float64)
    tol = 50 * np.finfo(dtype).eps
    m = rng.standard_normal((20, 16))
    product_into(other[:, 4:20], buf[:, :20], m)                        # into another buffer's columns
    np.testing.assert_allclose(other[:, 4:20], ref[:, :20] @ m, rtol=0, atol=tol * np.abs(ref[:, :20] @ m).max())
    assert np.isnan(other[:, :4]).all() and np.isnan(other[:, 20:]).all()
    m2 = rng.standard_normal((8, 16))
    subtract_product(buf[:, 8:24], buf[:, :8], m2)                     # out and a: disjoint columns
    expected = ref[:, 8:24] - ref[:, :8] @ m2
    np.testing.assert_allclose(buf[:, 8:24], expected, rtol=0, atol=tol * np.abs(expected).max())
    u = np.triu(rng.standard_normal((16, 16))) + 4 * np.eye(16)
    before = buf[:, 8:24].astype(np.float64)
    times_upper(buf[:, 8:24], u + np.tril(np.ones((16, 16)), -1))     # below the diagonal is ignored
    np.testing.assert_allclose(buf[:, 8:24], before @ u, rtol=0, atol=tol * np.abs(before @ u).max())
    np.testing.assert_array_equal(buf[:, :8], ref[:, :8].astype(dtype))
    whole = buf.astype(np.float64)
    replace_with_product(buf[:, 4:20], buf[:, :20], m)                 # in place over the same rows
    np.testing.assert_allclose(buf[:, 4:20], whole[:, :20] @ m, rtol=0, atol=tol * np.abs(whole[:, :20] @ m).max())
    np.testing.assert_array_equal(buf[:, 20:], whole[:, 20:].astype(dtype))
    with pytest.raises(ValueError, match="does not fit"):
        product_into(other[:, :3], buf[:, :20], m)
    two = np.full((301, 32), np.nan, dtype=dtype)
    product_into_both(two[:, :16], buf[:, :20], two[:, 16:], buf[:, 4:24], m)
    np.testing.assert_allclose(two[:, :16], buf[:, :20].astype(np.float64) @ m, rtol=0,
                               atol=tol * np.abs(buf[:, :20].astype(np.float64) @ m).max())
    np.testing.assert_allclose(two[:, 16:], buf[:, 4:24].astype(np.float64) @ m, rtol=0,
                               atol=tol * np.abs(buf[:, 4:24].astype(np.float64) @ m).max())
    theta = rng.standard_normal(8)
    r = np.full((301, 8), np.nan, dtype=dtype)
    sq = residual_into(r, buf[:, 16:24], buf[:, :8], theta)
    expected = buf[:, 16:24].astype(np.float64) - buf[:, :8].astype(np.float64) * theta.astype(dtype)
    np.testing.assert_allclose(r, expected, rtol=0, atol=tol * np.abs(expected).max())
    np.testing.assert_allclose(sq, (expected ** 2).sum(axis=0), rtol=20 * np.finfo(dtype).eps)
    with pytest.raises(ValueError, match="residual"):
        residual_into(r, buf[:, 16:24], buf[:, :8], theta[:5])


def test_rayleigh_ritz_ignores_column_scaling(rng):
    """S^T S is scaled to a unit diagonal before its Cholesky: a column 1e-11 long changes nothing
    (unscaled, its Cholesky factor looks singular and the call raises)."""
    a = _random_symmetric(300, rng).toarray()
    s = np.linalg.qr(rng.standard_normal((300, 12)))[0]
    theta, c, _ = dense.rayleigh_ritz(s, a @ s, 4)
    scaled = s * np.array([1.0] * 11 + [1e-11])
    theta_s, c_s, _ = dense.rayleigh_ritz(scaled, a @ scaled, 4)
    np.testing.assert_allclose(theta_s, theta, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.abs((scaled @ c_s).T @ (s @ c)), np.eye(4), atol=1e-8)


@needs_data
def test_tile_preconditioner_solves_its_tiles_exactly():
    prob = _problem("usdb.snt", 2, 2)
    h, _ = prob.build(storage="upper")
    labels = configuration_labels(prob)
    pc = TilePreconditioner(h, labels, upper=True, dense_max=10_000)
    hf = _full(h).toarray()
    mask = labels[:, None] == labels[None, :]
    k = np.where(mask, hf, 0.0)                           # block-diagonal K
    rng = np.random.default_rng(0)
    r = rng.standard_normal((h.shape[0], 2))
    theta = np.array([-50.0, -45.0])                      # below the spectrum: K - θ is SPD
    pc.shift = "ritz"
    w = pc.apply(r, theta)
    for i in range(2):
        np.testing.assert_allclose((k - theta[i] * np.eye(len(k))) @ w[:, i], r[:, i], atol=1e-8)
    # FOM on every tile at once: with as many steps as the largest tile it is exact too
    fom = TilePreconditioner(h, labels, upper=True, dense_max=0, fom_steps=pc.max_tile, shift="ritz")
    assert fom.large is not None and not fom.groups
    wf = fom.apply(r, theta)
    for i in range(2):
        np.testing.assert_allclose((k - theta[i] * np.eye(len(k))) @ wf[:, i], r[:, i], atol=1e-8)
    # the default shift: one σ = min(θ) - below for every column
    below = TilePreconditioner(h, labels, upper=True, dense_max=10_000, below=3.0)
    wb = below.apply(r, np.array([-44.0, -41.0]))
    sigma = -44.0 - 3.0
    np.testing.assert_allclose((k - sigma * np.eye(len(k))) @ wb, r, atol=1e-8)
    with pytest.raises(ValueError, match="shift must be 'below' or 'ritz', got 'near'"):
        TilePreconditioner(h, labels, upper=True, shift="near")


@needs_data
def test_cli_json(capsys):
    from cisolver.cli import main
    os.environ.setdefault("CISOLVER_DATA", str(DATA))
    assert main(["spectrum", "--interaction", str(DATA / "ckpot.snt"), "--protons", "4", "--neutrons", "4",
                 "--nev", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dimension"] == 51 and out["j"] == [0, 2, 1, 0, 4]
    np.testing.assert_allclose(out["energies"], REF["12C"][4], atol=2e-5)
    assert main(["spectrum", "--interaction", "nope.snt", "--protons", "1", "--neutrons", "1"]) == 2


@pytest.mark.slow
@needs_data
def test_24mg_lobpcg_vs_eigsh():
    prob = _problem("usdb.snt", 4, 4)
    h, info = prob.build(storage="upper")
    assert info.dimension == 28503
    res = lobpcg(SymmetricOperator(h, storage="upper"), 5, tol=1e-8)
    ws = np.sort(spla.eigsh(_full(h), k=5, which="SA", tol=1e-12)[0])
    np.testing.assert_allclose(res.eigenvalues, ws, rtol=1e-8)


@pytest.mark.parametrize("storage", ["full", "upper"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_threaded_cpu_spmm_equals_the_plain_product(storage, dtype, threads, rng):
    full = _random_symmetric(301, rng).astype(dtype)
    h = sp.triu(full, format="csr") if storage == "upper" else full.tocsr()
    op = SymmetricOperator(h, storage=storage, threads=threads)
    x = rng.standard_normal((301, 7)).astype(dtype)
    got = op.matmat(x)
    want = full.toarray().astype(np.float64) @ x.astype(np.float64)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert got.dtype == dtype
    assert np.abs(got - want).max() <= tol * np.abs(want).max()
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        SymmetricOperator(h, storage=storage, threads=0)


def test_cholesky_failures_name_the_cause():
    with pytest.raises(dense.NotPositiveDefinite, match="leading minor 2 is not positive definite"):
        dense.cholesky_upper(np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(dense.NotPositiveDefinite, match="non-finite"):
        dense.cholesky_upper(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    with pytest.raises(dense.NotPositiveDefinite, match="numerically singular"):
        dense.cholesky_upper(np.diag([1.0, 1e-30]))
    r = dense.cholesky_upper(np.array([[4.0, 2.0], [2.0, 5.0]]))
    np.testing.assert_allclose(r, [[2.0, 1.0], [0.0, 2.0]])
    np.testing.assert_allclose(dense.inverse_upper(r) @ r, np.eye(2), atol=1e-15)


def test_host_path_update_leaves_w_to_be_copied(rng, monkeypatch):
    """A queued end of iteration writes R into the next W columns and sets ``w_holds_r``; an update on the host
    path (also the redo of a GPU step that was not positive definite) does not write them, so it must clear
    the flag and the next orthonormalisation must copy W = R in. W's columns poisoned with NaN show a skipped
    copy (the host path would rescue it by taking the pass apart, which the test forbids)."""
    from cisolver.arrays import Timer
    from cisolver.iterations import Iterations
    n, b = 600, 4
    h = sp.random(n, n, density=0.02, random_state=rng, format="csr")
    h = (h + h.T + sp.diags(np.arange(n, dtype=float))).tocsr()
    op = SymmetricOperator(h, storage="full")
    s, hs, s_next, hs_next = (np.empty((n, 3 * b)) for _ in range(4))
    s[:] = np.linalg.qr(rng.standard_normal((n, 3 * b)))[0]
    hs[:] = h @ s
    r = rng.standard_normal((n, b))
    run = Iterations(op, (s, hs, s_next, hs_next), r, np.zeros(b), 1.0, np.ones(b), nev=2, tol=1e-8, precond=None,
                     context=None, comm=None, timer=Timer(np), callback=None, overlap=False)
    run.w_holds_r = True                            # as a queued update would have left it
    run._rayleigh_ritz_and_update(3 * b, b, b)
    assert run.w_holds_r is False
    run.s[:, 2 * b:] = np.nan                       # whatever the step before left there
    run.p_usable[:] = True
    import cisolver.iterations as iterations

    def rescue(*args, **kwargs):                    # a NaN W fails the pass, which would be taken apart here
        raise AssertionError("the orthonormalisation failed: W was not copied in")
    monkeypatch.setattr(iterations, "_orthonormalise_apart", rescue)
    run._orthonormalise(np.arange(b), run.r, b)
    assert np.isfinite(run.s).all()
