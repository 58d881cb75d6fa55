"""hybridblas's public API: flapw and cisolver import only what ``hybridblas.__all__`` exports, every exported
name resolves, importing hybridblas loads neither CuPy nor mpi4py, and the public helpers added for the
consumers (lowlevel, blas_threads, distributed, array_module, gpu_multiprocessors, peers) keep their
contracts: results against float64 references on random data, refusals naming the argument and value."""
import ast
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import hybridblas as hb
from hybridblas import blas_threads, distributed, lowlevel, peers

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS = ("flapw", "cisolver")


# ------------------------------------------------------------------ what the consumers import

def _exported_module(name):
    return name in hb.__all__ and isinstance(getattr(hb, name, None), types.ModuleType)


def _check_names(module, names):
    """The names of ``from <module> import names`` that are not public."""
    parts = module.split(".")
    if parts[0] != "hybridblas":
        return []
    if len(parts) == 1:
        return [n for n in names if n not in hb.__all__]
    if len(parts) > 2 or not _exported_module(parts[1]):
        return [f"{module} (not an exported module)"]
    public = getattr(getattr(hb, parts[1]), "__all__", None)
    return [f"{module}.{n}" for n in names if n.startswith("_") or (public is not None and n not in public)]


def private_imports(source, filename="<source>"):
    """[(line, what)] for every import of a hybridblas name that ``hybridblas.__all__`` does not export:
    ``import hybridblas.x`` and ``from hybridblas.x import y`` with x no exported module (or y private to
    it), ``from hybridblas import z`` with z not exported, and importlib.import_module("hybridblas.x")."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "hybridblas" and len(parts) > 1 and (len(parts) > 2 or not _exported_module(parts[1])):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, what) for what in _check_names(node.module, [a.name for a in node.names])]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            parts = node.args[0].value.split(".")
            if parts[0] == "hybridblas" and len(parts) > 1 and (len(parts) > 2 or not _exported_module(parts[1])):
                found.append((node.lineno, node.args[0].value))
    return found


def test_consumers_import_only_public_names():
    files = [p for pkg in CONSUMERS for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(files) > 20                                  # the walk found the packages
    bad = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in files
           for line, what in private_imports(p.read_text(encoding="utf-8"), str(p))]
    assert not bad, "flapw/cisolver import hybridblas internals:\n" + "\n".join(bad)


@pytest.mark.parametrize("source,flagged", [
    ("from hybridblas.problem import array_module", ["hybridblas.problem (not an exported module)"]),
    ("import hybridblas.cublas", ["hybridblas.cublas"]),
    ("import hybridblas.devices.cuda_skinny as s", ["hybridblas.devices.cuda_skinny"]),
    ("def f():\n    from hybridblas import herk, host_blas", ["host_blas"]),
    ("from hybridblas.console import _private", ["hybridblas.console._private"]),
    ("from hybridblas.distributed import threading", ["hybridblas.distributed.threading"]),
    ("import importlib\nimportlib.import_module('hybridblas.peers.x')", ["hybridblas.peers.x"]),
    ("import hybridblas as hb\nfrom hybridblas import lowlevel, array_module\nimport hybridblas.distributed\n"
     "from hybridblas.blas_threads import limit\nfrom numpy import problem", []),
])
def test_the_import_check_flags_internals(source, flagged):
    assert [what for _, what in private_imports(source)] == flagged


# ------------------------------------------------------------------ the package itself

def test_every_exported_name_resolves():
    assert len(set(hb.__all__)) == len(hb.__all__)
    for name in hb.__all__:
        assert getattr(hb, name, None) is not None, name
    for name in ("blas_threads", "console", "devspec", "distributed", "lowlevel", "memory", "peers", "testing"):
        module = getattr(hb, name)
        assert isinstance(module, types.ModuleType) and module.__doc__, name
        for member in getattr(module, "__all__", []):
            assert getattr(module, member, None) is not None, f"{name}.{member}"
    namespace = {}
    exec("from hybridblas import *", namespace)
    assert set(hb.__all__) <= set(namespace)


def test_import_loads_no_cupy_and_no_mpi4py():
    code = ("import sys, hybridblas; loaded = [m for m in ('cupy', 'mpi4py') if m in sys.modules]; "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------ lowlevel

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _close(got, expected, dtype):
    tol = 60 * np.finfo(dtype).eps * max(1.0, np.abs(expected).max(initial=0.0))
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)


def _laid_out(rng, shape, dtype, layout):
    """A random (rows, cols) block: "C", "F", or "cols" (a column range of a wider row-major buffer)."""
    if layout == "cols":
        buf = _rand(rng, (shape[0], shape[1] + 5), dtype)
        return buf[:, 2:2 + shape[1]]
    x = _rand(rng, shape, dtype)
    return np.asfortranarray(x) if layout == "F" else x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,p,q", [(0, 3, 4), (5, 0, 4), (1, 1, 1), (7, 3, 5), (33, 8, 1), (1, 6, 9)])
@pytest.mark.parametrize("layouts", [("C", "C", "C"), ("F", "F", "F"), ("cols", "cols", "C"), ("F", "C", "cols"),
                                     ("cols", "F", "F")])
def test_host_gemm_against_float64(dtype, n, p, q, layouts, rng):
    out = _laid_out(rng, (n, q), dtype, layouts[0])
    a, b = _laid_out(rng, (n, p), dtype, layouts[1]), _laid_out(rng, (p, q), dtype, layouts[2])
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    ref_a, ref_b, before = a.astype(wide), b.astype(wide), out.astype(wide)
    alpha, beta = (0.75 - 0.5j, 0.25 + 1j) if np.dtype(dtype).kind == "c" else (0.75, -0.5)
    assert lowlevel.host_gemm(out, a, b, beta, alpha) is out
    _close(out, alpha * ref_a @ ref_b + beta * before, dtype)
    out[...] = np.nan                                       # beta = 0 does not read out
    lowlevel.host_gemm(out, a, b)
    _close(out, ref_a @ ref_b, dtype)
    np.testing.assert_array_equal(a, ref_a.astype(dtype))   # inputs untouched


def test_host_gemm_writes_only_its_column_range(rng):
    buf = np.full((9, 20), np.nan)
    a, m = rng.standard_normal((9, 6)), rng.standard_normal((6, 7))
    lowlevel.host_gemm(buf[:, 4:11], a, m)
    _close(buf[:, 4:11], a @ m, np.float64)
    assert np.isnan(buf[:, :4]).all() and np.isnan(buf[:, 11:]).all()


def test_host_gemm_is_the_same_call_as_before_on_row_major_blocks(rng):
    """Row-major column ranges (cisolver's blocks) make the N, N call on out^T = m^T a^T, bit for bit."""
    from hybridblas.host_blas import Args, routine
    buf = rng.standard_normal((1001, 24))
    out, a, m = buf[:, :8], buf[:, 8:16], np.ascontiguousarray(rng.standard_normal((8, 8)))
    want = out.copy()
    g = Args()
    routine("d", "gemm")(g.char("N"), g.char("N"), g.int(8), g.int(1001), g.int(8), g.scalar(1.0, np.float64),
                         m.ctypes.data, g.int(8), a.ctypes.data, g.int(24), g.scalar(0.5, np.float64),
                         want.ctypes.data, g.int(8))
    lowlevel.host_gemm(out, a, m, 0.5)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,q", [(0, 3), (4, 0), (1, 1), (9, 5), (1, 4), (17, 1)])
@pytest.mark.parametrize("v_layout", ["C", "F", "cols"])
@pytest.mark.parametrize("t_layout", ["C", "F"])
@pytest.mark.parametrize("lower", [False, True])
def test_host_trmm_right_reads_one_triangle(dtype, n, q, v_layout, t_layout, lower, rng):
    v = _laid_out(rng, (n, q), dtype, v_layout)
    tri = (np.tril if lower else np.triu)(_rand(rng, (q, q), dtype) + 3 * np.eye(q, dtype=dtype))
    poisoned = tri + (np.triu if lower else np.tril)(np.full((q, q), np.nan, dtype=dtype), 1 if lower else -1)
    t = np.asfortranarray(poisoned) if t_layout == "F" else poisoned
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    expected = v.astype(wide) @ tri.astype(wide)
    assert lowlevel.host_trmm_right(v, t, lower=lower) is v
    _close(v, expected, dtype)


@pytest.mark.parametrize("call,exc,match", [
    (lambda o, a, b: lowlevel.host_gemm(o.tolist(), a, b), TypeError, r"out must be a numpy array, got list"),
    (lambda o, a, b: lowlevel.host_gemm(o, a[None], b), ValueError, r"a must be 2-D, got shape \(1, 6, 4\)"),
    (lambda o, a, b: lowlevel.host_gemm(o, a.astype(np.float32), b), TypeError,
     r"a has dtype float32, unlike out \(float64\)"),
    (lambda o, a, b: lowlevel.host_gemm(np.zeros((6, 5), int), a, b), TypeError, r"out has dtype int64; supported"),
    (lambda o, a, b: lowlevel.host_gemm(o, a, b[:3]), ValueError,
     r"a \(6, 4\) times b \(3, 5\) does not fit out \(6, 5\)"),
    (lambda o, a, b: lowlevel.host_gemm(o, a[:, ::2], b[:2]), ValueError,
     r"a needs a unit stride along its rows or its columns.*strides \(32, 16\)"),
    (lambda o, a, b: lowlevel.host_gemm(o, a, b, beta="0"), TypeError, r"beta must be a scalar, got '0'"),
    (lambda o, a, b: lowlevel.host_gemm(o, a, b, alpha=1j), ValueError, r"alpha is complex but the data is float64"),
    (lambda o, a, b: lowlevel.host_trmm_right(o, b[:5]), ValueError, r"t must be 5 x 5 for v of shape \(6, 5\)"),
    (lambda o, a, b: lowlevel.host_trmm_right(o, b[:5], lower=1), TypeError, r"lower must be True or False, got int 1"),
    (lambda o, a, b: lowlevel.device_gemm(o, a, b), TypeError, r"out must be a cupy array, got ndarray"),
    (lambda o, a, b: lowlevel.conj_transpose(o, o.T), TypeError, r"dst must be a cupy array, got ndarray"),
    (lambda o, a, b: lowlevel.to_host(o, o.copy()), TypeError, r"src must be a cupy array, got ndarray"),
    (lambda o, a, b: lowlevel.to_host([[0.0]], o), TypeError, r"dst must be a numpy array, got list"),
    (lambda o, a, b: lowlevel.to_host(o[:, ::2], o), ValueError, r"dst needs a unit stride"),
])
def test_lowlevel_refuses_bad_input_before_writing(call, exc, match, rng):
    out, a, b = np.full((6, 5), np.nan), rng.standard_normal((6, 4)), rng.standard_normal((4, 5))
    with pytest.raises(exc, match=match):
        call(out, a, b)
    assert np.isnan(out).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layouts", [("cols", "cols", "C"), ("F", "F", "F"), ("C", "F", "cols")])
def test_device_gemm_against_float64(dtype, layouts, rng):
    import cupy
    out, a, b = (_laid_out(rng, s, dtype, lay) for s, lay in zip([(37, 5), (37, 8), (8, 5)], layouts))
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    expected = 0.5 * a.astype(wide) @ b.astype(wide) - 2.0 * out.astype(wide)
    d_out, d_a, d_b = (cupy.asarray(x.base)[:, 2:2 + x.shape[1]] if lay == "cols" else cupy.asarray(x)
                       for x, lay in zip((out, a, b), layouts))
    lowlevel.device_gemm(d_out, d_a, d_b, beta=-2.0, alpha=0.5)
    _close(cupy.asnumpy(d_out), expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_conj_transpose_on_a_panel(dtype, rng):
    import cupy
    c = cupy.asarray(np.asfortranarray(_rand(rng, (70, 70), dtype)))
    want = cupy.asnumpy(c[40:70, 10:30]).conj().T
    before = cupy.asnumpy(c)
    lowlevel.conj_transpose(c[10:30, 40:70], c[40:70, 10:30])
    got = cupy.asnumpy(c)
    np.testing.assert_array_equal(got[10:30, 40:70], want)
    got[10:30, 40:70] = before[10:30, 40:70]
    np.testing.assert_array_equal(got, before)                 # nothing else written
    with pytest.raises(ValueError, match=r"src must be 30 x 20 for dst of shape \(20, 30\), got \(20, 30\)"):
        lowlevel.conj_transpose(c[10:30, 40:70], c[0:20, 0:30])


def test_prepare_kernels_refuses_bad_arguments():
    with pytest.raises(TypeError, match="dtype must be one of float32, float64, complex64, complex128, got int32"):
        lowlevel.prepare_kernels(np.int32, [0])
    for devices in ([-1], [True], ["cuda:0"]):
        with pytest.raises(ValueError, match=r"devices must be GPU indices \(non-negative integers\), got "):
            lowlevel.prepare_kernels(np.float32, devices)


def test_prepare_kernels_refuses_bad_emulation_arguments():
    for bits in (7, 63, 54.0, True, "54"):
        with pytest.raises(ValueError, match=r"emulation_bits must be an integer in 8..62 \(or None\), got "):
            lowlevel.prepare_kernels(np.complex128, [0], emulation_bits=bits, k=20000)
    for k in (None, 0, -5, 1.5e4, True):
        with pytest.raises(ValueError, match="k must be a positive integer.*, got "):
            lowlevel.prepare_kernels(np.complex128, [0], emulation_bits=54, k=k)
    with pytest.raises(ValueError, match="k must be a positive integer, got -5"):
        lowlevel.prepare_kernels(np.float64, [0], k=-5)
    assert lowlevel.prepare_kernels(np.float64, []) is None          # no GPU named: nothing to compile


class _CompilingCupy:
    """What the kernels' compilation (cuda_skinny, cuda_grams, cuda_ozaki, cuda_tri_store) uses of CuPy: RawModule
    and RawKernel (recording the device each loads on and the first line of the code, or the kernel's name),
    Device."""

    def __init__(self):
        fake, self.loaded, self.device = self, [], 0

        class RawModule:
            def __init__(self, code, options):
                fake.loaded.append((fake.device, code.split("\n", 1)[0]))

            def get_function(self, name):
                return name

        class Device:
            def __init__(self, i=None):
                self.i, self.id = i, fake.device

            def __enter__(self):
                self.prev, fake.device = fake.device, self.i

            def __exit__(self, *exc):
                fake.device = self.prev

        class RawKernel:
            def __init__(self, code, name):
                fake.loaded.append((fake.device, name))

        self.RawModule = RawModule
        self.RawKernel = RawKernel
        self.cuda = SimpleNamespace(Device=Device)


def test_skinny_kernels_prepared_once_per_device_in_the_background(monkeypatch):
    from hybridblas.devices import cuda_skinny
    monkeypatch.setattr(cuda_skinny, "_modules", {})
    cp = _CompilingCupy()
    assert cuda_skinny.prepare(cp, np.float64, [0, 1]) is None          # float64 takes cuBLAS: nothing to compile
    thread = cuda_skinny.prepare(cp, np.float32, [1, 0, 1])
    thread.join(5)
    assert cp.loaded == [(1, "typedef float T;"), (0, "typedef float T;")]
    assert cuda_skinny.prepare(cp, np.float32, [0, 1]) is None           # both have them now
    with cp.cuda.Device(1):
        assert cuda_skinny._kernels(cp, np.dtype(np.float32)) == ("skinny_gram_partials", "skinny_gram_finish")
    assert len(cp.loaded) == 2


def test_gram_kernels_prepared_once_per_device_dtype_and_constants(monkeypatch):
    from hybridblas.devices import cuda_grams
    monkeypatch.setattr(cuda_grams, "_modules", {})
    cp = _CompilingCupy()
    assert cuda_grams.prepare(cp, np.complex128, [0]) is None               # no Gram kernels for complex data
    cuda_grams.prepare(cp, np.float64, [1, 0, 1]).join(5)
    cuda_grams.prepare(cp, np.float32, [0]).join(5)
    assert cp.loaded == [(1, "typedef double T;"), (0, "typedef double T;"), (0, "typedef float T;")]
    assert cuda_grams.prepare(cp, np.float64, [0, 1]) is None               # both have them now
    with cp.cuda.Device(1):
        assert cuda_grams._kernels(cp, np.float64) == cuda_grams.KERNELS
    assert len(cp.loaded) == 3
    monkeypatch.setattr(cuda_grams, "TILE", 64)                              # another source: compiled again
    with cp.cuda.Device(1):
        cuda_grams._kernels(cp, np.float64)
    assert len(cp.loaded) == 4


def test_prepare_kernels_starts_the_gram_kernels_for_float32_and_float64(monkeypatch):
    from hybridblas.devices import cuda_grams, cuda_skinny, cuda_tri_store
    monkeypatch.setattr(cuda_grams, "_modules", {})
    monkeypatch.setattr(cuda_skinny, "_modules", {})
    monkeypatch.setattr(cuda_tri_store, "_kernels", {})
    cp = _CompilingCupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    both = lowlevel.prepare_kernels(np.float32, [0])         # the skinny products' module and the Grams', side by side
    assert both.join(5) is True and not both.is_alive() and both.done()
    assert sorted(cp.loaded) == [(0, "typedef float T;")] * 2
    assert list(cuda_grams._modules) == [(0, np.dtype(np.float32), cuda_grams._constants())]
    assert list(cuda_skinny._modules) == [(0, np.dtype(np.float32))]
    assert lowlevel.prepare_kernels(np.float64, [0]).join(5) is True       # the Grams' and the band triangle store
    assert sorted(cp.loaded[2:]) == [(0, "tri_store"), (0, "typedef double T;")]
    assert (0, np.dtype(np.float64), cuda_grams._constants()) in cuda_grams._modules
    for dtype in (np.float32, np.float64, np.complex64, np.complex128):
        assert lowlevel.prepare_kernels(dtype, [0]) is None                 # compiled, or none to compile
    assert len(cp.loaded) == 4


@pytest.mark.gpu
def test_prepared_skinny_kernels_are_the_ones_the_call_uses(monkeypatch, rng):
    import cupy
    from hybridblas.devices import cuda_skinny
    monkeypatch.setattr(cuda_skinny, "_modules", {})
    thread = lowlevel.prepare_kernels(np.float32, [0])
    thread.join()
    kernels = cuda_skinny._modules[(0, np.dtype(np.float32))]
    with cupy.cuda.Device(0):
        s = cupy.asarray(_rand(rng, (5000, 12), np.float32))
        c = cupy.full((12, 12), np.nan, dtype=np.float32)
        hb.syrk(1.0, s, 0.0, c, trans="T", context=hb.Context(devices=["cuda:0"]))
    ref = np.tril(cupy.asnumpy(s).astype(np.float64).T @ cupy.asnumpy(s).astype(np.float64))
    np.testing.assert_allclose(np.tril(cupy.asnumpy(c)), ref, rtol=1e-6)
    assert cuda_skinny._modules[(0, np.dtype(np.float32))] is kernels       # not compiled again


# ------------------------------------------------------------------ the other public helpers

def test_array_module_names_the_argument():
    assert hb.array_module(np.ones(2)) is np
    with pytest.raises(TypeError, match=r"x must be a numpy or cupy array, got list \[1, 2\]"):
        hb.array_module([1, 2])
    with pytest.raises(TypeError, match=r"h must be a numpy or cupy array, got tuple"):
        hb.array_module((1,), "h")


def test_blas_threads_limit_checks_and_restores():
    assert blas_threads.available_cores() >= 1
    before = blas_threads.current()
    with blas_threads.limit(1):
        assert blas_threads.current() == 1
    assert blas_threads.current() == before
    for bad, exc in ((0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)):
        with pytest.raises(exc, match=rf"threads must be a positive integer or None, got .*{bad!r}"):
            with blas_threads.limit(bad):
                pass
    assert blas_threads.current() == before


@pytest.mark.parametrize("n,size", [(0, 1), (1, 3), (10, 3), (17, 4), (5, 5)])
def test_block_range_covers_the_rows_evenly(n, size):
    ranges = [distributed.block_range(n, size, r) for r in range(size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(hi == lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("args,exc,match", [
    ((10, 0, 0), ValueError, r"size must be at least 1, got 0"),
    ((10, 2, 2), ValueError, r"rank must be below size=2, got 2"),
    ((-1, 2, 0), ValueError, r"n must be at least 0, got -1"),
    ((10.0, 2, 0), TypeError, r"n must be an integer, got float 10.0"),
])
def test_block_range_refuses(args, exc, match):
    with pytest.raises(exc, match=match):
        distributed.block_range(*args)


def test_distributed_helpers_without_mpi(rng):
    x = rng.standard_normal((4, 3))
    assert distributed.allreduce(x, None) is x and distributed.allgather_rows(x, None) is x
    with pytest.raises(TypeError, match=r"x must be a numpy or cupy array, got list"):
        distributed.allreduce([1.0], None)
    with pytest.raises(ValueError, match=r"devices must be 'all', 'gpu' or 'cpu', got 'cuda:0'"):
        distributed.node_context(None, "cuda:0")
    assert [d.kind for d in distributed.node_context(None, "cpu").devices] == ["cpu"]
    g = distributed.gram(x, None)
    _close(np.tril(g), np.tril(x.T @ x), np.float64)


def test_gpu_multiprocessors_refuses_before_asking():
    with pytest.raises(TypeError, match=r"device must be a GPU id \(int\) or None, got str '0'"):
        hb.gpu_multiprocessors("0")
    with pytest.raises(TypeError, match=r"got bool True"):
        hb.gpu_multiprocessors(True)
    with pytest.raises(ValueError, match=rf"device must be a visible GPU id, got {hb.gpu_count() + 3}"):
        hb.gpu_multiprocessors(hb.gpu_count() + 3)


@pytest.mark.gpu
def test_gpu_multiprocessors_is_the_runtime_count():
    import cupy
    want = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    assert hb.gpu_multiprocessors(0) == want
    with cupy.cuda.Device(0):
        assert hb.gpu_multiprocessors() == want


@pytest.mark.parametrize("call,exc,match", [
    (lambda a, c: peers.cublasxt_herk(1.0, a, 0.0, c, trans="C"), ValueError,
     r"a \(6, 4\) with trans='C' do not fit c \(6, 6\)"),
    (lambda a, c: peers.cublasxt_herk(1.0, np.ascontiguousarray(a), 0.0, c), TypeError,
     r"a must be a 2-D Fortran-ordered numpy array"),
    (lambda a, c: peers.cublasxt_herk(1.0, a.real.copy(order="F"), 0.0, c.real.copy(order="F")), TypeError,
     r"herk needs complex data, got dtype float64"),
    (lambda a, c: peers.cublasxt_her2k(1.0, a, a.astype(np.complex64, order="F"), 0.0, c), TypeError,
     r"b has dtype complex64; c has complex128"),
    (lambda a, c: peers.cublasxt_gemm(1.0, a, a, 0.0, c, transb="X"), ValueError,
     r"transb must be 'N', 'T' or 'C', got 'X'"),
    (lambda a, c: peers.cublasxt_gemm(1.0, a, a, 0.0, c), ValueError, r"op\(a\) times op\(b\) does not fit c"),
])
def test_peers_refuse_before_any_gpu_work(call, exc, match, rng):
    a = np.asfortranarray(_rand(rng, (6, 4), np.complex128))
    c = np.asfortranarray(np.full((6, 6), np.nan, dtype=np.complex128))
    with pytest.raises(exc, match=match):
        call(a, c)
    assert np.isnan(c).all()


def test_emulation_kernels_prepared_once_per_device_for_the_count_k_needs(monkeypatch):
    from hybridblas import ozaki
    from hybridblas.devices import cuda_ozaki
    monkeypatch.setattr(cuda_ozaki, "_modules", {})
    cp = _CompilingCupy()
    least = cuda_ozaki.MIN_K["c", False]
    assert cuda_ozaki.prepare(cp, np.complex64, [0], 54, 50000) is None          # not emulated
    assert cuda_ozaki.prepare(cp, np.complex128, [0], 54, least - 1) is None      # below the least emulated k
    thread = cuda_ozaki.prepare(cp, np.complex128, [1, 0, 1], 54, 60000)
    thread.join(30)
    count = ozaki.moduli_for(60000, 54, True)
    assert set(cuda_ozaki._modules) == {(1, count), (0, count)}
    assert [dev for dev, _ in cp.loaded] == [1, 0]
    assert cuda_ozaki.prepare(cp, np.complex128, [0, 1], 54, 60000) is None       # both have them now
    cuda_ozaki.prepare(cp, np.float64, [0], 40, 20000).join(30)
    assert (0, ozaki.moduli_for(20000, 40, False)) in cuda_ozaki._modules


def test_page_lock_refuses_non_arrays_and_leaves_small_ones_unlocked():
    """hybridblas.memory.page_lock: TypeError naming a non-array; False (nothing locked) under 256 MiB."""
    from hybridblas import host_pinning, memory
    with pytest.raises(TypeError, match=r"arr must be a numpy array, got list \[1, 2\]"):
        memory.page_lock([1, 2])
    before = host_pinning.pinned_bytes()
    assert memory.page_lock(np.zeros(1000)) is False
    assert host_pinning.pinned_bytes() == before
