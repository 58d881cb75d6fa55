"""Per-stage accounting of a build: seconds, LAWN 41 flops, bytes; a printable table and JSON."""
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["BuildReport", "GpuTimeline", "flops"]


def flops(kind, n, k, m=None):
    """LAWN 41 counts for complex double (one complex multiply-add = 8 flops), as hybridblas counts them.

    herk/herkx(gemmt): 4 k n(n+1); her2k: 8 k n(n+1); gemm: 8 m n k; small T·A products: 8 m n k.
    """
    if kind in ("zherk", "zherkx"):
        return 4.0 * k * n * (n + 1)
    if kind == "zher2k":
        return 8.0 * k * n * (n + 1)
    if kind in ("zgemm", "zhemm", "ztrmm"):
        return 8.0 * (n if m is None else m) * n * k if kind != "ztrmm" else 4.0 * m * n * k
    raise ValueError(f"unknown flop kind {kind!r}")


class GpuTimeline:
    """Times the stages of a GPU build by CUDA events on the current stream, one where each stage starts and
    one where it ends, read once when the build ends (BuildReport.settle) instead of waiting for the GPU after
    every stage: the host queues the next stage while the GPU runs this one. A stage's seconds run from the later
    of the end of the work queued before it and the moment the host began the stage, to the end of its own work
    (its work, and any wait for the host to queue the rest of it); a GPU left idle between stages, waiting for the
    host, counts in no stage. Waiting after each of a NaCl Kmax 3.0 k-point's 9 stages cost 3 of its 25.5 ms
    (one H100)."""

    def __init__(self, cupy):
        self._cupy = cupy

    def mark(self):
        event = self._cupy.cuda.Event()
        event.record()
        return event

    def seconds(self, start, end):
        end.synchronize()
        return self._cupy.cuda.get_elapsed_time(start, end) / 1e3


@dataclass
class Stage:
    name: str
    seconds: float = 0.0
    flops: float = 0.0
    blas: bool = False      # a large product that went to the BLAS backend
    calls: int = 0
    overlapped: bool = False   # ran beside a BLAS call: its seconds are not part of the total


