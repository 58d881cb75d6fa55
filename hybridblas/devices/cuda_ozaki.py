"""Float64 and complex128 products on INT8 tensor cores, for one GPU: the Ozaki scheme II (hybridblas.ozaki).

A backend (``Backend``) for the tiles of a call: where a block is large enough, ``gemm`` and ``rank_k`` run
as exact INT8 x INT8 -> INT32 products of residues, else as cuBLAS's own FP64 routines.

One block of C = op(A) op(B) (m x n, inner dimension k) goes in four steps on the run's compute stream:

1. Scaling. One power of two per row of op(A) and per column of op(B), from its largest |entry| (for complex
   data the larger of |re| and |im|): ``bits`` bits are kept (hybridblas.ozaki.bits_for). A row or column
   holding an infinity or NaN is marked, and its entries of C come out NaN.
2. Residues. The scaled integers (exact in int64) give balanced residues in [-128, 127], one int8 plane per
   modulus (three for complex data: re, im and re + im, for Karatsuba's three products), laid out k-contiguous
   (rows of op(A), columns of op(B)): the "TN" form in which cuBLAS runs INT8 products on the tensor cores
   (10x the throughput of the other layouts on an H200). k is padded to a multiple of 16 with zeros.
3. Products. cublasGemmEx, INT8 in, INT32 out, exact for k below 2^17 (longer k goes in chunks whose sums are
   reduced modulo p and added); each product is reduced modulo its p at once into a uint8 plane.
4. Reconstruction. One kernel per block: Garner's mixed-radix digits of each entry, its value (the innermost
   digits in int64, the outer ones in double-double), the scaling undone, then alpha, beta and the triangle.
   The value is the one hybridblas.ozaki.reconstruct gives on the host, bit for bit.

Residues are made once per group of moduli for the rows of a panel of C (all of C when its reduced planes fit),
so each operand is read once per group. Working memory, all taken before the first write into C: a panel's reduced
planes (one byte per entry of C, modulus and part) and the residue planes of a group of moduli (a byte per entry of
the operands, modulus and part), each within WORK_BYTES and a quarter of the GPU's spare memory (or of the run's
limit), and two INT32 product buffers of one block (at most SUB x SUB per part).
"""
import ctypes
import threading

import numpy as np

from .. import cublas, ozaki
from . import cuda_compile

SUB = 8192                 # output blocks at most SUB x SUB (INT8 products of 8192^2 x k run near peak)
STRIP = 2048               # a triangle goes in column strips this wide (waste: half a strip's square)
PANEL_MIN = 256            # C too large for its reduced planes goes in panels of a multiple of this many columns
ALIGN = 16                 # k padded to this (TN INT8 products want k-contiguous rows, 16-byte aligned)
EDGE = 16                  # the INT8 products' m and n rounded up to this (rows past a block's end are computed
                           # and not read): cuBLAS 13.1 ran 6490 x 2048 (k = 29152) at 292 TOPS, 6492 at 1458
K_CHUNK = (ozaki.INT32_K - 1) // ALIGN * ALIGN   # longest exact INT32 sum of int8 products
WORK_BYTES = 16 << 30      # at most this (and a quarter of the GPU's spare memory or of the run's limit) for
                           # each of: the residue planes of a group of moduli, the reduced planes of a panel of C
# Where emulation wins (benchmarks.blas emulation, one GPU, device operands, n = k, against cuBLAS): it lost with
# zgemm at 4096 (0.95x), zherk at 8192 (0.95x) and dgemm at 12288 (0.91x) on an H200; above these thresholds zgemm
# runs at 1.56-1.86x (8192-16384), zherk 1.25-1.47x (12288-16384), dgemm 1.24x (16384) on an H200, zgemm 1.89x and
# zherk 1.43x at 16384 on an H100. Per entry of C the products cost in proportion to k and the reductions and the
# reconstruction a fixed amount, so k decides:
MIN_EDGE = 2048            # m and n at least this
MIN_K = {("c", False): 6144, ("c", True): 12288,      # (dtype kind, triangle of a diagonal block): least k
         ("f", False): 16384, ("f", True): 16384}
NONFINITE = -(1 << 30)     # row shift of a row holding an infinity or NaN
EMULATED = (np.dtype(np.float64), np.dtype(np.complex128))
_CUDA_R_8I, _CUDA_R_32I, _COMPUTE_32I, _GEMM_DEFAULT = 3, 10, 72, -1
_ONE = np.array([1], dtype=np.int32)
_ZERO = np.array([0], dtype=np.int32)

_modules = {}
_modules_lock = threading.Lock()


def wanted(problem):
    """The call asks for emulation (Context emulation="int8") and its dtype has it: float64 or complex128."""
    return bool(problem.run.emulation) and problem.dtype in EMULATED


