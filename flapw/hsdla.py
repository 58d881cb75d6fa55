"""H and S assembly at one k-point: the refined HSDLA (Algorithm 3) and the original (Algorithm 1).

Stacked operands are column-major (n·N_L) × N_G matrices (see matching.py): the paper's A, B, X.
Atoms are processed in batches (``batch_atoms``, or as many as ``max_temp_bytes`` allows), in the order of
their atom classes, so the atoms of one class are side by side in a batch; each batch adds its share to
H and S with beta = 1, so a batch of all atoms is exactly the paper's algorithm and smaller batches bound
memory at the same flop count. Only the lower triangle of H and S is computed (the BLAS calls, the
interstitial part); the upper one is filled at the end unless ``lower_only``.

Where the small per-atom work runs: where the operands A, B, X live (``operands``). On a GPU (device
arrays, and by default host arrays whose BLAS runs on GPUs) everything is queued on the current GPU's stream
(matching, X = UB, the T products as one batched product per run of atoms of one class). With host operands
it is spread over the host's cores, and when the BLAS runs on GPUs (``overlap``) it runs beside the BLAS calls
that do not read what it writes, in a fourth buffer Y:

    fill A | S = AᴴA ‖ fill B, X = UB | S += XᴴX ‖ Y = T^BA A + ½T^BB B | H = YᴴB + BᴴY ‖ X = T^AA A
           | H += AᴴX

Host H and S with the operands on a GPU: when the whole build fits on that GPU (DEVICE_SHARE of its free
memory, as for the CLI's device arrays) H and S are built there and copied into the host arrays at the end
(hybridblas.lowlevel.to_host: the lower triangles only with ``lower_only``); else they stay in host memory and
hybridblas writes C's tiles there, with the batches the GPU holds beside its tiles (OPERAND_SHARE). With the
refined method the interstitial part then comes first, and S, complete after the last batch's S += XᴴX, is
copied to the host on a second stream while the GPU computes H's last two products.

Memory: ``build_bytes`` estimates what a build holds at its peak; a host build larger than the host's
available memory is refused before anything is allocated. ``build_hs_with_fallback`` repeats a build that
ran out of memory with half the atoms per batch, and a device build that fails even with one atom per
batch on host arrays. A ``Workspace`` keeps the buffers (and H and S) from one build to the next, so that
k-points after the first allocate nothing and find their host memory already page-locked.
"""
import gc
import logging
import math
import sys

import numpy as np

import hybridblas as hb

from .backends import BACKENDS, PeerBackend, get_backend
from .interstitial import scratch_bytes, table_span
from .matching import atom_runs, fill_coefficients, k_only_factors, phases
from .report import BuildReport, GpuTimeline, flops
from .system import System

__all__ = ["build_hs", "build_hs_with_fallback", "build_bytes", "fitting_batch", "METHODS", "Workspace"]

METHODS = ("refined", "original")
_C16 = 16
TILE_ROWS = 1024              # rows of one host T product (N_L columns): its temporary stays in the caches
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


DEVICE_SHARE = 0.8            # of a GPU's free memory, at most, for a whole build there (the CLI's --arrays auto)
OPERAND_SHARE = 0.75          # of a GPU's free memory, at most, for host-array builds' operands (the rest: tiles)


def operands_place(arrays, operands, backend):
    """Where a build's A, B, X and T products live, "host" or "device": ``operands`` ("host", "device", or
    None / "auto": on the current GPU for device arrays, and for host arrays whose BLAS is hybridblas on a
    context with a GPU; else on the host)."""
    if operands not in (None, "auto", "host", "device"):
        raise ValueError(f"operands must be 'auto', 'host' or 'device', got {operands!r}")
    if arrays == "device":
        if operands == "host":
            raise ValueError("operands='host' needs arrays='host': device H and S take device operands")
        return "device"
    able = _hybridblas_on_gpu(backend)
    if operands == "device" and not able:
        why = ("its context has no GPU (or CuPy is missing)" if backend.name == "hybridblas" and
               not isinstance(backend, PeerBackend) else f"the backend is {backend.name!r}")
        raise ValueError(f"operands 'device' with host arrays needs hybridblas on a GPU, but {why}")
    if operands in ("host", "device"):
        return operands
    return "device" if able else "host"


def _hybridblas_on_gpu(backend):
    if isinstance(backend, PeerBackend) or backend.name != "hybridblas" or not _runs_on_gpu(backend):
        return False
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def _sync(xp):
    """How a build's stages are timed: on the host (numpy) by the wall clock, on a GPU by a GpuTimeline."""
    if xp is np:
        return None
    return GpuTimeline(xp)


def buffers_per_atom(method, overlap=False):
    """N_L x N_G buffers a batch holds per atom: A, B, X (refined; and Y when the host work runs beside the
    BLAS calls) or A, B, Z, UB (original)."""
    return 4 if method == "original" or overlap else 3


