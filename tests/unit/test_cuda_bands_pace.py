"""cuda_bands._Call._pace on a real layout without a GPU (the GPU's events, lanes and devices stand in): it waits for
block b - 2, reports, and at the last blocks hands parts to the GPU free first, a block before the last only where
the move repays its write-back coming after the last block."""
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from hybridblas import band_plan, band_tail
from hybridblas.devices import cuda_bands

from test_band_plan import build


class _Ended:
    done = True


def _call(block_s, d2h=20e9):
    prob = build("gemmt", "CN", 2048, 2048, np.complex128, True, "F")
    lay = band_plan.BandLayout(prob, [1e13, 1e13], 20e9, 40e9, shared=True, order="outer")
    call = SimpleNamespace(layout=lay, d2h=d2h, balance=band_tail.Balance(2), lock=threading.Lock(), parts=[],
                           stop=threading.Event())
    call.gpus = [SimpleNamespace(slot=g, blocks=lay.blocks[g], ends=[_Ended()] * len(lay.blocks[g]), stats={},
                                 lane=band_tail.Lane(g, [block_s] * len(lay.blocks[g])),
                                 device=SimpleNamespace(name=f"cuda:{g}")) for g in range(2)]
    for gpu in call.gpus:           # the blocks ended at once here: their pace as modelled
        gpu.lane.pace.factor = lambda: 1.0
    call._wait_event = lambda ev: cuda_bands._Call._wait_event(call, ev)
    call._taker_s = lambda tasks, t: block_s
    return call, lay


@pytest.mark.parametrize("d2h,before_last", [(1e9, False), (1e12, True)])
def test_pace_splits_the_last_blocks_of_a_late_gpu(d2h, before_last):
    """GPU 1 free, GPU 0 with 3 ms of blocks to go: it hands parts of its last blocks to GPU 1; the block before
    the last only where its write-back (slow at 1 GB/s, quick at 1 TB/s) is repaid."""
    call, lay = _call(1e-3, d2h)
    gpu = call.gpus[0]
    call.balance.report(1, time.perf_counter(), 0.0)
    given = []
    for b in range(gpu.lane.first, len(gpu.blocks)):
        part = cuda_bands._Call._pace(call, gpu, b)
        if part is not None:
            given.append(part)
            assert part.slot == 0 and part.taker == 1 and part.b == b and part.tasks is gpu.blocks[b]
            assert lay.final[0] < part.k0 < part.k1 == lay.final[1]
            assert part.box == cuda_bands._Part.bounds(gpu.blocks[b])
    last = len(gpu.blocks) - 1
    assert given and (given[0].b == last - 1) == before_last and all(p.b >= last - 1 for p in given)
    assert gpu.stats["given"] == [(p.b, p.k0, p.k1, "cuda:1") for p in given]
    assert call.parts == given and call.balance.giver == [True, False] and call.balance.taker == [False, True]


def test_pace_stops_while_waiting_for_a_block():
    call, _ = _call(1e-3)
    gpu = call.gpus[0]
    gpu.ends = [SimpleNamespace(done=False)] * len(gpu.blocks)
    call.stop.set()
    with pytest.raises(cuda_bands._Stop):
        cuda_bands._Call._pace(call, gpu, len(gpu.blocks) - 1)
