"""`flapw build` with bad input: exit 2, a one-line message naming the option and its value, no traceback,
nothing written, and no build started. Also: --quiet prints the results only, progress never reaches a log file,
and the memory check shrinks the batch or refuses before any work."""
import json
import sys

import pytest

import flapw
import hybridblas as hb
from flapw import cli
from flapw.hsdla import build_bytes

SMALL = ["--system", "NaCl", "--supercell", "1", "1", "1", "--kmax", "1.8"]

# (extra arguments, what the message must contain: the option and the value)
BAD = [
    (["--kpoints", "0"], ["--kpoints", "'0'"]),
    (["--kpoints", "-3"], ["--kpoints", "'-3'"]),
    (["--kpoints", "two"], ["--kpoints", "'two'"]),
    (["--kmax", "0"], ["--kmax", "'0'"]),
    (["--kmax", "-2.5"], ["--kmax", "'-2.5'"]),
    (["--kmax", "nan"], ["--kmax", "'nan'"]),
    (["--kmax", "inf"], ["--kmax", "'inf'"]),
    (["--kmax", "0.2"], ["--kmax 0.2", "N_G = 0"]),
    (["--solve", "-1"], ["--solve", "'-1'"]),
    (["--solve", "100000"], ["--solve 100000", "N_G = "]),
    (["--kmax", "4.0", "--solve", "3"], ["--solve 3", "--interstitial"]),
    (["--batch-atoms", "0"], ["--batch-atoms", "'0'"]),
    (["--batch-atoms", "1.5"], ["--batch-atoms", "'1.5'"]),
    (["--max-temp-gib", "0"], ["--max-temp-gib", "'0'"]),
    (["--max-temp-gib", "-1"], ["--max-temp-gib", "'-1'"]),
    (["--max-temp-gib", "nan"], ["--max-temp-gib", "'nan'"]),
    (["--max-temp-gib", "1e-9"], ["--max-temp-gib 1e-09", "one atom"]),
    (["--supercell", "1", "0", "1"], ["--supercell", "'0'"]),
    (["--v0", "nan"], ["--v0", "'nan'"]),
    (["--k", "0.1", "nan", "0.2"], ["--k", "'nan'"]),
    (["--devices", "bogus"], ["--devices", "'bogus'"]),
    (["--devices", "cpu,cpu"], ["--devices", "'cpu,cpu'"]),
    (["--devices", "cuda:99"], ["--devices", "'cuda:99'"]),
    (["--devices", ""], ["--devices", "''"]),
    (["--blas", "cublasxt"], ["--blas cublasxt", "'cpu'"]),
    (["--arrays", "device"], ["--arrays device", "'cpu'"]),
    (["--method", "fast"], ["--method", "'fast'"]),
    (["--system", "GaAs"], ["--system", "'GaAs'"]),
    (["--k", "500", "0", "0"], ["k must be three finite fractional coordinates in [-100, 100]", "(500.0, 0.0, 0.0)"]),
    (["--v0", "1e5"], ["v0 must be a finite number of Ha in [-100, 100]", "100000.0"]),
    (["--kpoints", "99999999999999999999"], ["--kpoints must be at most 100000", "99999999999999999999"]),
    (["--supercell", "99999999999999999999", "1", "1"], ["supercell must hold at most 1000 cells"]),
    (["--supercell", "1000000", "1", "1"], ["supercell must hold at most 1000 cells", "1000000"]),
    (["--structure", ""], ["structure file '' does not exist"]),
]


def _run(capsys, args):
    rc = cli.main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def no_build(monkeypatch):
    """Any start of a build fails the test: the checks must come first."""
    def refuse(*a, **k):
        raise AssertionError("a build started")
    monkeypatch.setattr(cli, "build_hs_with_fallback", refuse)