def _batch_size(cell, method, batch_atoms, max_temp_bytes):
    """Atoms per batch: all, or as many as ``batch_atoms`` and ``max_temp_bytes`` allow (both: the fewer)."""
    nb = n_a = cell.n_atoms
    if batch_atoms is not None:
        if not isinstance(batch_atoms, (int, np.integer)) or isinstance(batch_atoms, bool) or batch_atoms < 1:
            raise ValueError(f"batch_atoms must be a positive integer, got {batch_atoms!r}")
        nb = min(int(batch_atoms), n_a)
    if max_temp_bytes is not None:
        try:
            ok = (isinstance(max_temp_bytes, (int, float, np.integer, np.floating))
                  and not isinstance(max_temp_bytes, bool) and math.isfinite(max_temp_bytes) and max_temp_bytes > 0)
        except OverflowError:                   # an int beyond a float: as good as no bound
            ok = True
        if not ok:
            raise ValueError(f"max_temp_bytes must be a positive number of bytes, got {max_temp_bytes!r}")
        per_atom = buffers_per_atom(method) * _C16 * cell.n_l * cell.n_g
        fits = int(max_temp_bytes // per_atom) if per_atom else n_a
        if fits < 1:
            raise ValueError(f"max_temp_bytes={max_temp_bytes!r} is below one atom's buffers "
                             f"({per_atom} bytes for {method})")
        nb = min(nb, fits)
    return nb


def build_bytes(cell, method, batch_atoms, interstitial=False, *, overlap=False, on_device=False):
    """Bytes a build of ``cell`` holds at its peak, with ``batch_atoms`` atoms per batch: H and S, the k-only
    matching factors (three N_G x N_L per species: A, B and UB, with Y*_lm and a temporary), one batch's
    buffers (A, B, X, and Y with ``overlap``, or the original method's four) with its phases, and with
    ``interstitial`` the step-function table and the scratch of the interstitial part (host tiles, or
    ``on_device`` GPU blocks); the T products need no temporaries (hybridblas.gemm_batched). Against traced
    host peaks of NaCl builds at N_G 880-1862 it came 2.5 % low to 1.7 % high (radial meshes and T are left
    out)."""
    n_g, n_l = cell.n_g, cell.n_l
    n_species = len({sp.symbol for sp in cell.structure.species})
    batch = (_C16 * buffers_per_atom(method, overlap) * n_l + 24) * batch_atoms * n_g     # + the batch's phases
    fixed = _C16 * n_g * (2 * n_g + (3 * n_species + 2) * n_l)
    if not interstitial:
        return fixed + batch
    table = _C16 * int(np.prod(2 * table_span(cell.structure.lattice, cell.kmax) + 1)) + 16 * n_g
    return fixed + batch + table + scratch_bytes(n_g, on_device)


def memory_breakdown(cell, method, batch_atoms, overlap=False):
    """'H and S 25.3 GiB, A/B/X of 384 atoms 40.5 GiB': the two parts of build_bytes a user can change."""
    fmt = hb.memory.format_bytes
    names = "A/B/Z/UB" if method == "original" else "A/B/X/Y" if overlap else "A/B/X"
    atoms = f"{batch_atoms} atom{'s' if batch_atoms != 1 else ''}"
    return (f"H and S {fmt(2 * _C16 * cell.n_g ** 2)}, {names} of {atoms} "
            f"{fmt(_C16 * buffers_per_atom(method, overlap) * batch_atoms * cell.n_l * cell.n_g)}")


def fitting_batch(cell, method, batch_atoms, limit, interstitial=False, *, overlap=False, on_device=False):
    """The first of batch_atoms, batch_atoms // 2, ..., 1 whose build fits in ``limit`` bytes (build_bytes);
    None when not even one atom per batch does."""
    nb = batch_atoms
    while nb >= 1:
        if build_bytes(cell, method, nb, interstitial, overlap=overlap, on_device=on_device) <= limit:
            return nb
        nb //= 2
    return None


def _host_bytes(cell, method, nb, interstitial, overlap, on_host=True):
    """build_bytes for a host build; with the operands on a GPU (``on_host`` False), H and S and the
    interstitial part's table and host scratch only."""
    if on_host:
        return build_bytes(cell, method, nb, interstitial, overlap=overlap)
    extra = build_bytes(cell, method, 0, interstitial) - build_bytes(cell, method, 0) if interstitial else 0
    return 2 * _C16 * cell.n_g ** 2 + extra


def _require_host_memory(cell, method, nb, interstitial, overlap, held, on_host=True):
    """Refuse a host build whose estimate, less the ``held`` bytes a workspace already holds for it,
    exceeds 90 % of the host's available memory, before allocating."""
    hb.memory.require(
        max(0, _host_bytes(cell, method, nb, interstitial, overlap, on_host) - held), where="host",
        what=f"the {method} build of {cell.name} at kmax={cell.kmax} (N_G={cell.n_g}: "
             f"{memory_breakdown(cell, method, nb, overlap)})",
        advice="fewer atoms per batch (batch_atoms= or max_temp_bytes=) shrink the buffers; a smaller kmax "
               "shrinks everything (N_G grows as kmax³, H and S as N_G²)")


def _check_arguments(cell, method, context, blas, arrays, flags, progress, workspace=None, overlap=None,
                     hs_on_gpu="auto"):
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
    if workspace is not None and not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must be a flapw.Workspace or None, got {type(workspace).__name__} "
                        f"{workspace!r:.80}")
    if overlap is not None and overlap != "auto" and not isinstance(overlap, (bool, np.bool_)):
        raise TypeError(f"overlap must be True, False, 'auto' or None, got {type(overlap).__name__} {overlap!r}")
    if not (hs_on_gpu is False or (isinstance(hs_on_gpu, str) and hs_on_gpu == "auto")):
        raise ValueError(f"hs_on_gpu must be 'auto' or False, got {type(hs_on_gpu).__name__} {hs_on_gpu!r}")


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
    from hybridblas.lowlevel import conj_transpose
    n = c.shape[0]
    for j0 in range(0, n, tile):
        j1 = min(n, j0 + tile)
        d = c[j0:j1, j0:j1]
        c[j0:j1, j0:j1] = xp.tril(d) + xp.tril(d, -1).conj().T
        if j1 < n and c.flags.f_contiguous:
            # the rest of the column panel in one cuBLAS geam: a strided conj().T copy ran at ~1/100
            # of the memory bandwidth (0.66 s of an 8.2 s TiO2 Kmax 4.0 build on two H200s)
            conj_transpose(c[j0:j1, j1:n], c[j1:n, j0:j1])
            continue
        if j1 < n:       # the rest of the column panel in one copy
            c[j0:j1, j1:n] = c[j1:n, j0:j1].conj().T


