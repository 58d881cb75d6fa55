"""The chunk arithmetic of the single-precision inline GPU path, run on the CPU.

cuBLAS's strided-batched gemm is replaced by a numpy stand-in that reads batch b at b * stride elements
past the operand's first one, in the operand's own memory, as cuBLAS does. So the strides, the chunk
starts, the split into several batched calls and the tail of ``cuda_inline._chunked_full`` are checked in
CI on every operand layout. The same path on a GPU is tested in test_gpu_inline_chunks.py.
"""
import numpy as np
import pytest

import hybridblas as hb
from blas_cases import ROUTINES, call_routine, layout, make_case
from hybridblas import cublas, host_blas, routines
from hybridblas import problem as _p
from hybridblas.devices import cuda_inline


class _NumpyBackend:
    xp = np
    handle = None
    stream = type("Stream", (), {"ptr": 0})()
    gemm = staticmethod(host_blas.gemm)


def _owner(x):
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def _shifted(base, elements):
    """base's shape and strides, starting ``elements`` items later in the same allocation (numpy checks
    that the view stays inside it, so a wrong stride fails here instead of reading stray memory)."""
    root = _owner(base)
    offset = base.__array_interface__["data"][0] - root.__array_interface__["data"][0] + elements * base.itemsize
    return np.ndarray(base.shape, base.dtype, buffer=root, offset=offset, strides=base.strides)


def _apply(x, op):
    out = x.T if op & _p.T else x
    return out.conj() if op & _p.R else out


def _strided_batched(handle, stream_ptr, parts, alpha, x, stride_x, y, stride_y, beta):
    for b in range(parts.shape[0]):
        prod = alpha * (_apply(_shifted(x.base, b * stride_x), x.op) @ _apply(_shifted(y.base, b * stride_y), y.op))
        parts[b] = (prod + beta * parts[b].T).T if beta != 0 else prod.T


@pytest.mark.parametrize("how", ["F", "C", "ld", "C-ld", "step"])
@pytest.mark.parametrize("name", list(ROUTINES))
def test_chunks_cover_k_once(name, how, rng, monkeypatch):
    captured = []
    monkeypatch.setattr(routines.scheduler, "execute", lambda prob, ctx: captured.append(prob))
    monkeypatch.setattr(cublas, "gemm_strided_batched", _strided_batched)
    monkeypatch.setattr(cuda_inline, "CHUNK", 8)
    legal = ROUTINES[name][2]
    for partials in (1 << 20, 1):               # one batched call, or one per chunk
        monkeypatch.setattr(cuda_inline, "PARTIALS_BYTES", partials)
        for k in (7, 8, 24, 21):
            trans = tuple(legal[rng.integers(len(legal))] for _ in range(2 if name in ("gemm", "gemmt") else 1))
            values, c0, expected, tol = make_case(rng, name, np.complex64, trans, True, 5, k, 0.7, -1.3)
            ops = [layout(v, how) for v in values]
            call_routine(name, 0.7, ops, -1.3, np.asfortranarray(c0), trans, True, hb.Context(devices=["cpu"]))
            full = cuda_inline._chunked_full(_NumpyBackend, captured.pop())
            if name in ("herk", "her2k"):       # BLAS ignores Im C_ii; _store keeps the real part
                np.fill_diagonal(full, full.diagonal().real)
            mask = np.ones(c0.shape, bool) if name == "gemm" else np.tril(np.ones(c0.shape, bool))
            err = np.abs(full[mask] - expected[mask]).max()
            assert err <= tol, (trans, k, partials, err)
