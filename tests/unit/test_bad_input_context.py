"""Bad input to hb.Context(...): every argument refused with a TypeError or ValueError that names the
argument and the value given (no raw comparison errors); good values of every kind accepted."""
import math

import numpy as np
import pytest

import hybridblas as hb
from hybridblas.profile.model import FORMAT, Profile
from hybridblas.profile.node import current_fingerprint

CASES = [
    # devices (parsed by hybridblas.devspec)
    (dict(devices="tpu"), ValueError, "unknown device 'tpu'"),
    (dict(devices=[]), ValueError, r"devices must be .* got \[\]"),
    (dict(devices=None), ValueError, "devices must be .* got None"),
    (dict(devices=["cpu", 3.5]), ValueError, "devices: unknown device 3.5"),
    # strategy
    (dict(strategy="fast"), ValueError, r"strategy must be one of \('static', 'dynamic', 'auto'\), got 'fast'"),
    (dict(strategy=None), TypeError, "strategy must be one of .* got None"),
    (dict(strategy=1), TypeError, "strategy must be one of .* got 1"),
    # block_size
    (dict(block_size=True), ValueError, "block_size must be a positive integer or None, got True"),
    (dict(block_size=64.0), ValueError, r"block_size must be a positive integer or None, got 64\.0"),
    (dict(block_size=0), ValueError, "block_size must be a positive integer or None, got 0"),
    (dict(block_size=-64), ValueError, "block_size must be a positive integer or None, got -64"),
    (dict(block_size="64"), TypeError, "block_size must be a positive integer or None, got '64'"),
    # cpu_threads
    (dict(cpu_threads=True), ValueError, "cpu_threads must be a positive integer or None, got True"),
    (dict(cpu_threads=0), ValueError, "cpu_threads must be a positive integer or None, got 0"),
    (dict(cpu_threads=2.0), ValueError, r"cpu_threads must be a positive integer or None, got 2\.0"),
    (dict(cpu_threads="2"), TypeError, "cpu_threads must be a positive integer or None, got '2'"),
    # rates
    (dict(rates=[("cpu", 1.0)]), TypeError, r"rates must be a dict of device name -> flop/s, got \[\('cpu', 1\.0\)\]"),
    (dict(rates="cpu=1"), TypeError, "rates must be a dict .* got 'cpu=1'"),
    (dict(rates={"cpu": "fast"}), TypeError, r"rates\['cpu'\] must be a positive number \(finite\), got 'fast'"),
    (dict(rates={"cpu": None}), TypeError, r"rates\['cpu'\] must be a positive number .* got None"),
    (dict(rates={"cpu": -1}), ValueError, r"rates\['cpu'\] must be a positive number .* got -1"),
    (dict(rates={"cpu": 0}), ValueError, r"rates\['cpu'\] must be a positive number .* got 0"),
    (dict(rates={"cpu": math.nan}), ValueError, r"rates\['cpu'\] must be a positive number .* got nan"),
    (dict(rates={"cpu": math.inf}), ValueError, r"rates\['cpu'\] must be a positive number .* got inf"),
    (dict(rates={"cpu": True}), ValueError, r"rates\['cpu'\] must be a positive number .* got True"),
    (dict(rates={0: 1.0}), TypeError, "rates: device names must be strings .* got 0"),
    # tail_fraction
    (dict(tail_fraction="x"), TypeError, r"tail_fraction must be a number in \[0, 1\), got 'x'"),
    (dict(tail_fraction=None), TypeError, r"tail_fraction must be a number in \[0, 1\), got None"),
    (dict(tail_fraction=1.0), ValueError, r"tail_fraction must be a number in \[0, 1\), got 1\.0"),
    (dict(tail_fraction=-0.1), ValueError, r"tail_fraction must be .* got -0\.1"),
    (dict(tail_fraction=math.nan), ValueError, "tail_fraction must be .* got nan"),
    (dict(tail_fraction=False), ValueError, "tail_fraction must be .* got False"),
    # memory_limit
    (dict(memory_limit=0), ValueError, "memory_limit must be a positive number of bytes .* got 0"),
    (dict(memory_limit=-1), ValueError, "memory_limit must be .* got -1"),
    (dict(memory_limit=1.5e9), ValueError, r"memory_limit must be .* got 1500000000\.0"),
    (dict(memory_limit=True), ValueError, "memory_limit must be .* got True"),
    (dict(memory_limit="8GB"), TypeError, "memory_limit must be .* got '8GB'"),
    # cpu_min_share
    (dict(cpu_min_share=1.0), ValueError, r"cpu_min_share must be a number in \[0, 1\) or None, got 1\.0"),
    (dict(cpu_min_share=-0.5), ValueError, r"cpu_min_share must be .* got -0\.5"),
    (dict(cpu_min_share=math.nan), ValueError, "cpu_min_share must be .* got nan"),
    (dict(cpu_min_share="half"), TypeError, "cpu_min_share must be .* got 'half'"),
    # min_call_seconds
    (dict(min_call_seconds=-1), ValueError, "min_call_seconds must be a number >= 0 .* got -1"),
    (dict(min_call_seconds=math.nan), ValueError, "min_call_seconds must be .* got nan"),
    (dict(min_call_seconds=math.inf), ValueError, "min_call_seconds must be .* got inf"),
    (dict(min_call_seconds=None), TypeError, "min_call_seconds must be .* got None"),
    (dict(min_call_seconds="0"), TypeError, "min_call_seconds must be .* got '0'"),
    # pin_host
    (dict(pin_host="yes"), ValueError, "pin_host must be True, False, 'auto' or None, got 'yes'"),
    (dict(pin_host=1), ValueError, "pin_host must be .* got 1"),
    (dict(pin_host=np.zeros(2)), ValueError, r"pin_host must be .* got array\(\[0\., 0\.\]\)"),
    # sync
    (dict(sync="yes"), TypeError, "sync must be True or False, got 'yes'"),
    (dict(sync=1), TypeError, "sync must be True or False, got 1"),
    (dict(sync=None), TypeError, "sync must be True or False, got None"),
    # profile
    (dict(profile=True), TypeError, r"profile must be a loaded profile \(hybridblas.load_profile\(\)\), None or "
                                    "False, got True"),
    (dict(profile="node.yaml"), TypeError, "profile must be .* got 'node.yaml'"),
    (dict(profile={"devices": {}}), TypeError, "profile must be .* got {'devices': {}}"),
]


