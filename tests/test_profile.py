"""Profiles: search order, fingerprint naming, lookups, and what the static splitter makes of them."""
import logging
import warnings

import numpy as np
import pytest
import yaml

import hybridblas as hb
from hybridblas import plan, profile as pm, scheduler
from hybridblas.problem import build_problem, N


def make_profile(rates, static=None, fingerprint=None, blocks=None):
    """A profile dict: rates = {device: flop/s} for complex128 herk/syrk/gemm at n = 64 and 4096."""
    devices = {}
    for name, r in rates.items():
        kind = "cpu" if name.startswith("cpu") else "cuda"
        table = {64: r / 2, 4096: r}
        devices[name] = {"kind": kind, "rates": {k: {"complex128": dict(table)} for k in ("herk", "gemm")}}
        if blocks:
            devices[name]["block_size"] = {"herk": {"complex128": blocks[name]}, "default": blocks[name]}
    data = {"format": pm.FORMAT, "fingerprint": dict(fingerprint or pm.current_fingerprint()),
            "devices": devices}
    if static:
        data["static"] = static
    return data


def herk_problem(n, k, rng):
    a = np.asfortranarray(rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k)))
    return build_problem("herk", 1.0, [a], 0.0, None, [N], True, None)


def test_fingerprint_names_the_file_not_the_host(monkeypatch):
    import socket
    fp = pm.current_fingerprint()
    name = pm.profile_filename(fp)
    assert name.endswith(".yaml") and socket.gethostname().lower() not in name.lower()
    assert set(pm.FINGERPRINT_KEYS) <= set(fp)
    other = dict(fp, gpus=["NVIDIA H200"], gpu_count=1)
    assert pm.profile_filename(other) != name          # another node, another file


def test_blas_name_ignores_a_blas_loaded_for_other_work(monkeypatch):
    """MKL loaded by cisolver's sparse products next to scipy's OpenBLAS must not rename the profile."""
    from hybridblas import blas_threads
    libs = [{"internal_api": "openblas", "version": "0.3.30"}, {"internal_api": "mkl", "version": "2026.2"}]
    monkeypatch.setattr(blas_threads, "blas_info", lambda: libs)
    monkeypatch.setattr(pm, "_scipy_blas_api", lambda: "openblas")
    assert pm.blas_libraries() == ["openblas 0.3.30"]
    monkeypatch.setattr(pm, "_scipy_blas_api", lambda: None)          # unknown: every library, as before
    assert pm.blas_libraries() == ["mkl 2026.2", "openblas 0.3.30"]


def test_search_order(tmp_path, monkeypatch):
    monkeypatch.setenv(pm.ENV_DIR, str(tmp_path))
    dirs = pm.search_dirs()
    assert dirs[0] == tmp_path
    assert dirs[1].parts[-3:] == (".config", "hybridblas", "profiles")
    assert dirs[2].parts[-2:] == ("etc", "hybridblas")


def test_no_profile_gives_defaults_and_one_notice(profile_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridblas"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")             # a notice, not a warning storm
            assert hb.load_profile() is None
            assert hb.load_profile() is None
    notices = [r for r in caplog.records if "no profile for this node" in r.getMessage()]
    assert len(notices) == 1
    assert "hybridblas-tune calibrate" in notices[0].getMessage()


def test_save_and_load_roundtrip(profile_dir):
    path = pm.save_profile(make_profile({"cpu": 3e10}))
    assert path.parent == profile_dir and path.name == pm.profile_filename()
    assert yaml.safe_load(path.read_text())["format"] == pm.FORMAT
    prof = hb.load_profile()
    assert prof is not None and prof.path == path
    assert prof.rate("cpu", "herk", np.complex128, 4096) == pytest.approx(3e10)
    assert prof.rate("cpu", "herk", "complex128", 64) == pytest.approx(1.5e10)
    mid = prof.rate("cpu", "herk", "complex128", 512)     # log-log interpolation between the sizes
    assert 1.5e10 < mid < 3e10
    assert prof.rate("cpu", "herk", "complex128", 10**6) == pytest.approx(3e10)   # clamped
    assert prof.rate("cpu", "syrk", "complex128", 4096) == pytest.approx(3e10)    # same kernel shape
    assert prof.rate("cpu", "herk", "complex64", 4096) is None                    # not measured
    assert prof.rate("cpu#1", "herk", "complex128", 4096) == pytest.approx(3e10)  # sibling worker
    assert prof.rate("cuda:0", "herk", "complex128", 4096) is None


@pytest.mark.parametrize("text, reason", [
    ("format: [unclosed\n  devices: {", "not valid YAML"),
    ("- just\n- a list\n", "YAML mapping"),
    ("format: something-else/9\n", "format must be"),
])
def test_corrupt_profile_warns_once_and_uses_defaults(profile_dir, text, reason):
    (profile_dir / pm.profile_filename()).write_text(text)
    with pytest.warns(pm.ProfileWarning, match=reason) as record:
        assert hb.load_profile() is None
        assert hb.load_profile() is None
    assert len(record) == 1
    ctx = hb.Context(devices="cpu")
    a = np.random.default_rng(1).standard_normal((30, 20))
    c = hb.herk(1.0, a, context=ctx)                   # the library still works, on defaults
    assert np.allclose(np.tril(c), np.tril(a @ a.T))


def test_bad_values_are_rejected_with_their_place(profile_dir):
    data = make_profile({"cpu": 3e10})
    data["devices"]["cpu"]["rates"]["herk"]["complex128"][4096] = -1.0
    (profile_dir / pm.profile_filename()).write_text(yaml.safe_dump(data))
    with pytest.warns(pm.ProfileWarning, match=r"devices\['cpu'\]\.rates\['herk'\]"):
        assert hb.load_profile() is None