class Workspace:
    """Buffers that one build after another reuses: A, B, X (Y), H, S and, for host arrays, the k-only
    matching factors (give it to build_hs as ``workspace=``). Later builds allocate nothing new up to the
    largest sizes seen, and host memory that hybridblas page-locked for the GPUs stays locked. The H and S a build returns are views of the
    workspace's buffers: the next build with the same workspace overwrites them, and their upper triangle
    holds what the last build left there when ``lower_only``. ``release()`` frees everything."""

    def __init__(self):
        self._buffers = {}

    def get(self, name, size, xp=np):
        """``size`` complex elements of buffer ``name`` (a flat view), reallocated when too small or when
        it lives elsewhere (host vs GPU)."""
        buf = self._buffers.get(name)
        if buf is None or buf.size < size or (xp is np) != isinstance(buf, np.ndarray):
            self._buffers.pop(name, None)
            del buf
            buf = self._buffers[name] = xp.zeros(max(size, 1), complex)     # zeros: never junk that is not finite
        return buf[:size]

    def reserve(self, cell, method, batch_atoms, overlap=False, xp=np, threads=None, operands="host"):
        """Allocate the buffers a build of ``cell`` with ``batch_atoms`` atoms per batch takes (build_hs's
        names and sizes) and, on the host, write every page once on all cores: the page faults of first
        use are paid here rather than inside the first build. With ``operands`` "device" (host H and S,
        operands on a GPU) only H and S, page-locked too (hybridblas.memory.page_lock: the GPU writes them by
        DMA, and the first build does not pay for locking them); the build makes its GPU buffers itself."""
        n_g = cell.n_g
        sizes = {} if operands == "device" and xp is np else dict.fromkeys(_buffer_names(method, overlap),
                                                                          n_g * batch_atoms * cell.n_l)
        sizes.update(H=n_g * n_g, S=n_g * n_g)
        bufs = [self.get(name, size, xp) for name, size in sizes.items()]
        if xp is np:
            if operands != "device":           # with the k-only factors of each species (build_hs keeps them here)
                bufs += [self.get(f"k-only {f} {sp}", n_g * cell.n_l)
                         for sp in sorted({sp.symbol for sp in cell.structure.species}) for f in "AB"]
            from hybridblas.blas_threads import available_cores
            chunk = 1 << 22
            jobs = [(b, i) for b in bufs for i in range(0, b.size, chunk)]
            hb.workers.map(lambda job: job[0][job[1]:job[1] + chunk].fill(0), jobs,
                           min(max(1, len(jobs)), threads or available_cores()))
            if operands == "device":
                for name in ("H", "S"):
                    hb.memory.page_lock(self._buffers[name])

    def drop(self, *names):
        """Free the buffers ``names`` (those it holds)."""
        for name in names:
            self._buffers.pop(name, None)

    def held_bytes(self, xp=np):
        """Bytes held in ``xp``'s memory (host for numpy)."""
        return sum(b.nbytes for b in self._buffers.values() if (xp is np) == isinstance(b, np.ndarray))

    def release(self):
        self._buffers.clear()


def _buffer_names(method, overlap):
    return ("A", "B", "X", "Y") if overlap else ("A", "B", "X") if method == "refined" else ("A", "B", "Z", "UB")


def _matrix(workspace, name, n, xp):
    if workspace is None:
        return xp.zeros((n, n), complex, order="F")
    return workspace.get(name, n * n, xp).reshape((n, n), order="F")


def _backend(blas, context):
    """The backend ``blas`` names (a string; 'cublasxt' needs a visible GPU) or is."""
    if not isinstance(blas, str):
        return blas
    backend = get_backend(blas, context)
    if blas == "cublasxt" and not hb.gpu_count():
        raise ValueError("blas='cublasxt' runs on GPUs, and none is visible (it needs CuPy and a CUDA GPU)")
    return backend


def _runs_on_gpu(backend):
    """True when the backend's large products run on a GPU (cuBLASXt; a hybridblas context with one)."""
    if isinstance(backend, PeerBackend):
        return True
    ctx = getattr(backend, "context", None)
    if ctx is None and backend.name == "hybridblas":
        ctx = hb.default_context()
    return any(getattr(d, "kind", None) == "cuda" for d in getattr(ctx, "devices", []))


