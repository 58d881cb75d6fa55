"""``cisolver spectrum`` with bad input: exit code 2 and one line on stderr naming the option and its value, no
traceback, nothing built (a stand-in for the Hamiltonian fails the test if reached), no output file written.
Also: --json and the table share exit codes (1 when LOBPCG did not converge), --output writes JSON or CSV, a run
too big for the memory is refused in seconds, and notes and progress stay off pipes and log files."""
import csv
import json
import time

import numpy as np
import pytest

import hybridblas as hb
from cisolver import spectrum
from cisolver.cli import main
from ci_data import needs_data

NE20 = ["spectrum", "--interaction", "usdb", "--protons", "2", "--neutrons", "2"]     # dimension 640
NE20_ENERGIES = [-40.472331, -38.725641, -36.297059, -33.774153, -32.929372]        # data README, KSHELL


@pytest.fixture
def nothing_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("ShellModelProblem was reached")
    monkeypatch.setattr(spectrum.hamiltonian, "ShellModelProblem", refuse)


def _refused(capsys, argv, *fragments):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for f in fragments:
        assert f in err, (f, err)
    return err


BAD = [
    (["--nev", "0"], "argument --nev: must be an integer >= 1, got '0'"),
    (["--nev", "641"], "--nev must be at most the M-scheme dimension 640 of Z=2 N=2 2M=0"),
    (["--nev", "two"], "argument --nev: must be an integer >= 1, got 'two'"),
    (["--maxiter", "-5"], "argument --maxiter: must be an integer >= 0, got '-5'"),
    (["--block-size", "0"], "argument --block-size: must be an integer >= 1, got '0'"),
    (["--block-size", "3"], "--block-size must be an integer >= 5 (at least --nev = 5), got 3"),
    (["--nev", "6", "--block-size", "5"], "--block-size must be an integer >= 6 (at least --nev = 6), got 5"),
    (["--threads", "0"], "argument --threads: must be an integer >= 1, got '0'"),
    (["--threads", "-1"], "argument --threads: must be an integer >= 1, got '-1'"),
    (["--tol", "0"], "argument --tol: must be a finite number > 0, got '0'"),
    (["--tol=-1e-8"], "argument --tol: must be a finite number > 0, got '-1e-8'"),
    (["--tol", "nan"], "argument --tol: must be a finite number > 0, got 'nan'"),
    (["--tol", "inf"], "argument --tol: must be a finite number > 0, got 'inf'"),
    (["--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
    (["--twice-m", "1"], "--twice-m must be even for 4 valence nucleons (2M has the parity of A), got 1"),
    (["--twice-m", "18"], "--twice-m must be an integer in -16..16"),
    (["--twice-m", "-20"], "got -20"),
    (["--devices", "tpu"], "--devices: unknown device 'tpu' in 'tpu'"),
    (["--devices", "0,0"], "--devices: GPU 0 is named twice in '0,0'"),
    (["--devices", ""], "--devices must name at least one device"),
    (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    (["--storage", "lower"], "argument --storage: invalid choice: 'lower'"),
    (["--layout", "cols"], "argument --layout: invalid choice: 'cols'"),
]


@needs_data
@pytest.mark.parametrize("extra,message", BAD, ids=[" ".join(e) for e, _ in BAD])
def test_bad_option(capsys, nothing_built, extra, message):
    _refused(capsys, NE20 + extra, message)


@needs_data
@pytest.mark.parametrize("who,value,limit", [("--protons", "13", 12), ("--protons", "-1", None),
                                             ("--neutrons", "13", 12), ("--neutrons", "-2", None)])
def test_bad_particle_numbers(capsys, nothing_built, who, value, limit):
    argv = ["spectrum", "--interaction", "usdb", "--protons", "2", "--neutrons", "2"]
    argv[argv.index(who) + 1] = value
    if limit is None:
        _refused(capsys, argv, f"argument {who}: must be an integer >= 0, got '{value}'")
    else:
        _refused(capsys, argv, f"{who} must be an integer in 0..{limit}", f"got {value}")


@needs_data
@pytest.mark.skipif(hb.gpu_count() > 0, reason="checks the message on a node without usable GPUs")
@pytest.mark.parametrize("devices", ["0", "cuda:0", "cuda:0,cuda:1", "gpu"], ids=lambda d: f"devices={d}")
def test_gpus_asked_for_where_there_are_none(capsys, nothing_built, devices):
    err = _refused(capsys, NE20 + ["--devices", devices], f"--devices={devices!r} asks for CUDA GPUs, but")
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert 'pip install "hybridblas[cuda13]"' in err


def test_missing_interaction(capsys, nothing_built):
    _refused(capsys, ["spectrum", "--interaction", "no-such.snt", "--protons", "1", "--neutrons", "1"],
             "interaction 'no-such.snt' not found")


@needs_data
def test_bad_output_path_refused_and_nothing_written(capsys, tmp_path, nothing_built):
    _refused(capsys, NE20 + ["--output", str(tmp_path / "missing" / "out.json")], "--output", "does not exist")
    _refused(capsys, NE20 + ["--output", str(tmp_path)], "is a folder")
    _refused(capsys, NE20 + ["--output", str(tmp_path / "out.txt")], "must end in .json or .csv, got '.txt'")
    # an output refused for another option's sake is not created either
    _refused(capsys, NE20 + ["--nev", "641", "--output", str(tmp_path / "out.json")], "--nev")
    assert list(tmp_path.iterdir()) == []


@needs_data
def test_56ni_refused_in_seconds(capsys, monkeypatch, nothing_built):
    """gxpf1a, 8 protons and 8 neutrons (dimension 1.09e9): once 53 s and then a 239 GiB allocation."""
    monkeypatch.setattr(hb.memory, "host_available", lambda: 8 << 30)
    t0 = time.perf_counter()
    err = _refused(capsys, ["spectrum", "--interaction", "gxpf1a", "--protons", "8", "--neutrons", "8"],
                   "M-scheme dimension 1087455228", "needs about", "more than the 7.2 GiB of available host memory",
                   "--dtype float32", "MPI ranks")
    assert time.perf_counter() - t0 < 5.0
    assert err.count("\n") == 1


@needs_data
def test_not_converged_is_exit_1_in_both_modes(capsys):
    argv = NE20 + ["--maxiter", "2", "-q"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "converged: False" in captured.out and "did not converge" in captured.err
    assert main(argv + ["--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["converged"] is False and out["iterations"] == 2


@needs_data
def test_output_json_and_csv(capsys, tmp_path):
    j, c = tmp_path / "ne20.json", tmp_path / "ne20.csv"
    assert main(NE20 + ["--json", "--output", str(j)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(j.read_text())
    assert written == printed and "eigenvectors" not in written
    np.testing.assert_allclose(written["energies"], NE20_ENERGIES, atol=2e-5, rtol=0)
    assert main(NE20 + ["-q", "--output", str(c)]) == 0
    assert capsys.readouterr().err == ""
    with open(c, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["index", "energy", "J", "J2", "residual"]
    assert [int(r[0]) for r in rows[1:]] == [1, 2, 3, 4, 5]
    table = np.array([[float(x) for x in r[1:]] for r in rows[1:]])
    np.testing.assert_allclose(table[:, 0], NE20_ENERGIES, atol=2e-5, rtol=0)
    assert list(table[:, 1]) == [0, 2, 4, 0, 2]
    np.testing.assert_allclose(table[:, 2], table[:, 1] * (table[:, 1] + 1), atol=1e-6)
    assert (table[:, 3] < 1e-8).all()


@needs_data
def test_notes_on_stderr_and_no_carriage_returns(capsys):
    """Without -q a note gives the dimension and the memory estimate; the build's progress bar never writes
    into a pipe (capsys is not a terminal)."""
    assert main(NE20 + ["--nev", "2"]) == 0
    captured = capsys.readouterr()
    assert "cisolver: M-scheme dimension 640: H with about" in captured.err
    assert "\r" not in captured.err and "\r" not in captured.out


def test_version_and_unexpected_errors(capsys, monkeypatch):
    assert main(["--version"]) == 0
    assert hb.__version__ in capsys.readouterr().out

    def broken(*args, **kwargs):
        raise RuntimeError("a fault")
    monkeypatch.setattr(spectrum, "prepare", broken)
    assert main(["spectrum", "--interaction", "usdb", "--protons", "1", "--neutrons", "1"]) == 1
    err = capsys.readouterr().err
    assert "cisolver: error: RuntimeError: a fault (run with -v for the traceback)" in err and "Traceback" not in err
