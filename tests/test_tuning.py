"""hybridblas-tune: a tiny CPU-only calibration into a temporary directory, reloaded and used."""
import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

import hybridblas as hb
from hybridblas import profile as pm, scheduler
from hybridblas.devices import CPUDevice, base
from hybridblas.problem import N, build_problem
from hybridblas.tuning import Settings, calibrate_to
from hybridblas.tuning.cli import main
from hybridblas.tuning.measure import Call, combos, flops


def tiny(**kw):
    s = Settings.quick()
    s.routines, s.dtypes = ("herk", "gemm"), ("complex128",)
    s.sizes = {"cpu": (32, 96), "cuda": (32, 96)}
    s.blocks = {"cpu": (32, 48), "cuda": (32, 48)}
    s.min_time, s.min_reps, s.max_call_s = 0.0, 2, 10.0
    for k, v in kw.items():
        setattr(s, k, v)
    return s


class _FakeGPU(CPUDevice):
    """A host-BLAS worker that calls itself cuda:i, to drive the CPU+GPU code paths without a GPU."""
    kind = "cuda"

    @property
    def name(self):
        return f"cuda:{self.index}"


@pytest.fixture
def fake_cuda(monkeypatch):
    def factory(spec):
        return [_FakeGPU(int(spec.split(":")[1]))]
    monkeypatch.setitem(base._REGISTRY, "cuda", factory)


def test_flop_counts_follow_lawn41():
    assert flops("gemm", 10, np.float64) == 2 * 10 ** 3
    assert flops("herk", 10, np.complex128) == 8 * 55 * 10
    assert flops("her2k", 10, np.complex128) == 2 * 8 * 55 * 10
    assert ("herk", "float64") not in combos(("herk", "gemm"), ("float64",))


def test_call_computes_the_right_thing():
    call = Call("her2k", 24, "complex128", seed=3)
    call.run(hb.Context(devices="cpu", profile=False))
    a, b = call.a, call.b
    assert np.allclose(np.tril(call.c), np.tril(a @ b.conj().T + b @ a.conj().T))


def test_tiny_cpu_calibration_is_reloaded_and_used(profile_dir, rng):
    path, log_path, data = calibrate_to(None, ["cpu"], tiny())
    assert path.parent == profile_dir and path.name == pm.profile_filename()
    assert data["fingerprint"] == pm.current_fingerprint()
    records = json.loads(log_path.read_text())["records"]
    assert {r["step"] for r in records} == {"rate", "block"}
    prof = hb.load_profile()
    assert prof is not None and prof.path == path
    measured = yaml.safe_load(path.read_text())["devices"]["cpu"]
    for n, r in measured["rates"]["herk"]["complex128"].items():
        rec = [x for x in records if x["step"] == "rate" and x["routine"] == "herk" and x["n"] == n][0]
        assert r == pytest.approx(rec["flops"] / rec["best_s"])      # rates are what was timed
    assert prof.block_size("cpu", "herk", np.complex128) in (32, 48)
    # the library picks it up by itself: a fresh Context's rate is the profile's
    ctx = hb.Context(devices="cpu")
    a = np.asfortranarray(rng.standard_normal((96, 96)) + 1j * rng.standard_normal((96, 96)))
    prob = build_problem("herk", 1.0, [a], 0.0, None, [N], True, None)
    assert ctx.profile is prof
    assert ctx.rate(ctx.devices[0], prob) == pytest.approx(measured["rates"]["herk"]["complex128"][96])


