"""LOBPCG's iterations after the start (paper Algorithm 1), on the host or on GPUs.

Each iteration: the residuals of X decide which columns are still active; W = K^{-1} R for those; [P W]
made orthonormal and orthogonal to X; H W (the only sparse product); Rayleigh-Ritz on S = [X | P | W];
the new X, P, H X, H P and the residual of the new X in one update. S and H S are column ranges of one
row-major buffer each (s, hs); the update writes the next pair (s_next, hs_next), then the pairs swap.

On the host, and with MPI ranks on CPUs, every small step waits for its Gram matrices (a host trip). A GPU
run (``overlap``: in one process, or on MPI ranks with one GPU each whose Gram sums and row gathers NCCL
queues on the stream) queues whole iterations instead, and the host only reads small results the GPU has
long finished:
- the first orthonormalisation pass is factored on the GPU (cisolver.gpu_ortho) and Rayleigh-Ritz runs
  there too (cisolver.gpu_rayleigh_ritz), on Grams of one pass over S and H S for blocks of up to 2^18
  rows, float64 ones up to 2^20 (hybridblas.lowlevel.grams; hb.gemmt and hb.syrk beyond);
- the end of iteration writes R into the next basis's W columns too while every column is active, and the
  next orthonormalisation then skips its copy of W = R (``w_holds_r``; any host-path update clears it);
- the residuals of X are read once the next [P W] pass is queued, so W's columns follow the residuals of
  the X before (soft locking decided one iteration late; the convergence test itself is not late);
- the Rayleigh-Ritz summary (theta, which P columns are usable, whether S^T S was positive definite) is
  read once the next iteration's [P W] pass is queued on the guess that every active P column is usable.
Whatever the GPU kernels decline, or a guess that did not hold, goes to the host path from blocks the GPU
left as they were. MPI ranks sum their Grams on the GPUs (cisolver.distributed.device_sum) and every rank
then runs the same small kernels on the same sums, so all take the same path; each small result read on
the host is compared across ranks (``agreed``).
"""
import hashlib

import numpy as np

import hybridblas as hb

from . import dense, gpu_ortho, gpu_rayleigh_ritz
from .arrays import Later, Ready, module_of, to_host
from .blocks import update_with_residual
from .distributed import device_sum


def agreed(value, comm):
    """A small result the GPU worked out, as this rank read it. MPI ranks queue the same steps on the same
    summed Grams, so they must read the same; were they not to, they would take different paths and wait
    for each other for ever, so that is an error."""
    if comm is None:
        return value
    key = b"".join(np.asarray(v).tobytes() for v in (value if isinstance(value, tuple) else (value,)))
    digest = np.frombuffer(hashlib.blake2b(key, digest_size=16).digest(), dtype=np.uint64)
    every = np.empty((comm.Get_size(), 2), dtype=np.uint64)
    comm.Allgather(digest, every)              # a buffer collective: no pickling on the host's path
    if (every != digest[None, :]).any():
        raise RuntimeError("MPI ranks read different results of the same GPU step (non-deterministic kernel?)")
    return value


def _orthonormalise_on_host(s, q, k):
    """Last resort for a W = s[:, q:k] that is (nearly) rank deficient, serial runs only: project it off
    s[:, :q] twice and take a host QR."""
    xp = module_of(s)
    basis, w = s[:, :q], xp.ascontiguousarray(s[:, q:k])
    for _ in range(2):
        w -= basis @ (basis.T @ w)
    s[:, q:k] = xp.asarray(np.linalg.qr(to_host(w))[0], dtype=s.dtype)


