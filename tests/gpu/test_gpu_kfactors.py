"""The k-only matching factors computed by one kernel on a GPU (flapw.matching_gpu) against the host's numpy
recurrences: every element written (outputs poisoned with NaN first), equal to 1e-14 of the largest element,
for every preset's lmax, the Γ point (K = 0 among the G vectors), |K|R on both sides of the series/recurrence
border, lmax 0 and 1, on GPU 0 and GPU 1; the H and S of a device build equal the host build's."""
import time

import numpy as np
import pytest

import flapw
from flapw import matching

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _both(cell, device=0):
    radials = [cell.radial[s] for s in sorted(cell.radial)]
    host = matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, threads=2)
    shape = (cell.n_g, cell.n_l)
    with cupy.cuda.Device(device):
        out = [(cupy.full(shape, np.nan, complex), cupy.full(shape, np.nan, complex)) for _ in radials]
        got = matching.k_only_factors(cell.basis, radials, cell.lmax, cell.omega, out=out)
    for (ga, gb), (oa, ob) in zip(got, out, strict=True):
        assert ga is oa and gb is ob and ga.device.id == device
    return host, [(a.get(), b.get()) for a, b in got]


def _close(host, gpu):
    for (ha, hb_), (ga, gb) in zip(host, gpu, strict=True):
        for h, g in ((ha, ga), (hb_, gb)):
            assert np.isfinite(g).all()
            scale = np.abs(h).max()
            assert scale > 0
            assert np.abs(g - h).max() <= 1e-14 * scale, np.abs(g - h).max() / scale


@pytest.mark.parametrize("name,kmax", [("NaCl", 2.5), ("AuAg", 2.5), ("TiO2", 2.0)])
def test_kernel_equals_host_recurrences(name, kmax):
    cell = flapw.System.preset(name, kmax=kmax, k=(0.1234, -0.2345, 0.3456))
    host, gpu = _both(cell)
    _close(host, gpu)


@pytest.mark.parametrize("lmax", [0, 1, 3])
def test_gamma_point_and_small_lmax(lmax):
    cell = flapw.System.preset("NaCl", kmax=2.0, k=(0.0, 0.0, 0.0), supercell=(1, 1, 1), lmax=lmax)
    assert np.count_nonzero(cell.basis.norm == 0) == 1                # K = 0: j_0 = 1 and Y_00 alone
    x = cell.basis.norm * max(r.mesh.r[-1] for r in cell.radial.values())
    assert (x < 1).any() and (x >= 1).any()                          # series and downward recurrence both used
    host, gpu = _both(cell)
    _close(host, gpu)


@pytest.mark.multi_gpu
def test_on_the_second_gpu():
    cell = flapw.System.preset("NaCl", kmax=2.5, k=(0.3, 0.1, -0.2))
    host, gpu = _both(cell, device=1)
    _close(host, gpu)


def test_device_build_equals_host_build():
    cell = flapw.System.preset("NaCl", kmax=2.2, supercell=(1, 1, 1), k=(0.2, 0.1, 0.05))
    h, s = flapw.build_hs(cell, interstitial=True, lower_only=True)
    with cupy.cuda.Device(0):
        t0 = time.perf_counter()
        hd, sd, rep = flapw.build_hs(cell, interstitial=True, lower_only=True, arrays="device", return_report=True)
        wall = time.perf_counter() - t0
        hd, sd = hd.get(), sd.get()
    assert not rep._marks                                        # every GPU stage's events read
    assert all(st.seconds > 0 for st in rep.stages.values())
    assert 0 < rep.total_seconds <= wall
    for got, want in ((hd, h), (sd, s)):
        low = np.tril_indices(cell.n_g)
        assert np.abs(got[low] - want[low]).max() <= 1e-12 * np.abs(want[low]).max()


def test_queued_builds_equal_waited_ones_and_settle_when_read():
    """build_hs(wait=False) on device arrays: three k-points queued one after another on GPU 0's stream (each
    H and S dropped once queued, as the CLI does), every report settled when read, after the last was queued;
    the H and S of the last equal the waited build's, the seconds positive and no mark left unread."""
    base = flapw.System.preset("NaCl", kmax=2.2, supercell=(1, 1, 1))
    cells = [base.with_k(k) for k in ((0.0, 0.0, 0.0), (0.25, 0.0, 0.1), (0.2, 0.1, 0.05))]
    with cupy.cuda.Device(0):
        reports = []
        for cell in cells:
            hd, sd, rep = flapw.build_hs(cell, interstitial=True, lower_only=True, arrays="device",
                                         return_report=True, wait=False)
            reports.append(rep)
        assert reports[-1]._marks                                # left for the reader
        hd, sd = hd.get(), sd.get()
        d = [r.as_dict() for r in reports]
        want_h, want_s = flapw.build_hs(cells[-1], interstitial=True, lower_only=True, arrays="device")
    assert all(not r._marks and r.total_seconds > 0 and r.blas_seconds > 0 for r in reports)
    assert all(x["total_seconds"] == r.total_seconds for x, r in zip(d, reports))
    low = np.tril_indices(cells[-1].n_g)
    for got, want in ((hd, want_h.get()), (sd, want_s.get())):
        assert np.abs(got[low] - want[low]).max() <= 1e-13 * np.abs(want[low]).max()


def test_cli_kpoints_queued_on_one_gpu(capsys):
    """flapw build on GPU 0 with device arrays and nothing read on the host (no --solve, no --output): its
    k-points are queued one after another; the reports come in k-point order with seconds from their events."""
    from flapw import cli
    rc = cli.main(["build", "--system", "NaCl", "--kmax", "2.0", "--kpoints", "3", "--interstitial", "--devices",
                   "0", "--arrays", "device", "--json"])
    assert rc == 0, capsys.readouterr().err
    import json
    doc = json.loads(capsys.readouterr().out)
    assert [r["k_index"] for r in doc["reports"]] == [0, 1, 2]
    for r in doc["reports"]:
        assert r["arrays"] == "device" and r["total_seconds"] > 0 and r["blas_seconds"] > 0
        assert sum(s["seconds"] for s in r["stages"]) == pytest.approx(r["total_seconds"])
    assert 0 < sum(r["total_seconds"] for r in doc["reports"]) <= doc["loop_seconds"][0] * 1.05
