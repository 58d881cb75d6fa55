"""Beyond one node (public: ``hybridblas.distributed``): MPI through mpi4py, NCCL through CuPy for GPU
collectives. mpi4py, CuPy and NCCL are imported only inside the functions that use them (``import
hybridblas`` imports neither), and every function works with ``comm=None`` (one process, nothing sent).

    comm = distributed.world()                          # COMM_WORLD under mpiexec with >1 rank, else None
    lo, hi = distributed.block_range(n, size, rank)     # this rank's rows
    g = distributed.gram(s[lo:hi], comm)                # S^T S over all ranks' rows, on every rank

The pattern is MFDn's: vectors are distributed by rows, a Gram matrix is a local hybridblas split-K
product over the local rows followed by one Allreduce. Arrays are numpy or cupy arrays (TypeError
otherwise); the collectives must be called by every rank of ``comm``.
"""
import threading
from numbers import Integral

import numpy as np
from hybridblas_cuda_start import MPI_VARIABLES, under_mpi

from . import workers
from .problem import array_module

__all__ = ["world", "local_rank", "block_range", "allreduce", "allgather_rows", "gather_rows_into",
           "device_collectives", "prepare_collectives", "gram", "node_context", "rank_print"]


LAUNCHER_VARIABLES = MPI_VARIABLES     # set in every rank's environment by the MPI launchers


def world():
    """mpi4py's COMM_WORLD when running under MPI with more than one rank, else None. mpi4py (0.6 s to import
    and initialise MPI on a GPU node) is imported only when an MPI launcher started this process (one of
    LAUNCHER_VARIABLES is set) or HYBRIDBLAS_MPI=1 asks for it."""
    if not under_mpi():
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


def local_rank(comm):
    """(rank, size) among the ranks that share this node."""
    if comm is None:
        return 0, 1
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def block_range(n, size, rank):
    """Rows [lo, hi) of rank ``rank`` in a balanced 1-D block distribution of n rows over ``size`` ranks."""
    for name, value, least in (("n", n, 0), ("size", size, 1), ("rank", rank, 0)):
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    if rank >= size:
        raise ValueError(f"rank must be below size={size}, got {rank}")
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def _is_cupy(x):
    return type(x).__module__.split(".")[0] == "cupy"


def allreduce(x, comm, wait=True):
    """Sum x over the ranks, in place; returns x. Host arrays through MPI, cupy arrays through NCCL
    when CuPy has it (else through host memory). wait=False leaves NCCL's sum queued on the current
    stream (work queued after it on that stream sees the sum; the host does not wait)."""
    array_module(x)
    if comm is None:
        return x
    from mpi4py import MPI
    if _is_cupy(x):
        nccl = _nccl_comm(comm, x)
        if nccl is not None:
            import cupy
            from cupy.cuda import nccl as _n
            _check_contiguous(x)
            with cupy.cuda.Device(x.device.id):
                stream = cupy.cuda.get_current_stream()
                nccl.allReduce(x.data.ptr, x.data.ptr, x.size * _reals(x), _nccl_type(_n, x), _n.NCCL_SUM,
                               stream.ptr)
                if wait:
                    stream.synchronize()
            return x
        host = x.get()
        comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
        x.set(host)
        return x
    _check_contiguous(x)
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    return x


def _check_contiguous(x):
    if not (x.flags.c_contiguous or x.flags.f_contiguous):
        raise ValueError(f"x must be contiguous (C or Fortran order) for allreduce, got shape {x.shape} "
                         f"with strides {x.strides}")


def _reals(x):
    return 2 if x.dtype.kind == "c" else 1