def test_calibrated_cpu_plus_gpu_profile_sets_the_static_split(profile_dir, fake_cuda, rng):
    """CPU + a (fake) GPU: the share search runs, and the static splitter gives the CPU that share."""
    path, log_path, data = calibrate_to(None, ["cpu", "cuda:0"], tiny(share_factors=(0.5, 1.0)))
    share = data["static"]["herk"]["complex128"]
    (n, entry), = share.items()
    assert 0.0 <= entry["cpu_share"] < 1 and isinstance(entry["cpu_helps"], bool)
    assert entry["cpu_helps"] == (entry["cpu_share"] > 0)
    prof = hb.load_profile()
    ctx = hb.Context(devices=["cpu", "cuda:0"], strategy="static")
    a = np.asfortranarray(rng.standard_normal((n, 40)) + 1j * rng.standard_normal((n, 40)))
    prob = build_problem("herk", 1.0, [a], 0.0, None, [N], True, None)
    devices = ctx.devices_for(prob)
    if not entry["cpu_helps"]:
        assert [d.name for d in devices] == ["cuda:0"]
        return
    rates = [ctx.rate(d, prob) for d in devices]
    assert rates[0] / sum(rates) == pytest.approx(prof.cpu_share("herk", np.complex128, n))
    assign = scheduler.static_assignment(prob, devices, rates, ctx)
    work = [sum(t.flops for t in tasks) for tasks in assign]
    assert work[0] / sum(work) == pytest.approx(entry["cpu_share"], abs=0.05)   # band edges are whole rows


def test_cli_calibrate_show_info_json(profile_dir, capsys):
    rc = main(["calibrate", "--devices", "cpu", "--routines", "herk", "--dtypes", "complex128",
               "--sizes", "32", "64", "--output", str(profile_dir / "out"), "--json"])
    out = capsys.readouterr()
    assert rc == 0
    result = json.loads(out.out)
    assert result["profile_path"].startswith(str(profile_dir / "out"))
    assert "cpu herk complex128" in out.err                 # progress on stderr
    assert main(["show", "--file", result["profile_path"], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["profile"]["devices"]["cpu"]["rates"]["herk"]["complex128"].keys() == {"32", "64"}
    assert main(["show"]) == 1                              # nothing in $HYBRIDBLAS_PROFILE_DIR itself
    assert "no usable profile" in capsys.readouterr().err
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["profile"]["status"].startswith("none") and info["devices"][0]["name"] == "cpu"
    assert info["fingerprint"]["blas"]


def test_cli_rejects_bad_input(profile_dir, capsys):
    assert main(["calibrate", "--devices", "tpu:0", "--sizes", "16", "--no-progress"]) == 2
    assert "tpu:0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["calibrate", "--routines", "trsm"])


def test_module_entry_point(profile_dir):
    (profile_dir / pm.profile_filename()).write_text("format: [unclosed\n  devices: {")
    out = subprocess.run([sys.executable, "-m", "hybridblas.tuning", "info", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)["profile"]["status"]
    assert status.startswith("ignored: not valid YAML")
    show = subprocess.run([sys.executable, "-m", "hybridblas.tuning", "show"],
                          capture_output=True, text=True, timeout=120)
    assert show.returncode == 1 and "not valid YAML" in show.stderr and "Traceback" not in show.stderr


def test_share_trials_keep_a_small_cpu_share(profile_dir, fake_cuda, monkeypatch):
    """A CPU share of ~1 % is timed with the CPU in the call: the scheduler's rule that drops a CPU
    worth under 5 % must not turn the hybrid trial into a second GPU-only run."""
    seen = []
    real = scheduler.static_assignment

    def spy(problem, devices, rates, ctx):
        seen.append(([d.name for d in devices], rates[0] / sum(rates)))
        return real(problem, devices, rates, ctx)
    monkeypatch.setattr(scheduler, "static_assignment", spy)
    _, log_path, _ = calibrate_to(None, ["cpu", "cuda:0"], tiny(share_factors=(0.02,)))
    trials = [r for r in json.loads(log_path.read_text())["records"] if r["step"] == "share"]
    hybrid = [frac for names, frac in seen if names == ["cpu", "cuda:0"]]
    for trial in trials:                         # herk and gemm
        share = float(*trial["trials"])
        assert 0 < share < 0.05
        assert any(f == pytest.approx(share) for f in hybrid)
