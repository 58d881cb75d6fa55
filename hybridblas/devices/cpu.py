"""The host CPU as a device: tiles go to scipy's BLAS through GIL-free ctypes calls."""
import numpy as np

from .. import host_blas
from ..kernels import compute_block
from .base import Device, DeviceRun


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
        return problem.xp is np

    def open(self, problem):
        return _CPURun(problem)

    def preferred_block(self, problem):
        return 512


class _CPURun(DeviceRun):
    def __init__(self, problem):
        self.problem = problem
        self.partial = None

    def launch(self, task):
        p = self.problem
        if task.split:
            if self.partial is None:
                self.partial = np.zeros((p.m, p.n), dtype=p.dtype, order="F")
            out = self.partial[task.i0:task.i1, task.j0:task.j1]
            beta = 1.0     # the partial starts at zero: every split task adds into it
        else:
            out = p.c[task.i0:task.i1, task.j0:task.j1]
            beta = p.beta
        compute_block(_HostBackend, p, task, out, beta)

    def wait(self, handle):
        return None

    def close(self):
        return self.partial