@pytest.mark.parametrize("extra, words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_option(tmp_path, capsys, no_build, extra, words):
    out_file = tmp_path / "hs.npz"
    rc, out, err = _run(capsys, ["build", *SMALL, "--output", str(out_file), *extra])
    assert rc == 2, err
    assert "Traceback" not in err and out == ""
    for w in words:
        assert w in err, (w, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["missing/hs.npz", "folder", "hs.txt", "notdir/hs.npz"])
def test_bad_output_path(tmp_path, capsys, no_build, where):
    (tmp_path / "folder").mkdir()
    (tmp_path / "notdir").write_text("a file where a folder should be")
    before = sorted(p.name for p in tmp_path.iterdir())
    target = str(tmp_path / where)
    rc, out, err = _run(capsys, ["build", *SMALL, "--output", target])
    assert rc == 2 and "Traceback" not in err
    assert "--output" in err and repr(target) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_hdf5_output_without_h5py(tmp_path, capsys, no_build, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)
    rc, _, err = _run(capsys, ["build", *SMALL, "--output", str(tmp_path / "hs.h5")])
    assert rc == 2 and 'pip install "hybridblas[hdf5]"' in err and "--output" in err
    assert list(tmp_path.iterdir()) == []


def test_gpu_devices_without_cupy_names_the_extra(capsys, no_build, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)                    # CuPy not installed
    for devices in ("cuda:0", "gpu", "0,1", "cpu,cuda:1"):
        rc, _, err = _run(capsys, ["build", *SMALL, "--devices", devices])
        assert rc == 2 and "Traceback" not in err
        assert f"--devices={devices!r}" in err and "pip install" in err


def test_mpi_accepts_only_every_device_words(monkeypatch):
    from flapw import parallel
    monkeypatch.setattr(hb, "parse_devices", lambda spec, name: hb.DeviceSpec(cpu=False, gpus=(0,)))
    with pytest.raises(ValueError, match=r"under MPI --devices must be all, gpu or cpu.*'cuda:0'"):
        parallel.check_devices("cuda:0", comm=object())
    assert parallel.check_devices("gpu", comm=object()).gpus == (0,)


def test_memory_refusal_before_any_work(tmp_path, capsys, no_build, monkeypatch):
    monkeypatch.setattr(hb.memory, "host_available", lambda: 1 << 20)      # 1 MiB free
    rc, out, err = _run(capsys, ["build", *SMALL, "--output", str(tmp_path / "hs.npz")])
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "--kmax 1.8" in err and "needs about" in err and "available host memory" in err
    assert "--max-temp-gib" in err and "MPI ranks" in err
    assert list(tmp_path.iterdir()) == []


def test_memory_check_shrinks_the_batch(capsys, monkeypatch):
    """Host memory that holds two atoms' buffers but not eight: the build runs with 2 atoms per batch."""
    cell = flapw.System.preset("NaCl", kmax=1.8, supercell=(1, 1, 1))
    room = build_bytes(cell, "refined", 2) + 1000
    monkeypatch.setattr(hb.memory, "host_available", lambda: room / 0.9)
    rc, out, err = _run(capsys, ["build", *SMALL, "--json"])
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["batch_atoms"] == 2 and doc["reports"][0]["batch_atoms"] == 2
    assert "host memory: 2 atoms per batch instead of 8" in err
    assert doc["reports"][0]["N_G"] == cell.n_g


def test_quiet_prints_the_results_only_and_json_only_json(capsys):
    """-q: one result line per k-point (and the eigenvalues with --solve), no notes, tables or progress."""
    rc, out, err = _run(capsys, ["build", *SMALL, "--quiet", "--batch-atoms", "3", "--kpoints", "2", "--solve", "2"])
    lines = out.splitlines()
    assert rc == 0 and err == "" and len(lines) == 4
    assert lines[0].startswith("k-point 1: N_G=") and "TFLOP/s" in lines[0] and lines[2].startswith("k-point 2: ")
    assert "lowest eigenvalues (Ha): " in lines[1] and len(lines[1].split(": ")[-1].split()) == 2
    rc, out, err = _run(capsys, ["build", *SMALL, "-q", "--json"])
    assert rc == 0 and err == "" and json.loads(out)["reports"][0]["N_A"] == 8


def test_notes_without_progress_lines(capsys):
    """Not a terminal (captured): notes through logging, no per-batch progress lines."""
    rc, out, err = _run(capsys, ["build", *SMALL, "--batch-atoms", "3"])
    assert rc == 0 and "refined HSDLA build" in out
    assert "flapw: NaCl: N_A=8" in err and "3 atoms per batch" in err
    assert "batch 1/3" not in err and "\r" not in err


def test_version_and_unexpected_errors(capsys, monkeypatch):
    assert cli.main(["--version"]) == 0
    assert hb.__version__ in capsys.readouterr().out
    monkeypatch.setattr(cli, "build_hs_with_fallback",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a fault deep inside")))
    rc, _, err = _run(capsys, ["build", *SMALL])
    assert rc == 1 and "RuntimeError: a fault deep inside" in err and "Traceback" not in err


def test_an_argparse_refusal_is_one_line_and_negative_numbers_in_e_notation_are_values(capsys):
    rc, out, err = _run(capsys, ["build", *SMALL, "--kmax", "nan"])
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == ["flapw build: error: argument --kmax: must be a finite number > 0, got 'nan' "
                                        "(--help lists the options)"]
    rc, out, err = _run(capsys, ["build", *SMALL, "--v0", "-1e-3", "--k", "0", "0", "-2.5e-1", "-q", "--json"])
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["reports"][0]["k"] == [0.0, 0.0, -0.25]


def test_both_batch_bounds_take_the_tighter_one(capsys):
    rc, out, err = _run(capsys, ["build", *SMALL, "--batch-atoms", "8", "--max-temp-gib", "0.0005", "--json", "-q"])
    assert rc == 0, err
    alone = json.loads(out)["batch_atoms"]
    rc, out, err = _run(capsys, ["build", *SMALL, "--max-temp-gib", "0.0005", "--json", "-q"])
    assert json.loads(out)["batch_atoms"] == alone < 8
    rc, out, err = _run(capsys, ["build", *SMALL, "--max-temp-gib", "1e300", "--json", "-q"])
    assert rc == 0 and json.loads(out)["batch_atoms"] == 8
