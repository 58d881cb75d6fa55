"""Where host operands go by bands (devices.cuda_bands) rather than tiles: the rule's decisions on the shapes
measured on 2 x H100 (complex128, n = k), and the rates that earlier calls calibrate. CPU only: no GPU runs."""
from types import SimpleNamespace

import numpy as np
import pytest

import hybridblas as hb
from hybridblas.devices import cuda_bands
from hybridblas.problem import C, N, build_problem


def _problem(kind, n):
    a = np.empty((n, n), dtype=np.complex128, order="F")
    if kind == "herk":
        return build_problem("herk", 1.0, [a], 0.0, None, [N], True, None)
    b = np.empty_like(a)
    ops = [C, N] if kind == "gemmt" else [N, N]
    return build_problem(kind, 1.0, [a, b], 0.0, None, ops, True, None)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(cuda_bands, "_calibration", {})
    return hb.Context("cpu", profile=False)


@pytest.mark.parametrize("kind,n,gpus,bands", [
    ("gemmt", 4096, 1, False), ("gemmt", 8192, 1, False), ("gemmt", 16384, 1, True),
    ("herk", 8192, 1, True), ("her2k", 8192, 1, True), ("herk", 8192, 2, True), ("her2k", 8192, 2, True),
    ("gemmt", 16384, 2, True), ("herk", 16384, 2, True), ("gemmt", 8192, 2, True), ("gemmt", 4096, 2, False)])
def test_bands_where_uploads_hide_under_compute(kind, n, gpus, bands):
    """25 GB/s each way (policy.TRANSFER_RATE), 40 TF/s (the default GPU rate)."""
    rule = cuda_bands.uploads_hide(_problem(kind, n), gpus, True, [40e12] * gpus, 25e9, 25e9)
    assert rule is bands


def test_gpus_sharing_pieces_allow_longer_uploads():
    """zgemmt at 8192: on two GPUs sharing pieces the uploads may take SHARED_SHARE of compute plus write-back
    (bands against tiles, 2 x H100: 45 against 59 ms), on one GPU or without peer access UPLOAD_SHARE."""
    prob = _problem("gemmt", 8192)
    upload = prob.flops() / 80e12                # rates at which the uploads take as long as the compute
    h2d = 2 * 8192 * 8192 * 16 / 2 / upload
    assert cuda_bands.uploads_hide(prob, 2, True, [40e12] * 2, h2d, 1e15)
    assert not cuda_bands.uploads_hide(prob, 2, False, [40e12] * 2, 2 * h2d, 1e15)
    assert not cuda_bands.uploads_hide(prob, 1, True, [80e12], h2d * 2, 1e15)
    assert cuda_bands.uploads_hide(prob, 1, True, [80e12], h2d * 2 / cuda_bands.UPLOAD_SHARE, 1e15)


def test_uploads_without_peer_access_or_with_old_values_count():
    """herk at 16384 on two GPUs hides its uploads when the GPUs share pieces, not when each uploads all of A
    (15 GB/s per link); C's old values (beta != 0) count as uploads too."""
    prob = _problem("herk", 16384)
    assert cuda_bands.uploads_hide(prob, 2, True, [40e12] * 2, 15e9, 25e9)
    assert not cuda_bands.uploads_hide(prob, 2, False, [40e12] * 2, 15e9, 25e9)
    a = np.empty((8192, 8192), dtype=np.complex128, order="F")
    c = np.empty((8192, 8192), dtype=np.complex128, order="F")
    plain = build_problem("herk", 1.0, [a], 0.0, c, [N], True, None)
    old = build_problem("herk", 1.0, [a], 1.0, c, [N], True, None)
    assert cuda_bands.uploads_hide(plain, 1, True, [40e12], 25e9, 25e9)
    assert not cuda_bands.uploads_hide(old, 1, True, [40e12], 25e9, 25e9)


def test_a_gpus_first_call_of_a_routine_is_not_its_rate(fresh):
    """The first band call of a routine on a GPU loads its kernels: its reading is left out, later ones count;
    each routine and GPU on its own."""
    a, b = SimpleNamespace(name="cuda:0"), SimpleNamespace(name="cuda:1")
    assert [cuda_bands._warm(a, "herk"), cuda_bands._warm(a, "herk"), cuda_bands._warm(a, "gemmt"),
            cuda_bands._warm(b, "herk"), cuda_bands._warm(a, "gemmt")] == [False, True, False, False, True]
    assert cuda_bands.calibrated(a, "herk") is None


