"""Single BLAS calls on strided blocks, for hot loops (public: ``hybridblas.lowlevel``).

A hybrid routine (``hb.gemm`` ...) plans tiles over the devices and checks overlaps: 130-275 µs of host
time per call on one GPU. The functions here are one BLAS call each on the caller's arrays as they lie,
with no planning, no threads, no copies and no memory queries (``to_host``, a copy, page-locks its target and
uses the host copy threads); the checks are of types, dtypes, shapes and layouts only (TypeError / ValueError
naming the argument and its value, before any call).

    host_gemm(out, a, b, beta=0.0, alpha=1.0)     out <- alpha a b + beta out          numpy; scipy's BLAS
    host_trmm_right(v, t, lower=False)            v <- v t in place, t triangular    numpy; scipy's BLAS
    device_gemm(out, a, b, beta=0.0, alpha=1.0)   out <- alpha a b + beta out          cupy; cuBLAS
    conj_transpose(dst, src)                      dst <- src^H (src^T for real data)   cupy; cuBLAS geam
    to_host(dst, src, lower=None, wait=True)      numpy dst <- cupy src, or one triangle of it, by DMA
    grams(s, hs=None, *, staged=True)             [s^T hs, s^T s] summed in double     cupy; hybridblas's kernels
    grams_preferred(s, hs=None)                   whether grams is the faster way      no GPU work
    cuda_tile_helpers()                           CUDA text: async row copies into shared memory, for kernels
    prepare_kernels(dtype, devices, ...)          compile hybridblas's own CUDA kernels ahead, in the background

Every matrix is 2-D with a unit stride along its rows or its columns and a leading dimension (a column
range of a row-major buffer qualifies, as does any C- or Fortran-ordered array); all share one dtype of
float32, float64, complex64, complex128. The output must not share memory with an input: that is not
checked (disjoint blocks of one buffer are the common case here, and an exact test costs more than the
call). Host calls run scipy's BLAS through ctypes with the GIL released, on the calling thread; device
calls run on CuPy's current device and stream, where every array must live, and return without waiting.

``grams`` is the tall-skinny exception to "one BLAS call": both Gram matrices of a tall row-major block S
(n x k, k <= 32, float32 or float64) and of H S in one pass of hybridblas's own kernels, summed in double
(for float32 blocks too), where a gemmt and a syrk read S twice and take 130-275 us of host time each.
"""
import numpy as np

from . import cublas, host_blas
from .devices import cuda_compile, cuda_grams
from .problem import SUPPORTED_DTYPES, Operand, _check_scalar, is_column_major, leading_dim

__all__ = ["host_gemm", "host_trmm_right", "device_gemm", "conj_transpose", "to_host", "grams",
           "grams_preferred", "cuda_tile_helpers", "prepare_kernels"]


def _check(arrays, device):
    """TypeError / ValueError unless ``arrays`` ({name: array}) are 2-D numpy (cupy with ``device``) arrays
    of one supported dtype, each readable by BLAS as it lies (and on the current GPU with ``device``)."""
    dtype = None
    for name, x in arrays.items():
        ok = type(x).__module__.split(".")[0] == "cupy" if device else isinstance(x, np.ndarray)
        if not ok:
            raise TypeError(f"{name} must be a {'cupy' if device else 'numpy'} array, got {type(x).__name__} "
                            f"{x!r:.60}")
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {x.shape}")
        if dtype is None:
            dtype = x.dtype
            if dtype not in SUPPORTED_DTYPES:
                raise TypeError(f"{name} has dtype {dtype}; supported: float32, float64, complex64, complex128")
        elif x.dtype != dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, unlike {next(iter(arrays))} ({dtype}): one dtype for all")
        if x.size and not (is_column_major(x) or is_column_major(x.T)):      # an empty one is never read
            raise ValueError(f"{name} needs a unit stride along its rows or its columns and a leading dimension, "
                             f"got shape {x.shape} with strides {x.strides}")
    if device:
        import cupy
        current = cupy.cuda.Device().id
        for name, x in arrays.items():
            if x.device.id != current:
                raise ValueError(f"{name} lives on GPU {x.device.id}, not on the current device {current}")


def _operand(x):
    """x as a BLAS operand: a column-major base and an op (x itself, or the transpose of x^T)."""
    return Operand(x, 0) if is_column_major(x) else Operand(x.T, 1)


