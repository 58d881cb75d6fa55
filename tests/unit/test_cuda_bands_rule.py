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
    ("gemmt", 16384, 2, True), ("herk", 16384, 2, True)])
def test_bands_where_uploads_hide_under_compute(kind, n, gpus, bands, fresh):
    """Default rates (no profile, nothing calibrated): 25 GB/s each way, 40 TF/s."""
    devices = [SimpleNamespace(name=f"cuda:{i}") for i in range(gpus)]
    assert cuda_bands._hides_uploads(_problem(kind, n), devices, [40e12] * gpus, fresh) is bands


def test_calibrated_rates_decide_once_measured(fresh):
    """One GPU, zgemmt at 8192 goes by tiles at the default rates; a GPU measured ten times faster at the same
    transfers then hides the uploads under compute plus write-back no more (tiles), and transfers measured ten
    times faster do (bands)."""
    dev = SimpleNamespace(name="cuda:0")
    prob = _problem("gemmt", 8192)
    assert not cuda_bands._hides_uploads(prob, [dev], [40e12], fresh)
    cuda_bands._calibrate(dev, "flops", "gemmt", 400e12)
    assert cuda_bands.calibrated(dev, "gemmt") == 400e12
    assert not cuda_bands._hides_uploads(prob, [dev], [40e12], fresh)
    cuda_bands._calibrate(dev, "h2d_pinned", None, 250e9)
    cuda_bands._calibrate(dev, "d2h_pinned", None, 250e9)
    cuda_bands._calibrate(dev, "flops", "gemmt", 40e12)
    assert not cuda_bands._hides_uploads(prob, [dev], [40e12], fresh)   # 0.7 * 400 + 0.3 * 40 TF/s by now
    for _ in range(40):
        cuda_bands._calibrate(dev, "flops", "gemmt", 40e12)
    assert abs(cuda_bands.calibrated(dev, "gemmt") - 40e12) < 1e11
    assert cuda_bands._hides_uploads(prob, [dev], [40e12], fresh)
    assert cuda_bands._rate(fresh, [dev], "h2d_pinned") == 250e9


def test_bands_not_for_cpu_devices_or_device_operands(fresh):
    prob = _problem("herk", 8192)
    assert not cuda_bands.applies(prob, fresh.devices, [1e12], fresh)