@pytest.mark.parametrize("kwargs,exc,match", CASES, ids=[f"{next(iter(k))}={next(iter(k.values()))!r}"
                                                          for k, _, _ in CASES])
def test_bad_argument_named_with_its_value(kwargs, exc, match):
    kwargs = dict(kwargs)
    kwargs.setdefault("devices", "cpu")
    with pytest.raises(exc, match=match):
        hb.Context(**kwargs)


def test_pin_host_environment_checked(monkeypatch):
    from hybridblas.context import PIN_ENV
    monkeypatch.setenv(PIN_ENV, "sometimes")
    with pytest.raises(ValueError, match=r"\$HYBRIDBLAS_PIN_HOST must be auto, on or off, got 'sometimes'"):
        hb.Context("cpu")


def test_good_values_of_every_kind_accepted(profile_dir):
    table = {"rates": {"herk": {"complex128": {64: 1e9, 4096: 2e9}}}}
    prof = Profile({"format": FORMAT, "fingerprint": dict(current_fingerprint()),
                       "devices": {"cpu": dict(table, kind="cpu")}})
    ctx = hb.Context(devices=["cpu", "cpu"], strategy="dynamic", block_size=np.int64(64), cpu_threads=np.int32(2),
                     rates={"cpu": np.float64(1e9), "cpu#1": 5}, profile=prof, sync=np.True_,
                     tail_fraction=0, memory_limit=1 << 30, cpu_min_share=0.0, min_call_seconds=0,
                     pin_host="auto")
    assert ctx.block_size == 64 and type(ctx.block_size) is int
    assert ctx.cpu_threads == 2 and type(ctx.cpu_threads) is int
    assert ctx.rates == {"cpu": 1e9, "cpu#1": 5.0}
    assert ctx.sync is True and ctx.tail_fraction == 0.0 and ctx.memory_limit == 1 << 30
    assert ctx.cpu_min_share == 0.0 and ctx.min_call_seconds == 0.0 and ctx.pin_host == "auto"
    assert ctx.profile is prof
    assert hb.Context("cpu", profile=False).profile is None
    assert hb.Context("cpu", pin_host=np.False_).pin_host is False


def test_device_lists_take_the_words_of_the_string_form(monkeypatch):
    """A list of devices is spelled like the string form (any case, spaces around); 'all' on a node without
    GPUs is its cores, as for the string; a word the string form refuses is refused, never an empty Context."""
    from hybridblas import context
    monkeypatch.setattr(context, "gpu_count", lambda: 0)
    for devices in (["CPU"], [" cpu"], ["Cpu"], ["all"], "all", "CPU"):
        assert [d.name for d in hb.Context(devices).devices] == ["cpu"], devices
    assert [d.name for d in hb.Context(["cpu", "CPU "]).devices] == ["cpu", "cpu#1"]
    for devices in (["cpux"], [None], [True], ["cpu", 1.5]):
        with pytest.raises(ValueError, match="devices: unknown device"):
            hb.Context(devices)
    with pytest.raises(ValueError, match=r"devices must name at least one device .* got \[''\]"):
        hb.Context([""])
