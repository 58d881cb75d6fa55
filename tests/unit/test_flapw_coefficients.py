"""flapw.hs_from_coefficients: H and S from given A, B, T, U equal build_hs, a per-entry float64 sum, and
refuse bad input before any work."""
import numpy as np
import pytest

import flapw
import hybridblas as hb
from flapw.matching import phases, species_factors


def _rel(x, ref):
    return np.abs(x - ref).max() / np.abs(ref).max()


def _crystal_coefficients(cell):
    """A, B of every atom (one species factor times the atom's phase per column block), each class's T and
    U, and each atom's class: what build_hs holds for a crystal, computed here one atom at a time."""
    fac = {s: species_factors(cell.basis, r, cell.lmax, cell.omega) for s, r in cell.radial.items()}
    ph = phases(cell.basis, cell.structure.positions)
    a = np.hstack([fac[sp.symbol][0] * ph[:, [j]] for j, sp in enumerate(cell.structure.species)])
    b = np.hstack([fac[sp.symbol][1] * ph[:, [j]] for j, sp in enumerate(cell.structure.species)])
    t = {f: np.stack([getattr(m, f) for m in cell.tmats]) for f in ("taa", "tab", "tbb", "udot_norm_lm")}
    return a, b, t["taa"], t["tab"], t["tbb"], t["udot_norm_lm"], cell.atom_class_index()


@pytest.fixture(scope="module", params=["NaCl", "TiO2"])
def crystal(request):
    kmax = {"NaCl": 1.8, "TiO2": 2.0}[request.param]
    cell = flapw.System.preset(request.param, kmax=kmax, supercell=(1, 1, 1))
    return cell, _crystal_coefficients(cell)


@pytest.mark.parametrize("method", flapw.METHODS)
def test_reproduces_build_hs(crystal, method):
    cell, (a, b, taa, tab, tbb, u, cls) = crystal
    h_build, s_build = flapw.build_hs(cell, method=method)
    h, s = flapw.hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=cls, method=method)
    assert _rel(h, h_build) <= 1e-12 and _rel(s, s_build) <= 1e-12
    # one T set per atom (no t_index), T^BA given as well: the same matrices
    h1, s1 = flapw.hs_from_coefficients(a, b, taa[cls], tab[cls], tbb[cls], u[cls], method=method,
                                        tba=tab[cls].conj().transpose(0, 2, 1))
    assert _rel(h1, h_build) <= 1e-12 and _rel(s1, s_build) <= 1e-12


@pytest.mark.parametrize("method", flapw.METHODS)
def test_batches_accumulate_to_the_whole(crystal, method):
    """Atoms in three calls (1, 2, rest), the lower triangles accumulated, the last call filling."""
    cell, (a, b, taa, tab, tbb, u, cls) = crystal
    n_l = cell.n_l
    h_all, s_all = flapw.hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=cls, method=method)
    h = np.full((cell.n_g, cell.n_g), np.nan, complex)
    s = np.full((cell.n_g, cell.n_g), np.nan, complex)
    edges = [0, 1, 3, cell.n_atoms]
    for i, (j0, j1) in enumerate(zip(edges[:-1], edges[1:])):
        cols = slice(j0 * n_l, j1 * n_l)
        flapw.hs_from_coefficients(a[:, cols], b[:, cols], taa, tab, tbb, u, t_index=cls[j0:j1], method=method,
                                   h=h, s=s, accumulate=i > 0, lower_only=j1 < cell.n_atoms)
    assert _rel(h, h_all) <= 1e-13 and _rel(s, s_all) <= 1e-13


