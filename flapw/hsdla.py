"""H and S assembly at one k-point: the refined HSDLA (Algorithm 3) and the original (Algorithm 1).

Stacked operands are column-major (n·N_L) × N_G matrices (see matching.py): the paper's A, B, X.
Atoms are processed in batches (``batch_atoms``, or as many as ``max_temp_bytes`` allows); each batch
adds its share to H and S with beta = 1, so a batch of all atoms is exactly the paper's algorithm and
smaller batches bound memory at the same flop count.  Each batch goes through
``flapw.hs_from_coefficients`` (flapw/coefficients.py), the public call on given coefficients.  Only the
lower triangle is accumulated; the upper one is filled at the end unless ``lower_only``.
"""
import numpy as np

from .backends import get_backend
from .matching import fill_coefficients, k_only_factors, phases
from .report import BuildReport, flops

__all__ = ["build_hs", "METHODS"]

METHODS = ("refined", "original")
_C16 = 16


def _array_module(arrays):
    if arrays == "host":
        return np
    if arrays == "device":
        try:
            import cupy
        except ImportError:
            raise ValueError("arrays='device' needs cupy, which is not installed") from None
        return cupy
    raise ValueError(f"arrays must be 'host' or 'device', got {arrays!r}")


def _sync(xp):
    if xp is np:
        return None
    return lambda: xp.cuda.get_current_stream().synchronize()


def buffers_per_atom(method):
    """N_L x N_G buffers a batch holds per atom: A, B, X (refined) or A, B, Z, UB (original)."""
    return 3 if method == "refined" else 4


