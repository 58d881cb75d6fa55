"""The GPU emulation's driver (hybridblas.devices.cuda_ozaki: panels, groups of moduli, k chunks, buffers, the
order of products, reductions and reconstruction) run on the host: CuPy replaced by numpy stand-ins whose kernels
do what the CUDA kernels do (the reconstruction through hybridblas.ozaki.reconstruct, which the CUDA code equals bit
for bit), cublasGemmEx by an exact integer product. Results must equal hybridblas.ozaki.gemm bit for bit and the
float64 reference for every routine kind. The CUDA kernels themselves: tests/gpu/test_gpu_emulation.py."""
import ctypes
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from hybridblas import cublas, ozaki, reference
from hybridblas.devices import cuda_ozaki
from hybridblas.problem import C, N, T, Operand


class Arr(np.ndarray):
    """A host array with CuPy's ``data.ptr``."""
    @property
    def data(self):
        return SimpleNamespace(ptr=self.ctypes.data)


def _arr(x):
    return np.asarray(x).view(Arr)


def _at(ptr, dtype, shape, strides):
    """An array over raw host memory at ``ptr`` (element strides), like a CUDA kernel reads it."""
    item = np.dtype(dtype).itemsize
    span = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    raw = np.frombuffer((ctypes.c_char * (span * item)).from_address(int(ptr)), dtype=dtype)
    return np.lib.stride_tricks.as_strided(raw, shape, [st * item for st in strides])


def _residue_planes(args, cplx):
    src, sr, sq, rows, depth, padded, shift, conj, out, plane, g0, g1 = args
    x = _at(src, np.complex128 if cplx else np.float64, (int(rows), int(depth)), (int(sr), int(sq)))
    s = np.asarray(shift)[:, None]
    ok = s != cuda_ozaki.NONFINITE
    values = [x.real, -x.imag if conj else x.imag] if cplx else [x]
    ints = [np.where(ok, np.trunc(np.ldexp(v, np.where(ok, s, 0).astype(np.int32))), 0) for v in values]
    parts = np.asarray(out).reshape(3 if cplx else 1, int(g1 - g0), int(rows), int(padded))
    parts[...] = 0
    for mod in range(int(g0), int(g1)):
        p = ozaki.MODULI[mod]
        res = [ozaki._residues(v, p, np) for v in ints]
        if cplx:
            res.append(ozaki._residues(res[0] + res[1], p, np))
        for part, r in enumerate(res):
            parts[part, mod - g0, :, :int(depth)] = r


def _reduce(args, cplx):
    if cplx:
        rr, ii, ss, m, n, ldp, mod, re, im, ld, acc = args
    else:
        rr, m, n, ldp, mod, re, ld, acc = args
    p, m, n, ldp, ld = ozaki.MODULI[int(mod)], int(m), int(n), int(ldp), int(ld)
    def grid(a, stride):
        return np.asarray(a)[:stride * n].reshape(n, stride)[:, :m].astype(np.int64)
    a = grid(rr, ldp) % p
    outs = [(a - grid(ii, ldp) % p) % p, (grid(ss, ldp) - a - grid(ii, ldp)) % p] if cplx else [a]
    for target, value in zip([re, im] if cplx else [re], outs):
        view = np.asarray(target)[:ld * (n - 1) + m]
        view = np.lib.stride_tricks.as_strided(view, (n, m), (ld, 1))
        view[...] = (value + view) % p if acc else value


def _rebuild(args, cplx):
    if cplx:
        planes, plane, m, n, lda, sa, sb, ptr, ldc, ar, ai, br, bi, beta_zero, mode, diag, herm = args
        alpha, beta = complex(ar, ai), complex(br, bi)
    else:
        planes, plane, m, n, lda, sa, sb, ptr, ldc, ar, br, beta_zero, mode, diag, herm = args
        alpha, beta = float(ar), float(br)
    m, n, lda, plane = int(m), int(n), int(lda), int(plane)
    count = planes.size // plane // (2 if cplx else 1)          # planes: (parts, moduli, n, lda)
    flat = np.asarray(planes).reshape(-1)
    def value(part):
        res = [flat[(part * count + t) * plane:(part * count + t + 1) * plane].reshape(n, lda)[:, :m].T
               for t in range(count)]
        return ozaki.reconstruct(res, ozaki.MODULI[:count])
    sa, sb = np.asarray(sa)[:, None], np.asarray(sb)[None, :]
    bad = (sa == cuda_ozaki.NONFINITE) | (sb == cuda_ozaki.NONFINITE)
    scale = np.where(bad, 0, -(sa + sb)).astype(np.int32)
    v = np.ldexp(value(0), scale)
    if cplx:
        v = v + 1j * np.ldexp(value(1), scale)
    v = np.where(bad, np.nan, v)
    c = _at(ptr, np.complex128 if cplx else np.float64, (m, n), (1, int(ldc)))
    new = alpha * v + (0 if beta_zero else beta * c)
    i, j = np.indices((m, n))
    below = i - j + int(diag)
    keep = np.ones((m, n), bool) if mode == 0 else (below >= 0 if mode == 1 else below <= 0)
    if herm and cplx:
        new = np.where(below == 0, new.real, new)
    c[keep] = new[keep]