def _orthonormalise_apart(s, hs, w, b, n_p, k, restarts, context, comm):
    """[P W] failed to orthonormalise together: find which part is at fault (returns the new n_p and
    restart count). P alone first: if it is fine, W is (nearly) rank deficient and gets the host QR
    against [X P], keeping P; if P alone fails too, P is dropped (a restart) and W, restored from the
    preconditioner's output (a failed pass may have mixed P into it), is orthonormalised against X alone."""
    n_w = k - b - n_p
    w_alone_failed = n_p == 0                # the failed call was W alone already
    if n_p:
        try:
            dense.orthonormalise_tail(s[:, :b + n_p], hs[:, :b + n_p], b, n_p, context=context, comm=comm)
        except dense.NotPositiveDefinite:
            n_p, restarts = 0, restarts + 1
    s[:, b + n_p:b + n_p + n_w] = w
    if n_p == 0 and not w_alone_failed:
        try:
            dense.orthonormalise_tail(s[:, :b + n_w], hs[:, :b + n_w], b, 0, context=context, comm=comm)
            return n_p, restarts
        except dense.NotPositiveDefinite:
            pass
    if comm is not None:
        raise dense.NotPositiveDefinite("W is rank deficient on a distributed run (no host QR there)")
    _orthonormalise_on_host(s, b + n_p, b + n_p + n_w)
    return n_p, restarts