def _batch_size(cell, method, batch_atoms, max_temp_bytes):
    n_a = cell.n_atoms
    if batch_atoms is not None:
        if not isinstance(batch_atoms, (int, np.integer)) or isinstance(batch_atoms, bool) or batch_atoms < 1:
            raise ValueError(f"batch_atoms must be a positive integer, got {batch_atoms!r}")
        return min(int(batch_atoms), n_a)
    if max_temp_bytes is not None:
        per_atom = buffers_per_atom(method) * _C16 * cell.n_l * cell.n_g
        nb = int(max_temp_bytes // per_atom)
        if nb < 1:
            raise ValueError(f"max_temp_bytes={max_temp_bytes!r} is below one atom's buffers "
                             f"({per_atom} bytes for {method})")
        return min(nb, n_a)
    return n_a


def hermitian_fill(c, xp=np, block=None):
    """Copy the conjugate of the strict lower triangle into the upper one, in place; real diagonal.

    On the host the transposing copy goes tile by tile (128: cache-sized, 8x faster than whole panels
    at N_G = 3650), the column panels spread over the cores (one core took 6.3 s for TiO2 Kmax 4.0's H
    and S). On a GPU the rest of each 2048-wide column panel is one cuBLAS geam (Fortran-ordered arrays;
    others take the strided copy).
    """
    n = c.shape[0]
    if xp is np:
        tile = block or 128
        _on_host_cores([(j0, min(n, j0 + tile)) for j0 in range(0, n, tile)],
                       lambda panel: _fill_host_panel(c, *panel, tile))
    else:
        _fill_on_gpu(c, xp, block or 2048)
    idx = xp.arange(n)
    c[idx, idx] = c[idx, idx].real
    return c


def _fill_host_panel(c, j0, j1, tile):
    """Diagonal block j0:j1, then the upper rows j0:j1 right of it from the lower column panel. Panels
    can run at once: each writes only its own rows of the upper triangle and reads only its diagonal
    block and strictly lower blocks, which no panel writes."""
    d = c[j0:j1, j0:j1]
    c[j0:j1, j0:j1] = np.tril(d) + np.tril(d, -1).conj().T
    for i0 in range(j1, c.shape[0], tile):
        i1 = min(c.shape[0], i0 + tile)
        c[j0:j1, i0:i1] = c[i0:i1, j0:j1].conj().T


def _fill_on_gpu(c, xp, tile):
    from hybridblas.cublas import conj_transpose_into
    n = c.shape[0]
    for j0 in range(0, n, tile):
        j1 = min(n, j0 + tile)
        d = c[j0:j1, j0:j1]
        c[j0:j1, j0:j1] = xp.tril(d) + xp.tril(d, -1).conj().T
        if j1 < n and c.flags.f_contiguous:
            # the rest of the column panel in one cuBLAS geam: a strided conj().T copy ran at ~1/100
            # of the memory bandwidth (0.66 s of an 8.2 s TiO2 Kmax 4.0 build on two H200s)
            conj_transpose_into(c[j0:j1, j1:n], c[j1:n, j0:j1])
            continue
        if j1 < n:       # the rest of the column panel in one copy
            c[j0:j1, j1:n] = c[j1:n, j0:j1].conj().T


def build_hs(cell, method="refined", context=None, interstitial=False, *, batch_atoms=None,
             max_temp_bytes=None, lower_only=False, blas="hybridblas", arrays="host",
             return_report=False, progress=None):
    """H and S (N_G × N_G, complex, Hermitian) of ``cell`` at its k-point.

    method:         "refined" (Algorithm 3: zherk, zherk, zher2k, zherkx; one temporary buffer X)
                    or "original" (Algorithm 1: Z and UB work buffers, Cholesky of T^AA, zgemm).
    context:        a hybridblas.Context passed to every large product (None: hybridblas's default).
    interstitial:   add the plane-wave parts (needed for eigenvalues); the MT parts only otherwise.
    batch_atoms / max_temp_bytes: bound the A, B, X buffers by processing atoms in batches.
    lower_only:     leave the upper triangle unfilled (it holds junk for "original").
    blas:           "hybridblas", "cublasxt" (hybridblas.peers.cublasxt_* on GPU 0; see backends.py), or a
                    backend object from flapw.backends.get_backend (e.g. cuBLASXt on chosen GPUs).
    arrays:         "host" (numpy) or "device" (cupy: A, B, X, H, S on the current GPU).
    return_report:  also return a BuildReport (per-stage seconds, flops, peak temporary bytes).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    xp = _array_module(arrays)
    backend = get_backend(blas, context) if isinstance(blas, str) else blas
    nb = _batch_size(cell, method, batch_atoms, max_temp_bytes)
    n_g, n_l, n_a = cell.n_g, cell.n_l, cell.n_atoms
    rep = BuildReport(method=method, system=cell.name, n_atoms=n_a, n_g=n_g, n_l=n_l, batch_atoms=nb,
                      backend=backend.name)
    sync = _sync(xp)

    # k-independent data (computed on first use, then cached on the crystal)
    tmats, radial = cell.tmats, cell.radial
    rep.setup = cell.setup_seconds()
    cls_of = cell.atom_class_index()
    species = sorted(radial)
    sp_of = np.array([species.index(sp.symbol) for sp in cell.structure.species])

    with rep.stage("matching (k-only)"):
        basis = cell.basis
        # under MPI a rank's context holds its share of the node's cores (cpu_threads)
        threads = getattr(getattr(backend, "context", None), "cpu_threads", None)
        fac = k_only_factors(basis, [radial[s] for s in species], cell.lmax, cell.omega, threads=threads)
        fa = [xp.asarray(f[0]) for f in fac]
        fb = [xp.asarray(f[1]) for f in fac]
        del fac
    from .coefficients import hs_from_coefficients     # the per-batch assembly (it builds on this module)
    taa, tab, tbb, u = (np.stack([getattr(t, f) for t in tmats]) for f in ("taa", "tab", "tbb", "udot_norm_lm"))

    h = xp.zeros((n_g, n_g), complex, order="F")
    s = xp.zeros((n_g, n_g), complex, order="F")
    rep.hs_bytes = 2 * _C16 * n_g * n_g
    width = nb * n_l
    # flat buffers: a batch of any width is a contiguous (n_g, w) view, i.e. a column-major (w, n_g) matrix
    a_buf = xp.empty(n_g * width, complex)
    b_buf = xp.empty(n_g * width, complex)
    work = {"X": xp.empty(n_g * width, complex)} if method == "refined" else \
        {"Z": xp.empty(n_g * width, complex), "UB": xp.empty(n_g * width, complex)}
    rep.note_buffers(A=a_buf.nbytes, B=b_buf.nbytes, **{k: v.nbytes for k, v in work.items()})

    batches = [list(range(i, min(n_a, i + nb))) for i in range(0, n_a, nb)]
    for ib, atoms in enumerate(batches):
        w = len(atoms) * n_l
        view = lambda buf: buf[:n_g * w].reshape(n_g, w)     # noqa: E731
        a, b = view(a_buf), view(b_buf)
        with rep.stage("matching A, B", sync=sync):
            ph = phases(basis, cell.structure.positions[atoms], xp)
            each = _on_host_cores if xp is np else None
            fill_coefficients(a, fa, ph, sp_of[atoms], n_l, each)
            fill_coefficients(b, fb, ph, sp_of[atoms], n_l, each)
        hs_from_coefficients(a, b, taa, tab, tbb, u, t_index=cls_of[atoms], method=method, blas=backend, h=h, s=s,
                             accumulate=ib > 0, lower_only=True, work=[view(buf) for buf in work.values()], report=rep)
        if progress:
            progress(ib + 1, len(batches))
    del a_buf, b_buf, work
    if interstitial:
        from .interstitial import add_interstitial
        with rep.stage("interstitial", sync=sync):
            hermitian_fill(h, xp)
            hermitian_fill(s, xp)
            add_interstitial(h, s, cell, xp)
    if not lower_only:
        with rep.stage("hermitian fill", sync=sync):
            hermitian_fill(h, xp)
            hermitian_fill(s, xp)
    return (h, s, rep) if return_report else (h, s)


def _small(rep, name, n_g, n_l, n_atoms, sync):
    return rep.stage(name, flops("zgemm", n_l, n_l, m=n_g) * n_atoms, sync=sync)


def _refined_batch(rep, be, atoms, cls_of, dev_t, a, b, h, s, beta, n_l, n_g, w, sync, xp, x):
    """Algorithm 3 on one batch: S += AᴴA + (UB)ᴴ(UB); H += XᴴB + BᴴX (X = T^BA A + ½T^BB B); H += Aᴴ(T^AA A)."""
    with rep.stage("zherk S=AᴴA", flops("zherk", n_g, w), blas=True, sync=sync):
        be.herk(1.0, a.T, beta, s)
    with rep.stage("scale X=UB", 2.0 * n_g * w, sync=sync):
        _each_atom(xp, atoms, n_l, lambda sl, at: xp.multiply(b[:, sl], dev_t[cls_of[at]]["u"][None, :],
                                                              out=x[:, sl]))
    with rep.stage("zherk S+=XᴴX", flops("zherk", n_g, w), blas=True, sync=sync):
        be.herk(1.0, x.T, 1.0, s)
    with _small(rep, "T·A, T·B (zgemm)", n_g, n_l, 2 * len(atoms), sync):
        _ta_plus_half_tb(xp, x, a, b, atoms, cls_of, dev_t, n_l)
    with rep.stage("zher2k H=XᴴB+BᴴX", flops("zher2k", n_g, w), blas=True, sync=sync):
        be.her2k(1.0, x.T, b.T, beta, h)
    with _small(rep, "T^AA·A (zgemm)", n_g, n_l, len(atoms), sync):
        def taa(sl, at):
            x[:, sl] = a[:, sl] @ dev_t[cls_of[at]]["taa_t"]
        _each_atom(xp, atoms, n_l, taa)
    with rep.stage("zherkx H+=AᴴX", flops("zherkx", n_g, w), blas=True, sync=sync):
        be.herkx(1.0, a.T, x.T, 1.0, h)


def _ta_plus_half_tb(xp, out, a, b, atoms, cls_of, dev_t, n_l):
    """Per atom: out = T^BA A + ½ T^BB B (column blocks of the stacked, transposed coefficients):
    Algorithm 3's X, Algorithm 1's Z."""
    def one(sl, at):
        t = dev_t[cls_of[at]]
        out[:, sl] = a[:, sl] @ t["tba_t"] + b[:, sl] @ t["half_tbb_t"]
    _each_atom(xp, atoms, n_l, one)


def _each_atom(xp, atoms, n_l, fn):
    """fn(column slice, atom) for every atom of the batch. On the host the atoms' small products run on
    all cores, one BLAS thread each: OpenBLAS threads a single 81-wide product poorly, and numpy's
    elementwise operations use one core (TiO2 Kmax 2.5: 9.4 s of host zgemm and 1.6 s of scaling per
    k-point on 32 cores, one after the other). On a GPU they are queued in order on the stream."""
    slices = [(slice(j * n_l, (j + 1) * n_l), at) for j, at in enumerate(atoms)]
    if xp is not np:
        for sl, at in slices:
            fn(sl, at)
        return
    _on_host_cores(slices, lambda job: fn(*job))


def _on_host_cores(jobs, fn):
    """fn(job) for every job on a pool of the host's cores, one BLAS thread each (numpy's elementwise
    operations and copies release the GIL)."""
    jobs = list(jobs)
    if len(jobs) < 2:
        for job in jobs:
            fn(job)
        return
    from concurrent.futures import ThreadPoolExecutor
    from hybridblas import blas_threads
    with blas_threads.limit(1), ThreadPoolExecutor(min(len(jobs), blas_threads.available_cores())) as pool:
        list(pool.map(fn, jobs))


def _cholesky_factors(taa, xp):
    """{set: conj(C)} with T^AA = C Cᴴ (C lower), or None where T^AA is not positive definite."""
    out = {}
    for c, t in taa.items():
        try:
            out[c] = xp.asarray(np.linalg.cholesky(t).conj())
        except np.linalg.LinAlgError:
            out[c] = None
    return out


def _original_batch(rep, be, atoms, cls_of, dev_t, a, b, h, s, beta, n_l, n_g, w, sync, xp, z, ub, chol):
    """Algorithm 1 on one batch with A and B left as given: Z = T^BA A + ½T^BB B in the first work buffer
    (the paper overwrites A and restores A, B from backups; the same four buffers, no backup copies), her2k,
    S with UB in the second work buffer, then the Cholesky split: B_T, B_B in the second, the A_a of the
    atoms whose T^AA is not positive definite gathered in the first (where some T^AA are)."""
    with _small(rep, "T·A, T·B (zgemm)", n_g, n_l, 2 * len(atoms), sync):
        _ta_plus_half_tb(xp, z, a, b, atoms, cls_of, dev_t, n_l)
    with rep.stage("zher2k H=ZᴴB+BᴴZ", flops("zher2k", n_g, w), blas=True, sync=sync):
        be.her2k(1.0, z.T, b.T, beta, h)
    with rep.stage("zherk S=AᴴA", flops("zherk", n_g, w), blas=True, sync=sync):
        be.herk(1.0, a.T, beta, s)
    with rep.stage("scale UB", 2.0 * n_g * w, sync=sync):
        _each_atom(xp, atoms, n_l, lambda sl, at: xp.multiply(b[:, sl], dev_t[cls_of[at]]["u"][None, :],
                                                              out=ub[:, sl]))
    with rep.stage("zherk S+=(UB)ᴴUB", flops("zherk", n_g, w), blas=True, sync=sync):
        be.herk(1.0, ub.T, 1.0, s)
    hpd = [at for at in atoms if chol[cls_of[at]] is not None]
    other = [at for at in atoms if chol[cls_of[at]] is None]
    pos = {at: j for j, at in enumerate(atoms)}
    with rep.stage("T^AA·A (ztrmm/zhemm)", (flops("ztrmm", n_l, n_l, m=n_g) * len(hpd)
                                            + flops("zhemm", n_l, n_l, m=n_g) * len(other)), sync=sync):
        # B_T = [Cᴴ A_a] for positive definite T^AA, then B_B = [T^AA A_a], both in ub; the other atoms' A_a in z
        for i, at in enumerate(hpd + other):
            src = slice(pos[at] * n_l, (pos[at] + 1) * n_l)
            op = chol[cls_of[at]] if i < len(hpd) else dev_t[cls_of[at]]["taa_t"]
            ub[:, i * n_l:(i + 1) * n_l] = a[:, src] @ op
        if hpd:              # gather the other atoms' A_a (where no T^AA is positive definite, A is that)
            for i, at in enumerate(other):
                z[:, i * n_l:(i + 1) * n_l] = a[:, pos[at] * n_l:(pos[at] + 1) * n_l]
    a_b = z if hpd else a
    n_t, n_b = len(hpd) * n_l, len(other) * n_l
    if n_t:
        with rep.stage("zherk H+=B_TᴴB_T", flops("zherk", n_g, n_t), blas=True, sync=sync):
            be.herk(1.0, ub[:, :n_t].T, 1.0, h)
    if n_b:
        with rep.stage("zgemm H+=AᴴB_B", flops("zgemm", n_g, n_b, m=n_g), blas=True, sync=sync):
            be.gemm(1.0, a_b[:, :n_b].T, ub[:, n_t:n_t + n_b].T, 1.0, h, transa="C", transb="N")
