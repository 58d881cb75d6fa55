"""LOBPCG's start: the start block made orthonormal, H X, Rayleigh-Ritz on span(X), and the residual of the
Ritz vectors, into the first columns of the S and H S buffers.

On the host path each step waits for its Grams: Cholesky-QR twice (dense.cholqr2), then dense.rayleigh_ritz,
six host trips, each a hybridblas call and on MPI ranks a host Allreduce. At 47V on two ranks with one H200
each that took 2.5-3 ms, 35-46 us of every iteration's dense steps over a run (`dense:start` in
benchmarks.cisolver ranks).
A GPU run that queues its iterations queues the start as one: a Cholesky-QR pass factored on the GPU
(cisolver.gpu_ortho with no X: the iterations' adaptive pass, which declines where a second pass is wanted),
H X, the Grams summed on the GPUs, Rayleigh-Ritz there (cisolver.gpu_rayleigh_ritz), X C and H X C by the row
kernels and the residual; the host reads the pass's flag and the Rayleigh-Ritz summary at the end. Whatever
the GPU declined goes to the host path from the same block (made orthonormal, or as it came).
"""
import numpy as np

import hybridblas as hb

from . import dense, gpu_ortho, gpu_rayleigh_ritz
from .arrays import Later
from .blocks import product_into, residual_into
from .distributed import device_sum

def first_block(op, x, s, hs, r, *, context, comm, timer, queued, agree):
    """s[:, :b] <- the Ritz vectors X of span(x), hs[:, :b] <- H X, r <- H X - X Theta (b = x's columns; x,
    this rank's rows of the start block, is overwritten). ``queued``: try the GPU's queued start first.
    ``agree(value)``: a small result read on the host, checked to be the same on every MPI rank.
    Returns (theta, the largest |Ritz value|, r's column sums of squares on the host, and 1 when the GPU's
    queued start was declined and the host path redid it, else 0)."""
    b = x.shape[1]
    tried = queued and gpu_ortho.fits(x, 0) and gpu_rayleigh_ritz.fits(x, b)
    if tried:
        got = _queued(op, x, s, hs, r, context=context, comm=comm, timer=timer, agree=agree)
        if got is not None:
            return got + (0,)
    return _on_host_path(op, x, s, hs, r, context=context, comm=comm, timer=timer) + (int(tried),)


def _queued(op, x, s, hs, r, *, context, comm, timer, agree):
    """The start queued on the GPU (x fits its kernels); None when a kernel declined (the host path then starts
    from x: as it came, or after one Cholesky-QR pass)."""
    b = x.shape[1]
    with timer.phase("dense", "start"):
        flag = Later(gpu_ortho.first_pass(x, x, 0, 0, context=context, comm=comm))
    with timer.phase("spmm"):
        hx = op.matmat(x)
    with timer.phase("dense", "start"):
        if hb.lowlevel.grams_preferred(x, hx):
            both = hb.lowlevel.grams(x, hx)
        else:
            both = dense.gram_buffer(x, hx, context=context)
        rr = gpu_rayleigh_ritz.queue(device_sum(both, comm), b, x.dtype)
        product_into(s[:, :b], x, rr.m[:, :b])
        product_into(hs[:, :b], hx, rr.m[:, :b])
        sums = residual_into(r, hs[:, :b], s[:, :b], rr.theta, later=True)
        passed = agree(flag.result())[0] == gpu_ortho.OK
        theta, largest, _, definite = agree(rr.summary())
        if not (passed and definite):
            return None
        return theta, largest, sums.result()


def _on_host_path(op, x, s, hs, r, *, context, comm, timer):
    b = x.shape[1]
    with timer.phase("dense", "start"):
        dense.cholqr2(x, context=context, comm=comm)
    with timer.phase("spmm"):
        hx = op.matmat(x)
    with timer.phase("dense", "start"):
        theta, c, allv = dense.rayleigh_ritz(x, hx, b, context=context, comm=comm)
        product_into(s[:, :b], x, c)
        product_into(hs[:, :b], hx, c)
        sums = residual_into(r, hs[:, :b], s[:, :b], theta)
    return theta, float(np.abs(allv).max()), sums
