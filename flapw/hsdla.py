"""H and S assembly at one k-point: the refined HSDLA (Algorithm 3) and the original (Algorithm 1).

Stacked operands are column-major (n·N_L) × N_G matrices (see matching.py): the paper's A, B, X.
Atoms are processed in batches (``batch_atoms``, or as many as ``max_temp_bytes`` allows); each batch
adds its share to H and S with beta = 1, so a batch of all atoms is exactly the paper's algorithm and
smaller batches bound memory at the same flop count.  Each batch goes through
``flapw.hs_from_coefficients`` (flapw/coefficients.py), the public call on given coefficients.  Only the
lower triangle is accumulated; the upper one is filled at the end unless ``lower_only``.

Memory: ``build_bytes`` estimates what a build holds at its peak; a host build larger than the host's
available memory is refused before anything is allocated. ``build_hs_with_fallback`` repeats a build that
ran out of memory with half the atoms per batch, and a device build that fails even with one atom per
batch on host arrays.
"""
import gc
import logging
import sys

import numpy as np

import hybridblas as hb

from .backends import BACKENDS, PeerBackend, get_backend
from .matching import fill_coefficients, k_only_factors, phases
from .report import BuildReport, flops
from .system import System

__all__ = ["build_hs", "build_hs_with_fallback", "build_bytes", "fitting_batch", "METHODS"]

METHODS = ("refined", "original")
_C16 = 16
_INTERSTITIAL_ROWS = 1024     # rows of H and S add_interstitial fills at once
_INTERSTITIAL_BYTES = 112     # bytes per element of such a row block (index triples, Θ, H part, temporaries;
                              # traced peaks: 80-104 for NaCl and TiO2 at N_G 1529-4414)
log = logging.getLogger("flapw")


