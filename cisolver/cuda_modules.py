"""cisolver's CUDA kernels for one dtype as a few translation units ("units"), compiled once per (GPU
architecture, dtype), the units side by side on threads of their own.

Why units: one NVRTC call compiles on one thread, and a cold machine (empty kernel cache) waits for the
compilation before the GPUs build H. All the kernels of a dtype as one translation unit took 4.4 s (float32)
and 3.7 s (float64); as units compiled at once, one core each, the wall is that of the largest unit. NVRTC 12.9,
sm_90, a 2-core CPU, each unit alone (python3 -m benchmarks.cisolver cuda-sources --arch 90):

    unit           float32  float64
    main            1.05 s   1.03 s   every family but row_kernels and gpu_fill (then 12 kernels, now 9)
    gpu_fill        0.24     0.23     the GPU build of H (6 kernels)
    row_product_8   0.12     0.14     rows_times_small_8 (float64: and staged_product_8)
    row_update_8    0.27     0.29     update_residual_8 (float64: and staged_update_8)
    row_product_16  0.23     0.21
    row_update_16   0.54     0.48
    row_product_32  0.56     0.39
    row_update_32   1.40     0.99

(a unit's own cost, its typedefs and PRELUDE, is 0.02 s). "main" was timed with LOBPCG's Gram kernels in it;
they have since moved to hybridblas, which compiles them itself (hybridblas.lowlevel.grams, prepare_kernels).
row_kernels' instantiations are the bulk: all of them in one unit took 3.2 s (float32) and 2.6 s (float64);
its largest kernel, update_residual_32 in float32, takes 1.4 s alone. On those 2 cores the 8 units of a dtype
at once took 2.6 s (float32) and 2.0 s (float64) wall (--together).

How it works
- ``units(dtype)`` gives each unit's name, source and kernel names. Every unit is self-contained: T (and VT,
  its 16-byte vector) typedef'd to ``dtype``, the device functions PRELUDE, then its sections. "gpu_fill" (the
  GPU build of H, whose kernels a run needs first: 0.23 s alone) is a unit of its own; "main" holds
  SMALL_FACTOR and every other family's section but row_kernels' in a fixed order (FAMILIES: the
  orthonormalisation and Rayleigh-Ritz kernels, the residual, the assembly of the GPU operator's rows, the
  angular-momentum sums); row_kernels' section is cut into one unit per (output width of QMAX_CHOICES, step):
  "row_product_Q" (out <- a m) and "row_update_Q" (LOBPCG's end of iteration), thread-per-row and, for float64,
  staged. A family module gives its section as ``cuda_section(dtype)`` -> (code, constants, kernel names)
  (row_kernels' takes the widths and steps too): its constants become macros defined before its code and
  undefined after it (with every macro the code defines itself), its code sits in a namespace of its own, and
  its kernels are ``extern "C"``: one entry point per template instantiation a launcher uses
  (``rows_times_small_16`` runs the template body ``rows_times_small<16>``), listed up front. The text depends
  on the dtype and on the families' constants alone: sizes, strides and widths that vary from call to call are
  kernel arguments or instantiations, never macros, so one run's source is the next run's.
- ``function(cupy, dtype, name)`` gives one kernel on the current device. The first call for its unit on a
  (device, dtype) compiles the unit's source with NVRTC (through CuPy's binding) to a cubin for the device's
  architecture, with the options CuPy itself would add, and keeps it as cisolver-<sha256>.cubin in CuPy's
  kernel cache folder (~/.cupy/kernel_cache, or $CUPY_CACHE_DIR; a private temporary folder where that one is
  not writable), keyed by the source, the options, the architecture and NVRTC's version; the unit is loaded
  from that file (cupy.RawModule(path=...)). A second device of the same architecture, and every later process
  on the machine, load the cubin without compiling. An architecture that NVRTC cannot compile for goes through
  CuPy's RawModule(code=...), which makes PTX for the driver. No name expressions: plain ``extern "C"`` names
  need none.
- ``prepare(cupy, dtype, devices)`` starts one background thread per unit (NVRTC releases the GIL), each
  compiling and loading its unit on the devices one after the other, so that the compilations overlap each
  other and the host's work; ``function`` waits for the unit it needs where it must, and raises the exception
  of a failed background compilation there.
- A family's constants may be changed at run time (benchmarks sweep e.g. row_kernels.STAGE_ROWS): the units
  are kept per value of every family's constants, so a changed constant compiles new units.
- ``kernel_names(dtype)`` lists every kernel of every unit; python3 -m benchmarks.cisolver cuda-sources compiles
  the units for sm_80 and sm_90 in both dtypes with NVRTC (no GPU needed) and checks that each kernel is in its
  unit's cubin.

SMALL_FACTOR holds the device functions of the one-block kernels (cisolver.gpu_ortho, gpu_rayleigh_ritz)
that factor a small q x q matrix (q <= 32) in shared memory: the in-place upper Cholesky factor, its test
for a numerically singular factor, and the triangular inverse. Every thread of the block must call them, the
block a multiple of 32 threads. cholesky_upper synchronises the block before it returns; flag_singular and
inverse_upper do not: the caller synchronises before another thread reads *bad or the inverse.
"""
import hashlib
import os
import re
import sys
import tempfile
import threading
import time
from operator import attrgetter

