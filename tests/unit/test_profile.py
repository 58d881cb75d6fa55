"""Profiles: search order, fingerprint naming, lookups, and what the static splitter makes of them."""
import logging
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import hybridblas as hb
from hybridblas import plan, policy, scheduler
from hybridblas.problem import build_problem, N
from hybridblas.profile.model import (BLOCK_SIZE_RANGE, DTYPES, FORMAT, ROUTINE_KINDS, TRANSFER_KEYS, Profile,
                                     ProfileError)
from hybridblas.profile.node import FINGERPRINT_KEYS, blas_libraries, current_fingerprint, profile_filename
from hybridblas.profile.search import ENV_DIR, ENV_FILE, search_dirs
from hybridblas.profile.store import (MAX_FILE_BYTES, RANK_VARIABLES, ProfileWarning, launcher_rank, reset_notices,
                                     save_profile)


def make_profile(rates, static=None, fingerprint=None, blocks=None):
    """A profile dict: rates = {device: flop/s} for complex128 herk/syrk/gemm at n = 64 and 4096."""
    devices = {}
    for name, r in rates.items():
        kind = "cpu" if name.startswith("cpu") else "cuda"
        table = {64: r / 2, 4096: r}
        devices[name] = {"kind": kind, "rates": {k: {"complex128": dict(table)} for k in ("herk", "gemm")}}
        if blocks:
            devices[name]["block_size"] = {"herk": {"complex128": blocks[name]}, "default": blocks[name]}
    data = {"format": FORMAT, "fingerprint": dict(fingerprint or current_fingerprint()),
            "devices": devices}
    if static:
        data["static"] = static
    return data


def herk_problem(n, k, rng):
    a = np.asfortranarray(rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k)))
    return build_problem("herk", 1.0, [a], 0.0, None, [N], True, None)


def test_fingerprint_names_the_file_not_the_host(monkeypatch):
    import socket
    fp = current_fingerprint()
    name = profile_filename(fp)
    assert name.endswith(".yaml") and socket.gethostname().lower() not in name.lower()
    assert set(FINGERPRINT_KEYS) <= set(fp)
    other = dict(fp, gpus=["NVIDIA H200"], gpu_count=1)
    assert profile_filename(other) != name          # another node, another file


def test_blas_name_ignores_a_blas_loaded_for_other_work(monkeypatch):
    """MKL loaded by cisolver's sparse products next to scipy's OpenBLAS must not rename the profile."""
    from hybridblas import blas_threads
    from hybridblas.profile import node
    libs = [{"internal_api": "openblas", "version": "0.3.30"}, {"internal_api": "mkl", "version": "2026.2"}]
    monkeypatch.setattr(blas_threads, "blas_info", lambda: libs)
    monkeypatch.setattr(node, "_scipy_blas_api", lambda: "openblas")
    assert blas_libraries() == ["openblas 0.3.30"]
    monkeypatch.setattr(node, "_scipy_blas_api", lambda: None)          # unknown: every library, as before
    assert blas_libraries() == ["mkl 2026.2", "openblas 0.3.30"]


def test_search_order(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    dirs = search_dirs()
    assert dirs[0] == tmp_path
    assert dirs[1] == Path.home() / ".config" / "hybridblas" / "profiles"
    assert dirs[2].parts[-2:] == ("etc", "hybridblas")
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/config")      # not absolute: ignored, as the XDG rules say
    assert search_dirs()[1] == Path.home() / ".config" / "hybridblas" / "profiles"


def test_xdg_config_home_holds_the_user_profiles(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_DIR, raising=False)
    monkeypatch.delenv(ENV_FILE, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = tmp_path / "hybridblas" / "profiles"
    assert search_dirs()[0] == folder
    path = save_profile(make_profile({"cpu": 3e10}))       # calibrate's default folder, made if missing
    assert path == folder / profile_filename()
    reset_notices()
    prof = hb.load_profile()
    assert prof is not None and prof.path == path
    reset_notices()


@pytest.fixture
def notices():
    """The 'hybridblas' logger's records at INFO and above, whatever handlers a CLI left on it."""
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("hybridblas")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def _missing(records):
    return [r for r in records if "no profile for this node" in r.getMessage()]


def _herk_is_right(ctx, rng, n=37, k=23):
    """One herk through ``ctx`` on random complex data into a NaN-poisoned C: the lower triangle is A A^H."""
    a = np.asfortranarray(rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k)))
    c = np.full((n, n), np.nan, dtype=complex, order="F")
    out = hb.herk(1.0, a, 0.0, c, context=ctx)
    ref = a @ a.conj().T
    assert np.allclose(np.tril(out), np.tril(ref), rtol=1e-12, atol=1e-12)