def _nccl_type(_n, x):
    return {4: _n.NCCL_FLOAT32, 8: _n.NCCL_FLOAT64}[x.dtype.itemsize // _reals(x)]


def device_collectives(comm, device_array):
    """True when sums and gathers of cupy arrays over ``comm`` can stay queued on the GPU (NCCL). Collective:
    the ranks agree first (a rank without NCCL makes it False for all, rather than some ranks waiting in
    NCCL's set-up), then build the communicator for the array's device."""
    if comm is None or not _is_cupy(device_array):
        return False
    from mpi4py import MPI
    if not comm.allreduce(int(_nccl_available()), op=MPI.MIN):
        return False
    return _nccl_comm(comm, device_array) is not None


def gather_rows_into(full, counts, comm):
    """Every rank's rows of ``full`` (C-contiguous, rank r's rows at sum(counts[:r]), already written there by
    that rank) onto every rank, in place: one NCCL broadcast per rank in one group, queued on the current
    stream (no padding, no concatenation, no host wait). Needs device_collectives(comm, full)."""
    array_module(full, "full")
    import cupy
    from cupy.cuda import nccl as _n
    if not full.flags.c_contiguous or full.shape[0] != sum(counts):
        raise ValueError(f"gather_rows_into: full {full.shape} (C-contiguous: {full.flags.c_contiguous}) "
                         f"against row counts {counts}")
    nccl = _nccl_comm(comm, full)
    row = int(np.prod(full.shape[1:])) * _reals(full)
    with cupy.cuda.Device(full.device.id):
        kind, stream = _nccl_type(_n, full), cupy.cuda.get_current_stream().ptr
        start = 0
        _n.groupStart()
        try:
            for root, count in enumerate(counts):
                if count:
                    ptr = full.data.ptr + start * row * full.itemsize // _reals(full)
                    nccl.broadcast(ptr, ptr, count * row, kind, root, stream)
                start += count
        finally:
            _n.groupEnd()
    return full


_NCCL = {}                 # (id(comm), device) -> (comm, NCCL communicator)
_NCCL_PENDING = {}         # (id(comm), device) -> threading.Event of a communicator being made in the background
_NCCL_FAILED = {}          # (id(comm), device) -> the exception its making raised
_NCCL_LOCK = threading.Lock()


def prepare_collectives(comm, device):
    """Start making the NCCL communicator of ``comm`` for GPU ``device`` (an index; None on a rank without a
    GPU) on a background thread, so that NCCL's set-up (about a second on a GPU node) overlaps the caller's
    work; the first collective on that device waits for it (and raises what its making raised). Collective:
    every rank of ``comm`` calls it at the same point of its sequence of collectives; the ranks agree first,
    and a rank without a GPU or without NCCL makes it do nothing on every rank. Returns the thread, or None."""
    if comm is None:
        return None
    if device is not None and (isinstance(device, bool) or not isinstance(device, Integral) or device < 0):
        raise ValueError(f"device must be a GPU index or None, got {device!r}")
    from mpi4py import MPI
    able = device is not None and _nccl_available()
    if not comm.allreduce(int(able), op=MPI.MIN):
        return None
    import cupy
    from cupy.cuda import nccl
    key = (id(comm), int(device))
    with _NCCL_LOCK:
        entry = _NCCL.get(key)
        ready = (entry is not None and entry[0] is comm) or key in _NCCL_PENDING
    if comm.allreduce(int(ready), op=MPI.MAX):      # some rank has it or is making it: nothing to start
        return None
    uid = comm.bcast(nccl.get_unique_id() if comm.Get_rank() == 0 else None, root=0)
    size, rank, done = comm.Get_size(), comm.Get_rank(), threading.Event()
    with _NCCL_LOCK:
        _NCCL_PENDING[key] = done

    def make():
        try:
            with cupy.cuda.Device(int(device)):
                made = nccl.NcclCommunicator(size, uid, rank)
                _connect(made, size)
            with _NCCL_LOCK:
                _NCCL[key] = (comm, made)
        except Exception as exc:          # raised by the first collective that needs the communicator
            with _NCCL_LOCK:
                _NCCL_FAILED[key] = exc
        finally:
            with _NCCL_LOCK:
                _NCCL_PENDING.pop(key).set()
    return workers.start(make, name="nccl-setup")


def _connect(made, size):
    """One small sum and one broadcast from each rank on a new communicator, on a stream of their own: NCCL
    connects its rings at a communicator's first collectives (0.5-1 s between two GPUs of a node), which this
    moves onto prepare_collectives' thread. Every rank runs the same sequence, before anyone else can use the
    communicator (its first user waits for prepare_collectives' thread)."""
    import cupy
    from cupy.cuda import nccl as _n
    stream = cupy.cuda.Stream(non_blocking=True)
    buf = cupy.zeros(1 << 16, dtype=cupy.float64)       # 512 KiB: past the small-message protocol as well
    for count in (1, buf.size):
        made.allReduce(buf.data.ptr, buf.data.ptr, count, _n.NCCL_FLOAT64, _n.NCCL_SUM, stream.ptr)
    _n.groupStart()
    try:
        for root in range(size):
            made.broadcast(buf.data.ptr, buf.data.ptr, 1, _n.NCCL_FLOAT64, root, stream.ptr)
    finally:
        _n.groupEnd()
    stream.synchronize()


def _nccl_available():
    try:
        from cupy.cuda import nccl
    except ImportError:
        return False
    return bool(nccl.available)


def _nccl_comm(comm, x):
    """One NCCL communicator per MPI communicator and device (x's), built from an id broadcast over MPI."""
    if not _nccl_available():
        return None
    import cupy
    from cupy.cuda import nccl
    key = (id(comm), x.device.id)
    with _NCCL_LOCK:
        waiting = _NCCL_PENDING.get(key)
    if waiting is not None:                 # prepare_collectives is making it
        waiting.wait()
    with _NCCL_LOCK:
        error = _NCCL_FAILED.pop(key, None)
        if error is not None:
            raise error
        entry = _NCCL.get(key)
        if entry is None or entry[0] is not comm:
            # the entry holds the MPI communicator itself, so its id cannot be reused by another one
            uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
            uid = comm.bcast(uid, root=0)
            with cupy.cuda.Device(x.device.id):
                entry = _NCCL[key] = (comm, nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank()))
    return entry[1]


