"""The host CPU as a device: tiles go to scipy's BLAS through GIL-free ctypes calls.

A task (a static band can be most of C) is computed as tiles of about TILE_SECONDS each at the device's
rate, so an interrupted call stops within a tile's time and a failed one knows which tiles are done.
"""
import math

import numpy as np

from .. import host_blas
from ..kernels import compute_block
from ..plan import subtiles
from .base import Device, DeviceRun, check_cancel

TILE_SECONDS = 0.5       # target time of one host tile at the device's rate
MIN_TILE = 256           # never cut tiles narrower than this (BLAS efficiency)
DEFAULT_RATE = 20e9      # flop/s assumed when the call carries no rate for this device


class _HostBackend:
    xp = np
    gemm = staticmethod(host_blas.gemm)
    rank_k = staticmethod(host_blas.rank_k)


class CPUDevice(Device):
    """All (or a share of) the host's cores. Several CPUDevices in one context are separate workers."""
    kind = "cpu"

    def __init__(self, index=0):
        self.index = index

    @property
    def name(self):
        return "cpu" if self.index == 0 else f"cpu#{self.index}"

    def accepts(self, problem):
        return problem.fxp is np         # host operands (and so a host C)

    def open(self, problem):
        return _CPURun(problem, problem.run.rates.get(self.name, DEFAULT_RATE))

    def preferred_block(self, problem):
        return 512


def tile_edge(problem, k, rate):
    """Edge of square tiles that take about TILE_SECONDS at ``rate`` flop/s over inner dimension k."""
    per = problem.tile_flops(1, 1, max(k, 1))
    edge = math.sqrt(max(rate, 1.0) * TILE_SECONDS / per)
    return max(MIN_TILE, int(edge) // 64 * 64)


class _CPURun(DeviceRun):
    def __init__(self, problem, rate):
        self.problem = problem
        self.rate = rate
        self.partial = None
        self.progress = {}      # id(task) -> [tiles, tiles done, a tile was being computed]
        self.finished = set()   # id(task) of tasks computed whole

    def launch(self, task):
        p = self.problem
        if task.split and self.partial is None:
            self.partial = np.zeros((p.m, p.n), dtype=p.dtype, order="F")
        tiles = subtiles(p, task, tile_edge(p, task.k1 - task.k0, self.rate))
        state = self.progress[id(task)] = [tiles, 0, False]
        for t in tiles:
            check_cancel(p)
            state[2] = True
            if t.split:
                out, beta = self.partial[t.i0:t.i1, t.j0:t.j1], 1.0   # the partial starts at zero
            else:
                out, beta = p.c[t.i0:t.i1, t.j0:t.j1], p.beta
            compute_block(_HostBackend, p, t, out, beta)
            state[1] += 1
            state[2] = False
        del self.progress[id(task)]
        self.finished.add(id(task))

    def wait(self, handle):
        return None

    def remainder(self, task):
        if id(task) in self.finished:
            return [], []
        state = self.progress.get(id(task))
        if state is None:
            return [task], []
        tiles, done, busy = state
        if busy:
            return tiles[done + 1:], [tiles[done]]
        return tiles[done:], []

    def close(self):
        return self.partial