import numpy as np

from hybridblas import lowlevel, workers

_CTYPES = {np.dtype(np.float32): ("float", "float4"), np.dtype(np.float64): ("double", "double2")}
OPTIONS = ("--std=c++14",)
# the families in "main"'s order, row_kernels and OWN_UNIT apart (units of their own): (module of cisolver, its
# constants that enter the source)
FAMILIES = (("row_kernels", ("MIN_BLOCKS", "STAGE_ROWS", "QMAX_CHOICES")),
            ("gpu_ortho", ("BMAX", "QMAX", "CANCELS", "NOT_DEFINITE", "SECOND_PASS")),
            ("gpu_rayleigh_ritz", ("KMAX", "EIG_RESIDUAL")),
            ("blocks", ()),
            ("gpu_spmm", ("UNSORTED", "LOWER")),
            ("gpu_angmom", ("BLOCK_FIELDS",)),
            ("gpu_fill", ("TILE",)))

OWN_UNIT = ("gpu_fill",)   # the GPU build's kernels: needed first, and not behind "main"'s compilation

# VEC, shared_address, copy_rows_async and the async group macros: the routines hybridblas's kernels stage
# tall blocks with
PRELUDE = lowlevel.cuda_tile_helpers()

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
_modules = {}          # (device, dtype, constants, unit) -> loaded cupy.RawModule
_pending = {}          # (device, dtype, constants, unit) -> threading.Event of a compilation under way
_failed = {}           # (device, dtype, constants, unit) -> the exception a background compilation raised
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
    """Every family's source constants as they are now (part of the key of the units made from them)."""
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


def units(dtype):
    """The translation units for ``dtype`` (float32 or float64): ((unit name, CUDA source, kernel names), ...).
    "main" holds every family but row_kernels and those of OWN_UNIT, each of which is a unit of its own;
    row_kernels' kernels make one unit per (output width, step)."""
    dtype = _dtype(dtype)
    head = "typedef {} T;\ntypedef {} VT;\n".format(*_CTYPES[dtype])
    main, names, rows, made = [head, PRELUDE, SMALL_FACTOR], [], None, []
    for module, _ in _family_modules():
        family = module.__name__.rsplit(".", 1)[1]
        if family == "row_kernels":
            rows = module
            continue
        code, constants, kernels = module.cuda_section(dtype)
        if family in OWN_UNIT:
            made.append((family, "\n".join([head, PRELUDE, section(family, code, constants)]), tuple(kernels)))
            continue
        main.append(section(family, code, constants))
        names += kernels
    made.insert(0, ("main", "\n".join(main), tuple(names)))
    for q in rows.QMAX_CHOICES:
        for step in rows.STEPS:
            code, constants, kernels = rows.cuda_section(dtype, widths=(q,), steps=(step,))
            made.append((f"row_{step}_{q}", "\n".join([head, PRELUDE, section("row_kernels", code, constants)]),
                          tuple(kernels)))
    return tuple(made)