def allgather_rows(local, comm):
    """Stack every rank's row block (same column count) into the full array on every rank.

    cupy blocks go GPU to GPU through NCCL when every rank has it (gather_rows_into: one broadcast per rank,
    in place, no padding), else through host memory and MPI's Allgatherv. Collective: every rank calls it."""
    array_module(local, "local")
    if comm is None:
        return local
    counts = comm.allgather(local.shape[0])
    if device_collectives(comm, local):
        import cupy
        with cupy.cuda.Device(local.device.id):
            full = cupy.empty((sum(counts),) + local.shape[1:], dtype=local.dtype)
            lo = sum(counts[:comm.Get_rank()])
            full[lo:lo + local.shape[0]] = local
            gather_rows_into(full, counts, comm)
            cupy.cuda.get_current_stream().synchronize()
        return full
    on_gpu = _is_cupy(local)
    host = np.ascontiguousarray(local.get() if on_gpu else local)
    cols = int(np.prod(host.shape[1:]))
    out = np.empty((sum(counts),) + host.shape[1:], dtype=host.dtype)
    sizes = [c * cols for c in counts]
    offsets = [int(o) for o in np.concatenate([[0], np.cumsum(sizes)[:-1]])]
    comm.Allgatherv(host, [out, (sizes, offsets)])
    if on_gpu:
        import cupy
        return cupy.asarray(out)
    return out


def gram(s_local, comm, *, other=None, context=None):
    """Lower triangle of Sᵀ·S (or Sᵀ·other) for S distributed by rows: local split-K product + Allreduce.

    Complex data gets Sᴴ·S. The result is full-size on every rank (Fortran order).
    """
    import hybridblas as hb
    complex_ = s_local.dtype.kind == "c"
    if other is None:
        c = (hb.herk if complex_ else hb.syrk)(1.0, s_local, trans="C" if complex_ else "T", context=context)
    else:
        c = hb.gemmt(1.0, s_local, other, transa="C" if complex_ else "T", context=context)
    return allreduce(c, comm)


def node_context(comm, devices="all", **kwargs):
    """A hybridblas Context for this rank: its share of the node's GPUs (local rank -> device) and cores.
    ``devices``: "all", "gpu" or "cpu"; ``kwargs`` go to Context (cpu_threads defaults to the rank's share).
    Where the calling thread has no current GPU, the rank's first GPU becomes current first (console.use_first_gpu),
    so that device switches (the Context's own included) come back to it, not to device 0, where they would make a
    CUDA context (about 500 MiB) on a GPU that is not the rank's (rank 0's, for rank 1 of two)."""
    if devices not in ("all", "gpu", "cpu"):
        raise ValueError(f"devices must be 'all', 'gpu' or 'cpu', got {devices!r}")
    import hybridblas as hb
    from .blas_threads import available_cores
    from .console import use_first_gpu
    from .devspec import gpu_count
    lrank, lsize = local_rank(comm)
    n_gpu = gpu_count() if devices in ("all", "gpu") else 0
    specs = []
    if devices in ("all", "cpu"):
        specs.append("cpu")
    if n_gpu:
        mine = [g for g in range(n_gpu) if g % lsize == lrank] or [lrank % n_gpu]
        specs += [f"cuda:{g}" for g in mine]
        use_first_gpu(mine)
    if not specs:
        specs = ["cpu"]
    kwargs.setdefault("cpu_threads", max(1, available_cores() // lsize))
    return hb.Context(devices=specs, **kwargs)


def rank_print(comm, *args, **kwargs):
    """print on rank 0 only."""
    if comm is None or comm.Get_rank() == 0:
        print(*args, **kwargs)