def build_hs(cell, method="refined", context=None, interstitial=False, *, batch_atoms=None,
             max_temp_bytes=None, lower_only=False, blas="hybridblas", arrays="host",
             return_report=False, progress=None, workspace=None, overlap=None, operands=None, hs_on_gpu="auto",
             wait=True):
    """H and S (N_G × N_G, complex, Hermitian) of ``cell`` at its k-point.

    method:         "refined" (Algorithm 3: zherk, zherk, zher2k, zherkx; one temporary buffer X)
                    or "original" (Algorithm 1: Z and UB work buffers, Cholesky of T^AA, zgemm).
    context:        a hybridblas.Context passed to every large product (None: hybridblas's default).
    interstitial:   add the plane-wave parts (needed for eigenvalues); the MT parts only otherwise.
    batch_atoms / max_temp_bytes: bound the A, B, X buffers by processing atoms in batches.
    lower_only:     compute the lower triangle only (G' >= G, what LAPACK's and cuSOLVER's eigensolvers
                    read with uplo='L'); the upper one is then left as it was (zeros in new matrices;
                    "original" leaves partial sums there). False: both triangles (a Hermitian fill).
    blas:           "hybridblas", "cublasxt" (hybridblas.peers.cublasxt_* on GPU 0; see backends.py), or a
                    backend object from flapw.backends.get_backend (e.g. cuBLASXt on chosen GPUs).
    arrays:         "host" (numpy) or "device" (cupy: A, B, X, H, S on the current GPU).
    operands:       where A, B, X and the T products live with host arrays: "device" (the current GPU), "host",
                    or None / "auto": the device when blas is hybridblas on a context with a GPU
                    (operands_place).
    hs_on_gpu:      host arrays with the operands on a GPU: "auto" builds H and S on that GPU too when the
                    whole build fits in DEVICE_SHARE of its free memory and copies them into the host arrays at
                    the end; False (and a build that does not fit) keeps them in host memory, only C's tiles
                    crossing PCIe, with a batch of at most OPERAND_SHARE of the GPU's free memory.
    return_report:  also return a BuildReport (per-stage seconds, flops, peak temporary bytes).
    progress:       called as progress(batch, batches) after each batch of atoms (on a GPU: once the batch is
                    queued).
    workspace:      a flapw.Workspace to take the buffers and H, S from, and to leave them in for the next
                    build (the returned H and S are its buffers).
    wait:           False, with device arrays: return once the build's GPU work is queued on the current stream
                    (H and S are then ordered on that stream like any CuPy result; the host queues the next
                    k-point while this one runs); the report's seconds are read, waiting for the GPU, when first
                    asked for (BuildReport.settle). True (and any build with host H and S): return when H and S
                    are complete.
    overlap:        run the host's per-atom work beside the BLAS calls (refined, host arrays; a fourth
                    buffer). None or False: not. "auto": when the BLAS runs on a GPU and the estimate with four
                    buffers fits. Measured on two H100s (TiO2 Kmax 3.0, --devices all, host arrays): 21 s a
                    k-point beside the BLAS calls against 4.8 s after them (the host products then have the
                    cores to themselves), so it is off unless asked for.

    Every argument is checked before any work (ValueError or TypeError naming it and its value); a host
    build whose estimate (build_bytes) exceeds the host's available memory raises
    hybridblas.InsufficientMemory before anything is allocated.
    """
    _check_arguments(cell, method, context, blas, arrays, dict(interstitial=interstitial, lower_only=lower_only,
                     return_report=return_report, wait=wait), progress, workspace, overlap, hs_on_gpu)
    hxp = _array_module(arrays)                 # H and S
    nb = _batch_size(cell, method, batch_atoms, max_temp_bytes)
    backend = _backend(blas, context)
    place = operands_place(arrays, operands, backend)
    xp = _array_module(place)                   # A, B, X, the k-only factors, T
    if method != "refined" or xp is not np:
        overlap = False
    on_gpu = None          # host H and S built on the GPU (the atoms per batch that fit there), then copied
    if hxp is np:
        held = workspace.held_bytes() if workspace is not None else 0
        if overlap is None:
            overlap = False
        elif overlap == "auto":
            overlap = _runs_on_gpu(backend) and build_bytes(cell, method, nb, interstitial, overlap=True) - held \
                <= 0.9 * hb.memory.host_available()
        _require_host_memory(cell, method, nb, interstitial, bool(overlap), held, on_host=xp is np)
        if xp is not np:
            on_gpu = _gpu_holds_build(cell, method, nb, interstitial, workspace) if hs_on_gpu == "auto" else None
            if not on_gpu and workspace is not None:     # an earlier build's GPU copies of H and S: not needed
                workspace.drop("H on the GPU", "S on the GPU")
            nb = on_gpu or _device_batch(cell, method, nb, workspace)
    n_g, n_l, n_a = cell.n_g, cell.n_l, cell.n_atoms
    rep = BuildReport(method=method, system=cell.name, n_atoms=n_a, n_g=n_g, n_l=n_l, batch_atoms=nb,
                      backend=backend.name, operands=place, hs_built_on_gpu=bool(on_gpu))
    sync = _sync(xp)

    # k-independent data (computed on first use, then cached on the crystal)
    tmats, radial = cell.tmats, cell.radial
    if interstitial:
        cell.step_table
    rep.setup = cell.setup_seconds()
    cls_of = cell.atom_class_index()
    species = sorted(radial)
    sp_of = np.array([species.index(sp.symbol) for sp in cell.structure.species])
    taa, tab, tbb, u = (np.stack([getattr(t, f) for t in tmats]) for f in ("taa", "tab", "tbb", "udot_norm_lm"))
    # U·B comes from its own species factor: one group per (species, U) pair, i.e. per species
    groups = {}
    ub_of = np.array([groups.setdefault((sp_of[a], u[cls_of[a]].tobytes()), len(groups)) for a in range(n_a)],
                     dtype=int)
    group_ub = [(sp, np.frombuffer(key, float)) for sp, key in groups]

    with rep.stage("matching (k-only)", sync=sync):
        basis = cell.basis
        # under MPI a rank's context holds its share of the node's cores (cpu_threads)
        threads = getattr(getattr(backend, "context", None), "cpu_threads", None)
        def keep(name):        # GPU arrays, or a workspace's host buffers (no new host arrays to fault in)
            if workspace is not None and xp is np:
                return workspace.get(name, n_g * n_l, np).reshape(n_g, n_l)
            return xp.empty((n_g, n_l), complex)
        fac = k_only_factors(basis, [radial[s] for s in species], cell.lmax, cell.omega, threads=threads,
                             out=[(keep(f"k-only A {sp}"), keep(f"k-only B {sp}")) for sp in species])
        fa, fb = [f[0] for f in fac], [f[1] for f in fac]
        fub = [xp.multiply(fb[sp], xp.asarray(uu)[None, :], out=keep(f"k-only UB {g}"))
               for g, (sp, uu) in enumerate(group_ub)]
        del fac
        dev_t = _device_t(taa, tab, tbb, u, sorted(set(cls_of.tolist())), xp)     # the T sets, where A and B live

    h = _matrix(workspace, "H", n_g, hxp)
    s = _matrix(workspace, "S", n_g, hxp)
    early = None            # S's copy to the host, started beside H's last products (_EarlyS)
    if on_gpu:
        host_hs, hxp = (h, s), xp
        h, s = _matrix(workspace, "H on the GPU", n_g, xp), _matrix(workspace, "S on the GPU", n_g, xp)
        if method == "refined" and n_g:
            early = _EarlyS(host_hs[1], s, lower_only, xp, rep, sync)
    rep.hs_bytes = 2 * _C16 * n_g * n_g
    width = nb * n_l
    bufs = {k: (workspace.get(k, n_g * width, xp) if workspace is not None else xp.empty(n_g * width, complex))
            for k in _buffer_names(method, overlap)}
    rep.note_buffers(**{k: v.nbytes for k, v in bufs.items()})

    order = np.argsort(cls_of, kind="stable")          # the atoms of one class side by side
    batches = [order[i:i + nb] for i in range(0, n_a, nb)]
    each = _on_host_cores if xp is np else None
    pool = _HostLane() if overlap else None
    try:
        try:
            if early is not None and interstitial:        # first, so that S is complete after its last product
                with rep.stage("interstitial", sync=sync):
                    h.fill(0)
                    s.fill(0)
                    from .interstitial import add_interstitial
                    add_interstitial(h, s, cell, hxp, threads=threads)
            for ib, atoms in enumerate(batches):
                w = len(atoms) * n_l
                view = {k: v[:n_g * w].reshape(n_g, w) for k, v in bufs.items()}
                with rep.stage("matching A, B" if not overlap else "matching A", sync=sync):
                    ph = phases(basis, cell.structure.positions[atoms], xp)

                    def fill(name, factors, of, ph=ph, atoms=atoms, view=view):
                        fill_coefficients(view[name], factors, ph, of[atoms], n_l, each)
                    fill("A", fa, sp_of)
                    if not overlap:
                        fill("B", fb, sp_of)
                batch = _Batch(rep, backend, view["A"], view["B"], h, s, cls_of[atoms], dev_t,
                               ib > 0 or (early is not None and interstitial), n_l, sync, xp, pool)
                if early is not None and ib == len(batches) - 1:
                    batch.after_s = early.start
                if method == "refined":
                    fill_b = (lambda: fill("B", fb, sp_of)) if overlap else None
                    _refined_batch(batch, view["X"], lambda: fill("X", fub, ub_of), fill_b, view.get("Y"))
                else:
                    _original_batch(batch, view["Z"], view["UB"], _cholesky_factors(
                        {c: taa[c] for c in set(cls_of[atoms].tolist())}, xp))
                if progress:
                    progress(ib + 1, len(batches))
        finally:
            if pool is not None:
                pool.wait()
        bufs = view = batch = None           # without a workspace the buffers go before the interstitial part
        if interstitial and n_g and early is None:       # an empty basis has no plane-wave part to add
            from .interstitial import add_interstitial
            with rep.stage("interstitial", sync=sync):
                add_interstitial(h, s, cell, hxp, threads=threads)
        if not lower_only:
            with rep.stage("hermitian fill", sync=sync):
                hermitian_fill(h, hxp)
                if early is None:
                    hermitian_fill(s, hxp)
        if wait or hxp is np or on_gpu:
            rep.settle()                     # the GPU's work done: H and S complete, the stages' seconds known
        if on_gpu:
            with rep.stage("H, S to the host"):
                if early is not None:
                    early.wait()
                for dst, src in zip(host_hs, (h, s) if early is None else (h,)):
                    hb.lowlevel.to_host(dst, src, lower=True if lower_only else None)
            h, s = host_hs
    finally:
        if early is not None:
            early.wait(quiet=True)           # after an error too: nothing in flight into the host's S
    return (h, s, rep) if return_report else (h, s)