def test_no_profile_gives_defaults_and_one_notice(profile_dir, notices):
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # a notice, not a warning
        assert hb.load_profile() is None
        assert hb.load_profile() is None
    (notice,) = _missing(notices)
    assert notice.levelno == logging.INFO and notice.name == "hybridblas"
    assert "hybridblas-tune calibrate" in notice.getMessage() and str(profile_dir) in notice.getMessage()


def test_missing_profile_notice_only_where_devices_could_share(profile_dir, notices, rng):
    """A Context of one device has nothing to split: no notice, however often it runs; two devices: one."""
    single = ["cpu"] + (["all"] if hb.gpu_count() == 0 else [])        # 'all' is the cores alone here
    for _ in range(3):
        for devices in single:
            ctx = hb.Context(devices=devices)
            assert len(ctx.devices) == 1
            _herk_is_right(ctx, rng)
    assert _missing(notices) == []
    for _ in range(3):
        _herk_is_right(hb.Context(devices=["cpu", "cpu"]), rng)
    assert len(_missing(notices)) == 1


@pytest.mark.parametrize("variable", RANK_VARIABLES)
def test_missing_profile_notice_only_on_rank_zero(profile_dir, notices, monkeypatch, rng, variable):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "3")
    assert launcher_rank() == 3
    _herk_is_right(hb.Context(devices=["cpu", "cpu"]), rng)
    assert _missing(notices) == []
    reset_notices()
    monkeypatch.setenv(variable, "0")
    _herk_is_right(hb.Context(devices=["cpu", "cpu"]), rng)
    assert len(_missing(notices)) == 1