def test_measured_speeds_only_where_every_gpu_has_one(fresh):
    a, b = SimpleNamespace(name="cuda:0"), SimpleNamespace(name="cuda:1")
    prob = _problem("gemmt", 1024)
    cuda_bands._calibrate(a, "flops", "gemmt", 51e12, (1024, 1024))
    assert cuda_bands._speeds(prob, [a, b], [40e12, 40e12], fresh) == [40e12, 40e12]
    cuda_bands._calibrate(b, "flops", "gemmt", 49e12, (1024, 1024))
    assert cuda_bands._speeds(prob, [a, b], [40e12, 40e12], fresh) == [51e12, 49e12]
    explicit = hb.Context("cpu", profile=False, rates={"cuda:1": 7e12})
    assert cuda_bands._speeds(prob, [a, b], [40e12, 7e12], explicit) == [51e12, 7e12]


def test_a_corner_calls_mix_is_its_diagonal_blocks_rate_and_share(fresh):
    """_mix: (diagonal blocks' flop/s over the rest's, their share of the flops) from a call's kernel classes;
    kept per GPU and routine as the last call's, handed to the layout only where every GPU has one and a
    measured speed."""
    classes = {"final-rect": [2.0, 100.0], "step-rect": [1.0, 50.0], "final-diag": [1.0, 30.0]}
    ratio, share = cuda_bands._mix(classes)
    assert ratio == pytest.approx((30 / 1) / (150 / 3)) and share == pytest.approx(30 / 180)
    assert cuda_bands._mix({"final-rect": [1.0, 10.0]}) is None
    a, b = SimpleNamespace(name="cuda:0"), SimpleNamespace(name="cuda:1")
    prob = _problem("gemmt", 1024)
    size = (1024, 1024)
    cuda_bands._calibrate(a, "mix", "gemmt", (0.6, 0.2), size)
    cuda_bands._calibrate(a, "mix", "gemmt", (0.8, 0.1), size)
    assert cuda_bands.calibrated(a, ("mix", "gemmt")) == (0.8, 0.1) and cuda_bands.calibrated(a, "gemmt") is None
    assert cuda_bands._mixes(prob, [a, b], fresh) is None
    cuda_bands._calibrate(b, "mix", "gemmt", (0.9, 0.05), size)
    assert cuda_bands._mixes(prob, [a, b], fresh) is None                  # no measured speeds yet
    for d in (a, b):
        cuda_bands._calibrate(d, "flops", "gemmt", 50e12, size)
    assert cuda_bands._mixes(prob, [a, b], fresh) == [(0.8, 0.1), (0.9, 0.05)]
    explicit = hb.Context("cpu", profile=False, rates={"cuda:1": 7e12})
    assert cuda_bands._mixes(prob, [a, b], explicit) is None