def kernel_names(dtype):
    """Every kernel of every unit for ``dtype``."""
    return tuple(name for _, _, names in units(dtype) for name in names)


# what CuPy adds to a RawModule's options when it compiles for the device (cupy.cuda.compiler): the same code
NVRTC_OPTIONS = OPTIONS + ("-ftz=true", "--device-as-default-execution-space")


def _compile(cupy, code, names):
    """The unit ``code`` compiled (or read from the on-disk cache) and loaded on the current device.

    NVRTC is called here, to a cubin for the device's architecture, kept as cisolver-<sha256>.cubin in CuPy's
    kernel cache folder and loaded from there (cupy.RawModule(path=...)): CuPy's own RawModule(code=...)
    compilation ran the units of a dtype barely side by side (8 units on 8 threads: 4.5-6 s on an H100 node's
    16 cores, against 2.3-2.6 s, the largest unit's own time, with NVRTC called directly; NVRTC 13.0). Where
    NVRTC cannot compile for the architecture, CuPy's path takes over (it then makes PTX for the driver)."""
    nvrtc = _nvrtc(cupy)
    arch = _cubin_arch(cupy, nvrtc)
    if arch is None:
        module = cupy.RawModule(code=code, options=OPTIONS)
    else:
        module = cupy.RawModule(path=_cubin(nvrtc, code, arch))
    module.get_function(names[0])          # compiles and loads it here
    return module


def _cubin_arch(cupy, nvrtc, device=None):
    """The architecture (e.g. 90) of ``device`` (None: the current one) when NVRTC compiles cubins for it, else
    None (``nvrtc`` None: a stand-in ``cupy``, whose devices are not asked)."""
    if nvrtc is None:
        return None
    arch = int(cupy.cuda.Device(device).compute_capability)
    return arch if arch in getattr(nvrtc, "getSupportedArchs", tuple)() else None


def _nvrtc(cupy):
    """CuPy's NVRTC binding when ``cupy`` is CuPy itself (None for a stand-in)."""
    if cupy is not sys.modules.get("cupy"):
        return None
    return cupy.cuda.nvrtc


def _cache_folder():
    return os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser(os.path.join("~", ".cupy", "kernel_cache"))


def _cubin_name(nvrtc, code, arch):
    """The file name and NVRTC options of ``code``'s cubin for sm_<arch> (keyed by the source, the options, the
    architecture and NVRTC's version)."""
    options = NVRTC_OPTIONS + (f"-arch=sm_{arch}",)
    key = hashlib.sha256(repr((code, options, tuple(nvrtc.getVersion()))).encode()).hexdigest()
    return f"cisolver-{key}.cubin", options


def _cached_path(name):
    for folder in (_cache_folder(), _fallback_folder()):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    return None


def cached(cupy, dtype, device):
    """Whether every unit for ``dtype`` lies compiled in the on-disk cache for ``device``'s architecture (a
    machine that ran cisolver on such a GPU in this dtype before). False where NVRTC cannot compile for the
    architecture (CuPy's own path then keeps the PTX) or ``cupy`` is a stand-in. No GPU work."""
    nvrtc = _nvrtc(cupy)
    arch = _cubin_arch(cupy, nvrtc, device)
    if arch is None:
        return False
    return all(_cached_path(_cubin_name(nvrtc, code, arch)[0]) is not None for _, code, _ in units(dtype))