class _EarlyS:
    """Host S <- the GPU's S on a second stream, started once S is complete (after the last batch's
    S += XᴴX; with both triangles after S's hermitian fill), while the current stream goes on with H."""

    def __init__(self, dst, src, lower_only, xp, rep, sync):
        self.dst, self.src, self.lower_only, self.xp, self.rep, self.sync = dst, src, lower_only, xp, rep, sync
        self.pending = self.stream = None

    def start(self):
        cuda = self.xp.cuda
        if not self.lower_only:
            with self.rep.stage("hermitian fill", sync=self.sync):
                hermitian_fill(self.src, self.xp)
        ready = cuda.Event(disable_timing=True)
        ready.record(cuda.get_current_stream())
        self.stream = cuda.Stream(non_blocking=True)
        self.stream.wait_event(ready)
        with self.stream:
            self.pending = hb.lowlevel.to_host(self.dst, self.src, lower=True if self.lower_only else None,
                                               wait=False)

    def wait(self, quiet=False):
        """Until S has landed; ``quiet``: a failure is not raised (an error already on its way)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        try:
            pending.wait()
        except Exception:
            if not quiet:
                raise
            log.warning("copying S to the host after an error failed too", exc_info=True)


def _gpu_holds_build(cell, method, nb, interstitial, workspace):
    """Atoms per batch (the first of nb, nb // 2, ..., 1) for which the whole build, H and S included, takes
    at most DEVICE_SHARE of the current GPU's free memory (with what the workspace holds there); None when
    not even one atom per batch fits. Host H and S are then built there, like device arrays, and copied to the
    host at the end (the lower triangles only with lower_only): each BLAS call then reads and writes GPU
    memory, not host memory over PCIe, and the interstitial part runs on the GPU."""
    import cupy
    free = hb.memory.gpu_free(cupy.cuda.Device().id) + (workspace.held_bytes(cupy) if workspace is not None else 0)
    return fitting_batch(cell, method, nb, DEVICE_SHARE * free, interstitial, on_device=True)


def _device_batch(cell, method, nb, workspace):
    """Atoms per batch for operands on the current GPU beside host H and S: at most ``nb``, the batch's
    buffers and the k-only factors within OPERAND_SHARE of the GPU's free memory (and what the workspace
    already holds there); at least 1 (a batch that still does not fit runs out of memory, and
    build_hs_with_fallback takes over)."""
    import cupy
    free = hb.memory.gpu_free(cupy.cuda.Device().id) + (workspace.held_bytes(cupy) if workspace is not None else 0)
    fixed = build_bytes(cell, method, 0) - 2 * _C16 * cell.n_g ** 2          # build_bytes without H and S
    per_atom = build_bytes(cell, method, 1) - build_bytes(cell, method, 0)
    return max(1, min(nb, int((OPERAND_SHARE * free - fixed) // max(per_atom, 1))))


def build_hs_with_fallback(cell, method="refined", context=None, interstitial=False, *, batch_atoms=None,
                           max_temp_bytes=None, lower_only=False, blas="hybridblas", arrays="host",
                           return_report=False, progress=None, workspace=None, overlap=None, operands=None,
                           hs_on_gpu="auto", wait=True, out_of_memory=(MemoryError,)):
    """build_hs that outlives running out of memory, with the same H and S.

    An attempt that raises one of ``out_of_memory`` (default MemoryError, which covers CuPy's
    OutOfMemoryError and hybridblas's "GPU memory exhausted") is repeated with half the atoms per batch
    (less A/B/X memory, the same flops; the workspace's buffers are freed first), except that a host build
    whose H and S were being built on the GPU is first repeated with the same batch and H and S in host memory
    (hs_on_gpu=False from then on); a device build (or a host build with its operands on a GPU) that fails even
    with one atom per batch is built once more on host arrays (host operands), with the largest halving of the
    first batch that the host's memory holds. Each
    retry logs one line on the 'flapw' logger. The estimate's refusal (hybridblas.InsufficientMemory) and
    the error of the last possible attempt propagate. Other arguments as for build_hs; after a fall back to
    the host, H and S are numpy arrays.
    """
    _check_arguments(cell, method, context, blas, arrays, dict(interstitial=interstitial, lower_only=lower_only,
                     return_report=return_report, wait=wait), progress, workspace, overlap, hs_on_gpu)
    if not isinstance(out_of_memory, tuple) or not all(isinstance(e, type) and issubclass(e, BaseException)
                                                       for e in out_of_memory):
        raise TypeError(f"out_of_memory must be a tuple of exception types, got {out_of_memory!r}")
    first = nb = _batch_size(cell, method, batch_atoms, max_temp_bytes)
    place = arrays
    backend = _backend(blas, context)
    on_gpu = operands_place(arrays, operands, backend) == "device"
    while True:
        staged = (place == "host" and on_gpu and hs_on_gpu == "auto"      # build_hs's own choice, made alike
                  and _gpu_holds_build(cell, method, nb, interstitial, workspace) is not None)
        try:
            return build_hs(cell, method, None, interstitial, batch_atoms=nb,
                            lower_only=lower_only, blas=backend, arrays=place, return_report=return_report,
                            progress=progress, workspace=workspace, overlap=overlap,
                            operands="device" if on_gpu else "host", hs_on_gpu=hs_on_gpu, wait=wait)
        except hb.InsufficientMemory:
            raise
        except out_of_memory as exc:
            if nb == 1 and not on_gpu:
                raise
            why = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        if workspace is not None:
            workspace.release()
        _release_memory()          # the failed attempt's arrays, now that its traceback is gone
        where = "GPU" if on_gpu else "host"
        if staged:
            hs_on_gpu = False
            log.info("GPU out of memory building H and S there with %d atoms per batch (%s); retrying with H and S "
                     "in host memory", nb, why)
        elif nb > 1:
            log.info("%s out of memory with %d atoms per batch (%s); retrying with %d", where, nb, why, nb // 2)
            nb //= 2
        else:
            limit = 0.9 * hb.memory.host_available()
            place, on_gpu, nb = "host", False, fitting_batch(cell, method, first, limit, interstitial) or 1
            log.info("GPU out of memory even with 1 atom per batch (%s); building on host arrays with %d atoms "
                     "per batch", why, nb)


def _release_memory():
    """Collect the arrays a failed attempt left in reference cycles and hand CuPy's idle blocks back."""
    gc.collect()
    cupy = sys.modules.get("cupy")      # only when a device build imported it
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()


class _HostLane:
    """Host jobs run one after the other beside the GPU calls, in the order they were started."""

    def __init__(self):
        self.last = None

    def submit(self, fn):
        before = self.last

        def run():
            if before is not None:
                before.wait()
            return fn()
        self.last = hb.workers.start(run, name="flapw-host")
        return self.last

    def wait(self):
        if self.last is not None:
            self.last.wait()


class _Batch:
    """One batch's operands and where its work goes: the BLAS backend, the report, the host pool beside."""

    def __init__(self, rep, backend, a, b, h, s, t_index, dev_t, accumulate, n_l, sync, xp, pool=None):
        self.rep, self.be, self.a, self.b, self.h, self.s = rep, backend, a, b, h, s
        self.t_index, self.dev_t, self.beta = np.asarray(t_index), dev_t, 1.0 if accumulate else 0.0
        self.n_l, self.n_g, self.w, self.sync, self.xp, self.pool = n_l, a.shape[0], a.shape[1], sync, xp, pool
        self.runs = atom_runs(self.t_index)   # (j0, j1, T set) of every run of atoms with one T set
        self.after_s = None                   # called once S's last product of the build is queued

    def blas(self, name, kind, fn, k=None):
        with self.rep.stage(name, flops(kind, self.n_g, self.w if k is None else k), blas=True, sync=self.sync):
            fn()

    def small(self, name, n_products, fn):
        """The per-atom products (8 N_L² N_G flops each), in the caller's thread."""
        with self.rep.stage(name, flops("zgemm", self.n_l, self.n_l, m=self.n_g) * n_products, sync=self.sync):
            fn()

    def beside(self, name, n_products, fn):
        """Start fn on the host pool, beside the next BLAS call; its seconds are reported as overlapped."""
        def run():
            with self.rep.stage(name, flops("zgemm", self.n_l, self.n_l, m=self.n_g) * n_products, overlapped=True):
                fn()
        return self.pool.submit(run)

    def join(self, job):
        """Wait for a job started beside a BLAS call; the wait is what the host work failed to hide."""
        with self.rep.stage("waiting for the host", sync=self.sync):
            job.result()

    def products(self, out, terms):
        """out = Σ src @ T[key] per atom (T of the atom's set): _products on this batch."""
        _products(self.xp, out, terms, self.runs, self.dev_t, self.n_l)


def _device_t(taa, tab, tbb, u, used, xp):
    """The T sets ``used``, transposed for the stacked (N_G, N_L) blocks, where the coefficients live:
    X_a^T = A_a^T (T^BA)^T + ½ B_a^T (T^BB)^T with (T^BA)^T = conj(T^AB)."""
    return {c: dict(taa_t=xp.asarray(taa[c].T), tba_t=xp.asarray(tab[c].conj()),
                    half_tbb_t=xp.asarray(0.5 * tbb[c].T), u=xp.asarray(u[c])) for c in used}


def _products(xp, out, terms, runs, dev_t, n_l):
    """out[:, atom j] = Σ_(src, key) src[:, atom j] @ dev_t[set of j][key] for every atom (N_G x N_L blocks).

    GPU: one strided batched product per run of atoms with one T set and term (hybridblas.gemm_batched on
    the run's blocks as an (atoms, N_G, N_L) strided view, read and written in place; CuPy's matmul copied
    them to contiguous temporaries and ran at under 1 TF/s). Host: each atom on a core of its own, in tiles
    of TILE_ROWS rows written straight into out, so that the second term's temporary stays in the caches
    (whole-block temporaries doubled the memory traffic of these products)."""
    if xp is not np:
        for j0, j1, c in runs:
            o = _atom_blocks(xp, out, j0, j1, n_l)
            for i, (src, key) in enumerate(terms):
                hb.gemm_batched(1.0, _atom_blocks(xp, src, j0, j1, n_l), dev_t[c][key], 1.0 if i else 0.0, o)
        return
    set_of = {j: c for j0, j1, c in runs for j in range(j0, j1)}
    n_g = out.shape[0]

    def atom(j):
        cols = slice(j * n_l, (j + 1) * n_l)
        t = dev_t[set_of[j]]
        tmp = np.empty((min(n_g, TILE_ROWS), n_l), complex) if len(terms) > 1 else None
        for g0 in range(0, n_g, TILE_ROWS):
            g1 = min(n_g, g0 + TILE_ROWS)
            o = out[g0:g1, cols]
            np.matmul(terms[0][0][g0:g1, cols], t[terms[0][1]], out=o)
            for src, key in terms[1:]:
                np.matmul(src[g0:g1, cols], t[key], out=tmp[:g1 - g0])
                o += tmp[:g1 - g0]
    _on_host_cores(sorted(set_of), atom)


def _atom_blocks(xp, m, j0, j1, n_l):
    """Atoms j0..j1-1's column blocks of the (N_G, n·N_L) array m as an (atoms, N_G, N_L) view."""
    s0, s1 = m.strides
    return xp.lib.stride_tricks.as_strided(m[:, j0 * n_l:], shape=(j1 - j0, m.shape[0], n_l),
                                           strides=(n_l * s1, s0, s1))


def _refined_batch(bt, x, make_ub, fill_b=None, y=None):
    """Algorithm 3 on one batch: S += AᴴA + (UB)ᴴ(UB); H += ZᴴB + BᴴZ (Z = T^BA A + ½T^BB B);
    H += Aᴴ(T^AA A).

    make_ub() writes UB into x. Without y everything runs in order (Z in x). With y (the host pool
    beside the BLAS calls), fill_b() fills B beside the first zherk, Z goes to y, T^AA A to x."""
    a, b = bt.a, bt.b
    tba = [(a, "tba_t"), (b, "half_tbb_t")]
    if y is None:
        bt.blas("zherk S=AᴴA", "zherk", lambda: bt.be.herk(1.0, a.T, bt.beta, bt.s))
        with bt.rep.stage("X=UB", 2.0 * bt.n_g * bt.w, sync=bt.sync):
            make_ub()
        bt.blas("zherk S+=XᴴX", "zherk", lambda: bt.be.herk(1.0, x.T, 1.0, bt.s))
        if bt.after_s is not None:
            bt.after_s()
        bt.small("T·A, T·B (zgemm)", 2 * (bt.w // bt.n_l), lambda: bt.products(x, tba))
        bt.blas("zher2k H=XᴴB+BᴴX", "zher2k", lambda: bt.be.her2k(1.0, x.T, b.T, bt.beta, bt.h))
        bt.small("T^AA·A (zgemm)", bt.w // bt.n_l, lambda: bt.products(x, [(a, "taa_t")]))
        bt.blas("zherkx H+=AᴴX", "zherkx", lambda: bt.be.herkx(1.0, a.T, x.T, 1.0, bt.h))
        return
    job = bt.beside("matching B, X=UB", 0, lambda: (fill_b(), make_ub()))
    bt.blas("zherk S=AᴴA", "zherk", lambda: bt.be.herk(1.0, a.T, bt.beta, bt.s))
    bt.join(job)
    job = bt.beside("T·A, T·B (zgemm)", 2 * (bt.w // bt.n_l), lambda: bt.products(y, tba))
    bt.blas("zherk S+=XᴴX", "zherk", lambda: bt.be.herk(1.0, x.T, 1.0, bt.s))
    bt.join(job)
    if bt.after_s is not None:
        bt.after_s()
    job = bt.beside("T^AA·A (zgemm)", bt.w // bt.n_l, lambda: bt.products(x, [(a, "taa_t")]))
    bt.blas("zher2k H=YᴴB+BᴴY", "zher2k", lambda: bt.be.her2k(1.0, y.T, b.T, bt.beta, bt.h))
    bt.join(job)
    bt.blas("zherkx H+=AᴴX", "zherkx", lambda: bt.be.herkx(1.0, a.T, x.T, 1.0, bt.h))


def scale_ub(bt, out, u_key="u"):
    """out = U B per atom (the diagonal U of the atom's set): the X = UB of a caller's coefficients."""
    xp, n_l = bt.xp, bt.n_l
    set_of = [c for j0, j1, c in bt.runs for _ in range(j0, j1)]

    def one(j):
        cols = slice(j * n_l, (j + 1) * n_l)
        xp.multiply(bt.b[:, cols], bt.dev_t[set_of[j]][u_key][None, :], out=out[:, cols])
    if xp is np:
        _on_host_cores(range(len(set_of)), one)
    else:
        for j in range(len(set_of)):
            one(j)


def _on_host_cores(jobs, fn):
    """fn(job) for every job on a pool of the host's cores, one BLAS thread each (numpy's elementwise
    operations and copies release the GIL). OpenBLAS threads a single 81-wide product poorly, and numpy's
    elementwise operations use one core (TiO2 Kmax 2.5: 9.4 s of host zgemm and 1.6 s of scaling per
    k-point on 32 cores, one after the other)."""
    jobs = list(jobs)
    if len(jobs) < 2:
        for job in jobs:
            fn(job)
        return
    from hybridblas import blas_threads
    with blas_threads.limit(1):
        hb.workers.map(fn, jobs, min(len(jobs), blas_threads.available_cores()))


def _cholesky_factors(taa, xp):
    """{set: conj(C)} with T^AA = C Cᴴ (C lower), or None where T^AA is not positive definite."""
    out = {}
    for c, t in taa.items():
        try:
            out[c] = xp.asarray(np.linalg.cholesky(t).conj())
        except np.linalg.LinAlgError:
            out[c] = None
    return out


def _original_batch(bt, z, ub, chol):
    """Algorithm 1 on one batch with A and B left as given: Z = T^BA A + ½T^BB B in the first work buffer
    (the paper overwrites A and restores A, B from backups; the same four buffers, no backup copies), her2k,
    S with UB in the second work buffer, then the Cholesky split: B_T, B_B in the second, the A_a of the
    atoms whose T^AA is not positive definite gathered in the first (where some T^AA are)."""
    a, b, n_l, n_g = bt.a, bt.b, bt.n_l, bt.n_g
    atoms = list(range(bt.w // n_l))
    bt.small("T·A, T·B (zgemm)", 2 * len(atoms), lambda: bt.products(z, [(a, "tba_t"), (b, "half_tbb_t")]))
    bt.blas("zher2k H=ZᴴB+BᴴZ", "zher2k", lambda: bt.be.her2k(1.0, z.T, b.T, bt.beta, bt.h))
    bt.blas("zherk S=AᴴA", "zherk", lambda: bt.be.herk(1.0, a.T, bt.beta, bt.s))
    with bt.rep.stage("scale UB", 2.0 * n_g * bt.w, sync=bt.sync):
        scale_ub(bt, ub)
    bt.blas("zherk S+=(UB)ᴴUB", "zherk", lambda: bt.be.herk(1.0, ub.T, 1.0, bt.s))
    set_of = bt.t_index
    hpd = [j for j in atoms if chol[set_of[j]] is not None]
    other = [j for j in atoms if chol[set_of[j]] is None]
    with bt.rep.stage("T^AA·A (ztrmm/zhemm)", (flops("ztrmm", n_l, n_l, m=n_g) * len(hpd)
                                               + flops("zhemm", n_l, n_l, m=n_g) * len(other)), sync=bt.sync):
        # B_T = [Cᴴ A_a] for positive definite T^AA, then B_B = [T^AA A_a], both in ub; the other atoms' A_a in z
        for i, j in enumerate(hpd + other):
            op = chol[set_of[j]] if i < len(hpd) else bt.dev_t[set_of[j]]["taa_t"]
            ub[:, i * n_l:(i + 1) * n_l] = a[:, j * n_l:(j + 1) * n_l] @ op
        if hpd:              # gather the other atoms' A_a (where no T^AA is positive definite, A is that)
            for i, j in enumerate(other):
                z[:, i * n_l:(i + 1) * n_l] = a[:, j * n_l:(j + 1) * n_l]
    a_b = z if hpd else a
    n_t, n_b = len(hpd) * n_l, len(other) * n_l
    if n_t:
        bt.blas("zherk H+=B_TᴴB_T", "zherk", lambda: bt.be.herk(1.0, ub[:, :n_t].T, 1.0, bt.h), k=n_t)
    if n_b:
        with bt.rep.stage("zgemm H+=AᴴB_B", flops("zgemm", n_g, n_b, m=n_g), blas=True, sync=bt.sync):
            bt.be.gemm(1.0, a_b[:, :n_b].T, ub[:, n_t:n_t + n_b].T, 1.0, bt.h, transa="C", transb="N")