def test_calibrated_rates_decide_once_measured(fresh):
    """One GPU, zgemmt at 4096 goes by tiles at the default rates (PINNED_RATE each way, 40 TF/s), and still with
    a GPU measured ten times faster; with transfers measured five times faster and the GPU back at 40 TF/s, by
    bands. A rate is the upper median of its last READINGS readings (one slower reading does not move it, three
    do); a speed below DROP of that median starts the speed's readings anew; explicit Context rates win over
    measured ones."""
    dev = SimpleNamespace(name="cuda:0")
    prob = _problem("gemmt", 4096)
    assert cuda_bands._rate(fresh, [dev], "h2d_pinned") == cuda_bands.PINNED_RATE

    def bands():
        speeds = cuda_bands._speeds(prob, [dev], [40e12], fresh)
        return cuda_bands.uploads_hide(prob, 1, True, speeds, cuda_bands._rate(fresh, [dev], "h2d_pinned"),
                                       cuda_bands._rate(fresh, [dev], "d2h_pinned"))
    assert not bands()
    size = (4096, 4096)
    for _ in range(3):
        cuda_bands._calibrate(dev, "flops", "gemmt", 400e12, size)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 400e12
    assert not bands()
    cuda_bands._calibrate(dev, "h2d_pinned", None, 250e9)
    cuda_bands._calibrate(dev, "d2h_pinned", None, 250e9)
    assert cuda_bands._rate(fresh, [dev], "h2d_pinned") == 250e9
    cuda_bands._calibrate(dev, "flops", "gemmt", 0.85 * 400e12, size)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 400e12          # one slower reading of four: the median
    assert not bands()
    for _ in range(2):
        cuda_bands._calibrate(dev, "flops", "gemmt", 0.85 * 400e12, size)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 0.85 * 400e12   # three of the last five
    cuda_bands._calibrate(dev, "flops", "gemmt", 40e12, size)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 40e12           # far below: its readings start anew
    assert bands()
    cuda_bands._calibrate(dev, "flops", "gemmt", 41e12, size)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 41e12           # the upper median of the two
    for value in (30e12, 30e12, 33e12):                                 # 0.73 of 41: anew, then within DROP
        cuda_bands._calibrate(dev, "flops", "gemmt", value, size)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 30e12
    cuda_bands._calibrate(dev, "flops", "gemmt", 39e12, size)           # 1.3 x 30: anew (the GPU is back)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 39e12
    cuda_bands._calibrate(dev, "h2d_pinned", None, 2.5e9)     # one slow reading: not the median
    assert cuda_bands._rate(fresh, [dev], "h2d_pinned") == 250e9
    for _ in range(2):
        cuda_bands._calibrate(dev, "d2h_pinned", None, 30e9)
    assert cuda_bands._rate(fresh, [dev], "d2h_pinned") == 30e9            # the rate measured, in three calls
    assert cuda_bands._speeds(prob, [dev], [7e12], hb.Context("cpu", profile=False, rates={"cuda:0": 7e12})) == [7e12]


def test_speeds_are_kept_per_size_class(fresh):
    """A speed measured at one size serves that size class ((log2 n, log2 k) rounded, and the call's GPUs); a
    size not measured takes the nearest class measured (of its GPU count where there is one), a class measured
    later replaces nothing of the others'."""
    dev = SimpleNamespace(name="cuda:0")
    cuda_bands._calibrate(dev, "flops", "gemmt", 46e12, (8192, 8192))
    assert cuda_bands.calibrated(dev, "gemmt", (16384, 16384)) == 46e12      # nearest measured
    cuda_bands._calibrate(dev, "flops", "gemmt", 40e12, (16384, 16384))
    assert cuda_bands.calibrated(dev, "gemmt", (16384, 16384)) == 40e12
    assert cuda_bands.calibrated(dev, "gemmt", (9000, 7000)) == 46e12        # rounds to 8192's class
    assert cuda_bands.calibrated(dev, "gemmt", (30000, 30000)) == 40e12
    assert cuda_bands.calibrated(dev, "gemmt") == 40e12                      # no size: the class measured last
    assert cuda_bands.calibrated(dev, "herk", (8192, 8192)) is None
    cuda_bands._calibrate(dev, "flops", "gemmt", 52e12, (8192, 8192, 2))
    assert cuda_bands.calibrated(dev, "gemmt", (8192, 8192, 2)) == 52e12      # its share of a two-GPU call
    assert cuda_bands.calibrated(dev, "gemmt", (16384, 16384, 2)) == 52e12    # the GPU count first
    assert cuda_bands.calibrated(dev, "gemmt", (8192, 8192)) == 46e12
    cuda_bands._calibrate(dev, "mix", "gemmt", (0.7, 0.2), (8192, 8192))
    cuda_bands._calibrate(dev, "mix", "gemmt", (0.8, 0.1), (16384, 16384))
    assert cuda_bands.calibrated(dev, ("mix", "gemmt"), (8192, 8192)) == (0.7, 0.2)


def test_bands_not_for_cpu_devices_or_device_operands(fresh):
    prob = _problem("herk", 8192)
    assert not cuda_bands.applies(prob, fresh.devices, [1e12], fresh)


def test_one_gpu_takes_bands_only_where_the_model_is_near_the_compute():
    """One GPU: zgemmt at 4096 (uploads twice the compute) goes by tiles, at 8192 (the corner order: modelled
    at 1.17 x the compute), 16384 and zherk at 8192 by bands; the model's rule does not apply to several
    GPUs."""
    from hybridblas import band_plan
    speed, h2d, d2h = [5.5e13], 55e9, 45e9
    for kind, n, want in (("gemmt", 4096, False), ("gemmt", 8192, True), ("gemmt", 16384, True), ("herk", 8192, True)):
        prob = _problem(kind, n)
        lay = band_plan.layout_for(prob, speed, d2h, h2d, speeds=speed)
        assert cuda_bands.model_within(prob, lay, speed, h2d, d2h) is want, (kind, n)