def applies(dtype, m, n, k, alpha, triangle=False):
    """Emulate this block: float64 or complex128, m and n at least MIN_EDGE, k at least MIN_K for the dtype and
    shape (a triangle: a diagonal block of herk/her2k/syrk/syr2k), alpha not 0 (BLAS reads no operand then)."""
    dtype = np.dtype(dtype)
    return (dtype in EMULATED and min(m, n) >= MIN_EDGE and k >= MIN_K[dtype.kind, bool(triangle)]
            and alpha != 0)


class Rows:
    """Rows of a factor as the products see them: ``count`` rows of ``depth`` entries, entry (r, q) at element
    offset r * sr + q * sq from ``base``'s first element, conjugated when ``conj``."""
    __slots__ = ("base", "sr", "sq", "count", "depth", "conj")

    def __init__(self, base, sr, sq, count, depth, conj):
        self.base, self.sr, self.sq, self.count, self.depth, self.conj = base, sr, sq, count, depth, conj

    def conjugated(self):
        return Rows(self.base, self.sr, self.sq, self.count, self.depth, not self.conj)

    def ptr(self, r0):
        return self.base.data.ptr + r0 * self.sr * self.base.dtype.itemsize

    def view(self):
        """The rows as a strided cupy array (count x depth), for reductions."""
        import cupy
        item = self.base.dtype.itemsize
        return cupy.ndarray((self.count, self.depth), self.base.dtype, memptr=self.base.data,
                            strides=(self.sr * item, self.sq * item))


def _strides(base):
    item = base.dtype.itemsize
    return base.strides[0] // item, base.strides[1] // item


def rows_left(x):
    """op(x) (m x k) of an Operand as rows: row i is op(x)[i, :]."""
    from ..problem import C, T
    s0, s1 = _strides(x.base)
    if x.op & T:
        return Rows(x.base, s1, s0, x.base.shape[1], x.base.shape[0], x.op == C)
    return Rows(x.base, s0, s1, x.base.shape[0], x.base.shape[1], False)


def rows_right(y):
    """op(y) (k x n) of an Operand as rows: row j is column j of op(y)."""
    from ..problem import C, T
    s0, s1 = _strides(y.base)
    if y.op & T:
        return Rows(y.base, s0, s1, y.base.shape[0], y.base.shape[1], y.op == C)
    return Rows(y.base, s1, s0, y.base.shape[1], y.base.shape[0], False)


class Backend(cublas.Backend):
    """kernels.compute_block's backend for one GPU with emulated FP64: residue products on the INT8 tensor
    cores where ``applies``, cuBLAS's FP64 routines elsewhere. ``bits``: bits kept per row and column;
    ``limit``: bytes the run may use on the GPU (None: its spare memory)."""

    def __init__(self, handle, stream, bits, limit=None):
        super().__init__(handle, stream)
        self.bits = bits
        self.limit = limit

    def gemm(self, c, alpha, x, y, beta):
        if not applies(c.dtype, c.shape[0], c.shape[1], x.cols, alpha):
            return super().gemm(c, alpha, x, y, beta)
        product(self, c, [(alpha, beta, rows_left(x), rows_right(y), False)])

    def rank_k(self, kind, c, lower, alpha, factors, beta):
        n = c.shape[0]
        if not applies(c.dtype, n, n, factors[0].cols, alpha, triangle=True):
            return super().rank_k(kind, c, lower, alpha, factors, beta)
        her = kind.startswith("her") and c.dtype.kind == "c"
        a = rows_left(factors[0])
        b = rows_left(factors[-1])
        if kind not in ("her2k", "syr2k"):
            product(self, c, [(alpha, beta, a, b.conjugated() if her else b, her)], lower)
            return
        second = np.conj(alpha) if her else alpha
        product(self, c, [(alpha, beta, a, b.conjugated() if her else b, False),
                          (second, 1.0, b, a.conjugated() if her else a, her)], lower)


def product(backend, c, terms, lower=None):
    """c <- alpha_1 L_1 R_1^T + beta_1 c, then c += alpha_t L_t R_t^T for the other terms (alpha, beta, L, R,
    hermitian): L (m rows) and R (n rows) of one depth k; only the lower (True) or upper (False) triangle when
    ``lower`` is not None; a term with ``hermitian`` zeroes the diagonal's imaginary part. ``c`` is a
    column-major cupy view on the current GPU.

    Every buffer is taken before the first write into c, so that running out of memory leaves c as it was
    (the tile can then be computed again); the panels and terms reuse them."""
    import cupy
    m, n, k = terms[0][2].count, terms[0][3].count, terms[0][2].depth
    cplx = c.dtype.kind == "c"
    moduli = ozaki.MODULI[:ozaki.moduli_for(k, backend.bits, cplx)]
    bits = ozaki.bits_for(k, moduli, cplx)
    kernels = _kernels(cupy, len(moduli))
    budget = _budget(cupy, backend.limit)
    panels = list(_panels(m, n, lower, (2 if cplx else 1) * len(moduli), budget))
    main, side = backend.stream, _side_stream(cupy)
    with main:
        shifts = [(_shifts(cupy, left, bits), _shifts(cupy, right, bits)) for _, _, left, right, _ in terms]
        work = _Work(cupy, panels, lower, moduli, cplx, k, budget)
        failed = True
        try:
            for rows, cols in panels:
                for (alpha, beta, left, right, hermitian), shift in zip(terms, shifts):
                    panel = _Panel(cupy, kernels, backend.handle, work, rows, cols)
                    panel.products(left, right, shift, lower, side)
                    panel.rebuild(c, shift, alpha, beta, lower, hermitian)
            failed = False
        finally:
            try:
                main.wait_event(_event(cupy, side))     # no reduction outlives the call (its buffers go back)
            except Exception:
                if not failed:                          # else the first error is the one to report
                    raise


