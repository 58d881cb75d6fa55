"""hybridblas-tune refuses bad input before any measurement: exit code 2, one line naming the option and
its value, no file written, no traceback."""
import contextlib
import logging
import os
import subprocess
import sys

import pytest

from hybridblas import console
from hybridblas.profile.node import profile_filename
from hybridblas.profile.search import ENV_DIR
from hybridblas.tuning import cli

LOGGERS = ("hybridblas", cli.PROG, "py.warnings")


@contextlib.contextmanager
def _logging_kept():
    """The CLI configures logging for its process; in this one, put it back as it was."""
    saved = {name: (lg.handlers[:], lg.level, lg.propagate) for name, lg in
             ((name, logging.getLogger(name)) for name in LOGGERS)}
    try:
        yield
    finally:
        for name, (handlers, level, propagate) in saved.items():
            lg = logging.getLogger(name)
            lg.handlers[:], lg.propagate = handlers, propagate
            lg.setLevel(level)
        logging.captureWarnings(False)


def run_tune(argv, capsys):
    """cli.main(argv) in this process: (exit code, stdout, stderr); argparse's exit counts as a return."""
    capsys.readouterr()
    with _logging_kept():
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def no_work(monkeypatch, profile_dir):
    """A calibration that reaches the measurement fails the test: every refusal comes before it."""
    def measured(*args, **kwargs):
        raise AssertionError("calibrate_to was reached")
    monkeypatch.setattr(cli, "calibrate_to", measured)
    return profile_dir


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _refused(code, err, *words):
    """Exit code 2 and one error line holding ``words``; besides it at most argparse's usage lines."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith(f"{cli.PROG}") and "error:" in line]
    assert len(errors) == 1, err
    assert all(line in errors or line.startswith(("usage:", " ")) for line in lines), err
    for word in words:
        assert word in errors[0], (word, err)


BAD_ARGUMENTS = {   # name: (arguments after 'calibrate', words the message must hold)
    "size zero": (["--sizes", "0"], ["--sizes", "'0'"]),
    "size negative": (["--sizes", "64", "-64"], ["--sizes", "'-64'"]),
    "size fractional": (["--sizes", "1.5"], ["--sizes", "'1.5'"]),
    "size as text": (["--sizes", "big"], ["--sizes", "'big'"]),
    "size beyond memory": (["--sizes", "64", "10000000"], ["--sizes 10000000", "memory"]),
    "unknown device": (["--devices", "tpu:0"], ["--devices", "tpu:0"]),
    "absent GPU": (["--devices", "cuda:99"], ["--devices", "cuda:99"]),
    "device twice": (["--devices", "cpu", "cpu"], ["--devices", "'cpu' is named twice"]),
    "unknown routine": (["--routines", "trsm"], ["--routines", "'trsm'"]),
    "unknown dtype": (["--dtypes", "float16"], ["--dtypes", "'float16'"]),
    "nothing to measure": (["--routines", "herk", "--dtypes", "float64"], ["--routines herk", "--dtypes float64"]),
    "unknown option": (["--fast"], ["--fast"]),
}


@pytest.mark.parametrize("name", BAD_ARGUMENTS)
def test_calibrate_refuses_bad_arguments(no_work, capsys, name):
    args, words = BAD_ARGUMENTS[name]
    code, out, err = run_tune(["calibrate", "--sizes", "32", *args] if "--sizes" not in args
                              else ["calibrate", *args], capsys)
    _refused(code, err, *words)
    assert out == "" and _files(no_work) == []


def test_output_into_a_missing_folder(no_work, capsys):
    target = no_work / "not-there" / "profiles"
    code, out, err = run_tune(["calibrate", "--sizes", "32", "--output", str(target)], capsys)
    _refused(code, err, "--output", str(target), "does not exist")
    assert _files(no_work) == []


def test_output_onto_a_file(no_work, capsys):
    target = no_work / "a-file"
    target.write_text("keep me\n")
    code, out, err = run_tune(["calibrate", "--sizes", "32", "--output", str(target)], capsys)
    _refused(code, err, "--output", str(target), "is a file")
    assert _files(no_work) == ["a-file"] and target.read_text() == "keep me\n"


def test_output_onto_a_folder_in_the_profiles_place(no_work, capsys):
    (no_work / "out" / profile_filename()).mkdir(parents=True)
    code, out, err = run_tune(["calibrate", "--sizes", "32", "--output", str(no_work / "out")], capsys)
    _refused(code, err, "--output", str(no_work / "out" / profile_filename()), "is a folder")
    assert _files(no_work) == ["out", f"out/{profile_filename()}"]


def test_output_into_a_read_only_folder(no_work, capsys, monkeypatch):
    target = no_work / "read-only"
    target.mkdir()
    target.chmod(0o555)
    if os.geteuid() == 0:           # root may write anywhere: report the folder as an ordinary user sees it
        real = os.access
        monkeypatch.setattr(console.os, "access",
                            lambda path, mode: False if str(path).startswith(str(target)) else real(path, mode))
    try:
        code, out, err = run_tune(["calibrate", "--sizes", "32", "--output", str(target)], capsys)
    finally:
        target.chmod(0o755)
    _refused(code, err, "--output", str(target), "cannot be written")
    assert _files(no_work) == ["read-only"]


def test_default_folder_that_cannot_be_made(no_work, capsys, monkeypatch):
    blocker = no_work / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(ENV_DIR, str(blocker / "profiles"))
    code, out, err = run_tune(["calibrate", "--sizes", "32"], capsys)
    _refused(code, err, str(blocker / "profiles"), "--output DIR")
    assert _files(no_work) == ["a-file"]


@pytest.mark.parametrize("case", ["missing", "corrupt", "folder"])
def test_show_refuses_a_bad_file(profile_dir, capsys, case):
    path = profile_dir / "given.yaml"
    if case == "corrupt":
        path.write_bytes(b"format: \xff\n")
    elif case == "folder":
        path.mkdir()
    code, out, err = run_tune(["show", "--file", str(path)], capsys)
    _refused(code, err, "--file", str(path), {"missing": "cannot read", "corrupt": "not UTF-8",
                                              "folder": "cannot read"}[case])
    assert out == ""


@pytest.mark.parametrize("case", ["empty name", "NUL byte"])
def test_show_refuses_an_empty_name_and_says_yaml_errors_in_one_line(profile_dir, capsys, case):
    path = profile_dir / "given.yaml"
    path.write_bytes(b"format: 1\n\x00bad")
    name = "" if case == "empty name" else str(path)
    code, out, err = run_tune(["show", "--file", name], capsys)
    _refused(code, err, "--file", repr(name), "give a file name" if case == "empty name" else "not valid YAML")
    assert len(err.strip().splitlines()) == 1 and out == ""


def test_calibrate_refuses_an_empty_output_folder(no_work, capsys):
    code, out, err = run_tune(["calibrate", "--sizes", "32", "--output", ""], capsys)
    _refused(code, err, "--output", "''", "give the folder")
    assert _files(no_work) == []


def test_show_plot_needs_a_figure_suffix_and_rates(profile_dir, capsys, monkeypatch):
    code, out, err = run_tune(["show", "--plot", str(profile_dir / "rates.txt")], capsys)
    _refused(code, err, "--plot", "must end in .png")

    class Empty:
        def to_dict(self):
            return {"devices": {"cpu": {"kind": "cpu"}}}
    from hybridblas.tuning.plot import plot_rates
    with pytest.raises(ValueError, match="the profile holds no rates to plot"):
        plot_rates(Empty(), str(profile_dir / "rates.png"))
    assert not (profile_dir / "rates.png").exists() and not (profile_dir / "rates.txt").exists()


@pytest.mark.parametrize("case", ["missing folder", "a folder"])
def test_show_refuses_a_bad_plot_path(profile_dir, capsys, case):
    target = profile_dir / ("nowhere/rates.png" if case == "missing folder" else "plots")
    if case == "a folder":
        target.mkdir()
    code, out, err = run_tune(["show", "--plot", str(target)], capsys)
    _refused(code, err, "--plot", str(target))
    assert _files(profile_dir) == ([] if case == "missing folder" else ["plots"])


@pytest.mark.parametrize("args, words", [
    (["calibrate", "--sizes", "0"], ["--sizes", "'0'"]),
    (["calibrate", "--sizes", "32", "--output", "/nonexistent-folder/profiles"], ["--output", "/nonexistent-folder"]),
])
def test_the_module_entry_point_refuses_in_one_line(profile_dir, args, words):
    out = subprocess.run([sys.executable, "-m", "hybridblas.tuning", *args], capture_output=True, text=True,
                         timeout=120)
    _refused(out.returncode, out.stderr, *words)
    assert out.stdout == "" and _files(profile_dir) == []