class CUBLASError(Exception):
    """Stands for CuPy's error of that name (cuda_bands matches it by name)."""


def test_the_side_stream_falls_back_when_cublas_cannot_make_its_handle():
    """_Side.make: a cuBLAS error making the side stream's handle leaves the diagonals on the compute stream (None);
    any other error is raised."""
    def failing(exc):
        def handle():
            raise exc
        return SimpleNamespace(side_handle=handle)
    assert cuda_bands._Side.make(failing(CUBLASError("CUBLAS_STATUS_NOT_INITIALIZED"))) is None
    assert cuda_bands._Side.make(failing(cuda_bands.cublas.CublasAllocError("cublasCreate failed"))) is None
    with pytest.raises(RuntimeError, match="device lost"):
        cuda_bands._Side.make(failing(RuntimeError("device lost")))


def test_a_dropped_stream_set_destroys_its_handles_once(monkeypatch):
    """_StreamSet.close: the set's cuBLAS handles are destroyed on its GPU, once; a destroy that fails is
    tolerated."""
    import contextlib
    import sys
    destroyed = []

    def destroy(h):
        destroyed.append(h)
        if h == 13:
            raise RuntimeError("a GPU in an error state")
    fake_cublas = SimpleNamespace(destroy=destroy)
    fake_cuda = SimpleNamespace(cublas=fake_cublas, Device=lambda i: contextlib.nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=fake_cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake_cuda)
    for handles in ({1: 7, 2: 8}, {2: 13, 3: 14}):
        streams = object.__new__(cuda_bands._StreamSet)
        streams.cp, streams.index, streams._handles = SimpleNamespace(cuda=fake_cuda), 1, handles
        streams.close()
        streams.close()
        assert streams._handles == {}
    unused = object.__new__(cuda_bands._StreamSet)
    unused.cp, unused.index, unused._handles = SimpleNamespace(cuda=fake_cuda), 0, {}
    unused.close()
    assert destroyed == [7, 8, 13, 14]                      # 14 after 13 failed


def test_a_stream_set_makes_one_handle_per_stream_on_its_gpu_and_keeps_it(monkeypatch):
    """_StreamSet.comp_handle / side_handle: made by cublas.new_handle for the stream, with the set's GPU
    current, once; each stream its own."""
    import contextlib
    made, current = [], []

    @contextlib.contextmanager
    def device(i):
        current.append(i)
        yield
        current.pop()
    monkeypatch.setattr(cuda_bands.cublas, "new_handle", lambda ptr: made.append((ptr, current[-1])) or 100 + ptr)
    streams = object.__new__(cuda_bands._StreamSet)
    streams.cp, streams.index, streams._handles = SimpleNamespace(cuda=SimpleNamespace(Device=device)), 1, {}
    streams.streams = tuple(SimpleNamespace(ptr=p) for p in (1, 2, 3, 4))
    streams.s_side = SimpleNamespace(ptr=5)
    assert streams.comp_handle() == 103 and streams.comp_handle() == 103
    assert streams.side_handle() == 105 and streams.side_handle() == 105
    assert made == [(3, 1), (5, 1)]


def test_the_side_stream_computes_the_dots_after_the_compute_stream_reached_them(monkeypatch):
    """_Side.dots: the values are allocated while the compute stream is current (its arena frees them after its
    own wait), the side stream waits for an event the compute stream records after that, computes the dots,
    and hands back the buffer with an event recorded after them."""
    seen, current = [], []

    class Stream:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            current.append(self.name)

        def __exit__(self, *exc):
            current.pop()

        def wait_event(self, event):
            seen.append(("wait", self.name, event))

    comp, side = Stream("comp"), Stream("side")
    cp = SimpleNamespace(empty=lambda shape, dtype: seen.append(("alloc", current[-1], shape)) or "values")

    def record(stream):
        seen.append(("record", stream.name))
        return f"event-{len(seen)}"
    streams = SimpleNamespace(cp=cp, s_side=side, event=record, side_handle=lambda: 7)
    monkeypatch.setattr(cuda_bands.cuda_direct, "diagonal_dots",
                        lambda backend, coef, x, y, out: seen.append(("dots", backend.stream.name, out)))
    monkeypatch.setitem(__import__("sys").modules, "cupy", SimpleNamespace())      # cublas.Backend imports it
    values, ready = cuda_bands._Side(streams).dots(SimpleNamespace(stream=comp), 1.0, "x", "y",
                                                   np.empty((5, 5), np.complex128))
    assert seen == [("alloc", "comp", (5, 1, 1)), ("record", "comp"), ("wait", "side", "event-2"),
                    ("dots", "side", "values"), ("record", "side")]
    assert (values, ready) == ("values", "event-5")


