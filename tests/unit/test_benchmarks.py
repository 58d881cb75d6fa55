"""The benchmark drivers (python3 -m benchmarks.blas / flapw / cisolver / cli): every driver and every command
answers --help on a machine without a GPU, a driver run as a file finds the repository's packages (not itself),
bad input ends with exit code 2 and the argument named, `blas cpu` and the CLI timer write the JSON they always
wrote, the plot commands read the JSON kept in benchmarks/results, and reproduce.sh lists its stages."""
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks import blas, cisolver, cli, flapw
from benchmarks.common import main

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = {"blas": blas, "flapw": flapw, "cisolver": cisolver}


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_every_command_answers_help(name, capsys):
    driver = DRIVERS[name]
    assert main(name, driver.__doc__, driver.COMMANDS, ["--help"]) == 0
    listing = capsys.readouterr().out
    assert f"usage: python3 -m benchmarks.{name}" in listing
    for command in driver.COMMANDS:
        assert command in listing
        assert main(name, driver.__doc__, driver.COMMANDS, [command, "--help"]) == 0
        assert f"usage: python3 -m benchmarks.{name} {command}" in capsys.readouterr().out


def test_the_cli_timer_answers_help(capsys):
    assert cli.main(["--help"]) == 0
    assert "usage: python3 -m benchmarks.cli" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["blas", "flapw", "cisolver", "cli"])
def test_a_driver_run_as_a_file_imports_the_packages_not_itself(name):
    # benchmarks/flapw.py and benchmarks/cisolver.py share their names with the packages they measure
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--help"], cwd=ROOT / "tests",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"usage: python3 -m benchmarks.{name}" in out.stdout


@pytest.mark.parametrize("argv, message", [
    (["cpu", "--n", "0"], "--n: must be an integer >= 1, got '0'"),
    (["gpu", "--repeats", "-1"], "--repeats: must be an integer >= 1, got '-1'"),
    (["sweep-ratio", "--routine", "trsm"], "invalid choice: 'trsm'"),
    (["band-settings", "--setting", "x", "band_plan.NOPE=1"], "got 'band_plan.NOPE=1'"),
    (["band-settings", "--setting", "x", "band_plan.OUTER_GAIN=zz"], "must be a Python literal, got 'band_plan.OUTER_GAIN=zz'"),
    (["band-settings", "--calls", "0"], "--calls: must be an integer >= 1, got '0'"),
])
def test_bad_blas_options_exit_2_naming_the_argument(argv, message, capsys):
    assert main("blas", blas.__doc__, blas.COMMANDS, argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["solve", "--out", "x", "--cases", "24Mg,99Xx"], "unknown case(s) ['99Xx']"),
    (["build", "--cases", ""], "unknown case(s) ''"),
    (["spmm-cpu", "--case", "12C"], "invalid choice: '12C'"),
    (["threads", "--tol", "0"], "--tol: must be a finite number > 0, got '0'"),
])
def test_bad_cisolver_options_exit_2_naming_the_argument(argv, message, capsys):
    assert main("cisolver", cisolver.__doc__, cisolver.COMMANDS, argv) == 2
    assert message in capsys.readouterr().err


def test_a_missing_output_folder_is_refused_before_any_work(tmp_path, capsys):
    target = tmp_path / "missing" / "out.json"
    assert main("blas", blas.__doc__, blas.COMMANDS, ["cpu", "--n", "8", "--json", str(target)]) == 2
    err = capsys.readouterr()
    assert "does not exist" in err.err and err.out == ""
    assert not target.parent.exists()


def test_sweep_ratio_refuses_a_device_set_without_anything_to_sweep(profile_dir, capsys):
    argv = ["sweep-ratio", "--devices", "cpu", "--n", "16", "--rounds", "1", "--warmup", "0"]
    assert main("blas", blas.__doc__, blas.COMMANDS, argv) == 2
    assert "nothing to sweep on ['cpu']" in capsys.readouterr().err