@dataclass
class BuildReport:
    method: str = "refined"
    system: str = ""
    n_atoms: int = 0
    n_g: int = 0
    n_l: int = 0
    batch_atoms: int = 0
    backend: str = ""
    stages: dict = field(default_factory=dict)
    peak_temp_bytes: int = 0          # A, B and work buffers alive at once (H and S excluded)
    buffers: dict = field(default_factory=dict)
    hs_bytes: int = 0
    setup: dict = field(default_factory=dict)   # k-independent seconds (radial functions, T matrices)
    operands: str = "host"            # where A, B, X and the T products lived: "host" or "device"
    hs_built_on_gpu: bool = False     # host H and S built on the GPU of the operands, then copied to the host
    _marks: list = field(default_factory=list, repr=False, compare=False)    # (stage, timeline, start, end)
    _settling: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @contextmanager
    def stage(self, name, flop_count=0.0, blas=False, sync=None, overlapped=False):
        """Time one stage: host wall seconds, after sync() when given (the work it queued has finished),
        or, with a GpuTimeline, the GPU's seconds between events, added by settle()."""
        st = self.stages.setdefault(name, Stage(name, blas=blas, overlapped=overlapped))
        timeline = sync if isinstance(sync, GpuTimeline) else None
        start = timeline.mark() if timeline is not None else None
        t0 = time.perf_counter()
        try:
            yield st
        finally:
            if timeline is not None:
                self._marks.append((st, timeline, start, timeline.mark()))
            else:
                if sync is not None:
                    sync()
                st.seconds += time.perf_counter() - t0
            st.flops += flop_count
            st.calls += 1

    def settle(self):
        """Wait for the GPU work of the stages timed by a GpuTimeline and add their seconds (the build's work is
        then complete); nothing to do for host stages. Reading the report's seconds (total_seconds,
        blas_seconds, as_dict, table) settles it first."""
        with self._settling:                   # a second reader waits for the first one's result
            while self._marks:
                st, timeline, start, end = self._marks[0]
                seconds = timeline.seconds(start, end)              # raises (a GPU fault): the mark stays
                st.seconds += seconds
                self._marks.pop(0)

    def note_buffers(self, **nbytes):
        self.buffers.update(nbytes)
        self.peak_temp_bytes = max(self.peak_temp_bytes, sum(self.buffers.values()))

    @property
    def total_seconds(self):
        """Wall seconds: every stage but those that ran beside a BLAS call (their wait is a stage)."""
        self.settle()
        return sum(s.seconds for s in self.stages.values() if not s.overlapped)

    @property
    def total_flops(self):
        return sum(s.flops for s in self.stages.values())

    @property
    def blas_seconds(self):
        self.settle()
        return sum(s.seconds for s in self.stages.values() if s.blas)

    @property
    def blas_flops(self):
        return sum(s.flops for s in self.stages.values() if s.blas)

    def as_dict(self):
        self.settle()

        def rate(f, t):
            return f / t / 1e12 if t > 0 else 0.0
        return {
            "method": self.method, "system": self.system, "N_A": self.n_atoms, "N_G": self.n_g,
            "N_L": self.n_l, "batch_atoms": self.batch_atoms, "backend": self.backend,
            "stages": [{"name": s.name, "seconds": s.seconds, "flops": s.flops, "calls": s.calls,
                        "blas": s.blas, "overlapped": s.overlapped, "tflops": rate(s.flops, s.seconds)}
                       for s in self.stages.values()],
            "total_seconds": self.total_seconds, "total_flops": self.total_flops,
            "total_tflops": rate(self.total_flops, self.total_seconds),
            "blas_seconds": self.blas_seconds, "blas_flops": self.blas_flops,
            "blas_tflops": rate(self.blas_flops, self.blas_seconds),
            "effective_zgemm_tflops": rate(self.total_flops, self.total_seconds),
            "peak_temp_bytes": self.peak_temp_bytes, "hs_bytes": self.hs_bytes, "setup_seconds": self.setup,
            "operands": self.operands, "hs_built_on_gpu": self.hs_built_on_gpu,
        }

    def table(self):
        d = self.as_dict()
        lines = [f"{self.method} HSDLA build: {self.system}  N_A={self.n_atoms} N_L={self.n_l} "
                 f"N_G={self.n_g}  batch={self.batch_atoms} atoms  BLAS={self.backend}",
                 f"{'stage':<24}{'seconds':>10}{'GFLOP':>12}{'TFLOP/s':>10}"]
        for name, secs in self.setup.items():
            lines.append(f"{'(once) ' + name:<24}{secs:>10.3f}{'':>12}{'':>10}")
        for s in d["stages"]:
            tag = " *" if s["blas"] else " ‖" if s["overlapped"] else ""
            lines.append(f"{s['name'] + tag:<24}{s['seconds']:>10.3f}{s['flops'] / 1e9:>12.1f}"
                         f"{s['tflops']:>10.3f}")
        lines.append(f"{'total (per k)':<24}{d['total_seconds']:>10.3f}{d['total_flops'] / 1e9:>12.1f}"
                     f"{d['total_tflops']:>10.3f}")
        lines.append(f"BLAS part (*): {d['blas_seconds']:.3f} s, {d['blas_tflops']:.3f} TFLOP/s; "
                     f"effective zgemm performance: {d['effective_zgemm_tflops'] * 1e3:.1f} GFLOP/s")
        if any(s["overlapped"] for s in d["stages"]):
            lines.append("(‖) ran on the host beside the BLAS calls: not part of the total")
        lines.append(f"peak temporary bytes: {_fmt_bytes(self.peak_temp_bytes)} "
                     f"({', '.join(f'{k} {_fmt_bytes(v)}' for k, v in self.buffers.items())}); "
                     f"H and S: {_fmt_bytes(self.hs_bytes)}")
        return "\n".join(lines)


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024.0