def test_staged_readings_count_only_until_one_by_dma(fresh):
    """Speeds and mixes from calls that staged their operands through host buffers (products queued late, kernel
    times long) serve until the first reading from a call by DMA, which replaces them; after that a staged reading
    changes nothing. Link rates are not staged readings."""
    dev = SimpleNamespace(name="cuda:0")
    size = (8192, 8192, 2)
    cuda_bands._calibrate(dev, "flops", "gemmt", 27e12, size, staged=True)
    cuda_bands._calibrate(dev, "flops", "gemmt", 36e12, size, staged=True)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 36e12              # nothing better yet
    cuda_bands._calibrate(dev, "mix", "gemmt", (0.3, 0.2), size, staged=True)
    cuda_bands._calibrate(dev, "flops", "gemmt", 52e12, size)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 52e12              # the staged ones are gone
    cuda_bands._calibrate(dev, "mix", "gemmt", (0.8, 0.16), size)
    for _ in range(4):
        cuda_bands._calibrate(dev, "flops", "gemmt", 20e12, size, staged=True)
        cuda_bands._calibrate(dev, "mix", "gemmt", (0.2, 0.16), size, staged=True)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 52e12
    assert cuda_bands.calibrated(dev, ("mix", "gemmt"), size) == (0.8, 0.16)
    cuda_bands._calibrate(dev, "flops", "gemmt", 54e12, size)
    assert cuda_bands.calibrated(dev, "gemmt", size) == 54e12              # readings by DMA go on as before
    other = SimpleNamespace(name="cuda:1")                     # a GPU that only ever staged keeps its readings
    for value in (30e12, 31e12, 32e12):
        cuda_bands._calibrate(other, "flops", "gemmt", value, size, staged=True)
    assert cuda_bands.calibrated(other, "gemmt", size) == 31e12


def test_host_marks_are_noted_only_with_trace(monkeypatch):
    """_Call._mark: nothing without TRACE; with it, (what [index], seconds since the call began, thread name)."""
    import threading
    import time
    call = object.__new__(cuda_bands._Call)
    call.t0 = time.perf_counter()
    gpu = SimpleNamespace(host_marks=[])
    monkeypatch.setattr(cuda_bands, "TRACE", False)
    call._mark(gpu, "upload", 3)
    assert gpu.host_marks == []
    monkeypatch.setattr(cuda_bands, "TRACE", True)
    call._mark(gpu, "upload", 3)
    call._mark(gpu, "worker")
    assert [m[0] for m in gpu.host_marks] == ["upload 3", "worker"]
    assert all(m[1] >= 0 and m[2] == threading.current_thread().name for m in gpu.host_marks)