def _gemm_problem(out, a, b, beta, alpha):
    """Checked (c, alpha, x, y, beta) for one column-major gemm c <- alpha op(x) op(y) + beta c, or None when
    there is nothing to multiply (then ``out`` is already scaled). A row-major ``out`` is computed as
    out^T = b^T a^T, so row-major blocks make an N, N call on their own memory."""
    if a.shape[0] != out.shape[0] or b.shape != (a.shape[1], out.shape[1]):
        raise ValueError(f"a {a.shape} times b {b.shape} does not fit out {out.shape}")
    alpha = alpha if type(alpha) is float else _check_scalar(alpha, "alpha", out.dtype, False)
    beta = beta if type(beta) is float else _check_scalar(beta, "beta", out.dtype, False)
    if out.size == 0:
        return None
    if a.shape[1] == 0 or alpha == 0:          # BLAS implementations differ on what they write here
        if beta == 0:
            out[...] = 0
        elif beta != 1:
            out *= beta
        return None
    if is_column_major(out.T):
        return out.T, alpha, _operand(b.T), _operand(a.T), beta
    return out, alpha, _operand(a), _operand(b), beta


def _writable(x, name):
    if not x.flags.writeable:
        raise ValueError(f"{name} must be writeable, got a read-only array")


def host_gemm(out, a, b, beta=0.0, alpha=1.0):
    """out <- alpha a @ b + beta out (numpy arrays; no transposes: pass ``x.T`` views), one BLAS gemm on the
    calling thread (GIL released); ``beta = 0`` does not read ``out``. Returns ``out``."""
    _check({"out": out, "a": a, "b": b}, device=False)
    _writable(out, "out")
    problem = _gemm_problem(out, a, b, beta, alpha)
    if problem is not None:
        host_blas.gemm(*problem)
    return out


def host_trmm_right(v, t, lower=False):
    """v <- v @ t in place (numpy arrays), ``t`` square and triangular: its upper triangle (``lower`` False)
    or lower triangle is read, the other is taken as zero. One BLAS trmm on the calling thread (GIL released),
    no scratch; sizes and leading dimensions beyond 32-bit ints are an OverflowError. Returns ``v``."""
    _check({"v": v, "t": t}, device=False)
    _writable(v, "v")
    if not isinstance(lower, bool):
        raise TypeError(f"lower must be True or False, got {type(lower).__name__} {lower!r}")
    n, q = v.shape
    if t.shape != (q, q):
        raise ValueError(f"t must be {q} x {q} for v of shape {v.shape}, got {t.shape}")
    if v.size == 0:
        return v
    rows = is_column_major(v.T)            # v row-major: v^T <- t^T v^T, t on the left
    tt = _operand(t)                       # t = tt.base, or tt.base^T when tt.trans
    base = tt.base
    side, m_, n_, b = ("L", q, n, v.T) if rows else ("R", n, q, v)
    g = host_blas.Args()
    host_blas.routine(host_blas._PREFIX[v.dtype], "trmm")(
        g.char(side), g.char("L" if lower != tt.trans else "U"), g.char("T" if tt.trans != rows else "N"),
        g.char("N"), g.int(m_), g.int(n_), g.scalar(1.0, v.dtype), base.ctypes.data, g.int(leading_dim(base)),
        b.ctypes.data, g.int(leading_dim(b)))
    return v


def device_gemm(out, a, b, beta=0.0, alpha=1.0):
    """out <- alpha a @ b + beta out (cupy arrays on the current device; no transposes: pass ``x.T`` views),
    one cuBLAS gemm queued on the current stream; returns ``out`` without waiting. ``beta = 0`` does not
    read ``out``."""
    _check({"out": out, "a": a, "b": b}, device=True)
    problem = _gemm_problem(out, a, b, beta, alpha)
    if problem is not None:
        import cupy
        cublas.gemm(cublas.handle(), cupy.cuda.get_current_stream().ptr, *problem)
    return out


def conj_transpose(dst, src):
    """dst <- src^H (src^T for real data), cupy arrays on the current device, both column-major (Fortran
    order or column ranges of it), dst m x n and src n x m: one tiled cuBLAS geam queued on the current
    stream (a strided ``conj().T`` copy runs far below the memory bandwidth). Returns ``dst``."""
    _check({"dst": dst, "src": src}, device=True)
    for name, x in (("dst", dst), ("src", src)):
        if x.size and not is_column_major(x):
            raise ValueError(f"{name} must be column-major (unit stride down its columns), got shape {x.shape} "
                             f"with strides {x.strides}")
    if src.shape != dst.shape[::-1]:
        raise ValueError(f"src must be {dst.shape[1]} x {dst.shape[0]} for dst of shape {dst.shape}, "
                         f"got {src.shape}")
    return cublas.conj_transpose_into(dst, src)