def _random_case(rng, n_g, n_atoms, n_l, n_t=2):
    """Random A, B (complex), Hermitian T^AA (set 0 positive definite: the original's Cholesky branch; the
    others indefinite), general T^AB, Hermitian T^BB, positive u, and an atom -> set map."""
    def cplx(*shape):
        return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    a, b = cplx(n_g, n_atoms * n_l), cplx(n_g, n_atoms * n_l)
    taa, tab, tbb = cplx(n_t, n_l, n_l), cplx(n_t, n_l, n_l), cplx(n_t, n_l, n_l)
    taa = taa + taa.conj().transpose(0, 2, 1)
    taa[0] = taa[0] @ taa[0].conj().T + np.eye(n_l)
    tbb = tbb + tbb.conj().transpose(0, 2, 1)
    u = rng.uniform(0.2, 2.0, (n_t, n_l))
    return a, b, taa, tab, tbb, u, rng.integers(0, n_t, n_atoms)


def _einsum_hs(a, b, taa, tab, tbb, u, idx):
    """Eqs. (6)-(7) entry by entry in float64 (no BLAS-shaped regrouping)."""
    n_g, n_l = a.shape[0], taa.shape[-1]
    h = np.zeros((n_g, n_g), complex)
    s = np.zeros((n_g, n_g), complex)
    for j, c in enumerate(idx):
        aj, bj = a[:, j * n_l:(j + 1) * n_l].T, b[:, j * n_l:(j + 1) * n_l].T        # N_L x N_G
        s += np.einsum("lg,lh->gh", aj.conj(), aj, optimize=False)
        s += np.einsum("lg,l,lh->gh", bj.conj(), u[c] ** 2, bj, optimize=False)
        for left, t, right in ((aj, taa[c], aj), (aj, tab[c], bj), (bj, tab[c].conj().T, aj), (bj, tbb[c], bj)):
            h += np.einsum("pg,pq,qh->gh", left.conj(), t, right, optimize=False)
    return h, s


def _layout(x, how):
    if how == "C":
        return np.ascontiguousarray(x)
    if how == "F":
        return np.asfortranarray(x)
    big = np.full((x.shape[0] * 2 + 1, x.shape[1] + 3), np.nan, complex)     # a strided view inside NaNs
    view = big[1::2, 2:2 + x.shape[1]]
    view[...] = x
    return view


@pytest.mark.parametrize("method", flapw.METHODS)
@pytest.mark.parametrize("n_g,n_atoms,n_l", [(1, 1, 1), (7, 3, 4), (37, 2, 9), (0, 2, 4), (5, 0, 4)])
@pytest.mark.parametrize("how", ["C", "F", "strided"])
def test_random_coefficients_against_einsum(rng, method, n_g, n_atoms, n_l, how):
    a, b, taa, tab, tbb, u, idx = _random_case(rng, n_g, n_atoms, n_l)
    h_ref, s_ref = _einsum_hs(a, b, taa, tab, tbb, u, idx)
    inputs = [x.copy() for x in (a, b, taa, tab, tbb, u, idx)]
    aa, bb = _layout(a, how), _layout(b, how)
    h = np.full((n_g, n_g), np.nan, complex, order="F")      # poisoned outputs: overwritten, not read
    s = np.full((n_g, n_g), np.nan, complex)
    out = flapw.hs_from_coefficients(aa, bb, taa, tab, tbb, u, t_index=idx, method=method, h=h, s=s)
    assert out[0] is h and out[1] is s
    scale = max(1.0, np.abs(h_ref).max(initial=0.0))
    assert np.abs(h - h_ref).max(initial=0.0) <= 1e-13 * scale
    assert np.abs(s - s_ref).max(initial=0.0) <= 1e-13 * max(1.0, np.abs(s_ref).max(initial=0.0))
    assert np.array_equal(h, h.conj().T) and np.array_equal(s, s.conj().T)
    for x, x0 in zip((aa, bb, taa, tab, tbb, u, idx), inputs, strict=True):    # inputs left as given
        np.testing.assert_array_equal(x, x0)
    # accumulate adds to what is there
    h2, s2 = flapw.hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=idx, method=method, h=h.copy(), s=s.copy(),
                                        accumulate=True)
    assert np.abs(h2 - 2 * h_ref).max(initial=0.0) <= 2e-13 * scale