def test_foreign_profile_is_ignored_with_one_warning(profile_dir, monkeypatch):
    other = dict(pm.current_fingerprint(), cpu_model="AMD EPYC 9654 96-Core Processor",
                 gpus=["NVIDIA H200", "NVIDIA H200"], gpu_count=2)
    (profile_dir / pm.profile_filename()).write_text(yaml.safe_dump(make_profile({"cpu": 3e10}, fingerprint=other)))
    with pytest.warns(pm.ProfileWarning, match="another node") as record:
        assert hb.load_profile() is None
        assert hb.load_profile() is None
    assert len(record) == 1 and "cpu_model" in str(record[0].message)
    # named explicitly through $HYBRIDBLAS_PROFILE: still refused
    explicit = profile_dir / "copied.yaml"
    explicit.write_text(yaml.safe_dump(make_profile({"cpu": 3e10}, fingerprint=other)))
    monkeypatch.setenv(pm.ENV_FILE, str(explicit))
    with pytest.warns(pm.ProfileWarning, match="another node"):
        assert hb.load_profile() is None


def test_static_splitter_follows_profile_rates(profile_dir, rng):
    """Two CPU workers with different measured rates: the bands follow the ratio 1 : 3."""
    pm.save_profile(make_profile({"cpu": 1e10, "cpu#1": 3e10}))
    ctx = hb.Context(devices=["cpu", "cpu"], strategy="auto")
    prob = herk_problem(400, 60, rng)
    devices = ctx.devices_for(prob)
    rates = [ctx.rate(d, prob) for d in devices]
    assert rates == [pytest.approx(ctx.profile.rate("cpu", "herk", "complex128", 400)),
                     pytest.approx(ctx.profile.rate("cpu#1", "herk", "complex128", 400))]
    assert rates[1] / rates[0] == pytest.approx(3.0)
    assert ctx.resolve_strategy(devices) == "static"            # the profile covers both
    assign = scheduler.static_assignment(prob, devices, rates, ctx)
    work = [sum(t.flops for t in tasks) for tasks in assign]
    assert work[1] / work[0] == pytest.approx(3.0, rel=0.05)
    # without the profile the two workers are equal
    bare = hb.Context(devices=["cpu", "cpu"], profile=False)
    even = [bare.rate(d, prob) for d in bare.devices_for(prob)]
    assert even[0] == even[1]
    edges = plan.band_edges(prob.n, rates, prob.triangular)
    assert edges != plan.band_edges(prob.n, even, prob.triangular)
    # and the result is still right
    c = hb.herk(1.0, prob.factors[0].base, context=ctx)
    a = prob.factors[0].base
    assert np.allclose(np.tril(c), np.tril(a @ a.conj().T))




def _fake_gpu(index):
    from hybridblas.devices import CPUDevice

    class _Fake(CPUDevice):
        kind = "cuda"

        @property
        def name(self):
            return f"cuda:{self.index}"
    return _Fake(index)


def test_cpu_share_and_cpu_helps_drive_the_hybrid_split(profile_dir, rng):
    share = 0.2
    static = {"herk": {"complex128": {4096: {"cpu_share": share, "cpu_helps": True}}}}
    prof = pm.Profile(make_profile({"cpu": 1e11, "cuda:0": 4e12}, static=static))
    ctx = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=prof)
    prob = herk_problem(300, 40, rng)
    cpu, gpu = ctx.devices_for(prob)
    r_cpu, r_gpu = ctx.rate(cpu, prob), ctx.rate(gpu, prob)
    assert r_cpu / (r_cpu + r_gpu) == pytest.approx(share)      # the calibrated share, not the raw rate
    # a profile that found the CPU useless leaves it out of CPU+GPU calls
    static_no = {"herk": {"complex128": {4096: {"cpu_share": 0.0, "cpu_helps": False}}}}
    prof_no = pm.Profile(make_profile({"cpu": 1e11, "cuda:0": 4e12}, static=static_no))
    ctx_no = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=prof_no)
    assert [d.name for d in ctx_no.devices_for(prob)] == ["cuda:0"]
    # ... unless the caller forces a CPU rate
    forced = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=prof_no, rates={"cpu": 1.0})
    assert [d.name for d in forced.devices_for(prob)] == ["cpu", "cuda:0"]


def test_block_size_from_profile(profile_dir, rng):
    prof = pm.Profile(make_profile({"cpu": 1e10, "cpu#1": 1e10}, blocks={"cpu": 96, "cpu#1": 64}))
    ctx = hb.Context(devices=["cpu", "cpu"], profile=prof)
    prob = herk_problem(200, 30, rng)
    assert ctx.block_size_for(prob, ctx.devices_for(prob)) == 64
    assert hb.Context(devices=["cpu", "cpu"], profile=prof, block_size=50).block_size_for(prob, ctx.devices) == 50
    assert hb.Context(devices=["cpu"], profile=False).block_size_for(prob, ctx.devices[:1]) is None


def test_partial_coverage_falls_back_to_defaults_for_all(rng):
    """A profile without one device's numbers must not mix measured rates with guesses."""
    prof = pm.Profile(make_profile({"cpu": 1e10}))
    ctx = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=prof)
    bare = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=False)
    prob = herk_problem(100, 20, rng)
    for d in ctx.devices:
        assert ctx.rate(d, prob) == bare.rate(d, prob)