def test_a_call_without_speed_readings_still_moves_bands_off_a_slow_gpu(fresh):
    """_Call._rebalance: GPUs measured at 50 TF/s; a call by DMA that gives no speed reading ran GPU 1's kernels
    at 0.42 of GPU 0's. Each speed starts anew at its speed times its kernels' rate over its speed, over the ratio
    nearest 1 (GPU 0's, which keeps its speed; so too when GPU 1 is back, or both ran slow); GPUs that ran alike
    within BALANCE, a GPU without kernels, or an explicit rate change nothing of theirs."""
    devs = [SimpleNamespace(name="cuda:0"), SimpleNamespace(name="cuda:1")]
    prob = _problem("gemmt", 8192)
    size = (8192, 8192, 2)
    for d in devs:
        for _ in range(3):
            cuda_bands._calibrate(d, "flops", "gemmt", 50e12, size)

    def call(readings, ctx=fresh):
        c = object.__new__(cuda_bands._Call)
        c.problem, c.devices, c.rates, c.ctx = prob, devs, [40e12, 40e12], ctx
        c.gpus = [SimpleNamespace(device=d, summary=(None, 1.0, r, None, None)) for d, r in zip(devs, readings)]
        c._rebalance(size)

    call([48e12, 37e12])                                       # 0.77 of GPU 0's: alike
    assert [cuda_bands.calibrated(d, "gemmt", size) for d in devs] == [50e12, 50e12]
    call([48e12, None])
    assert [cuda_bands.calibrated(d, "gemmt", size) for d in devs] == [50e12, 50e12]
    explicit = hb.Context("cpu", profile=False, rates={"cuda:1": 50e12})
    call([48e12, 20e12], explicit)
    assert cuda_bands.calibrated(devs[1], "gemmt", size) == 50e12
    call([48e12, 20e12])
    assert cuda_bands.calibrated(devs[0], "gemmt", size) == 50e12
    assert cuda_bands.calibrated(devs[1], "gemmt", size) == pytest.approx(50e12 * 20 / 48)
    assert cuda_bands._speeds(prob, devs, [40e12] * 2, fresh) == pytest.approx([50e12, 50e12 * 20 / 48])
    slow = 50e12 * 20 / 48
    call([49e12, 45e12])                                       # GPU 1 back: GPU 0 ran nearest its speed
    assert cuda_bands.calibrated(devs[0], "gemmt", size) == 50e12
    assert cuda_bands.calibrated(devs[1], "gemmt", size) == pytest.approx(slow * (45e12 / slow) / (49 / 50))
    call([30e12, 20e12])                                       # both slowed (0.6, 0.43): GPU 0 keeps its speed
    assert cuda_bands.calibrated(devs[0], "gemmt", size) == 50e12
    assert cuda_bands.calibrated(devs[1], "gemmt", size) == pytest.approx(50e12 * 20 / 30)


def test_only_calls_by_dma_on_warm_gpus_and_a_kept_layout_rebalance():
    """_Call._rebalances: a call that gave a speed reading, staged its operands, ran its layout's first time, ran on
    one GPU, or on a GPU new to the routine (its kernels loading) moves no speed; else it may."""
    call = object.__new__(cuda_bands._Call)
    call.gpus, call.first_use = [object(), object()], False
    assert call._rebalances(False, False, [True, True])
    assert not call._rebalances(True, False, [True, True])
    assert not call._rebalances(False, True, [True, True])
    assert not call._rebalances(False, False, [True, False])
    assert not call._rebalances(False, False, [True])          # a GPU without products
    call.first_use = True
    assert not call._rebalances(False, False, [True, True])
    call.gpus, call.first_use = [object()], False
    assert not call._rebalances(False, False, [True])


def test_fits_from_the_pools_free_blocks_before_asking_the_device(monkeypatch):
    """_fits: a GPU whose memory pool already holds free blocks for the call's arrays fits without a device memory
    query; otherwise (or with a pool limit) the budget decides."""
    import contextlib
    import sys
    from hybridblas import band_plan
    from hybridblas.devices import cuda
    prob = _problem("gemmt", 2048)
    lay = band_plan.BandLayout(prob, [1e13, 1e13], 20e9, 40e9, shared=True, order="outer")
    totals, _ = band_plan.device_bytes(prob, None, edges=lay.edges)
    pool = SimpleNamespace(free=0, limit=0)
    fake = SimpleNamespace(cuda=SimpleNamespace(Device=lambda i: contextlib.nullcontext()),
                           get_default_memory_pool=lambda: SimpleNamespace(free_bytes=lambda: pool.free,
                                                                           get_limit=lambda: pool.limit))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    asked = []
    budget = [0]
    monkeypatch.setattr(cuda, "budget", lambda d, p: asked.append(d.index) or budget[0])
    devs = [SimpleNamespace(index=g, memory_limit=None) for g in (0, 1)]
    pool.free = max(totals)                     # an earlier call's blocks: no query
    assert cuda_bands._fits(prob, devs, lay) and asked == []
    pool.free = min(totals) - 1                 # too few free blocks: the budget decides
    assert not cuda_bands._fits(prob, devs, lay) and asked
    budget[0], asked[:] = max(totals), []
    assert cuda_bands._fits(prob, devs, lay) and len(asked) == 2
    pool.free, pool.limit, asked[:] = max(totals), 1 << 40, []   # a pool limit: always the budget
    assert cuda_bands._fits(prob, devs, lay) and len(asked) == 2