@pytest.mark.parametrize("method", flapw.METHODS)
def test_lower_only_leaves_the_upper_triangle(rng, method):
    a, b, taa, tab, tbb, u, idx = _random_case(rng, 23, 3, 5)
    h_ref, s_ref = _einsum_hs(a, b, taa, tab, tbb, u, idx)
    h = rng.standard_normal((23, 23)) + 1j * rng.standard_normal((23, 23))
    s = rng.standard_normal((23, 23)) + 1j * rng.standard_normal((23, 23))
    h0, s0 = h.copy(), s.copy()
    flapw.hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=idx, method=method, h=h, s=s, lower_only=True)
    lower = np.tril_indices(23)
    assert np.abs(h[lower] - h_ref[lower]).max() <= 1e-13 * np.abs(h_ref).max()
    assert np.abs(s[lower] - s_ref[lower]).max() <= 1e-13 * np.abs(s_ref).max()
    upper = np.triu_indices(23, 1)
    np.testing.assert_array_equal(s[upper], s0[upper])
    if method == "refined":                   # the original's zgemm also writes the upper triangle of H
        np.testing.assert_array_equal(h[upper], h0[upper])


def test_context_reaches_every_blas_call(rng, monkeypatch):
    a, b, taa, tab, tbb, u, idx = _random_case(rng, 40, 3, 4)
    ctx = hb.Context(devices="cpu", strategy="dynamic", block_size=16)
    seen = []
    for name in ("herk", "her2k", "herkx", "gemm"):
        real = getattr(hb, name)

        def spy(*args, _real=real, _name=name, **kw):
            seen.append((_name, kw.get("context")))
            return _real(*args, **kw)
        monkeypatch.setattr(hb, name, spy)
    h, s = flapw.hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=idx, context=ctx)
    assert [n for n, _ in seen] == ["herk", "herk", "her2k", "herkx"] and all(c is ctx for _, c in seen)
    h_ref, s_ref = _einsum_hs(a, b, taa, tab, tbb, u, idx)
    assert _rel(h, h_ref) <= 1e-13 and _rel(s, s_ref) <= 1e-13


def test_work_buffers_and_report(rng):
    a, b, taa, tab, tbb, u, idx = _random_case(rng, 19, 2, 4)
    h_ref, _ = _einsum_hs(a, b, taa, tab, tbb, u, idx)
    rep = flapw.BuildReport()
    for method, count in (("refined", 1), ("original", 2)):
        work = [np.full(a.shape, np.nan, complex) for _ in range(count)]
        h, _ = flapw.hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=idx, method=method, work=work, report=rep)
        assert _rel(h, h_ref) <= 1e-13
    assert rep.blas_flops > 0 and "zherkx H+=AᴴX" in rep.stages and "zher2k H=ZᴴB+BᴴZ" in rep.stages


def _bad(rng):
    a, b, taa, tab, tbb, u, idx = _random_case(rng, 11, 3, 4)
    return dict(a=a, b=b, taa=taa, tab=tab, tbb=tbb, u=u, t_index=idx)


def _non_hermitian(t):
    t = t.copy()
    t[1, 0, 2] += 1e-6 * np.abs(t[1]).max()
    return t