def test_build_refuses_an_unknown_storage(tmp_path, capsys):
    assert main("cisolver", cisolver.__doc__, cisolver.COMMANDS, ["build", "--storage", "upper,lower"]) == 2
    assert "--storage must be a comma list of upper, full; got 'upper,lower'" in capsys.readouterr().err


def test_blas_cpu_writes_its_table_and_json(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    n, k = 33, 17
    assert main("blas", blas.__doc__, blas.COMMANDS,
                ["cpu", "--n", str(n), "--k", str(k), "--repeat", "2", "--json", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"n = {n}, k = {k}, complex128")
    doc = json.loads(out.read_text())
    assert (doc["n"], doc["k"]) == (n, k) and doc["cores"] >= 1
    names = [r["name"] for r in doc["results"]]
    assert names == ["scipy zherk", "hybridblas herk (cpu)", "hybridblas herk (2 workers, dynamic 512)",
                     "numpy a @ b (full gemm)", "scipy zgemm", "hybridblas gemmt (cpu)"]
    flops = {"scipy zherk": 4.0 * k * n * (n + 1), "numpy a @ b (full gemm)": 8.0 * n * n * k}
    for r in doc["results"]:
        assert 0 < r["seconds_best"] <= r["seconds_median"]
        want = flops.get(r["name"], 8.0 * n * n * k if "zgemm" in r["name"] else 4.0 * k * n * (n + 1))
        assert r["gflops"] == pytest.approx(want / r["seconds_best"] / 1e9)
    base = {r["name"]: r["seconds_best"] for r in doc["results"]}
    assert doc["ratio_herk_over_zherk"] == pytest.approx(base["hybridblas herk (cpu)"] / base["scipy zherk"])


def _stage_printer(stages, code=0):
    """A command that prints a JSON object with the given stage seconds, as the CLIs' --json does."""
    doc = {"seconds": stages, "energies": [-1.5, -0.25], "dimension": 7}
    return [sys.executable, "-c", f"import json, sys; print(json.dumps({doc!r})); sys.exit({code})"]


def test_the_cli_timer_appends_records_with_stages(tmp_path, capsys):
    out = tmp_path / "runs.json"
    out.write_text(json.dumps([{"label": "earlier"}]))
    stages = {"read+build": 0.25, "solve": 0.5, "detail": {"spmm": 0.1}}
    assert cli.main(["--label", "two", "--repeat", "2", "--json", str(out), "--", *_stage_printer(stages)]) == 0
    assert cli.main(["--label", "fails", "--json", str(out), "--", *_stage_printer({}, code=3)]) == 0
    records = json.loads(out.read_text())
    assert [r["label"] for r in records] == ["earlier", "two", "two", "fails"]
    for i, r in enumerate(records[1:3]):
        assert r["repeat"] == i and r["rc"] == 0 and r["wall_s"] > 0
        assert r["stages"] == {"read+build": 0.25, "solve": 0.5} and r["details"] == {"detail": {"spmm": 0.1}}
        assert r["outside_stages_s"] == pytest.approx(r["wall_s"] - 0.75)
        assert r["energies"] == [-1.5, -0.25] and r["dimension"] == 7
    assert records[3]["rc"] == 3 and "stderr_tail" in records[3]
    assert "two #1: wall" in capsys.readouterr().out


def test_the_cli_timer_needs_a_command(capsys):
    assert cli.main(["--label", "x"]) == 2
    assert "give the command after --" in capsys.readouterr().err


STORED = ROOT / "benchmarks" / "results"


def test_blas_plot_merges_stored_runs(tmp_path):
    pytest.importorskip("matplotlib")
    files = [STORED / "h100x2-2026-11-26" / "blas-host" / "bench_blas_gpu.json",
             STORED / "h100x2-2026-11-26" / "blas-host-late" / "bench_blas_gpu.json"]
    assert main("blas", blas.__doc__, blas.COMMANDS, ["plot", *map(str, files), "--out", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "bench_blas_gpu.json").read_text())
    docs = [json.loads(f.read_text()) for f in files]

    def case(r):
        return r["routine"], r["n"], r["impl"], r["mode"], tuple(r["gpus"])
    later = {case(r): r for r in docs[1]["results"]}
    want = [later.pop(case(r), r) for r in docs[0]["results"]] + list(later.values())
    assert merged["results"] == want and len(want) < len(docs[0]["results"]) + len(docs[1]["results"])
    assert merged["commands"] == docs[0]["commands"] + [docs[1]["command"]]
    assert (tmp_path / "bench_blas_gpu.png").stat().st_size > 0
    assert (tmp_path / "bench_blas_gpu_scaling.png").stat().st_size > 0     # 1 and 2 GPUs in the runs


@pytest.mark.parametrize("name, figure", [("flapw", "flapw_tio2.png"), ("cisolver", "cisolver_peers.png")])
def test_the_summary_plots_read_the_stored_results(name, figure, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    driver = DRIVERS[name]
    assert main(name, driver.__doc__, driver.COMMANDS, ["plot", "--out", str(tmp_path / figure)]) == 0
    assert "no results for" not in capsys.readouterr().out               # every series found its JSON
    assert (tmp_path / figure).stat().st_size > 0


def test_the_cisolver_plot_reads_every_solver_of_the_stored_runs():
    from benchmarks.measure import ci_plot
    for label, folder, solver, _ in ci_plot.TIMES:
        points = ci_plot.points(folder, solver, lambda r: r["seconds"])
        assert points and all(dim > 0 and np.isfinite(s) and s > 0 for dim, s in points), label


def test_reproduce_lists_its_stages_and_refuses_an_unknown_one():
    script = ROOT / "benchmarks" / "reproduce.sh"
    listing = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0
    lines = {line.split()[0]: line for line in listing.stdout.splitlines()[3:] if line.strip()}
    for stage in ("blas-cpu", "blas-2gpu", "flapw-device", "flapw-cpu", "ci-gpu", "ci-ranks", "flapw-mpi",
                  "plot-flapw", "plot-cisolver", "e2e-flapw"):
        assert stage in lines
    assert "CPU box" in lines["blas-cpu"] and "2 GPUs + MPI" in lines["ci-ranks"]
    wrong = subprocess.run(["bash", str(script), "blas-cpu", "nope"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "unknown stage 'nope'" in wrong.stderr
    assert "===" not in wrong.stdout                                    # refused before running blas-cpu


def test_the_emulation_plot_reads_its_stored_run(tmp_path):
    pytest.importorskip("matplotlib")
    stored = STORED / "h200x2-2026-11-26" / "emulation" / "bench_blas_emulation.json"
    assert main("blas", blas.__doc__, blas.COMMANDS, ["emulation", "--plot-only", str(stored), "--out",
                                                       str(tmp_path)]) == 0
    assert (tmp_path / "blas_emulation.png").stat().st_size > 0


def test_band_settings_parse_module_constants_and_the_one_gpu_item():
    from benchmarks.measure.blas_band_settings import parse_setting
    assert parse_setting(["k", "band_plan.OUTER_GAIN=0", "one-gpu", "band_outer.CORNER_FIRST=512"]) == (
        "k", {("band_plan", "OUTER_GAIN"): 0, ("band_outer", "CORNER_FIRST"): 512}, True)
    assert parse_setting(["default"]) == ("default", {}, False)


def test_band_settings_turns_alternate_the_settings_and_pair_each_round(monkeypatch, capsys):
    """--turns: every round switches to each setting (reversed every other round), drops the call after the
    switch, keeps --calls timed ones; the paired figure is the median of each round's best over the first
    setting's best in that round."""
    from benchmarks.measure import blas_band_settings as S
    seen, applied = [], []
    clock = iter([10.0, 1.0, 2.0, 20.0, 3.0, 4.0, 20.0, 1.5, 2.5, 10.0, 2.0, 1.0, 10.0, 1.0, 1.0, 20.0, 2.0, 2.0])

    def fake_timed(cp, fn, count):
        fn()
        return [next(clock) for _ in range(count)]
    monkeypatch.setattr(S, "_timed", fake_timed)
    settings = [("a", {}, False), ("b", {("cuda_tri_store", "PANEL"): 0}, True)]
    doc = {"results": []}
    args = SimpleNamespace(turns=3, calls=2)
    S._take_turns(None, settings, args, {"routine": "zgemmt", "n": 8}, applied.append, lambda: {}, 1.0, doc,
                  seen.append)
    assert seen == [False, True, True, False, False, True]
    assert applied == [{}, settings[1][1], settings[1][1], {}, {}, settings[1][1]]
    a, b = doc["results"]
    assert a["seconds"] == [1.0, 2.0, 2.0, 1.0, 1.0, 1.0] and b["seconds"] == [3.0, 4.0, 1.5, 2.5, 2.0, 2.0]
    assert (a["best_s"], b["best_s"]) == (1.0, 1.5)
    assert b["paired_to_first"] == 2.0 and a["paired_to_first"] == 1.0      # rounds: 3/1, 1.5/1, 2/1
    assert b["median_s"] == 2.25 and b["one_gpu"] and b["values"] == {"cuda_tri_store.PANEL": 0}
    assert "rounds' best over a's: median 2.000" in capsys.readouterr().out


def test_band_replay_rates_by_class_and_its_refusal_without_two_gpus(capsys, monkeypatch):
    from benchmarks.measure.blas_band_replay import _rates
    from hybridblas import problem as P
    a = np.zeros((8, 6), np.complex128, order="F")
    prob = P.build_problem("gemmt", 1.0, [a, a.copy()], 0.0, None, [P.C, P.N], True, None)
    products = [(0, 4, 0, 4, 0, 8, True, 0.0), (4, 6, 0, 4, 0, 8, False, 0.0), (4, 6, 4, 6, 0, 8, True, 0.0)]
    out = _rates(prob, products, [1e-9, 2e-9, 1e-9])          # 8 flops an entry per k: 640, 512, 192 flops
    assert out["diag"] == {"tflops": round(832 / 2e-9 / 1e12, 2), "ms": round(2e-9 * 1e3, 3)}
    assert out["rect"]["tflops"] == round(512 / 2e-9 / 1e12, 2)
    assert out["all"]["tflops"] == round(1344 / 4e-9 / 1e12, 2)
    one_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", one_gpu)               # a node with one GPU, whatever this one has
    assert main("blas", blas.__doc__, blas.COMMANDS, ["band-replay", "--sizes", "64"]) == 2
    assert "band-replay compares two GPUs: this node has 1 that CuPy can use" in capsys.readouterr().err


def test_band_trace_summary_plot_and_refusal_without_two_gpus(capsys, monkeypatch, tmp_path):
    from benchmarks.measure import blas_band_trace as T
    timeline = [("upload", 0, 0.0, 1e-3, 0.5e-3), ("product-final-rect", 0, 1e-3, 2e-3, 0.9e-3),
                ("product-final-diag", 1, 2e-3, 3e-3, 2.6e-3), ("write", 0, 2e-3, 2.5e-3, None),
                ("write", 1, 3e-3, 3.4e-3, None)]
    s = T.summary(timeline, open_s=0.1e-3)          # queued at 0.8 and 2.5 ms on the GPU's clock
    assert s == {"products": 2, "late": 1, "late_s": pytest.approx(0.5e-3), "busy_s": pytest.approx(2e-3),
                 "first_product_s": 1e-3, "last_write_end_s": 3.4e-3}
    if _has_matplotlib():
        row = {"routine": "zherk", "n": 64, "calls_s": [0.01], "modelled_s": 0.009,
               "model": [[0, "compute", 0, 0.0, 1e-3], [1, "compute", 0, 0.0, 2e-3]],
               "gpus": {"0": {"timeline": timeline}, "1": {"timeline": timeline[:2]}}}
        out = T.plot(row, str(tmp_path / "trace.png"))
        assert (tmp_path / "trace.png").stat().st_size > 0 and out.endswith("trace.png")
    one_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", one_gpu)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["band-trace", "--sizes", "64"]) == 2
    assert "band-trace compares two GPUs: this node has 1 that CuPy can use" in capsys.readouterr().err


def test_turns_summaries_and_its_refusal_without_two_gpus(capsys, monkeypatch):
    import gc
    from benchmarks.measure.blas_turns import GcTimes, _mark, _summary
    assert _summary([0.3, 0.1, 0.2, 0.5]) == {"best": 0.1, "median": 0.25}
    times = GcTimes()
    try:
        times.mark()
        assert times.take() == 0.0
        junk = [[i] for i in range(200000)]
        gc.collect()
        took = times.take()
        assert took > 0.0 and times.take() == took          # summed since mark(), not reset by take()
        times.mark()
        assert times.take() == 0.0
        del junk
    finally:
        times.close()
    assert times._note not in gc.callbacks
    assert _mark({"seconds": 1.0}) == ""
    assert _mark({"new_layout": True, "beside_build": False, "gc_s": 2e-3}) == "ng"
    assert _mark({"new_layout": False, "beside_build": True, "gc_s": 0.0}) == "b"
    one_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", one_gpu)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["turns", "--sizes", "64"]) == 2
    assert "turns compares two GPUs: this node has 1 that CuPy can use" in capsys.readouterr().err


def test_turns_set_sets_band_constants_first_and_refuses_bad_items(capsys, monkeypatch):
    from hybridblas import band_plan
    monkeypatch.setattr(band_plan, "UNIT_K", band_plan.UNIT_K)          # restored after the test
    one_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", one_gpu)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["turns", "--set", "band_plan.NO_SUCH=1"]) == 2
    assert "--set item must be MODULE.CONSTANT=VALUE" in capsys.readouterr().err
    assert main("blas", blas.__doc__, blas.COMMANDS, ["turns", "--set", "band_plan.UNIT_K=zz"]) == 2
    assert "--set value must be a Python literal, got 'band_plan.UNIT_K=zz'" in capsys.readouterr().err
    assert main("blas", blas.__doc__, blas.COMMANDS, ["turns", "--set", "one-gpu"]) == 2
    assert "--set takes MODULE.CONSTANT=VALUE items only" in capsys.readouterr().err
    assert band_plan.UNIT_K == 1024
    assert main("blas", blas.__doc__, blas.COMMANDS, ["turns", "--set", "band_plan.UNIT_K=0"]) == 2
    assert "turns compares two GPUs" in capsys.readouterr().err
    assert band_plan.UNIT_K == 0                                         # set before the GPUs were looked at


def test_busy_thread_slowdowns_and_its_refusal_without_two_gpus(capsys, monkeypatch):
    from benchmarks.measure.blas_busy_thread import slowdown
    got = slowdown({"quiet": [0.02, 0.03, 0.025], "spin": [0.5, 0.7], "numpy": [0.03, 0.02]})
    assert got["quiet"] == {"best": 0.02, "median": 0.025, "best_ratio": 1.0, "median_ratio": 1.0}
    assert got["spin"]["best_ratio"] == pytest.approx(25.0) and got["spin"]["median_ratio"] == pytest.approx(24.0)
    assert got["numpy"]["median"] == pytest.approx(0.025) and got["numpy"]["best_ratio"] == pytest.approx(1.0)
    one_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", one_gpu)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["busy-thread", "--sizes", "64"]) == 2
    assert "busy-thread compares two GPUs: this node has 1 that CuPy can use" in capsys.readouterr().err


def _refused_on_one_gpu(command, capsys, monkeypatch, tmp_path):
    """``benchmarks.blas command --sizes 64 --json PATH`` on a node where CuPy sees one GPU: exit 2, saying so, and
    no JSON written."""
    one_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", one_gpu)
    out = tmp_path / f"{command}.json"
    assert main("blas", blas.__doc__, blas.COMMANDS, [command, "--sizes", "64", "--json", str(out)]) == 2
    assert f"{command} compares two GPUs: this node has 1 that CuPy can use" in capsys.readouterr().err
    assert not out.exists()


def test_writeback_bound_switches_the_write_back_and_puts_it_back(capsys, monkeypatch, tmp_path):
    """benchmarks.blas writeback-bound: "none" and "contiguous" replace the band path's write-back functions and keep
    the write-back rate out of the calibration; "as-is" and restore() put every one of them back."""
    from contextlib import nullcontext

    from hybridblas import downloads
    from hybridblas.devices import cuda_bands, cuda_tri_store

    from benchmarks.measure import blas_writeback_bound as wbb
    calls = []
    fake = SimpleNamespace(cuda=SimpleNamespace(Device=lambda g: nullcontext(), alloc_pinned_memory=lambda n: None),
                           empty=lambda n, dtype: None)
    monkeypatch.setattr(cuda_bands, "_calibrate", lambda *a, **k: calls.append(a[1]))
    before = (downloads.queue_full, cuda_tri_store.queue_off_diagonal, cuda_tri_store.queue, cuda_bands._calibrate)
    wb = wbb.Writeback(fake, (0, 1))
    for name in ("none", "contiguous"):
        wb.set(name)
        assert downloads.queue_full is not before[0] and cuda_tri_store.queue is not before[2]
        cuda_bands._calibrate("cuda:0", "d2h_pinned", None, 1e9)
        cuda_bands._calibrate("cuda:0", "flops", "gemmt", 5e13)
    wb.set("none")
    assert downloads.queue_full(None, None, None) is None               # nothing queued
    wb.set("as-is")
    assert downloads.queue_full is before[0] and cuda_bands._calibrate is before[3]
    wb.set("none")
    wb.restore()
    assert (downloads.queue_full, cuda_tri_store.queue_off_diagonal, cuda_tri_store.queue,
            cuda_bands._calibrate) == before
    assert calls == ["flops", "flops"]
    row = wbb.gpu_row({"upload_gbps": 48.0, "lead_s": 1e-3, "gaps_s": 2e-3, "tail_s": 3e-3, "kernel_s": 0.02})
    assert row == {"upload_gbps": 48.0, "writeback_gbps": None, "lead_ms": 1.0, "gaps_ms": 2.0, "tail_ms": 3.0,
                   "kernel_ms": 20.0}
    _refused_on_one_gpu("writeback-bound", capsys, monkeypatch, tmp_path)


def test_first_calls_is_refused_without_two_gpus_and_leaves_no_output(capsys, monkeypatch, tmp_path):
    _refused_on_one_gpu("first-calls", capsys, monkeypatch, tmp_path)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["first-calls", "--ahead", "maybe"]) == 2


def test_layout_build_times_each_routines_layout(capsys, tmp_path):
    """benchmarks.blas layout-build needs no GPU: each case's layout made from an empty cache, timed."""
    out = tmp_path / "layout.json"
    assert main("blas", blas.__doc__, blas.COMMANDS, ["layout-build", "--sizes", "512", "--repeats", "2",
                                                       "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert all(f"{r} n = k = 512" in printed for r in ("zherk", "zher2k", "zgemmt"))
    doc = json.loads(out.read_text())
    assert [(r["routine"], len(r["seconds"])) for r in doc["results"]] == [("zherk", 2), ("zher2k", 2), ("zgemmt", 2)]
    assert all(0 < r["best_s"] <= r["median_s"] and r["pieces"] > 0 for r in doc["results"])


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_band_replay_clocks_average_a_window_or_say_none():
    from benchmarks.measure.blas_band_replay import Clocks
    clocks = Clocks(2)
    if clocks.nvml is None:                      # no NVML on this machine: no clocks to report
        assert clocks.mean([(0.0, float("inf"))]) is None
    else:
        t0 = time.perf_counter()
        time.sleep(0.05)
        mhz = clocks.mean([(t0, time.perf_counter())])
        assert len(mhz) == 2 and all(m > 0 for m in mhz)
    clocks.stop.set()


def test_blas_plot_merge_lets_a_later_run_replace_the_same_case(tmp_path):
    from benchmarks.measure import blas_gpu

    def run_doc(command, rows):
        return {"benchmark": "bench_blas_gpu", "date": command, "command": command, "gpus": ["GPU"] * 2,
                "results": [dict(routine="zgemmt", n=n, impl=impl, mode="host" if impl != "cublas" else "device",
                                 gpus=gpus, tflops=t, best_s=1.0) for n, impl, gpus, t in rows]}
    old = run_doc("old", [(8192, "cublas", [0], 50.0), (8192, "hb-static", [0, 1], 70.0),
                          (2048, "hb-static", [0, 1], 3.0)])
    new = run_doc("new", [(8192, "cublas", [0], 52.0), (8192, "hb-static", [0, 1], 75.0)])
    files = []
    for name, doc in (("a.json", old), ("b.json", new)):
        (tmp_path / name).write_text(json.dumps(doc))
        files.append(str(tmp_path / name))
    merged = blas_gpu.merge_and_plot(files, str(tmp_path / "out"))
    got = {(r["n"], r["impl"]): r["tflops"] for r in merged["results"]}
    assert got == {(8192, "cublas"): 52.0, (8192, "hb-static"): 75.0, (2048, "hb-static"): 3.0}
    assert merged["commands"] == ["old", "new"]
    again = blas_gpu.merge_and_plot([str(tmp_path / "out" / "bench_blas_gpu.json")], str(tmp_path / "again"))
    assert again["commands"] == ["old", "new"] and len(again["results"]) == 3


def test_herkx_widths_counts_waves_and_refuses_without_a_gpu(capsys, monkeypatch):
    from benchmarks.measure import blas_herkx_widths as W
    assert W.waves(960, 132) == (120, 1) and W.waves(1024, 132) == (136, 2) and W.waves(2048, 132) == (528, 4)
    no_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=_no_driver)))
    monkeypatch.setitem(sys.modules, "cupy", no_gpu)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["herkx-widths", "--ks", "64"]) == 2
    assert "herkx-widths times a GPU: CuPy sees none" in capsys.readouterr().err
    assert main("blas", blas.__doc__, blas.COMMANDS, ["herkx-widths", "--widths", "512", "256", "64"]) == 2
    assert "--widths LAST must be at least FIRST, got 512 256 64" in capsys.readouterr().err


def test_rect_columns_lays_out_the_corner_order_and_refuses_without_a_gpu(capsys, monkeypatch):
    from benchmarks.measure import blas_rect_columns as R
    rects = R.rectangles(4096)
    assert rects and {g for g, *_ in rects} == {0, 1}
    assert all(i1 > i0 and j1 > j0 and j1 <= i0 for _, i0, i1, j0, j1 in rects)    # below the diagonal
    no_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=_no_driver)))
    monkeypatch.setitem(sys.modules, "cupy", no_gpu)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["rect-columns", "--sizes", "64"]) == 2
    assert "rect-columns times a GPU: CuPy sees none" in capsys.readouterr().err
    assert main("blas", blas.__doc__, blas.COMMANDS, ["rect-columns", "--columns", "0", "-64"]) == 2
    assert "--columns must be 0 or more, got -64" in capsys.readouterr().err


