"""hybridblas-tune: a tiny CPU-only calibration into a temporary directory, reloaded and used."""
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

import hybridblas as hb
from hybridblas import scheduler
from hybridblas.devices import CPUDevice, base
from hybridblas.problem import N, build_problem
from hybridblas.profile.model import BLOCK_SIZE_RANGE, TRANSFER_KEYS
from hybridblas.profile.node import current_fingerprint, profile_filename
from hybridblas.profile.store import read_profile
from hybridblas.tuning import Settings, calibrate_to
from hybridblas.tuning.measure import Call, combos, flops
from hybridblas.tuning.progress import Progress
from test_bad_input_tune import run_tune


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
    assert path.parent == profile_dir and path.name == profile_filename()
    assert data["fingerprint"] == current_fingerprint()
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
    out_dir = profile_dir / "out"
    out_dir.mkdir()
    code, out, err = run_tune(["calibrate", "--devices", "cpu", "--routines", "herk", "--dtypes", "complex128",
                               "--sizes", "32", "64", "--output", str(out_dir), "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["profile_path"] == str(out_dir / profile_filename())
    assert "calibration of cpu" in err                      # the note on stderr, no progress off a terminal
    assert "GFLOP/s" not in err and "\r" not in err
    code, out, err = run_tune(["show", "--file", result["profile_path"], "--json"], capsys)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["profile"]["devices"]["cpu"]["rates"]["herk"]["complex128"].keys() == {"32", "64"}
    code, out, err = run_tune(["show"], capsys)
    assert code == 1 and "no usable profile" in err         # nothing in $HYBRIDBLAS_PROFILE_DIR itself
    code, out, err = run_tune(["info", "--json"], capsys)
    assert code == 0, err
    info = json.loads(out)
    assert info["profile"]["status"].startswith("none") and info["devices"][0]["name"] == "cpu"
    assert info["fingerprint"]["blas"]
    # -v: each step's result in the log; -q: the result alone
    code, out, err = run_tune(["calibrate", "--quick", "--devices", "cpu", "--routines", "gemm", "--dtypes",
                               "float64", "--sizes", "32", "--output", str(out_dir), "-v"], capsys)
    assert code == 0 and "cpu gemm float64" in err and "GFLOP/s" in err
    assert out.startswith(f"wrote {out_dir / profile_filename()}")
    code, out, err = run_tune(["calibrate", "--quick", "--devices", "cpu", "--routines", "gemm", "--dtypes",
                               "float64", "--sizes", "32", "--output", str(out_dir), "-q"], capsys)
    assert code == 0 and err == "" and out.startswith("wrote ")


def test_cli_show_plots_the_rates(profile_dir, capsys):
    pytest.importorskip("matplotlib")
    path, _, _ = calibrate_to(None, ["cpu"], tiny())
    png = profile_dir / "rates.png"
    code, out, err = run_tune(["show", "--file", str(path), "--plot", str(png)], capsys)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "herk  complex128 GFLOP/s" in out and "block size: default" in out


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_only_on_a_terminal(monkeypatch, terminal):
    pytest.importorskip("tqdm")

    class Stream(io.StringIO):
        def isatty(self):
            return terminal
    stream = Stream()
    monkeypatch.setattr(sys, "stderr", stream)
    bar = Progress(2, enabled=True)
    bar.step("cpu herk complex128: 1.0 GFLOP/s")
    bar.step("cpu gemm complex128: 2.0 GFLOP/s")
    bar.close()
    assert ("calibrate:" in stream.getvalue()) is terminal      # the bar, drawn on a terminal only
    assert stream.getvalue() == "" or terminal


def test_module_entry_point(profile_dir):
    (profile_dir / profile_filename()).write_text("format: [unclosed\n  devices: {")
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


@pytest.mark.gpu
def test_cli_calibrates_a_gpu_into_a_valid_profile(profile_dir, capsys):
    """On a GPU node: the CLI's device syntax reaches the GPU, and what it measured passes the profile's
    validation (rates, a block size in range, the four transfer rates) and is loaded back."""
    code, out, err = run_tune(["calibrate", "--quick", "--devices", "cpu,0", "--routines", "gemm", "--dtypes",
                               "float64", "--sizes", "1024", "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["devices"] == ["cpu", "cuda:0"]
    prof = read_profile(result["profile_path"])
    lo, hi = BLOCK_SIZE_RANGE
    assert prof.rate("cuda:0", "gemm", np.float64, 1024) > 0
    assert lo <= prof.block_size("cuda:0", "gemm", np.float64) <= hi
    assert set(prof.transfer("cuda:0")) == set(TRANSFER_KEYS)
    assert hb.load_profile() is not None