BAD = [
    (lambda k: dict(k, b=k["b"][:, :-4]), "a and b must have the same shape"),
    (lambda k: dict(k, a=k["a"][:, :-1], b=k["b"][:, :-1]), "a has 11 columns, not a multiple of N_L = 4"),
    (lambda k: dict(k, a=k["a"].real.copy()), "a must be complex128, got float64"),
    (lambda k: dict(k, b=k["b"].astype(np.complex64)), "b must be complex128, got complex64"),
    (lambda k: dict(k, a=k["a"].tolist()), "a must be a numpy or cupy array"),
    (lambda k: dict(k, a=k["a"][None]), r"a must be a 2-D"),
    (lambda k: dict(k, taa=_non_hermitian(k["taa"])), r"taa\[1\] is not Hermitian"),
    (lambda k: dict(k, tbb=_non_hermitian(k["tbb"])), r"tbb\[1\] is not Hermitian"),
    (lambda k: dict(k, tba=k["tab"].copy()), r"tba\[0\] is not the conjugate transpose of tab"),
    (lambda k: dict(k, tab=k["tab"][:, :3, :3]), r"tab has shape \(2, 3, 3\)"),
    (lambda k: dict(k, taa=k["taa"].astype(np.complex64)), "taa must be float64 or complex128, got complex64"),
    (lambda k: dict(k, tbb=np.where(np.eye(4, dtype=bool), np.nan, k["tbb"])), "tbb holds NaN"),
    (lambda k: dict(k, u=k["u"] + 0j), "u must be float64"),
    (lambda k: dict(k, u=k["u"][:, :3]), r"u must be \(2, 4\) or \(4,\)"),
    (lambda k: dict(k, t_index=k["t_index"][:2]), "t_index must be 3 integers"),
    (lambda k: dict(k, t_index=np.array([0, 2, 1])), r"t_index must lie in \[0, 2\)"),
    (lambda k: dict(k, t_index=np.array([0.0, 1.0, 1.0])), "t_index must be 3 integers"),
    (lambda k: dict(k, t_index=None), "t_index is needed: 2 T sets for 3 atoms"),
    (lambda k: dict(k, method="fast"), "method must be one of"),
    (lambda k: dict(k, h=np.zeros((11, 10), complex)), r"h must be a \(11, 11\) complex128"),
    (lambda k: dict(k, s=np.zeros((11, 11))), r"s must be a \(11, 11\) complex128"),
    (lambda k: dict(k, s=k["h"]), "s shares memory with another argument"),
    (lambda k: dict(k, work=[]), r"work must be 1 array\(s\)"),
    (lambda k: dict(k, work=[k["a"]]), r"work\[0\] shares memory with another argument"),
    (lambda k: dict(k, work=[np.empty((11, 11), complex)]), r"work\[0\] must be a complex128 array of a's shape"),
]


@pytest.mark.parametrize("mutate,match", BAD)
def test_bad_input_is_refused_before_any_work(rng, mutate, match):
    kw = _bad(rng)
    kw["h"] = np.full((11, 11), 3.0 + 1j)
    kw["s"] = np.full((11, 11), 5.0 - 2j)
    kw = mutate(kw)
    keep = {k: np.array(v, copy=True) for k, v in kw.items() if isinstance(v, np.ndarray)}
    args = [kw.pop(k) for k in ("a", "b", "taa", "tab", "tbb", "u")]
    with pytest.raises(ValueError, match=match):
        flapw.hs_from_coefficients(*args, **kw)
    for name, x in zip(("a", "b", "taa", "tab", "tbb", "u"), args):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, keep[name])
    for name in ("h", "s"):
        if name in keep:
            np.testing.assert_array_equal(kw[name], keep[name])


@pytest.mark.gpu
@pytest.mark.parametrize("method", flapw.METHODS)
def test_device_coefficients_equal_host(rng, method):
    import cupy
    a, b, taa, tab, tbb, u, idx = _random_case(rng, 300, 4, 9)
    h_ref, s_ref = flapw.hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=idx, method=method)
    h, s = flapw.hs_from_coefficients(cupy.asarray(a), cupy.asarray(b), taa, tab, tbb, u, t_index=idx, method=method,
                                      context=hb.Context(devices=["cuda:0"]))
    assert isinstance(h, cupy.ndarray) and isinstance(s, cupy.ndarray)
    assert _rel(h.get(), h_ref) <= 1e-12 and _rel(s.get(), s_ref) <= 1e-12