def _array_module(arrays):
    if arrays == "host":
        return np
    if arrays == "device":
        try:
            import cupy
        except ImportError:
            raise ValueError(f"arrays='device' needs CuPy, which is not installed; "
                             f"{hb.devspec.CUDA_INSTALL_HINT}") from None
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
        if (not isinstance(max_temp_bytes, (int, float, np.integer, np.floating)) or isinstance(max_temp_bytes, bool)
                or not np.isfinite(max_temp_bytes) or max_temp_bytes <= 0):
            raise ValueError(f"max_temp_bytes must be a positive number of bytes, got {max_temp_bytes!r}")
        per_atom = buffers_per_atom(method) * _C16 * cell.n_l * cell.n_g
        nb = int(max_temp_bytes // per_atom)
        if nb < 1:
            raise ValueError(f"max_temp_bytes={max_temp_bytes!r} is below one atom's buffers "
                             f"({per_atom} bytes for {method})")
        return min(nb, n_a)
    return n_a


def build_bytes(cell, method, batch_atoms, interstitial=False):
    """Bytes a build of ``cell`` holds at its peak, with ``batch_atoms`` atoms per batch: H and S, the
    k-only matching factors (two N_G x N_L per species, with Y*_lm and a temporary), and the larger of one
    batch's A/B/X (or backup) buffers and the interstitial part's row blocks (made after the buffers are
    freed). Against traced host peaks of NaCl builds at N_G 880-1862 it came 1-4 % low without the
    interstitial part (radial meshes and T are left out) and 5-45 % high with it."""
    n_g, n_l = cell.n_g, cell.n_l
    n_species = len({sp.symbol for sp in cell.structure.species})
    batch = (_C16 * buffers_per_atom(method) * n_l + 24) * batch_atoms * n_g     # + the batch's phases
    rows = _INTERSTITIAL_BYTES * min(n_g, _INTERSTITIAL_ROWS) * n_g if interstitial else 0
    return _C16 * n_g * (2 * n_g + (2 * n_species + 2) * n_l) + max(batch, rows)


def memory_breakdown(cell, method, batch_atoms):
    """'H and S 25.3 GiB, A/B/X of 384 atoms 40.5 GiB': the two parts of build_bytes a user can change."""
    fmt = hb.memory.format_bytes
    names = "A/B/X" if method == "refined" else "A/B and their backups"
    atoms = f"{batch_atoms} atom{'s' if batch_atoms != 1 else ''}"
    return (f"H and S {fmt(2 * _C16 * cell.n_g ** 2)}, {names} of {atoms} "
            f"{fmt(_C16 * buffers_per_atom(method) * batch_atoms * cell.n_l * cell.n_g)}")


def fitting_batch(cell, method, batch_atoms, limit, interstitial=False):
    """The first of batch_atoms, batch_atoms // 2, ..., 1 whose build fits in ``limit`` bytes (build_bytes);
    None when not even one atom per batch does."""
    nb = batch_atoms
    while nb >= 1:
        if build_bytes(cell, method, nb, interstitial) <= limit:
            return nb
        nb //= 2
    return None


def _require_host_memory(cell, method, nb, interstitial):
    """Refuse a host build whose estimate exceeds 90 % of the host's available memory, before allocating."""
    hb.memory.require(
        build_bytes(cell, method, nb, interstitial), where="host",
        what=f"the {method} build of {cell.name} at kmax={cell.kmax} (N_G={cell.n_g}: "
             f"{memory_breakdown(cell, method, nb)})",
        advice="fewer atoms per batch (batch_atoms= or max_temp_bytes=) shrink the buffers; a smaller kmax "
               "shrinks everything (N_G grows as kmax³, H and S as N_G²)")


def _check_arguments(cell, method, context, blas, arrays, flags, progress):
    """Every argument of build_hs that is not a size, checked before any work (sizes: _batch_size)."""
    if not isinstance(cell, System):
        raise TypeError(f"cell must be a flapw.System, got {type(cell).__name__} {cell!r:.80}")
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if context is not None and not isinstance(context, hb.Context):
        raise TypeError(f"context must be a hybridblas.Context or None, got {type(context).__name__} {context!r}")
    if isinstance(blas, str):
        if blas not in BACKENDS:
            raise ValueError(f"blas must be one of {BACKENDS} or a backend object, got {blas!r}")
    elif not all(callable(getattr(blas, f, None)) for f in ("herk", "her2k", "herkx", "gemm")):
        raise TypeError(f"blas must be one of {BACKENDS} or a backend with herk, her2k, herkx and gemm "
                        f"(flapw.backends.get_backend), got {type(blas).__name__} {blas!r:.80}")
    if context is not None and blas != "hybridblas":
        raise ValueError(f"context= reaches hybridblas's calls only; blas={blas!r} takes none (its devices "
                         f"come from flapw.backends.get_backend)")
    if arrays == "device" and (blas == "cublasxt" or isinstance(blas, PeerBackend)):
        raise ValueError(f"arrays='device' needs blas='hybridblas': cuBLASXt takes host arrays, got blas={blas!r}")
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a function (batch, batches) or None, got {type(progress).__name__} "
                        f"{progress!r}")


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
    progress:       called as progress(batch, batches) after each batch of atoms.

    Every argument is checked before any work (ValueError or TypeError naming it and its value); a host
    build whose estimate (build_bytes) exceeds the host's available memory raises
    hybridblas.InsufficientMemory before anything is allocated.
    """
    _check_arguments(cell, method, context, blas, arrays, dict(interstitial=interstitial, lower_only=lower_only,
                     return_report=return_report), progress)
    xp = _array_module(arrays)
    nb = _batch_size(cell, method, batch_atoms, max_temp_bytes)
    if xp is np:
        _require_host_memory(cell, method, nb, interstitial)
    backend = get_backend(blas, context) if isinstance(blas, str) else blas
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
    if interstitial and n_g:       # an empty basis has no plane-wave part to add
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


def build_hs_with_fallback(cell, method="refined", context=None, interstitial=False, *, batch_atoms=None,
                           max_temp_bytes=None, lower_only=False, blas="hybridblas", arrays="host",
                           return_report=False, progress=None, out_of_memory=(MemoryError,)):
    """build_hs that outlives running out of memory, with the same H and S.

    An attempt that raises one of ``out_of_memory`` (default MemoryError, which covers CuPy's
    OutOfMemoryError and hybridblas's "GPU memory exhausted") is repeated with half the atoms per batch
    (less A/B/X memory, the same flops); a device build that fails even with one atom per batch is built
    once more on host arrays, with the largest halving of the first batch that the host's memory holds.
    Each retry logs one line on the 'flapw' logger. The estimate's refusal (hybridblas.InsufficientMemory)
    and the error of the last possible attempt propagate. Other arguments as for build_hs; after a fall
    back to the host, H and S are numpy arrays.
    """
    _check_arguments(cell, method, context, blas, arrays, dict(interstitial=interstitial, lower_only=lower_only,
                     return_report=return_report), progress)
    if not isinstance(out_of_memory, tuple) or not all(isinstance(e, type) and issubclass(e, BaseException)
                                                       for e in out_of_memory):
        raise TypeError(f"out_of_memory must be a tuple of exception types, got {out_of_memory!r}")
    first = nb = _batch_size(cell, method, batch_atoms, max_temp_bytes)
    place = arrays
    while True:
        try:
            return build_hs(cell, method, context, interstitial, batch_atoms=nb, lower_only=lower_only, blas=blas,
                            arrays=place, return_report=return_report, progress=progress)
        except hb.InsufficientMemory:
            raise
        except out_of_memory as exc:
            if nb == 1 and place != "device":
                raise
            why = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        _release_memory()          # the failed attempt's arrays, now that its traceback is gone
        where = "GPU" if place == "device" else "host"
        if nb > 1:
            log.info("%s out of memory with %d atoms per batch (%s); retrying with %d", where, nb, why, nb // 2)
            nb //= 2
        else:
            limit = 0.9 * hb.memory.host_available()
            place, nb = "host", fitting_batch(cell, method, first, limit, interstitial) or 1
            log.info("GPU out of memory even with 1 atom per batch (%s); building on host arrays with %d atoms "
                     "per batch", why, nb)


def _release_memory():
    """Collect the arrays a failed attempt left in reference cycles and hand CuPy's idle blocks back."""
    gc.collect()
    cupy = sys.modules.get("cupy")      # only when a device build imported it
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()


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
