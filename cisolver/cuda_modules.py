"""All of cisolver's CUDA kernels for one dtype in one module, compiled once per (GPU architecture, dtype).

How it works
- ``source(dtype)`` is the whole translation unit: T (and VT, its 16-byte vector) typedef'd to ``dtype``, the
  device functions several families share (PRELUDE, SMALL_FACTOR), then every family's section in a fixed
  order (FAMILIES: the row kernels, the Gram kernels, the orthonormalisation and Rayleigh-Ritz kernels, the
  residual, the assembly of the GPU operator's rows, the angular-momentum sums). A family module gives its
  section as ``cuda_section(dtype)`` -> (code, constants, kernel names): its constants become macros defined
  before its code and undefined after it (with every macro the code defines itself), its code sits in a
  namespace of its own, and its kernels are ``extern "C"``: one entry point per template instantiation a
  launcher uses (``rows_times_small_16`` runs the template body ``rows_times_small<16>``), listed up front.
  The text depends on the dtype and on the families' constants alone: sizes, strides and widths that vary
  from call to call are kernel arguments or instantiations, never macros, so one run's source is the next
  run's.
- ``function(cupy, dtype, name)`` gives one kernel of that module on the current device. The first call for a
  (device, dtype) makes a cupy.RawModule of the source and loads it: CuPy compiles it with NVRTC for the
  device's architecture (one call for every kernel of the dtype) and keeps the cubin in its on-disk kernel
  cache (~/.cupy/kernel_cache, or $CUPY_CACHE_DIR), keyed by the source, the options and the architecture.
  A second device of the same architecture, and every later process on the machine, load the cubin from
  there without compiling. No name expressions: CuPy before version 14 recompiles modules that have them at
  every load, and plain ``extern "C"`` names need none.
- ``prepare(cupy, dtype, devices)`` compiles and loads the module on a background thread (NVRTC releases
  the GIL), so that the compilation overlaps the host's work; ``function`` waits for it where it must.
- A family's constants may be changed at run time (benchmarks sweep e.g. row_kernels.STAGE_ROWS): the
  modules are kept per value of every family's constants, so a changed constant compiles a new module.
- ``kernel_names(dtype)`` lists every kernel of the module; python3 -m benchmarks.cisolver cuda-sources compiles the
  source for sm_80 and sm_90 in both dtypes with NVRTC (no GPU needed) and checks that each is in the cubin.

SMALL_FACTOR holds the device functions of the one-block kernels (cisolver.gpu_ortho, gpu_rayleigh_ritz)
that factor a small q x q matrix (q <= 32) in shared memory: the in-place upper Cholesky factor, its test
for a numerically singular factor, and the triangular inverse. Every thread of the block must call them, the
block a multiple of 32 threads. cholesky_upper synchronises the block before it returns; flag_singular and
inverse_upper do not: the caller synchronises before another thread reads *bad or the inverse.
"""
import re
import threading
from operator import attrgetter

import numpy as np

_CTYPES = {np.dtype(np.float32): ("float", "float4"), np.dtype(np.float64): ("double", "double2")}
OPTIONS = ("--std=c++14",)
# the families in the module's order: (module of cisolver, its constants that enter the source)
FAMILIES = (("row_kernels", ("MIN_BLOCKS", "STAGE_ROWS", "QMAX_CHOICES")),
            ("gpu_grams", ("TILE", "THREADS", "TOTAL_THREADS", "FETCH", "BLOCKS_PER_SM", "STAGES")),
            ("gpu_ortho", ("BMAX", "QMAX", "CANCELS", "NOT_DEFINITE", "SECOND_PASS")),
            ("gpu_rayleigh_ritz", ("KMAX", "EIG_RESIDUAL")),
            ("blocks", ()),
            ("gpu_spmm", ("UNSORTED", "LOWER")),
            ("gpu_angmom", ("BLOCK_FIELDS",)),
            ("gpu_fill", ("TILE",)))

PRELUDE = r"""
#define VEC ((int) (16 / sizeof(T)))      // elements of T in a 16-byte vector

// the shared-memory address of p, for cp.async
__device__ __forceinline__ unsigned shared_address(const void* p)
{
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
"""