def test_links_refuses_without_a_gpu_a_share_past_one_and_segments_past_a_column(capsys, monkeypatch):
    no_gpu = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=_no_driver)))
    monkeypatch.setitem(sys.modules, "cupy", no_gpu)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["links", "--gib", "0.01"]) == 2
    assert "links times GPUs: CuPy sees none" in capsys.readouterr().err
    assert main("blas", blas.__doc__, blas.COMMANDS, ["links", "--down-share", "1.5"]) == 2
    assert "--down-share must be at most 1, got 1.5" in capsys.readouterr().err
    assert main("blas", blas.__doc__, blas.COMMANDS, ["links", "--segments", "8", "256"]) == 2
    assert "--segments must be at most 128 KiB each, got [8, 256]" in capsys.readouterr().err
    assert main("blas", blas.__doc__, blas.COMMANDS, ["links", "--segments", "0"]) == 2


def _no_driver():
    raise RuntimeError("no CUDA driver")


def test_shared_gpu_shares_and_its_refusal_without_two_gpus(capsys, monkeypatch, tmp_path):
    from benchmarks.measure import blas_shared_gpu
    from hybridblas.devices import cuda
    monkeypatch.setattr(cuda, "last_stats", {
        "cuda:0": {"kernel_s": 0.3, "new_layout": True, "kernels": {"a": {"s": 0.2, "tflops": 50.0},
                                                                    "b": {"s": 0.1, "tflops": 40.0}}},
        "cuda:1": {"kernel_s": 0.28, "new_layout": False, "kernels": {"a": {"s": 0.28, "tflops": 25.0}}}})
    got = blas_shared_gpu.shares(["cuda:0", "cuda:1"])
    assert [round(x[0], 3) for x in got] == [round(14 / 21, 3), round(7 / 21, 3)]
    assert [x[1:] for x in got] == [(0.3, True), (0.28, False)]
    assert blas_shared_gpu.shares(["cuda:5"]) == [(0.0, 0.0, False)]
    _refused_on_one_gpu("shared-gpu", capsys, monkeypatch, tmp_path)
    assert main("blas", blas.__doc__, blas.COMMANDS, ["shared-gpu", "--after", "-1"]) == 2
    assert "--after: must be an integer >= 0, got '-1'" in capsys.readouterr().err