def to_host(dst, src, lower=None, wait=True):
    """dst <- src, numpy ``dst`` and cupy ``src`` (on the current device) of one shape and dtype, both
    column-major or both row-major; ``lower`` True / False copies only the lower / upper triangle of a square
    matrix, diagonal included (nothing else of ``dst`` is written). Waits for the current stream's earlier work
    on ``src`` and returns ``dst`` once the copy has landed. When the buffer ``dst`` lies in (numpy's owner of its
    memory) is 256 MiB or more, that buffer is page-locked on the first copy (once: it stays so while it lives, as
    hybridblas keeps host operands; not with $HYBRIDBLAS_PIN_HOST=off) and written by DMA at the link's rate;
    otherwise the copy goes through two page-locked buffers of at most 32 MiB (no GPU or host temporary of the
    matrix's size).

    ``wait=False``: queue the copy on the current stream and return a handle at once; its ``wait()`` finishes
    the copy (a triangle's diagonal blocks are put in place by the host there) and returns when it has landed.
    Until then ``dst`` must not be read nor ``src`` written; work queued later on other streams runs beside the
    copy. A target that is not page-locked is copied whole inside ``wait()``."""
    _check({"dst": dst}, device=False)
    _check({"src": src}, device=True)
    _writable(dst, "dst")
    if src.dtype != dst.dtype:
        raise TypeError(f"src has dtype {src.dtype}, unlike dst ({dst.dtype}): one dtype for both")
    if src.shape != dst.shape:
        raise ValueError(f"src must have dst's shape {dst.shape}, got {src.shape}")
    if lower is not None and not isinstance(lower, bool):
        raise TypeError(f"lower must be True, False or None, got {type(lower).__name__} {lower!r}")
    if lower is not None and dst.shape[0] != dst.shape[1]:
        raise ValueError(f"a triangle (lower={lower}) needs a square matrix, got shape {dst.shape}")
    if dst.size and not ((is_column_major(dst) and is_column_major(src))
                         or (is_column_major(dst.T) and is_column_major(src.T))):
        raise ValueError(f"dst and src must both be column-major or both row-major, got strides {dst.strides} "
                         f"and {src.strides}")
    if not isinstance(wait, bool):
        raise TypeError(f"wait must be True or False, got {type(wait).__name__} {wait!r}")
    from .downloads import start
    pending = start(dst, src, lower)
    if not wait:
        return pending
    pending.wait()
    return dst
def _check_grams(s, hs, staged):
    """TypeError / ValueError unless ``s`` (and ``hs``) are blocks ``grams`` takes."""
    arrays = {"s": s} if hs is None else {"s": s, "hs": hs}
    for name, x in arrays.items():
        if not cuda_grams.is_device(x):
            raise TypeError(f"{name} must be a cupy array, got {type(x).__name__} {x!r:.60}")
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {x.shape}")
        if x.dtype not in cuda_grams.DTYPES:
            raise TypeError(f"{name} has dtype {x.dtype}; grams takes float32 or float64")
    if not 1 <= s.shape[1] <= cuda_grams.KMAX:
        raise ValueError(f"s must have 1 to {cuda_grams.KMAX} columns, got shape {s.shape}")
    if hs is not None:
        if hs.dtype != s.dtype:
            raise TypeError(f"hs has dtype {hs.dtype}, unlike s ({s.dtype}): one dtype for both")
        if hs.shape != s.shape:
            raise ValueError(f"hs must have the shape of s {s.shape}, got {hs.shape}")
    for name, x in arrays.items():
        if x.shape[0] and cuda_grams.row_stride(x) is None:        # an empty block is never read
            raise ValueError(f"{name} must be row-major (unit stride along its rows, a leading dimension), got "
                             f"shape {x.shape} with strides {x.strides}")
    if not isinstance(staged, bool):
        raise TypeError(f"staged must be True or False, got {type(staged).__name__} {staged!r}")
    import cupy
    current = cupy.cuda.runtime.getDevice()
    for name, x in arrays.items():
        if x.device.id != current:
            raise ValueError(f"{name} lives on GPU {x.device.id}, not on the current device {current}")


