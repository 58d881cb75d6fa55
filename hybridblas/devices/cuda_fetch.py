"""Where one call's panels come from on one GPU: the operand itself when it lives there (a view), a peer copy
from the GPU that holds it, or an upload of a host operand through the staging ring, or a copy from another
GPU of the same call that uploaded that panel already (over NVLink rather than PCIe a second time).

Every copy is queued on the GPU's ``s_in`` stream and a panel's ``ready`` event says when it has landed;
the kernels' stream waits for that event. The panels stay in this GPU's ``PanelCache`` for the call's later
tiles; under memory pressure the least recently used go first.
"""
import time

import numpy as np

from .. import cuda_transfer, host_pinning
from ..cuda_panels import Panel, PanelCache, join_share, leave_share
from ..problem import k_axis


def device_of(x):
    """GPU id of a cupy array, None for a numpy array."""
    return None if isinstance(x, np.ndarray) else x.device.id


class PanelSource:
    """The panels of ``problem``'s factors on GPU ``index``, fetched on ``stream`` into ``capacity`` bytes;
    ``f_dev`` says where each factor lives (``device_of``)."""

    def __init__(self, cp, index, problem, stream, capacity, stats, f_dev):
        self.cp, self.index, self.problem, self.stream, self.stats = cp, index, problem, stream, stats
        self.f_dev = f_dev
        self.kaxis = [k_axis(problem.kind, f, fac.op) for f, fac in enumerate(problem.factors)]
        self.host_operands = problem.fxp.__name__ == "numpy"
        self.pins = [None] * len(problem.factors)       # the factors' page-locking, once asked for
        self.ring = None                                 # the 'in' staging ring, for host operands
        self.share = join_share(problem.run.call) if self.host_operands else None
        self.cache = PanelCache(capacity, stream, self.share, index)

    def close(self):
        """Leave the call's panel index, waiting for peers still copying from this GPU's panels, then drop
        the panels."""
        if self.share is not None:
            for ev in leave_share(self.problem.run.call, self.index):
                ev.synchronize()
            self.share = None
        self.cache.panels.clear()

    def needs(self, t, k0, k1):
        """The panel keys a tile's k range reads: (factor, outer0, outer1, k0, k1)."""
        kind = self.problem.kind
        if kind in ("gemm", "gemmt"):
            return [(0, t.i0, t.i1, k0, k1), (1, t.j0, t.j1, k0, k1)]
        keys = []
        for f in range(len(self.problem.factors)):
            keys.append((f, t.i0, t.i1, k0, k1))
            if (t.j0, t.j1) != (t.i0, t.i1):
                keys.append((f, t.j0, t.j1, k0, k1))
        return keys

    def ensure(self, key, keep):
        """The panel for ``key`` on this GPU, queued for arrival on the stream (its ``ready`` event)."""
        cp = self.cp
        found = self.cache.find(*key)
        if found is not None:          # this panel, or a larger one holding it
            return found
        f, o0, o1, k0, k1 = key
        base = self.problem.factors[f].base
        src = base[k0:k1, o0:o1] if self.kaxis[f] == 0 else base[o0:o1, k0:k1]
        where = self.f_dev[f]
        if where == self.index:                   # the operand already lives here: a view, no copy
            panel = Panel(key, src, owned=False, ready=None)
            self.cache.add(panel)
            return panel
        nbytes = src.shape[0] * src.shape[1] * src.dtype.itemsize
        if not self.cache.make_room(nbytes, keep):
            raise cp.cuda.memory.OutOfMemoryError(nbytes, self.cache.bytes, self.cache.capacity)
        with self.stream:
            arr = cp.empty(src.shape, dtype=src.dtype, order="F")
        if where is not None:                     # cupy on another GPU: peer copy
            cuda_transfer.copy_2d(arr, src, self.stream)
            panel = Panel(key, arr, True, self.record())
        else:
            panel = self._from_host_or_peer(key, src, arr)
        self.cache.add(panel)
        return panel

    def record(self):
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.stream)
        return ev

    def _from_host_or_peer(self, key, src, arr):
        entry, mine = self.share.claim(self.index, key)
        if not mine:
            entry["landed"].wait()
            ev = self.share.read(entry, lambda peer: self._peer_copy(arr, peer))
            if ev is not None:
                self.stats["bytes_from_peer"] += arr.nbytes
                return Panel(key, arr, True, self.record())
            entry, mine = self.share.claim(self.index, key)
        try:
            t0 = time.perf_counter()
            cuda_transfer.upload(arr, src, self.ring, self.stream, direct=host_pinning.is_ready(self.pins[key[0]]))
            self.stats["host_upload_s"] += time.perf_counter() - t0
            self.stats["bytes_from_host"] += arr.nbytes
        except BaseException:
            self.share.abandon(self.index, key)
            raise
        panel = Panel(key, arr, True, self.record())
        if mine:
            self.share.publish(entry, panel)
        return panel

    def _peer_copy(self, arr, peer):
        """Queue arr <- peer panel (another GPU) on the stream after the peer's data landed; return its event."""
        if peer.ready is not None:
            self.stream.wait_event(peer.ready)
        cuda_transfer.copy_2d(arr, peer.array, self.stream)
        return self.record()

    def view(self, f, a, b):
        """Base-oriented view of factor f over base rows a=(a0, a1) and columns b=(b0, b1), from the cache."""
        (a0, a1), (b0, b1) = a, b
        if self.kaxis[f] == 0:
            k0, k1, o0, o1 = a0, a1, b0, b1
        else:
            o0, o1, k0, k1 = a0, a1, b0, b1
        p = self.cache.find(f, o0, o1, k0, k1)
        if p is None:
            raise RuntimeError(f"cuda:{self.index}: panel {(f, o0, o1, k0, k1)} was not staged")
        _, po0, _, pk0, _ = p.key
        if self.kaxis[f] == 0:
            return p.array[k0 - pk0:k1 - pk0, o0 - po0:o1 - po0]
        return p.array[o0 - po0:o1 - po0, k0 - pk0:k1 - pk0]