SMALL_FACTOR = r"""
// Thread t works on the elements (i, j) of a q x q matrix with j = t % 32 and i = t / 32, t / 32 + nt / 32, ...
// (q <= 32, nt a multiple of 32): no integer division, and one barrier a step in the eliminations below.

// a (q x q, row-major, shared) <- its upper Cholesky factor R in place (row c holds R[c, c:]; the strictly
// lower part is left as it was). Right-looking: step c takes the unscaled row c (final after step c - 1) and
// updates the rows below it, one barrier a step; the rows are scaled at the end. A non-positive or non-finite
// pivot sets ``bit`` in *bad (and takes 1). piv: shared scratch of q doubles.
__device__ void cholesky_upper(double* a, int q, int* bad, int bit, double* piv)
{
    const int t = threadIdx.x, nt = blockDim.x, j = t & 31;
    for (int c = 0; c < q; ++c) {
        const double p = a[c * q + c];
        const bool ok = p > 0.0 && isfinite(p);
        const double inv = ok ? 1.0 / p : 1.0;
        if (t == 0) {
            if (!ok) atomicOr(bad, bit);
            piv[c] = ok ? p : 1.0;
        }
        if (j > c && j < q) {
            const double acj = a[c * q + j] * inv;
            for (int i = (t >> 5); i <= j; i += nt >> 5)
                if (i > c) a[i * q + j] -= a[c * q + i] * acj;
        }
        __syncthreads();
    }
    for (int i = t >> 5; i < q; i += nt >> 5) {
        const double r = sqrt(piv[i]);
        if (j >= i && j < q) a[i * q + j] = j == i ? r : a[i * q + j] / r;
    }
    __syncthreads();
}

// sets ``bit`` in *bad when R's diagonal entries are more than 1 / ratio apart (as dense.cholesky_upper)
__device__ void flag_singular(const double* a, int q, double ratio, int* bad, int bit)
{
    if (threadIdx.x == 0) {
        double lo = fabs(a[0]), hi = fabs(a[0]);
        for (int c = 1; c < q; ++c) { lo = fmin(lo, fabs(a[c * q + c])); hi = fmax(hi, fabs(a[c * q + c])); }
        if (!(lo > ratio * hi)) atomicOr(bad, bit);
    }
}

// ri (q x q, row-major, shared) <- R^{-1} of the upper triangle of a (zero below the diagonal): R X = I solved
// from the last row up, step c taking row c of the right-hand side (final after step c + 1) off the rows above
// it, one barrier a step; the rows are scaled by 1 / R[c, c] at the end. rd: shared scratch of q doubles.
__device__ void inverse_upper(const double* a, double* ri, int q, double* rd)
{
    const int t = threadIdx.x, nt = blockDim.x, j = t & 31;
    if (t < q) rd[t] = 1.0 / a[t * q + t];
    for (int i = t >> 5; i < q; i += nt >> 5)
        if (j < q) ri[i * q + j] = i == j ? 1.0 : 0.0;
    __syncthreads();
    for (int c = q - 1; c > 0; --c) {
        if (j >= c && j < q) {
            const double xcj = ri[c * q + j] * rd[c];
            for (int i = t >> 5; i < c; i += nt >> 5) ri[i * q + j] -= a[i * q + c] * xcj;
        }
        __syncthreads();
    }
    for (int i = t >> 5; i < q; i += nt >> 5)
        if (j >= i && j < q) ri[i * q + j] *= rd[i];
}
"""

_lock = threading.Lock()
_families = []         # (module, getter of its source constants), imported on first use
_modules = {}          # (device, dtype, constants) -> loaded cupy.RawModule
_pending = {}          # (device, dtype, constants) -> threading.Event of a compilation under way
_failed = {}           # (device, dtype, constants) -> the exception a background compilation raised
_functions = {}        # (device, dtype, constants, name) -> cupy kernel


def small_factor_threads(threads):
    """``threads`` for a kernel that calls SMALL_FACTOR's functions: a positive multiple of 32 (their row loops
    step by threads / 32; fewer would loop for ever, a remainder would share elements)."""
    if threads < 32 or threads % 32:
        raise ValueError(f"one-block kernels need a positive multiple of 32 threads, got {threads}")
    return threads