def _budget(cupy, limit):
    """Bytes for each of the two big working sets (residue planes of a group of moduli, reduced planes of a
    panel): WORK_BYTES, at most a quarter of the GPU's spare memory and of the run's ``limit``."""
    free, _total = cupy.cuda.runtime.memGetInfo()
    spare = free + cupy.get_default_memory_pool().free_bytes()
    if limit:
        spare = min(spare, limit)
    return max(1, min(WORK_BYTES, spare // 4))


def _panels(m, n, lower, planes, budget):
    """((r0, r1), (c0, c1)) column panels of C whose residue planes (``planes`` bytes per entry) fit ``budget``:
    all of C when it fits; for a triangle only the rows that reach it."""
    rows = -(-m // 4) * 4
    width = n if planes * rows * n <= budget else budget // (planes * rows) // PANEL_MIN * PANEL_MIN
    width = max(PANEL_MIN, width)
    for c0 in range(0, n, width):
        c1 = min(n, c0 + width)
        r0, r1 = (c0, m) if lower is True else ((0, min(m, c1)) if lower is False else (0, m))
        if r0 < r1:
            yield (r0, r1), (c0, c1)


def _blocks(rows, cols, lower):
    """(i0, i1, j0, j1) blocks of a panel for the INT8 products (global indices): column strips (SUB wide, or
    about an eighth of the panel for a triangle, a multiple of 4), each cut in SUB rows, only what reaches the
    triangle."""
    (r0, r1), (c0, c1) = rows, cols
    width = SUB if lower is None else min(SUB, max(STRIP, -(-(c1 - c0) // 32) * 4))   # rows aligned to 4
    for j0 in range(c0, c1, width):
        j1 = min(c1, j0 + width)
        lo = max(r0, j0) if lower is True else r0
        hi = min(r1, j1) if lower is False else r1
        for i0 in range(lo, hi, SUB):
            yield i0, min(hi, i0 + SUB), j0, j1


def _shifts(cupy, rows, bits):
    """Per row: the power of two that brings its largest |entry| below 2^bits (int32), NONFINITE where the
    row holds an infinity or NaN, 0 for a row of zeros."""
    top = cupy.empty(rows.count, dtype=np.float64)
    if rows.depth == 0:
        top.fill(0)
    else:
        _absmax(cupy)(rows.view(), axis=1, out=top)
    return _shift_kernel(cupy)(top, bits)


_ABSMAX = r"""
#define HB_INF __longlong_as_double(0x7ff0000000000000ULL)
__device__ double hb_absmax(double a) { return isfinite(a) ? fabs(a) : HB_INF; }
__device__ double hb_absmax(complex<double> a) {
    double r = hb_absmax(a.real()), i = hb_absmax(a.imag());
    return r > i ? r : i;
}
"""


def _absmax(cupy):
    """Row maxima of |entry| (of |re| and |im| for complex data), infinity for a row with a non-finite entry."""
    with _modules_lock:
        if "absmax" not in _modules:
            _modules["absmax"] = cupy.ReductionKernel("T z", "float64 y", "hb_absmax(z)", "(a > b ? a : b)",
                                                      "y = a", "0", "hb_ozaki_absmax", preamble=_ABSMAX)
        return _modules["absmax"]


def _shift_kernel(cupy):
    with _modules_lock:
        if "shift" not in _modules:
            _modules["shift"] = cupy.ElementwiseKernel(
                "float64 top, int32 bits", "int32 s",
                f"int e; frexp(top, &e); s = isinf(top) ? {NONFINITE} : (top > 0 ? bits - e : 0)",
                "hb_ozaki_shift")
        return _modules["shift"]


class _Work:
    """The buffers of one ``product`` call, taken at once for its largest panel and block: the panel's reduced
    planes, residue planes of a group of moduli for its rows of L and of R, and two INT32 product buffers."""

    def __init__(self, cupy, panels, lower, moduli, cplx, k, budget):
        self.moduli, self.cplx = moduli, cplx
        self.parts = 3 if cplx else 1
        self.depth = -(-k // ALIGN) * ALIGN
        count = len(moduli)
        rows = max(r1 - r0 for (r0, r1), _ in panels)
        cols = max(c1 - c0 for _, (c0, c1) in panels)
        blocks = [b for rows_, cols_ in panels for b in _blocks(rows_, cols_, lower)]
        edge = max(_edge(i1 - i0) for i0, i1, _, _ in blocks)
        width = max(_edge(j1 - j0) for _, _, j0, j1 in blocks)
        self.group = max(1, min(count, budget // max(self.parts * (rows + cols) * self.depth, 1)))
        self.planes = cupy.empty((2 if cplx else 1) * count * cols * (-(-rows // 4) * 4), dtype=np.uint8)
        # residue planes, and EDGE rows more that the last block's rounded-up products may read
        self.left = cupy.empty((self.parts * self.group * rows + EDGE) * self.depth, dtype=np.int8)
        self.right = cupy.empty((self.parts * self.group * cols + EDGE) * self.depth, dtype=np.int8)
        self.scratch = [cupy.empty((self.parts, width * edge), dtype=np.int32) for _ in range(2)]


def _edge(size):
    return -(-size // EDGE) * EDGE


class _Panel:
    """A panel of C (rows r0:r1, columns c0:c1) in the buffers of a ``_Work``: residue planes of its rows of L and
    R, a group of moduli at a time; the INT8 products of its blocks reduced modulo p into uint8 planes; then its
    reconstruction. Kernels run on the current stream (``product`` makes the backend's stream current), cuBLAS
    on the same one, the reductions on the GPU's side stream."""

    def __init__(self, cupy, kernels, handle, work, rows, cols):
        self.cp, self.kernels, self.handle, self.work = cupy, kernels, handle, work
        self.moduli, self.cplx, self.parts, self.depth = work.moduli, work.cplx, work.parts, work.depth
        self.rows, self.cols = rows, cols
        self.m, self.n = rows[1] - rows[0], cols[1] - cols[0]
        self.ld = -(-self.m // 4) * 4
        shape = (2 if self.cplx else 1, len(self.moduli), self.n, self.ld)
        self.residues = work.planes[:int(np.prod(shape))].reshape(shape)

    def products(self, left, right, shifts, lower, side):
        """Every block's INT8 products on the current stream; their reductions modulo p on ``side``, each beside
        the next products (two INT32 buffers, handed over by events)."""
        cp, count, work = self.cp, len(self.moduli), self.work
        main = cp.cuda.get_current_stream()
        blocks = list(_blocks(self.rows, self.cols, lower))
        read = [None, None]              # per buffer: the event after the reduction that last read it
        side.wait_event(_event(cp, main))   # after what came before (a rebuild reading these planes)
        turn = 0
        for g0 in range(0, count, work.group):
            g1 = min(count, g0 + work.group)
            pa = self._residues(left, self.rows, shifts[0], g0, g1, work.left)
            pb = self._residues(right, self.cols, shifts[1], g0, g1, work.right)
            for mod in range(g0, g1):
                for i0, i1, j0, j1 in blocks:
                    a_rows, b_rows = i0 - self.rows[0], j0 - self.cols[0]
                    ldp, wide = _edge(i1 - i0), _edge(j1 - j0)
                    for q0 in range(0, self.depth, K_CHUNK):
                        q1 = min(self.depth, q0 + K_CHUNK)
                        if read[turn] is not None:
                            main.wait_event(read[turn])
                        out = work.scratch[turn][:, :wide * ldp]
                        for part in range(self.parts):
                            self._gemm(pa[part, mod - g0, a_rows:], pb[part, mod - g0, b_rows:], out[part],
                                       ldp, wide, ldp, q0, q1)
                        side.wait_event(_event(cp, main))
                        with side:
                            self._reduce(out, ldp, i1 - i0, j1 - j0, mod, a_rows, b_rows, accumulate=q0 > 0)
                        read[turn] = _event(cp, side)
                        turn ^= 1
            # the next group's residues overwrite pa, pb: after these products (same stream)
        main.wait_event(_event(cp, side))   # the reduced planes (and the buffers' last readers) done

    def _residues(self, rows, span, shifts, g0, g1, buffer):
        r0, r1 = span
        count = r1 - r0
        shape = (self.parts, g1 - g0, count, self.depth)
        out = buffer[:int(np.prod(shape))].reshape(shape)
        grid = (-(-self.depth // 32), -(-count // 32))
        name = "residues_c" if self.cplx else "residues_r"
        self.kernels[name](grid, (32, 8), (
            np.uint64(rows.ptr(r0)), np.int64(rows.sr), np.int64(rows.sq), np.int32(count), np.int32(rows.depth),
            np.int32(self.depth), shifts[r0:r1], np.int32(1 if rows.conj else 0), out,
            np.int64(count * self.depth), np.int32(g0), np.int32(g1)))
        return out

    def _gemm(self, a, b, out, m, n, ldc, q0, q1):
        """out (column-major m x n, leading dimension ldc) <- a[:m, q0:q1] b[:n, q0:q1]^T, INT8 in, INT32 out."""
        i = ctypes.c_int
        cublas.call("cublasGemmEx", self.handle, self.cp.cuda.get_current_stream().ptr, i(1), i(0), i(m), i(n),
                    i(q1 - q0), ctypes.c_void_p(_ONE.ctypes.data),
                    ctypes.c_void_p(a.data.ptr + q0), i(_CUDA_R_8I), i(self.depth),
                    ctypes.c_void_p(b.data.ptr + q0), i(_CUDA_R_8I), i(self.depth),
                    ctypes.c_void_p(_ZERO.ctypes.data),
                    ctypes.c_void_p(out.data.ptr), i(_CUDA_R_32I), i(ldc), i(_COMPUTE_32I), i(_GEMM_DEFAULT))

    def _reduce(self, products, ldp, m, n, mod, row, col, accumulate):
        """The block's INT32 products modulo p into the panel's planes at (row, col)."""
        threads = 256
        grid = (-(-m // (4 * threads)), min(n, 65535))
        name = "reduce_c" if self.cplx else "reduce_r"
        offset = col * self.ld + row
        planes = [self.residues[part, mod].reshape(-1)[offset:] for part in range(self.residues.shape[0])]
        args = list(products[:self.parts]) + [np.int32(m), np.int32(n), np.int32(ldp), np.int32(mod)]
        args += planes + [np.int32(self.ld), np.int32(1 if accumulate else 0)]
        self.kernels[name](grid, (threads,), tuple(args))

    def rebuild(self, c, shifts, alpha, beta, lower, hermitian):
        (r0, r1), (c0, c1) = self.rows, self.cols
        m, n = self.m, self.n
        threads = 256
        grid = (-(-m // threads), min(n, 65535))
        mode = 0 if lower is None else (1 if lower else 2)
        view = c[r0:r1, c0:c1]
        ldc = c.strides[1] // c.dtype.itemsize
        alpha, beta = complex(alpha), complex(beta)
        name = "rebuild_c" if self.cplx else "rebuild_r"
        args = [self.residues, np.int64(n * self.ld), np.int32(m), np.int32(n), np.int32(self.ld),
                shifts[0][r0:r1], shifts[1][c0:c1], np.uint64(view.data.ptr), np.int64(ldc), np.float64(alpha.real)]
        args += [np.float64(alpha.imag)] if self.cplx else []
        args += [np.float64(beta.real)] + ([np.float64(beta.imag)] if self.cplx else [])
        args += [np.int32(1 if beta == 0 else 0), np.int32(mode), np.int64(r0 - c0), np.int32(1 if hermitian else 0)]
        self.kernels[name](grid, (threads,), tuple(args))


def _event(cupy, stream):
    ev = cupy.cuda.Event(disable_timing=True)
    ev.record(stream)
    return ev


def _side_stream(cupy):
    """This GPU's stream for the reductions beside the products (one per GPU, kept for the process)."""
    key = ("side", cupy.cuda.Device().id)
    with _modules_lock:
        if key not in _modules:
            _modules[key] = cupy.cuda.Stream(non_blocking=True)
        return _modules[key]


def prepare(cupy, dtype, devices, bits, k):
    """Compile (or load from CuPy's kernel cache) the kernels that emulated products of ``dtype`` with ``bits``
    bits and inner dimension ``k`` use on ``devices``, one device after the other on a background thread;
    returns the thread, or None when there is nothing to do (k below the least emulated k, or every device has
    them). A shorter k chunk may take fewer moduli: its kernels are compiled by its first product. A failure
    is left to the first product."""
    dtype = np.dtype(dtype)
    if dtype not in EMULATED or k < min(MIN_K[dtype.kind, t] for t in (False, True)):
        return None
    count = ozaki.moduli_for(k, bits, dtype.kind == "c")
    with _modules_lock:
        todo = [d for d in dict.fromkeys(int(d) for d in devices) if (d, count) not in _modules]
    return cuda_compile.in_background(cupy, todo, lambda: _kernels(cupy, count))


def _kernels(cupy, count):
    """The residue, reduction and reconstruction kernels for the first ``count`` moduli on the current GPU."""
    key = (cupy.cuda.Device().id, count)
    with _modules_lock:
        if key not in _modules:
            module = cupy.RawModule(code=source(count), options=("--std=c++14", "--fmad=false"))
            _modules[key] = {name: module.get_function(name) for name in
                             ("residues_r", "residues_c", "reduce_r", "reduce_c", "rebuild_r", "rebuild_c")}
        return _modules[key]


_COMMON = r"""
template <int P> __device__ __forceinline__ int residue(double v) {
    // v mod P in [-128, 127] (balanced for P = 256, [-(P - 128), 127] below) of an integer v, |v| < 2^62: the
    // quotient rounded in double is within 7 of v / P, so v - qP (exact in one fma) is a small int
    double q = rint(v * (1.0 / P));
    int x = (int)fma(-q, (double)P, v) % P;
    x += x < 0 ? P : 0;
    return x > 127 ? x - P : x;
}
template <int P> __device__ __forceinline__ int fold(int s) {   // s in [-256, 254] -> the same range as residue
    return s > 127 ? s - P : (s < -128 ? s + P : s);
}
template <int P> __device__ __forceinline__ int modp(int s) { int x = s % P; return x < 0 ? x + P : x; }
template <int P> __device__ __forceinline__ int balanced(int t) { return t > P / 2 ? t - P : t; }
__device__ __forceinline__ void dd_step(double p, double& hi, double& lo, double v) {
    // (hi, lo) <- p (hi + lo) + v in double-double, p an integer below 2^9 (hybridblas.ozaki._times_small_plus)
    double t = hi * 513.0;
    double top = t - (t - hi);
    double low = hi - top;
    double ph = p * top;
    double pl = p * low + p * lo;
    double s = ph + v;
    double b = s - ph;
    double e = (ph - (s - b)) + (v - b) + pl;
    double head = s + e;
    lo = e - (head - s);
    hi = head;
}
__device__ __forceinline__ double integer(double x, int s) { return trunc(ldexp(x, s)); }   // exact in double
#define NONFINITE (-(1 << 30))
"""

_RESIDUES = r"""
extern "C" __global__ void residues_KIND(const double* __restrict__ src, long long sr, long long sq, int rows,
        int depth, int padded, const int* __restrict__ shift, int conj, signed char* __restrict__ out,
        long long plane, int g0, int g1) {
    // out[part][modulus - g0][r][q]: balanced residues of row r's scaled entries (zeros past depth)
    __shared__ double tile[PARTS_IN][32][33];
    int r0 = blockIdx.y * 32, q0 = blockIdx.x * 32, tx = threadIdx.x, ty = threadIdx.y;
    bool rfast = sr == 1 && sq != 1;
    for (int k = ty; k < 32; k += 8) {
        int r = rfast ? r0 + tx : r0 + k, q = rfast ? q0 + k : q0 + tx;
        int lr = rfast ? tx : k, lq = rfast ? k : tx;
        long long off = (long long)r * sr + (long long)q * sq;
        for (int c = 0; c < PARTS_IN; ++c)
            tile[c][lr][lq] = (r < rows && q < depth) ? src[PARTS_IN * off + c] : 0.0;
    }
    __syncthreads();
    long long count = g1 - g0;
    for (int k = ty; k < 32; k += 8) {
        int r = r0 + k, q = q0 + tx;
        if (r >= rows || q >= padded) continue;
        int s = shift[r];
        long long o = (long long)r * padded + q;
        double a = 0.0, b = 0.0;
        if (s != NONFINITE) {
            a = integer(tile[0][k][tx], s);
            PARTS_LOAD
        }
BODY
    }
}
"""

_REDUCE = r"""
// One column j per blockIdx.y (striding by gridDim.y), four rows per thread: 16-byte loads of the INT32
// products and 4-byte stores into the planes where both are aligned, one entry at a time elsewhere.
#define HB_ALIGNED(p, n) ((((unsigned long long)(p)) & ((n) - 1)) == 0)
template <int P> __device__ __forceinline__ void reduce_real(const int* __restrict__ x, int m, int n, int ldp,
        unsigned char* re, int ld, int accumulate) {
    for (int j = blockIdx.y; j < n; j += gridDim.y) {
        const int* src = x + (long long)j * ldp;
        unsigned char* dst = re + (long long)j * ld;
        for (int i = 4 * (blockIdx.x * blockDim.x + threadIdx.x); i < m; i += 4 * gridDim.x * blockDim.x) {
            if (i + 4 <= m && HB_ALIGNED(src + i, 16) && HB_ALIGNED(dst + i, 4)) {
                int4 v = *(const int4*)(src + i);
                int r[4] = {modp<P>(v.x), modp<P>(v.y), modp<P>(v.z), modp<P>(v.w)};
                if (accumulate) {
                    uchar4 o = *(uchar4*)(dst + i);
                    r[0] = (r[0] + o.x) % P; r[1] = (r[1] + o.y) % P;
                    r[2] = (r[2] + o.z) % P; r[3] = (r[3] + o.w) % P;
                }
                *(uchar4*)(dst + i) = make_uchar4(r[0], r[1], r[2], r[3]);
                continue;
            }
            for (int t = i; t < i + 4 && t < m; ++t) {
                int v = modp<P>(src[t]);
                if (accumulate) v = (v + dst[t]) % P;
                dst[t] = (unsigned char)v;
            }
        }
    }
}
template <int P> __device__ __forceinline__ void karatsuba(int a, int b, int c, int& x, int& y) {
    // re = rr - ii, im = ss - rr - ii (mod P)
    a %= P; b %= P; c %= P;
    x = modp<P>(a - b);
    y = modp<P>(c - a - b);
}
template <int P> __device__ __forceinline__ void reduce_complex(const int* __restrict__ rr,
        const int* __restrict__ ii, const int* __restrict__ ss, int m, int n, int ldp, unsigned char* re,
        unsigned char* im, int ld, int accumulate) {
    for (int j = blockIdx.y; j < n; j += gridDim.y) {
        long long s = (long long)j * ldp, o = (long long)j * ld;
        for (int i = 4 * (blockIdx.x * blockDim.x + threadIdx.x); i < m; i += 4 * gridDim.x * blockDim.x) {
            if (i + 4 <= m && HB_ALIGNED(rr + s + i, 16) && HB_ALIGNED(ii + s + i, 16)
                    && HB_ALIGNED(ss + s + i, 16) && HB_ALIGNED(re + o + i, 4) && HB_ALIGNED(im + o + i, 4)) {
                int4 a = *(const int4*)(rr + s + i), b = *(const int4*)(ii + s + i);
                int4 c = *(const int4*)(ss + s + i);
                int x[4], y[4];
                karatsuba<P>(a.x, b.x, c.x, x[0], y[0]);
                karatsuba<P>(a.y, b.y, c.y, x[1], y[1]);
                karatsuba<P>(a.z, b.z, c.z, x[2], y[2]);
                karatsuba<P>(a.w, b.w, c.w, x[3], y[3]);
                if (accumulate) {
                    uchar4 p = *(uchar4*)(re + o + i), q = *(uchar4*)(im + o + i);
                    x[0] = (x[0] + p.x) % P; x[1] = (x[1] + p.y) % P; x[2] = (x[2] + p.z) % P; x[3] = (x[3] + p.w) % P;
                    y[0] = (y[0] + q.x) % P; y[1] = (y[1] + q.y) % P; y[2] = (y[2] + q.z) % P; y[3] = (y[3] + q.w) % P;
                }
                *(uchar4*)(re + o + i) = make_uchar4(x[0], x[1], x[2], x[3]);
                *(uchar4*)(im + o + i) = make_uchar4(y[0], y[1], y[2], y[3]);
                continue;
            }
            for (int t = i; t < i + 4 && t < m; ++t) {
                int x, y;
                karatsuba<P>(rr[s + t], ii[s + t], ss[s + t], x, y);
                if (accumulate) { x = (x + re[o + t]) % P; y = (y + im[o + t]) % P; }
                re[o + t] = (unsigned char)x;
                im[o + t] = (unsigned char)y;
            }
        }
    }
}
extern "C" __global__ void reduce_r(const int* __restrict__ x, int m, int n, int ldp, int mod, unsigned char* re,
                                    int ld, int accumulate) {
    switch (mod) {
REAL_CASES
    }
}
extern "C" __global__ void reduce_c(const int* __restrict__ rr, const int* __restrict__ ii,
                                    const int* __restrict__ ss, int m, int n, int ldp, int mod, unsigned char* re,
                                    unsigned char* im, int ld, int accumulate) {
    switch (mod) {
COMPLEX_CASES
    }
}
"""

_REBUILD = r"""
extern "C" __global__ void rebuild_KIND(const unsigned char* __restrict__ planes, long long plane, int m, int n,
        int lda, const int* __restrict__ sa, const int* __restrict__ sb, unsigned long long out_ptr, long long ldc,
        ALPHA_BETA, int beta_zero, int mode, long long diag, int hermitian) {
    // C[i, j] <- alpha * value + beta * C[i, j] inside the wanted triangle (global row - column = i - j + diag)
    double* out = (double*)out_ptr;
    for (int j = blockIdx.y; j < n; j += gridDim.y) {
        // rows of column j inside the triangle: i - j + diag >= 0 (mode 1), <= 0 (mode 2)
        long long first = mode == 1 ? (long long)j - diag : 0, last = mode == 2 ? (long long)j - diag + 1 : m;
        int start = (int)(first < 0 ? 0 : (first > m ? m : first));
        int stop = (int)(last < 0 ? 0 : (last > m ? m : last));
        for (int i = start + blockIdx.x * blockDim.x + threadIdx.x; i < stop; i += gridDim.x * blockDim.x) {
            long long below = (long long)i - j + diag;
            long long idx = (long long)j * lda + i;
            int s = sa[i], t = sb[j];
            bool bad = s == NONFINITE || t == NONFINITE;
            int scale = bad ? 0 : -(s + t);
STORE
        }
    }
}
"""


def _garner(count, name):
    """Device function ``name``(planes, plane, idx): the value of the entry whose residues modulo the first
    ``count`` moduli sit at planes[m * plane + idx], as hybridblas.ozaki.reconstruct evaluates it."""
    moduli = ozaki.MODULI[:count]
    lines = [f"__device__ __forceinline__ double {name}(const unsigned char* __restrict__ pl, long long plane, "
             "long long idx) {"]
    for i, p in enumerate(moduli):
        lines.append(f"    int r{i} = pl[{i}LL * plane + idx];")
    for i, ((w, q), p) in enumerate(zip(ozaki.garner_weights(moduli), moduli)):
        if i == 0:
            lines.append(f"    int d0 = balanced<{p}>(r0);")
            continue
        terms = " + ".join(f"d{j} * {wj}" for j, wj in enumerate(w))
        lines.append(f"    int d{i} = balanced<{p}>(modp<{p}>(modp<{p}>(r{i} - ({terms})) * {q}));")
    n = count
    inner = min(n, ozaki._EXACT_DIGITS)
    lines.append(f"    long long y = d{n - 1};")
    for i in range(n - 2, n - 1 - inner, -1):
        lines.append(f"    y = d{i} + {moduli[i]}LL * y;")
    lines.append("    double hi = (double)y, lo = (double)(y - (long long)hi);")
    for i in range(n - 1 - inner, -1, -1):
        lines.append(f"    dd_step({moduli[i]}.0, hi, lo, (double)d{i});")
    lines.append("    return hi + lo;\n}")
    return "\n".join(lines)


def source(count):
    """CUDA source of the kernels for the first ``count`` moduli (the moduli are constants in the code)."""
    moduli = ozaki.MODULI[:count]
    real_body, cplx_body = [], []
    for idx, p in enumerate(moduli):
        guard = f"        if ({idx} >= g0 && {idx} < g1) {{"
        at = f"o + ({idx} - g0) * plane"
        real_body.append(f"{guard} out[{at}] = (signed char)residue<{p}>(a); }}")
        cplx_body.append(
            f"{guard} int x = residue<{p}>(a), y = residue<{p}>(b);"
            f" out[{at}] = (signed char)x; out[{at} + count * plane] = (signed char)y;"
            f" out[{at} + 2 * count * plane] = (signed char)fold<{p}>(x + y); }}")
    residues_r = (_RESIDUES.replace("KIND", "r").replace("PARTS_IN", "1").replace("PARTS_LOAD", "")
                  .replace("BODY", "\n".join(real_body)))
    residues_c = (_RESIDUES.replace("KIND", "c").replace("PARTS_IN", "2")
                  .replace("PARTS_LOAD", "b = integer(conj ? -tile[1][k][tx] : tile[1][k][tx], s);")
                  .replace("BODY", "\n".join(cplx_body)))
    store_r = """            double v = __longlong_as_double(0x7ff8000000000000ULL);
            if (!bad) v = ldexp(value(planes, plane, idx), scale);
            double* c = out + i + (long long)j * ldc;
            double r = ar * v;
            if (!beta_zero) r += br * c[0];
            c[0] = r;"""
    store_c = """            double vr = __longlong_as_double(0x7ff8000000000000ULL), vi = vr;
            if (!bad) {
                vr = ldexp(value(planes, plane, idx), scale);
                vi = ldexp(value(planes + (long long)COUNT * plane, plane, idx), scale);
            }
            double* c = out + 2 * (i + (long long)j * ldc);
            double xr = ar * vr - ai * vi, xi = ar * vi + ai * vr;
            if (!beta_zero) {
                double cr = c[0], ci = c[1];
                xr += br * cr - bi * ci;
                xi += br * ci + bi * cr;
            }
            if (hermitian && below == 0) xi = 0.0;
            c[0] = xr;
            c[1] = xi;""".replace("COUNT", str(count))
    rebuild_r = (_REBUILD.replace("KIND", "r").replace("ALPHA_BETA", "double ar, double br")
                 .replace("STORE", store_r))
    rebuild_c = (_REBUILD.replace("KIND", "c").replace("ALPHA_BETA", "double ar, double ai, double br, double bi")
                 .replace("STORE", store_c))
    reduce = _REDUCE.replace("REAL_CASES", "\n".join(
        f"    case {i}: reduce_real<{p}>(x, m, n, ldp, re, ld, accumulate); break;" for i, p in enumerate(moduli)))
    reduce = reduce.replace("COMPLEX_CASES", "\n".join(
        f"    case {i}: reduce_complex<{p}>(rr, ii, ss, m, n, ldp, re, im, ld, accumulate); break;"
        for i, p in enumerate(moduli)))
    return "\n".join([_COMMON, _garner(count, "value"), residues_r, residues_c, reduce, rebuild_r, rebuild_c])