class Iterations:
    """The state between iterations and the steps of one; ``run`` iterates. After it: ``s[:, :b]`` is X,
    ``theta`` its Ritz values, ``converged`` what the last residuals said, and the counters."""

    def __init__(self, op, buffers, r, theta, norm_est, sums, *, nev, tol, precond, context, comm, timer,
                 callback, overlap):
        self.op, (self.s, self.hs, self.s_next, self.hs_next), self.r = op, buffers, r
        self.theta, self.norm_est, self.pending = theta, norm_est, Ready(sums)
        self.b = r.shape[1]
        self.nev, self.tol, self.precond, self.context, self.comm = nev, tol, precond, context, comm
        self.timer, self.callback, self.overlap = timer, callback, overlap
        self.p_usable = np.zeros(self.b, dtype=bool)      # columns of s[:, b:2b] that hold a search direction
        self.converged = np.zeros(self.b, dtype=bool)
        self.history, self.it = [], 0
        self.restarts = self.second_passes = self.declined = self.redone = 0
        self.open_rr = None       # a GPU Rayleigh-Ritz step whose summary is not read yet: (queued, sums, k, n_p, n_w)
        self.w_holds_r = False    # s[:, 2b:] holds R (the queued update wrote it there): no copy when W = R fits

    def run(self, maxiter):
        """Iterate until the wanted columns have converged or ``maxiter`` iterations are done; a GPU
        Rayleigh-Ritz step still open at the end is settled."""
        for self.it in range(1, maxiter + 1):
            if self.step():
                return
        if self.open_rr is not None:
            self._settle()

    def step(self):
        """One iteration, host-trip or queued (``overlap``); True when the residuals it reads say the wanted
        columns have converged (the iteration stops there: X is the answer)."""
        b = self.b
        if self.overlap and self.declined >= 3 and self.declined * 10 > self.it:
            # the GPU passes are declined often (float32 whose [P W] wants a second pass): each decline
            # costs a wait and a host pass beside the GPU's, so the run takes the trip path from here on
            self.overlap = False
            if self.open_rr is not None:
                self._settle()
        if not self.overlap and self._residuals_read():
            return True
        active = np.nonzero(~self.converged)[0]
        n_w = len(active)
        guess = self.open_rr is not None and self.precond is None
        if self.open_rr is not None and not guess:
            self._settle()
        w = self._directions(active)
        usable = np.ones(b, dtype=bool) if guess else self.p_usable
        n_p, k, flag = self._orthonormalise(active[usable[active]], w, n_w)
        if guess:
            w, n_p, k, flag = self._settle_guess(active, w, n_w, (n_p, k, flag))
        if self.overlap and self._residuals_read():
            return True
        with self.timer.phase("spmm"):
            self._multiply(b + n_p, k)
        rr = grams = None
        if self.overlap:
            rr, grams, n_p, k = self._queue_rayleigh_ritz(w, n_p, k, flag)
        if rr is None:
            self._rayleigh_ritz_and_update(k, n_p, n_w, grams)
        else:
            self._queue_update(rr, k, n_p, n_w)
        return False

    def _settle_guess(self, active, w, n_w, orthonormalised):
        """The next [P W] pass was queued on the guess that every active P column is usable: read the open
        Rayleigh-Ritz step now, and redo the pass where the guess did not hold. Returns W, n_p, k and the
        flag."""
        n_p, k, flag = orthonormalised
        if not self._settle():                # redone on the host: new X, R and S
            w = self._directions(active)
            return (w,) + self._orthonormalise(active[self.p_usable[active]], w, n_w)
        if not self.p_usable[active].all():
            # an unusable P column is exactly zero, so the GPU pass declined and left the moved layout
            if flag.result()[0] == gpu_ortho.OK:
                raise RuntimeError("internal: the GPU pass took a P column of zeros")
            self.redone += 1
            return (w,) + self._orthonormalise(np.nonzero(self.p_usable[active])[0], w, n_w)
        return w, n_p, k, flag

    def _queue_rayleigh_ritz(self, w, n_p, k, flag):
        """The Grams of S and H S summed (over ranks too) on the GPU and Rayleigh-Ritz queued there when it
        fits (rr), else the Grams for the host's Rayleigh-Ritz (grams). A declined GPU pass takes the host
        path first, and H W again. Returns rr, grams, n_p, k."""
        rr = grams = None
        b = self.b
        with self.timer.phase("dense", "rayleigh_ritz"):
            s, hs = self.s[:, :k], self.hs[:, :k]
            if hb.lowlevel.grams_preferred(s, hs):
                both = hb.lowlevel.grams(s, hs)
            else:
                both = dense.gram_buffer(s, hs, context=self.context)
            both = device_sum(both, self.comm)
            if gpu_rayleigh_ritz.fits(s, b):
                rr = gpu_rayleigh_ritz.queue(both, b, s.dtype)
            else:
                grams = Later(both, dense.split_grams)
        if flag is not None and flag.result()[0]:
            # the GPU pass left S and H S as they were (V would cancel, is rank deficient or wants a
            # second pass): the host path, and H W again
            self.declined, rr, grams = self.declined + 1, None, None
            n_p, k = self._orthonormalise_on_host_path(w, n_p, k)
            with self.timer.phase("spmm"):
                self._multiply(b + n_p, k)
        return rr, grams, n_p, k

    def _queue_update(self, rr, k, n_p, n_w):
        """The new X, P, H X, H P and R from the queued Rayleigh-Ritz step, left open until the next
        iteration reads its summary."""
        b = self.b
        # R also into the next basis's W columns, where the next orthonormalisation wants it when nothing
        # moves (no preconditioner, every column active as now, all P usable): the staged kernel writes it
        # beside R, which saves that copy (15 us a rank at 47V, H200; the kernel's stores cost 12)
        r_in_w = self.precond is None and not self.converged.any()
        with self.timer.phase("dense", "update"):
            sums = update_with_residual(self.s_next[:, :2 * b], self.s[:, :k], self.hs_next[:, :2 * b],
                                        self.hs[:, :k], rr.m, self.r, rr.theta, later=True,
                                        r_copy=self.s_next[:, 2 * b:] if r_in_w else None)
        self.open_rr = (rr, sums, k, n_p, n_w)
        self._swap()
        self.w_holds_r = r_in_w

    def _residuals_read(self):
        """Relative residuals of the current X into the history; True when the wanted ones have converged."""
        with self.timer.phase("dense", "residual"):
            rel = np.sqrt(dense.host_sum(self.pending.result(), self.comm)) / self.norm_est
        self.history.append(rel.copy())
        self.converged = self._agreed(rel <= self.tol)     # sets the active columns: the ranks' widths
        if self.callback:
            self.callback(self.it, self.theta, rel)
        return self.converged[:self.nev].all()

    def _directions(self, active):
        """W = K^{-1} R for the active columns (R itself without a preconditioner)."""
        with self.timer.phase("precond"):
            w = self.r if len(active) == self.b else self.r[:, active]
            return self.precond.apply(w, self.theta[active]) if self.precond is not None else w

    def _orthonormalise(self, p_cols, w, n_w):
        """S = [X | P | W]: the P columns at ``p_cols`` (offsets after X) moved next to X, W after them, then
        [P W] orthonormal and orthogonal to X: queued on the GPU (returns a Later of gpu_ortho's flag) or
        on the host path (flag None). Returns n_p, k and the flag."""
        s, hs, b = self.s, self.hs, self.b
        with self.timer.phase("dense", "orthonormalise"):
            n_p = len(p_cols)
            in_place = self.w_holds_r and w is self.r and n_p == b      # the update wrote W = R there already
            self.w_holds_r = False
            if n_p and not np.array_equal(p_cols, np.arange(n_p)):
                s[:, b:b + n_p], hs[:, b:b + n_p] = s[:, b + p_cols], hs[:, b + p_cols]
            k = b + n_p + n_w
            if not in_place:
                s[:, b + n_p:k] = w
            if self.overlap:
                return n_p, k, Later(gpu_ortho.first_pass(s[:, :k], hs[:, :k], b, n_p, context=self.context,
                                                          comm=self.comm), self._agreed)
        n_p, k = self._orthonormalise_on_host_path(w, n_p, k)
        return n_p, k, None

    def _orthonormalise_on_host_path(self, w, n_p, k):
        """dense.orthonormalise_tail (one or two passes, host trips), taken apart when it fails."""
        b, n_w = self.b, k - self.b - n_p
        with self.timer.phase("dense", "orthonormalise"):
            try:
                passes = dense.orthonormalise_tail(self.s[:, :k], self.hs[:, :k], b, n_p, context=self.context,
                                                   comm=self.comm, adaptive=True)
                self.second_passes += passes > 1
            except dense.NotPositiveDefinite:
                n_p, self.restarts = _orthonormalise_apart(self.s, self.hs, w, b, n_p, k, self.restarts,
                                                           self.context, self.comm)
        return n_p, b + n_p + n_w

    def _multiply(self, c0, c1):
        """hs[:, c0:c1] <- H s[:, c0:c1]; GPU operators write the column range in place."""
        if getattr(self.op, "devices", None) is not None:
            self.op.matmat(self.s[:, c0:c1], out=self.hs[:, c0:c1])
        else:
            self.hs[:, c0:c1] = self.op.matmat(self.s[:, c0:c1])

    def _rayleigh_ritz_and_update(self, k, n_p, n_w, grams=None):
        """Rayleigh-Ritz on the host (P dropped when S^T S is not positive definite with it), then the new X,
        P = S Z (orthogonal to X, unit columns), H X, H P and the residual of the new X; the pairs swap."""
        s, hs, b = self.s, self.hs, self.b
        with self.timer.phase("dense", "rayleigh_ritz"):
            try:
                theta, c, allv, g = dense.rayleigh_ritz(s[:, :k], hs[:, :k], b, context=self.context,
                                                        comm=self.comm, with_gram=True, grams=grams)
            except dense.NotPositiveDefinite:
                if n_p == 0:
                    raise
                s[:, b:b + n_w], hs[:, b:b + n_w] = s[:, k - n_w:k].copy(), hs[:, k - n_w:k].copy()
                k, self.restarts = b + n_w, self.restarts + 1
                theta, c, allv, g = dense.rayleigh_ritz(s[:, :k], hs[:, :k], b, context=self.context,
                                                        comm=self.comm, with_gram=True)
            self.theta, self.norm_est = theta, max(self.norm_est, float(np.abs(allv).max()))
        with self.timer.phase("dense", "update"):
            z, self.p_usable = dense.next_p_coefficients(c, g, b)
            self.pending = update_with_residual(self.s_next[:, :2 * b], s[:, :k], self.hs_next[:, :2 * b],
                                                hs[:, :k], np.hstack([c, z]), self.r, theta, later=True)
            self._swap()
            self.w_holds_r = False    # this update left the W columns as they were (also when it redoes a GPU step)

    def _settle(self):
        """Read the open GPU Rayleigh-Ritz step's summary: True when it stands. When S^T S was not positive
        definite there, that step and its update are redone on the host from the same S and H S (the
        GPU's update of it is overwritten) and False is returned."""
        rr, sums, k, n_p, n_w = self.open_rr
        self.open_rr = None
        theta, largest, usable, definite = self._agreed(rr.summary())
        if definite:
            self.theta, self.p_usable, self.pending = theta, usable, sums
            self.norm_est = max(self.norm_est, largest)
            return True
        self.redone += 1
        self._swap()                                  # back to the S that step came from
        self._rayleigh_ritz_and_update(k, n_p, n_w)
        return False

    def _agreed(self, value):
        return agreed(value, self.comm)

    def _swap(self):
        self.s, self.s_next, self.hs, self.hs_next = self.s_next, self.s, self.hs_next, self.hs