def _family_modules():
    """[(module, getter of its source constants or None)] in FAMILIES' order (imported here, on first use: the
    family modules import this one)."""
    if not _families:
        import importlib
        _families[:] = [(importlib.import_module(f"{__package__}.{name}"), attrgetter(*names) if names else None)
                        for name, names in FAMILIES]
    return _families


def _constants():
    """Every family's source constants as they are now (part of the key of the module made from them)."""
    return tuple([get(module) for module, get in _family_modules() if get is not None])


def section(family, code, constants):
    """``code`` with ``constants`` (name -> value) as macros around it, in ``namespace family``; the macros it
    defines itself are undefined after it too."""
    macros = list(constants) + [m for m in re.findall(r"^\s*#define\s+(\w+)", code, re.M) if m not in constants]
    head = "".join(f"#define {name} {value}\n" for name, value in constants.items())
    tail = "".join(f"#undef {name}\n" for name in dict.fromkeys(macros))
    return f"// ---- cisolver.{family} ----\n{head}namespace {family} {{\n{code}\n}}  // namespace {family}\n{tail}"


def _dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype not in _CTYPES:
        raise TypeError(f"cisolver's CUDA kernels take float32 or float64, got {dtype}")
    return dtype


def source(dtype):
    """The module's CUDA source for ``dtype`` (float32 or float64) and its kernel names."""
    dtype = _dtype(dtype)
    parts = ["typedef {} T;\ntypedef {} VT;\n".format(*_CTYPES[dtype]), PRELUDE, SMALL_FACTOR]
    names = []
    for module, _ in _family_modules():
        code, constants, kernels = module.cuda_section(dtype)
        parts.append(section(module.__name__.rsplit(".", 1)[1], code, constants))
        names += kernels
    return "\n".join(parts), tuple(names)


def kernel_names(dtype):
    """Every kernel of the module for ``dtype``."""
    return source(dtype)[1]


def _compile(cupy, code, names):
    """The module ``code`` compiled (or read from CuPy's kernel cache) and loaded on the current device."""
    module = cupy.RawModule(code=code, options=OPTIONS)
    module.get_function(names[0])          # compiles and loads it here
    return module


def _module(cupy, dtype, key):
    with _lock:
        if key in _modules:
            return _modules[key]
        waiting = _pending.get(key)
    if waiting is not None:               # a background compilation: wait for it rather than compile twice
        waiting.wait()
        with _lock:
            if key in _modules:
                return _modules[key]
            error = _failed.pop(key, None)
        if error is not None:
            raise error
    module = _compile(cupy, *source(dtype))
    with _lock:
        return _modules.setdefault(key, module)


def function(cupy, dtype, name):
    """The kernel ``name`` of the module for ``dtype`` on the current device (compiled or loaded on first use)."""
    dtype = np.dtype(dtype)
    device = cupy.cuda.runtime.getDevice()
    constants = _constants()
    key = (device, dtype, constants, name)
    kernel = _functions.get(key)
    if kernel is None:
        kernel = _module(cupy, _dtype(dtype), key[:3]).get_function(name)
        _functions[key] = kernel
    return kernel


def prepare(cupy, dtype, devices):
    """Compile (or load from CuPy's cache) the module for ``dtype`` on ``devices`` on a background thread,
    one device after the other (a second device of the same architecture loads the first one's cubin).
    Returns the thread (None when every device has the module or is getting it); a failure is raised by the
    first ``function`` call that needs the module."""
    dtype = _dtype(dtype)
    constants = _constants()
    code, names = source(dtype)
    todo = []
    with _lock:
        for device in dict.fromkeys(devices):
            key = (device, dtype, constants)
            if key not in _modules and key not in _pending:
                _pending[key] = threading.Event()
                todo.append(key)
    if not todo:
        return None

    def work():
        for key in todo:
            try:
                with cupy.cuda.Device(key[0]):
                    module = _compile(cupy, code, names)
                with _lock:
                    _modules.setdefault(key, module)
            except Exception as exc:          # handed to the caller that needs the module
                with _lock:
                    _failed[key] = exc
            finally:
                with _lock:
                    _pending.pop(key).set()
    thread = threading.Thread(target=work, name="cisolver-cuda-compile", daemon=True)
    thread.start()
    return thread