def _cubin(nvrtc, code, arch):
    """The path of ``code``'s cubin for sm_<arch>, compiled by NVRTC unless the cache has it (_cubin_name);
    written whole or not at all (a temporary file renamed), so concurrent processes and threads read complete
    files."""
    name, options = _cubin_name(nvrtc, code, arch)
    path = _cached_path(name)
    if path is not None:
        return path
    prog = nvrtc.createProgram(code, "cisolver.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC could not compile cisolver's kernels for sm_{arch}: {exc}\n"
                               f"{nvrtc.getProgramLog(prog)}") from None
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    for folder in (_cache_folder(), _fallback_folder()):
        path = os.path.join(folder, name)
        part = f"{path}.{os.getpid()}.{threading.get_ident()}.part"
        try:
            os.makedirs(folder, exist_ok=True)
            with open(part, "wb") as f:
                f.write(cubin)
            os.replace(part, path)
            return path
        except OSError:               # a read-only or full cache folder: a private temporary one
            try:
                os.remove(part)
            except OSError:
                pass
    raise OSError(f"no folder to keep cisolver's compiled kernels in ({_cache_folder()}, {_fallback_folder()})")


def _fallback_folder():
    return os.path.join(tempfile.gettempdir(), f"cisolver-kernels-{os.getuid()}")


def _module(cupy, key, code, names):
    """The loaded unit of ``key`` (device, dtype, constants, unit): made here unless a background compilation
    made it or is making it (then waited for); the failure of a background compilation is raised here."""
    with _lock:
        if key in _modules:
            return _modules[key]
        waiting = _pending.get(key)
    if waiting is not None:               # a background compilation: wait for it rather than compile twice
        waiting.wait()
    with _lock:
        if key in _modules:
            return _modules[key]
        error = _failed.pop(key, None)    # a background compilation's failure, raised once (then tried again)
    if error is not None:
        raise error
    module = _compile(cupy, code, names)
    with _lock:
        return _modules.setdefault(key, module)


def function(cupy, dtype, name):
    """The kernel ``name`` for ``dtype`` on the current device (its unit compiled or loaded on first use)."""
    dtype = np.dtype(dtype)
    device = cupy.cuda.runtime.getDevice()
    constants = _constants()
    key = (device, dtype, constants, name)
    kernel = _functions.get(key)
    if kernel is None:
        unit = next((u for u in units(dtype) if name in u[2]), None)
        if unit is None:
            raise ValueError(f"cisolver has no CUDA kernel named {name!r}")
        kernel = _module(cupy, (device, dtype, constants, unit[0]), *unit[1:]).get_function(name)
        _functions[key] = kernel
    return kernel


class Compilations:
    """The background compilations ``prepare`` started: one job per unit (hybridblas.workers)."""

    def __init__(self, threads):
        self.threads = tuple(threads)

    def join(self, timeout=None):
        """Wait for every thread (``timeout``: seconds for all of them together)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self.threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def is_alive(self):
        return any(thread.is_alive() for thread in self.threads)


def _compile_on_devices(cupy, code, names, keys):
    """Compile (or load) one unit on the devices of ``keys``, one after the other; a failure is kept for the
    ``function`` call that needs the unit."""
    for key in keys:
        try:
            with cupy.cuda.Device(key[0]):
                module = _compile(cupy, code, names)
            with _lock:
                _modules.setdefault(key, module)
        except Exception as exc:          # handed to the caller that needs the unit
            with _lock:
                _failed[key] = exc
        finally:
            with _lock:
                _pending.pop(key).set()


def prepare(cupy, dtype, devices):
    """Compile (or load from CuPy's cache) every unit for ``dtype`` on ``devices`` in the background: one thread
    per unit, all started here, each taking the devices one after the other (a second device of the same
    architecture loads the first one's cubin). Returns the threads as one Compilations (None when every
    device has every unit or is getting it); a failure is raised by the first ``function`` call that needs the
    unit."""
    dtype = _dtype(dtype)
    constants = _constants()
    units_todo = []
    for unit, code, names in units(dtype):
        todo = []
        with _lock:
            for device in dict.fromkeys(devices):
                key = (device, dtype, constants, unit)
                if key not in _modules and key not in _pending:
                    _pending[key] = threading.Event()
                    todo.append(key)
        if todo:
            units_todo.append((code, names, todo))
    jobs = [workers.start(_compile_on_devices, cupy, code, names, todo, name="cuda-compile")
            for code, names, todo in units_todo]
    return Compilations(jobs) if jobs else None