def test_missing_profile_says_nothing_to_a_library_user_by_default(profile_dir):
    """Without logging configured, the INFO notice stays quiet: a script's stderr is its own."""
    code = ("import numpy as np, hybridblas as hb\n"
            "a = np.random.default_rng(1).standard_normal((40, 9))\n"
            "c = hb.herk(1.0, a, context=hb.Context(devices=['cpu', 'cpu']))\n"
            "assert np.allclose(np.tril(c), np.tril(a @ a.T))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_save_and_load_roundtrip(profile_dir):
    path = save_profile(make_profile({"cpu": 3e10}))
    assert path.parent == profile_dir and path.name == profile_filename()
    assert yaml.safe_load(path.read_text())["format"] == FORMAT
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


def valid_profile():
    """Two CPU workers and a GPU, with rates, block sizes, a static share and transfer rates."""
    static = {"herk": {"complex128": {4096: {"cpu_share": 0.2, "cpu_helps": True}}}}
    data = make_profile({"cpu": 3e10, "cpu#1": 1e10, "cuda:0": 4e12}, static=static,
                        blocks={"cpu": 64, "cpu#1": 96, "cuda:0": 2048})
    data["devices"]["cuda:0"]["transfer"] = {k: 2.5e10 for k in TRANSFER_KEYS}
    data["devices"]["cpu"]["threads"] = 2
    return data


def _set(*path_and_value):
    """A change to a profile dict: the value at ``path`` becomes ``value``."""
    *path, value = path_and_value

    def change(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return data
    return change


def _rekey(*path_and_keys):
    """A change to a profile dict: the mapping at ``path`` has key ``old`` renamed ``new``."""
    *path, old, new = path_and_keys

    def change(data):
        node = data
        for key in path:
            node = node[key]
        node[new] = node.pop(old)
        return data
    return change


CPU, BLOCK = ("devices", "cpu"), ("devices", "cpu", "block_size")
RATE = ("devices", "cpu", "rates", "herk", "complex128")
SHARE = ("static", "herk", "complex128", 4096)
TRANSFER = ("devices", "cuda:0", "transfer")
CORRUPTIONS = {     # name: (the file's bytes, or a change to valid_profile()), what the warning says
    "undecodable bytes": (b"format: hybridblas-profile/1\ndevices: \xff\xfe\x00\n", "not UTF-8 text"),
    "latin-1 text": ("format: hybridblas-profile/1  # r\xe9glage\n".encode("latin-1"), "not UTF-8 text"),
    "not YAML": (b"format: [unclosed\n  devices: {", "not valid YAML"),
    "a list": (b"- just\n- a list\n", "YAML mapping"),
    "empty": (b"", "YAML mapping"),
    "too large": (b"#" * (MAX_FILE_BYTES + 1), "larger than"),
    "other format": (_set("format", "something-else/9"), "format must be"),
    "no devices": (_set("devices", {}), "devices must be a non-empty mapping"),
    "devices a list": (_set("devices", ["cpu"]), "devices must be"),
    "device name": (_rekey("devices", "cpu#1", "gpu1"), "devices key = 'gpu1'"),
    "device kind": (_set(*CPU, "kind", "cuda"), r"devices\['cpu'\]\['kind'\]"),
    "device a number": (_set(*CPU, 5), r"devices\['cpu'\] must be a mapping"),
    "threads zero": (_set(*CPU, "threads", 0), r"\['threads'\] = 0"),
    "rates a list": (_set(*CPU, "rates", [1, 2]), r"devices\['cpu'\]\.rates must be a mapping"),
    "rates a number": (_set(*CPU, "rates", "herk", 3e10), r"rates\['herk'\] must be a mapping"),
    "rates unknown routine": (_rekey(*CPU, "rates", "herk", "trsm"), "trsm"),
    "rates unknown dtype": (_rekey(*CPU, "rates", "herk", "complex128", "complex256"), "complex256"),
    "rates table empty": (_set(*RATE, {}), "non-empty mapping"),
    "rate as text": (_set(*RATE, 64, "fast"), r"\[64\] = 'fast'"),
    "rate NaN": (_set(*RATE, 64, math.nan), r"\[64\] = nan"),
    "rate infinite": (_set(*RATE, 64, math.inf), r"\[64\] = inf"),
    "rate zero": (_set(*RATE, 64, 0.0), r"\[64\] = 0\.0"),
    "rate negative": (_set(*RATE, 64, -1.0), r"\[64\] = -1\.0"),
    "rate boolean": (_set(*RATE, 64, True), r"\[64\] = True"),
    "size as text": (_rekey(*RATE, 64, "64"), "key = '64'"),
    "size zero": (_rekey(*RATE, 64, 0), "key = 0"),
    "size fractional": (_rekey(*RATE, 64, 64.5), "key = 64.5"),
    "block 1": (_set(*BLOCK, "default", 1), r"block_size\['default'\] = 1:"),
    "block -64": (_set(*BLOCK, "default", -64), "= -64:"),
    "block huge": (_set(*BLOCK, "default", 1 << 20), "= 1048576:"),
    "block fractional": (_set(*BLOCK, "default", 512.0), "= 512.0:"),
    "block as text": (_set(*BLOCK, "default", "512"), "= '512':"),
    "routine block 1": (_set(*BLOCK, "herk", "complex128", 1), r"block_size\['herk'\]\['complex128'\] = 1:"),
    "block_size a list": (_set(*BLOCK, [512]), "block_size must be a mapping"),
    "share above 1": (_set(*SHARE, "cpu_share", 1.5), r"cpu_share'\] = 1\.5"),
    "share negative": (_set(*SHARE, "cpu_share", -0.1), r"cpu_share'\] = -0\.1"),
    "share as text": (_set(*SHARE, "cpu_share", "half"), r"cpu_share'\] = 'half'"),
    "share NaN": (_set(*SHARE, "cpu_share", math.nan), r"cpu_share'\] = nan"),
    "share missing": (_set(*SHARE, {"cpu_helps": True}), r"cpu_share'\] = None"),
    "helps as text": (_set(*SHARE, "cpu_helps", "yes"), r"cpu_helps'\] = 'yes'"),
    "static a list": (_set("static", [0.2]), "static must be a mapping"),
    "static size as text": (_rekey("static", "herk", "complex128", 4096, "big"), "key = 'big'"),
    "transfer negative": (_set(*TRANSFER, "h2d_pinned", -5.0), r"transfer\['h2d_pinned'\] = -5\.0"),
    "transfer zero": (_set(*TRANSFER, "d2h_pinned", 0), r"transfer\['d2h_pinned'\] = 0:"),
    "transfer as text": (_set(*TRANSFER, "h2d_pageable", "fast"), "= 'fast'"),
    "transfer unknown key": (_set(*TRANSFER, "p2p", 1e10), "key = 'p2p'"),
    "transfer a list": (_set(*TRANSFER, [1e10]), "transfer must be a mapping"),
    "fingerprint gpus": (_set("fingerprint", "gpus", "none"), r"fingerprint\['gpus'\]"),
    "fingerprint gpu_count": (_set("fingerprint", "gpu_count", 3), r"fingerprint\['gpu_count'\]"),
    "fingerprint cores": (_set("fingerprint", "cpu_cores", "2"), r"fingerprint\['cpu_cores'\]"),
    "fingerprint a list": (_set("fingerprint", ["cpu"]), "fingerprint must be a mapping"),
}


def test_the_valid_profile_of_these_tests_loads_and_is_used(profile_dir, rng):
    """The control for the corruptions below: unchanged, it loads without a word and sets the rates."""
    (profile_dir / profile_filename()).write_text(yaml.safe_dump(valid_profile()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctx = hb.Context(devices=["cpu", "cpu"])
        _herk_is_right(ctx, rng)
    assert ctx.profile is not None and ctx.profile.block_size("cpu", "herk", np.complex128) == 64
    prob = herk_problem(400, 60, rng)
    rates = [ctx.rate(d, prob) for d in ctx.devices]
    assert rates[0] / rates[1] == pytest.approx(3.0)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corrupt_profile_warns_once_and_calls_still_work(profile_dir, rng, name):
    change, reason = CORRUPTIONS[name]
    content = change if isinstance(change, bytes) else yaml.safe_dump(change(valid_profile())).encode()
    path = profile_dir / profile_filename()
    path.write_bytes(content)
    with pytest.warns(ProfileWarning, match=reason) as record:
        for _ in range(3):                                  # every call and Context: still one warning
            ctx = hb.Context(devices=["cpu", "cpu"])
            _herk_is_right(ctx, rng)
            assert ctx.profile is None
        assert hb.load_profile() is None
    assert len(record) == 1, [str(r.message) for r in record]
    assert str(path) in str(record[0].message) and "using default device rates" in str(record[0].message)
    bare = hb.Context(devices=["cpu", "cpu"], profile=False)
    prob = herk_problem(200, 30, rng)
    assert [ctx.rate(d, prob) for d in ctx.devices] == [bare.rate(d, prob) for d in bare.devices]


def test_the_documented_warning_category_filters_the_warning(profile_dir):
    """``hybridblas.profile.ProfileWarning``, the name docs/tuning.md gives for warning filters, is the
    category of the warning an unusable file gives."""
    import hybridblas.profile
    (profile_dir / profile_filename()).write_text("format: [unclosed\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=hybridblas.profile.ProfileWarning)
        assert hb.load_profile() is None


def test_a_rewritten_profile_is_judged_again(profile_dir):
    path = profile_dir / profile_filename()
    path.write_bytes(b"\xff")
    with pytest.warns(ProfileWarning, match="not UTF-8"):
        assert hb.load_profile() is None
    path.write_text(yaml.safe_dump(valid_profile()))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))     # a new version of the file
    assert hb.load_profile() is not None


def test_an_unreadable_profile_path_warns(profile_dir, monkeypatch, rng):
    monkeypatch.setenv(ENV_FILE, str(profile_dir))                 # a folder, not a file
    with pytest.warns(ProfileWarning, match="cannot read") as record:
        _herk_is_right(hb.Context(devices=["cpu", "cpu"]), rng)
        _herk_is_right(hb.Context(devices=["cpu", "cpu"]), rng)
    assert len(record) == 1


def test_block_size_range_edges_are_accepted():
    lo, hi = BLOCK_SIZE_RANGE
    for size in (lo, hi):
        data = valid_profile()
        data["devices"]["cpu"]["block_size"] = {"herk": {"complex128": size}, "default": size}
        assert Profile(data).block_size("cpu", "herk", np.complex128) == size
        assert Profile(data).block_size("cpu", "gemm", np.float32) == size
    for size in (lo - 1, hi + 1):
        data = valid_profile()
        data["devices"]["cpu"]["block_size"]["default"] = size
        with pytest.raises(ProfileError, match=rf"block_size\['default'\] = {size}: want an integer"):
            Profile(data)


def _places(node, path=()):
    """Every (path, value) of a nested mapping, the mappings themselves included."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _places(value, path + (key,))


def _lookups(prof):
    """Every lookup the library makes, over routines, dtypes, sizes and device names."""
    for name in ("cpu", "cpu#1", "cpu#2", "cuda:0", "cuda:1"):
        prof.covers(name), prof.has_device(name), prof.transfer(name)
        for kind in ROUTINE_KINDS:
            for dt in DTYPES:
                prof.block_size(name, kind, dt)
                for size in (1, 64, 100, 4096, 10**6):
                    prof.rate(name, kind, dt, size)
                    prof.cpu_share(kind, dt, size), prof.cpu_helps(kind, dt, size)
                    prof.cpu_hybrid_rate(kind, dt, size)
    prof.cpu_threads(), prof.id, prof.matches(), repr(prof)


@pytest.mark.parametrize("bad", [None, "x", -1, 0, 0.5, True, math.nan, [], {}, [1.0]], ids=repr)
def test_any_value_anywhere_is_refused_or_harmless(bad):
    """Put ``bad`` in every place of a valid profile in turn: the validation refuses it with a
    ProfileError, or every lookup still works on what it let through."""
    places = [path for path, _ in _places(valid_profile()) if path]
    refused = 0
    for path in places:
        try:
            prof = Profile(_set(*path, bad)(valid_profile()))
        except ProfileError:
            refused += 1
            continue
        _lookups(prof)
    assert refused > len(places) // 2


def test_bad_values_are_rejected_with_their_place(profile_dir):
    data = make_profile({"cpu": 3e10})
    data["devices"]["cpu"]["rates"]["herk"]["complex128"][4096] = -1.0
    (profile_dir / profile_filename()).write_text(yaml.safe_dump(data))
    with pytest.warns(ProfileWarning, match=r"devices\['cpu'\]\.rates\['herk'\]"):
        assert hb.load_profile() is None


def test_foreign_profile_is_ignored_with_one_warning(profile_dir, monkeypatch):
    other = dict(current_fingerprint(), cpu_model="AMD EPYC 9654 96-Core Processor",
                 gpus=["NVIDIA H200", "NVIDIA H200"], gpu_count=2)
    (profile_dir / profile_filename()).write_text(yaml.safe_dump(make_profile({"cpu": 3e10}, fingerprint=other)))
    with pytest.warns(ProfileWarning, match="another node") as record:
        assert hb.load_profile() is None
        assert hb.load_profile() is None
    assert len(record) == 1 and "cpu_model" in str(record[0].message)
    # named explicitly through $HYBRIDBLAS_PROFILE: still refused
    explicit = profile_dir / "copied.yaml"
    explicit.write_text(yaml.safe_dump(make_profile({"cpu": 3e10}, fingerprint=other)))
    monkeypatch.setenv(ENV_FILE, str(explicit))
    with pytest.warns(ProfileWarning, match="another node"):
        assert hb.load_profile() is None


def test_static_splitter_follows_profile_rates(profile_dir, rng):
    """Two CPU workers with different measured rates: the bands follow the ratio 1 : 3."""
    save_profile(make_profile({"cpu": 1e10, "cpu#1": 3e10}))
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
    prof = Profile(make_profile({"cpu": 1e11, "cuda:0": 4e12}, static=static))
    ctx = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=prof)
    prob = herk_problem(300, 40, rng)
    cpu, gpu = ctx.devices_for(prob)
    r_cpu, r_gpu = ctx.rate(cpu, prob), ctx.rate(gpu, prob)
    assert r_cpu / (r_cpu + r_gpu) == pytest.approx(share)      # the calibrated share, not the raw rate
    # a profile that found the CPU useless leaves it out of CPU+GPU calls
    static_no = {"herk": {"complex128": {4096: {"cpu_share": 0.0, "cpu_helps": False}}}}
    prof_no = Profile(make_profile({"cpu": 1e11, "cuda:0": 4e12}, static=static_no))
    ctx_no = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=prof_no)
    assert [d.name for d in ctx_no.devices_for(prob)] == ["cuda:0"]
    # ... unless the caller forces a CPU rate
    forced = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=prof_no, rates={"cpu": 1.0})
    assert [d.name for d in forced.devices_for(prob)] == ["cpu", "cuda:0"]


def test_a_short_call_times_the_operands_trip_at_the_measured_transfer_rate(rng):
    """A call too short to share runs on the device that finishes first, the operands' trip to a GPU
    counted at the profile's pinned host-to-GPU rate of that GPU; without one, at policy.TRANSFER_RATE."""
    prob = herk_problem(64, 32, rng)
    moved = prob.c.nbytes + prob.factors[0].base.nbytes
    devices = [hb.devices.CPUDevice(0), _fake_gpu(0)]
    slow = policy.TRANSFER_RATE / 100
    # the CPU takes as long as the trip at 10 x slow: it wins against the slow link only; the GPU computes at once
    rates = [prob.flops() / (policy.REMOTE_LATENCY + moved / (10 * slow)), prob.flops() * 1e6]
    data = make_profile({"cpu": 1e10, "cuda:0": 1e12})
    data["devices"]["cuda:0"]["transfer"] = {"h2d_pinned": slow, "h2d_pageable": slow / 2,
                                             "d2h_pinned": 3 * slow, "d2h_pageable": slow / 3}
    measured = hb.Context(devices=devices, profile=Profile(data))
    unmeasured = hb.Context(devices=devices, profile=Profile(make_profile({"cpu": 1e10, "cuda:0": 1e12})))
    bare = hb.Context(devices=devices, profile=False)

    def chosen(ctx):
        return [d.name for d in policy.one_device_if_small(prob, devices, rates, ctx)[0]]
    assert policy.transfer_rate(prob, devices[1], measured) == slow
    assert chosen(measured) == ["cpu"]
    for ctx in (unmeasured, bare):
        assert policy.transfer_rate(prob, devices[1], ctx) == policy.TRANSFER_RATE
        assert chosen(ctx) == ["cuda:0"]
    # operands on cuda:0: a CPU worker gets them at that GPU's GPU-to-host rate; another GPU at the constant
    cupy_like = SimpleNamespace(__name__="cupy")
    on_gpu = SimpleNamespace(xp=cupy_like, fxp=cupy_like, operand_xp=None,
                             c=SimpleNamespace(device=SimpleNamespace(id=0)))
    assert policy.transfer_rate(on_gpu, devices[0], measured) == 3 * slow
    assert policy.transfer_rate(on_gpu, devices[0], bare) == policy.TRANSFER_RATE
    assert policy.transfer_rate(on_gpu, _fake_gpu(1), measured) == policy.TRANSFER_RATE
    # operands on cuda:0 and C in host memory: the operands' GPU is the one whose rate counts
    host_c = SimpleNamespace(xp=np, fxp=cupy_like, operand_xp=cupy_like, c=np.zeros((2, 2)),
                             factors=[SimpleNamespace(base=SimpleNamespace(device=SimpleNamespace(id=0)))])
    assert policy.transfer_rate(host_c, devices[0], measured) == 3 * slow
    assert policy.home_gpu(host_c) == 0


def test_block_size_from_profile(profile_dir, rng):
    prof = Profile(make_profile({"cpu": 1e10, "cpu#1": 1e10}, blocks={"cpu": 96, "cpu#1": 64}))
    ctx = hb.Context(devices=["cpu", "cpu"], profile=prof)
    prob = herk_problem(200, 30, rng)
    assert ctx.block_size_for(prob, ctx.devices_for(prob)) == 64
    assert hb.Context(devices=["cpu", "cpu"], profile=prof, block_size=50).block_size_for(prob, ctx.devices) == 50
    assert hb.Context(devices=["cpu"], profile=False).block_size_for(prob, ctx.devices[:1]) is None


def test_partial_coverage_falls_back_to_defaults_for_all(rng):
    """A profile without one device's numbers must not mix measured rates with guesses."""
    prof = Profile(make_profile({"cpu": 1e10}))
    ctx = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=prof)
    bare = hb.Context(devices=[hb.devices.CPUDevice(0), _fake_gpu(0)], profile=False)
    prob = herk_problem(100, 20, rng)
    for d in ctx.devices:
        assert ctx.rate(d, prob) == bare.rate(d, prob)


def test_caller_events_skip_a_host_c(monkeypatch):
    """A host C beside GPU operands: only the operands' GPUs get an event (the problem says where C lives; a
    numpy array's own ``device`` attribute is the string "cpu", no GPU)."""
    import sys
    from hybridblas import scheduler
    recorded = []

    class Event:
        def __init__(self, **kw):
            pass

        def record(self, stream):
            recorded.append(stream)

    class Device:
        def __init__(self, gpu):
            self.gpu = gpu

        def __enter__(self):
            recorded.append(f"gpu {self.gpu}")

        def __exit__(self, *exc):
            return False
    fake = SimpleNamespace(cuda=SimpleNamespace(Device=Device, Event=Event, get_current_stream=lambda: "stream"))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    operand = type("ndarray", (), {"__module__": "cupy._core.core", "device": SimpleNamespace(id=1)})()
    prob = SimpleNamespace(c=np.zeros((2, 2)), factors=[SimpleNamespace(base=operand)], xp=np, fxp=fake)
    assert len(scheduler._caller_events(prob)) == 1
    assert recorded == ["gpu 1", "stream"]