def _gemm_ex(name, handle, stream, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo):
    assert name == "cublasGemmEx" and (ta.value, tb.value, at.value, bt.value, ct.value) == (1, 0, 3, 3, 10)
    m, n, k, lda, ldb, ldc = (v.value for v in (m, n, k, lda, ldb, ldc))
    x = _at(a.value, np.int8, (m, k), (lda, 1)).astype(np.int64)
    y = _at(b.value, np.int8, (n, k), (ldb, 1)).astype(np.int64)
    out = _at(c.value, np.int32, (m, n), (1, ldc))
    z = x @ y.T + int(_at(beta.value, np.int32, (1,), (1,))[0]) * out.astype(np.int64)
    assert np.abs(z).max(initial=0) < 2 ** 31                  # the INT32 sums are exact
    out[...] = z


class _Stream:
    ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait_event(self, event):
        pass


class _Kernel:
    def __init__(self, fn, cplx):
        self.fn, self.cplx = fn, cplx

    def __call__(self, grid, block, args):
        self.fn(args, self.cplx)


def _fake_cupy(count):
    kernels = {"residues_r": _Kernel(_residue_planes, False), "residues_c": _Kernel(_residue_planes, True),
               "reduce_r": _Kernel(_reduce, False), "reduce_c": _Kernel(_reduce, True),
               "rebuild_r": _Kernel(_rebuild, False), "rebuild_c": _Kernel(_rebuild, True)}

    def absmax(view, axis, out):
        v = np.asarray(view)
        mags = [np.abs(v.real), np.abs(v.imag)] if np.iscomplexobj(v) else [np.abs(v)]
        big = np.maximum.reduce([np.where(np.isfinite(x), x, np.inf) for x in mags])
        out[...] = big.max(axis=axis) if v.shape[axis] else 0

    def shifts(top, bits):
        _, e = np.frexp(top)
        return _arr(np.where(np.isinf(top), cuda_ozaki.NONFINITE, np.where(top > 0, bits - e, 0)).astype(np.int32))
    cuda = SimpleNamespace(Device=lambda *a: SimpleNamespace(id=0), Stream=lambda **kw: _Stream(),
                           Event=lambda **kw: SimpleNamespace(record=lambda stream=None: None),
                           get_current_stream=lambda: _Stream(),
                           runtime=SimpleNamespace(memGetInfo=lambda: (1 << 40, 1 << 40)))
    return SimpleNamespace(
        cuda=cuda, empty=lambda shape, dtype: _arr(np.full(shape, 77, dtype=dtype)),
        ndarray=lambda shape, dtype, memptr, strides: _at(memptr.ptr, dtype, shape,
                                                          [s // np.dtype(dtype).itemsize for s in strides]),
        get_default_memory_pool=lambda: SimpleNamespace(free_bytes=lambda: 0),
        ReductionKernel=lambda *a, **kw: absmax, ElementwiseKernel=lambda *a, **kw: shifts,
        RawModule=lambda code, options: SimpleNamespace(get_function=lambda name: kernels[name]))


@pytest.fixture
def host_gpu(monkeypatch):
    """cuda_ozaki on numpy stand-ins, emulating blocks of any size in small panels, groups and k chunks."""
    fake = _fake_cupy(None)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cuda_ozaki, "_modules", {})
    monkeypatch.setattr(cublas, "call", _gemm_ex)
    monkeypatch.setattr(cuda_ozaki, "MIN_EDGE", 1)
    monkeypatch.setattr(cuda_ozaki, "MIN_K", dict.fromkeys(cuda_ozaki.MIN_K, 1))
    for name, value in (("SUB", 24), ("STRIP", 8), ("PANEL_MIN", 8), ("K_CHUNK", 32)):
        monkeypatch.setattr(cuda_ozaki, name, value)
    return cuda_ozaki.Backend(0, _Stream(), 54)


def _random(rng, shape, cplx):
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-10, 10, (shape[0], 1)))
    return x + 1j * rng.standard_normal(shape) if cplx else x