def test_host_profile_times_what_it_wraps_and_puts_it_back(capsys, monkeypatch, tmp_path):
    """benchmarks.blas host-profile's wrappers: runs, wall and CPU seconds per label while on, nothing while off,
    the originals back after restore; the table per call, longest wall first; refused without two GPUs."""
    import time as time_mod

    from benchmarks.measure.blas_host_profile import TARGETS, Profile, table

    class Owner:
        def work(self, x):
            time_mod.sleep(0.002)
            return x + 1

    module = SimpleNamespace(helper=lambda x: 2 * x)
    real_work, real_helper = Owner.__dict__["work"], module.helper
    prof = Profile([(Owner, "work", "Owner.work"), (module, "helper", "helper")])
    assert Owner().work(1) == 2 and module.helper(3) == 6 and not prof.totals      # off: nothing counted
    prof.on = True
    for _ in range(4):
        assert Owner().work(1) == 2
    assert module.helper(5) == 10
    prof.on = False
    runs, wall, cpu = prof.totals["Owner.work"]
    assert runs == 4 and wall >= 0.008 and 0 <= cpu < wall
    assert prof.totals["helper"][0] == 1
    rows = table(prof.totals, 2)
    assert [r[0] for r in rows] == ["Owner.work", "helper"] and rows[0][1] == 2.0
    assert rows[0][2] == pytest.approx(wall / 2 * 1e3) and rows[0][4] == pytest.approx(wall / 4 * 1e6)
    prof.restore()
    assert Owner.__dict__["work"] is real_work and module.helper is real_helper
    assert all(name in owner.__dict__ for owner, name, _ in TARGETS)       # every target exists
    _refused_on_one_gpu("host-profile", capsys, monkeypatch, tmp_path)