def grams(s, hs=None, *, staged=True):
    """Both Gram matrices of a tall block in one pass, s^T hs and s^T s, summed in double and queued on the
    current stream (returns without waiting). ``s``: a row-major n x k cupy block (unit stride along its rows,
    any leading dimension: a column range of a wider row-major buffer is read in place), 1 <= k <= 32, float32
    or float64, on the current device; ``hs`` (H S, optional): the same shape, dtype and device, row-major too.

    Returns a new (k, k, 2) float64 cupy array in Fortran order on the current device (``out[:, :, g]`` a
    column-major k x k matrix): ``out[:, :, 0]`` = s^T hs (zeros without ``hs``) and ``out[:, :, 1]`` = s^T s,
    both whole (s^T s mirrored from its lower triangle, so exactly symmetric; s^T hs entry by entry). Every
    product is formed and summed in double, also for float32 blocks, and the per-block partial sums are added
    in a fixed order: the same inputs give the same bits on the same GPU. n = 0 gives zeros. ``staged`` False
    takes the register-prefetch kernel also where the cp.async-staged one applies (rows of whole, aligned
    16-byte vectors). ``grams_preferred`` says where this is faster than hb.gemmt and hb.syrk."""
    _check_grams(s, hs, staged)
    return cuda_grams.grams(s, hs, staged)


def grams_preferred(s, hs=None):
    """Whether ``grams(s, hs)`` takes these blocks (as they lie, on the current device) and is the faster way
    to their Grams: at most 2^18 rows, or 2^20 float64 rows that the staged kernel takes (beyond, cuBLAS
    through hb.gemmt and hb.syrk takes less GPU time; below, the host's time sets the pace and this call takes
    far less of it). No GPU work, and never an exception: False for anything ``grams`` would refuse."""
    return cuda_grams.preferred(s, hs)


def cuda_tile_helpers():
    """CUDA device code for kernels that stage rows of tall blocks through shared memory, the routine
    hybridblas's Gram kernels use: needs ``T`` and ``VT`` (T's 16-byte vector type) typedef'd before it; defines
    ``VEC`` (elements of T in 16 bytes), ``shared_address(p)``, ``copy_rows_async(src, ld, r0, rows, cols, kp,
    dst)`` (rows r0.. of a row-major block into shared memory as 16-byte cp.async copies spread over the block's
    threads; cols a multiple of VEC, rows 16-byte aligned) and ``ASYNC_COMMIT()`` / ``ASYNC_WAIT(n)`` (plain
    copies and no-ops before Ampere)."""
    from .devices.cuda_tiles import TILE_HELPERS
    return TILE_HELPERS


def prepare_kernels(dtype, devices, *, emulation_bits=None, k=None):
    """Compile (or load from CuPy's on-disk kernel cache) the CUDA kernels of hybridblas's own that calls of
    ``dtype`` use on the GPUs ``devices`` (indices), in the background, so that a program can overlap the
    compilation (about a second per module with an empty cache) with its own work: the tall-skinny float32
    products summed in double, or with ``emulation_bits`` (a Context's, when it has emulation="int8") the
    float64/complex128 products emulated on INT8 tensor cores at inner dimension ``k``; for float32 and
    float64 the kernels of ``grams``; and for float64 and complex128 the kernel that stores the diagonal blocks
    of a band call's C into page-locked host memory (devices.cuda_tri_store). Each module compiles on a thread
    of its own, the devices one after the other. Returns the background work (``join()`` waits for all of it),
    or None when there is nothing to do."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be one of float32, float64, complex64, complex128, got {dtype}")
    devices = list(devices)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in devices):
        raise ValueError(f"devices must be GPU indices (non-negative integers), got {devices!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if not devices:
        return None
    if emulation_bits is not None:
        if isinstance(emulation_bits, bool) or not isinstance(emulation_bits, (int, np.integer)) \
                or not 8 <= emulation_bits <= 62:
            raise ValueError(f"emulation_bits must be an integer in 8..62 (or None), got {emulation_bits!r}")
        if k is None:
            raise ValueError("k must be a positive integer with emulation_bits, got None")
    import cupy
    from .devices import cuda_ozaki, cuda_skinny, cuda_tri_store
    if emulation_bits is not None and dtype in cuda_ozaki.EMULATED:
        products = cuda_ozaki.prepare(cupy, dtype, devices, int(emulation_bits), int(k))
    else:
        products = cuda_skinny.prepare(cupy, dtype, devices)
    stores = cuda_tri_store.prepare(cupy, devices) if dtype in (np.dtype(np.float64), np.dtype(np.complex128)) \
        else None
    return cuda_compile.together(products, cuda_grams.prepare(cupy, dtype, devices), stores)