@pytest.mark.parametrize("work", [1 << 40, 1])          # all of C at once; one modulus a group, C in panels
@pytest.mark.parametrize("cplx", [False, True])
def test_gemm_equals_the_host_arithmetic_bit_for_bit(host_gpu, cplx, work, monkeypatch, rng):
    monkeypatch.setattr(cuda_ozaki, "WORK_BYTES", work)
    m, k, n = 53, 75, 41
    a, b = _random(rng, (m, k), cplx), _random(rng, (n, k), cplx).T
    c = _arr(np.full((m, n), np.nan, dtype=a.dtype, order="F"))
    host_gpu.gemm(c, 1.0, Operand(_arr(np.asfortranarray(a)), N), Operand(_arr(np.asfortranarray(b)), N), 0.0)
    expected = ozaki.gemm(a, b, n_moduli=ozaki.moduli_for(k, 54, cplx))
    np.testing.assert_array_equal(np.asarray(c), expected)


@pytest.mark.parametrize("kind", ["herk", "her2k", "syrk", "syr2k"])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("op", [N, C])
def test_triangles_match_the_reference(host_gpu, kind, lower, op, monkeypatch, rng):
    """Each kind's triangle (alpha and beta complex where the kind takes them), in several panels; the other
    triangle untouched."""
    monkeypatch.setattr(cuda_ozaki, "WORK_BYTES", 1)
    op = T if (kind.startswith("syr") and op == C) else op
    n, k = 45, 37
    base = [_random(rng, (n, k) if op == N else (k, n), True) for _ in range(2 if kind.endswith("2k") else 1)]
    c0 = _random(rng, (n, n), True)
    alpha = 0.7 if kind == "herk" else 0.7 - 0.4j
    beta = -1.3 if kind.startswith("her") else -1.3 + 0.6j
    c = _arr(np.asfortranarray(c0))
    host_gpu.rank_k(kind, c, lower, alpha, [Operand(_arr(np.asfortranarray(x)), op) for x in base], beta)
    trans = {N: "N", C: "C", T: "T"}[op]
    ref = getattr(reference, f"ref_{kind}")(alpha, *base, beta, c0, trans, lower)
    mask = np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))
    scale = np.abs(ref).max()
    assert np.max(np.abs(np.asarray(c)[mask] - ref[mask])) < 1e-14 * scale
    np.testing.assert_array_equal(np.asarray(c)[~mask], c0[~mask])


def test_strided_and_transposed_operands_and_infinities(host_gpu, rng):
    """op(A) = A^T of a C-ordered array and op(B) = B^H of a strided view; a row holding an infinity gives NaN
    in its row of C only."""
    m, k, n = 30, 50, 28
    at = _random(rng, (k, m), True)                 # op(A) = at^T
    big = _random(rng, (n + 5, 2 * k), True)
    bh = big[2:n + 2, ::2]                          # op(B) = bh^H, a strided view
    at[4, 7] = np.inf
    c = _arr(np.zeros((m, n), dtype=complex, order="F"))
    fa = _arr(np.asfortranarray(at))                # the problem holds column-major bases
    fb = _arr(np.asfortranarray(bh))
    host_gpu.gemm(c, 1.0, Operand(fa, T), Operand(fb, C), 0.0)
    with np.errstate(invalid="ignore"):             # the infinity's row of the reference
        got, ref = np.asarray(c), at.T @ bh.conj().T
    assert np.isnan(got[7]).all()
    rest = np.arange(m) != 7
    assert np.max(np.abs(got[rest] - ref[rest])) < 1e-14 * np.abs(ref[rest]).max()


def test_an_error_in_a_product_is_the_one_reported(host_gpu, monkeypatch, rng):
    """A failure inside the products is raised as it is, even when the final wait on the side stream then fails
    too (a GPU in an error state fails every later call)."""
    state = {"broken": False}
    real_event = cuda_ozaki._event

    def rebuild(self, *args, **kw):
        state["broken"] = True
        raise ValueError("the first failure")

    def event(cupy, stream):
        if state["broken"]:
            raise RuntimeError("a later failure")
        return real_event(cupy, stream)
    monkeypatch.setattr(cuda_ozaki._Panel, "rebuild", rebuild)
    monkeypatch.setattr(cuda_ozaki, "_event", event)
    a = _arr(np.asfortranarray(_random(rng, (30, 20), True)))
    c = _arr(np.zeros((30, 30), complex, order="F"))
    with pytest.raises(ValueError, match="the first failure"):
        host_gpu.gemm(c, 1.0, Operand(a, N), Operand(a, C), 0.0)
