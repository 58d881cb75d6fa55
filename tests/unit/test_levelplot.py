"""cisolver.levelplot: J^π labels, label spreading, reading spectrum JSON, figures in PNG/PDF/SVG, the plot command."""
import json
import sys

import numpy as np
import pytest

from cisolver import levelplot
from cisolver.cli import main


def _result(energies, js, parities=None, name="20Ne"):
    out = {"interaction": "/some/where/usdb.snt", "mass": 20, "protons": 2, "neutrons": 2,
           "energies": energies, "j": js}
    if parities is not None:
        out["observables"] = {"parity": parities, "nucleus": {"name": name}}
    return out


def test_jpi_labels():
    assert levelplot.jpi_label(2.0, 1) == "2+"
    assert levelplot.jpi_label(1.5, -1) == "3/2-"
    assert levelplot.jpi_label(0.0, None) == "0"
    assert levelplot.jpi_label(4.0, 0) == "4"
    assert levelplot.jpi_label(None, 1) == "?"


def test_spread_keeps_order_and_gap_and_moves_only_crowded_labels(rng):
    for _ in range(50):
        pos = np.sort(rng.uniform(0, 3, size=rng.integers(1, 25)))
        gap = rng.uniform(0.05, 0.3)
        out = np.array(levelplot.spread(list(pos), gap))
        assert len(out) == len(pos)
        assert np.all(np.diff(out) >= gap - 1e-9)
        assert abs(out.mean() - pos.mean()) < 1e-9        # every group is centred on its levels
    apart = [0.0, 1.0, 2.5]
    assert levelplot.spread(apart, 0.1) == apart
    crowd = levelplot.spread([1.0, 1.0, 1.0], 0.2)
    assert crowd == pytest.approx([0.8, 1.0, 1.2])
    assert levelplot.spread([], 0.1) == []


def test_levels_are_relative_to_the_lowest_state():
    res = _result([-38.7, -40.5, -36.3], [2.0, 0.0, 4.0], [1, 1, 1])
    assert levelplot.levels(res) == [(0.0, "0+"), (pytest.approx(1.8), "2+"), (pytest.approx(4.2), "4+")]
    assert [l for _, l in levelplot.levels(res, max_energy=2.0)] == ["0+", "2+"]
    assert levelplot.column_title(res) == "20Ne\nusdb"
    assert levelplot.column_title(_result([0.0], [0.0])) == "A=20 (Z_v=2, N_v=2)\nusdb"


def test_load_results_checks_its_input(tmp_path):
    good = tmp_path / "a.json"
    good.write_text(json.dumps(_result([-1.0, 0.5], [0.0, 2.0])))
    many = tmp_path / "b.json"
    many.write_text(json.dumps([_result([-1.0], [0.0]), _result([-2.0], [0.5])]))
    assert len(levelplot.load_results([good, many])) == 3
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not a JSON file"):
        levelplot.load_results([bad])
    bad.write_text(json.dumps({"energies": []}))
    with pytest.raises(ValueError, match="non-empty list 'energies'"):
        levelplot.load_results([bad])
    with pytest.raises(FileNotFoundError, match="none.json"):
        levelplot.load_results([tmp_path / "none.json"])


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".pdf", b"%PDF"), (".svg", b"<?xml")])
def test_figure_files(tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    results = [_result([-40.47, -38.73, -36.30, -33.77, -33.70], [0, 2, 4, 0, 2], [1, 1, 1, 1, 1]),
               _result([-87.1, -85.6, -83.0], [0, 2, 2], [1, 1, 1], name="24Mg")]
    out = levelplot.plot_level_scheme(results, tmp_path / f"levels{suffix}", max_energy=8.0, title="USDB")
    data = out.read_bytes()
    assert data.startswith(magic) and len(data) > 1000
    with pytest.raises(ValueError, match="output must end in one of"):
        levelplot.plot_level_scheme(results, tmp_path / "levels.jpg")
    with pytest.raises(ValueError, match="max_energy must be a positive number"):
        levelplot.plot_level_scheme(results, tmp_path / "levels.png", max_energy=0.0)


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError, match=r'pip install "hybridblas\[plot\]"'):
        levelplot.plot_level_scheme([_result([0.0], [0.0])], tmp_path / "x.png")
    src = tmp_path / "a.json"
    src.write_text(json.dumps(_result([0.0], [0.0])))
    assert main(["plot", str(src), "-o", str(tmp_path / "x.png")]) == 2
    assert not (tmp_path / "x.png").exists()


def test_plot_command(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    src = tmp_path / "a.json"
    src.write_text(json.dumps(_result([-40.47, -38.73], [0, 2], [1, 1])))
    assert main(["plot", str(src), str(src), "-o", str(tmp_path / "two.png"), "--max-energy", "5"]) == 0
    assert (tmp_path / "two.png").read_bytes().startswith(b"\x89PNG")
    assert main(["plot", str(src), "-o", str(tmp_path / "missing" / "x.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["plot", str(src), "-o", str(tmp_path / "x.gif")]) == 2
    assert main(["plot", str(tmp_path / "none.json"), "-o", str(tmp_path / "x.png")]) == 2


@pytest.mark.parametrize("text,match", [
    ("[]", "no result in it"),
    ('{"energies": [1, 2, 3], "j": [0]}', r"'j' must be a list of 3 values, one per energy, got \[0\]"),
    ('{"energies": [1, 2], "observables": [1]}', "'observables' must be an object, got list"),
    ('{"energies": [1, NaN]}', "'energies' of finite numbers"),
    ('{"energies": [1, 2], "observables": {"parity": [1]}}', "'observables.parity' must be a list of 2 values"),
])
def test_a_file_that_is_no_spectrum_is_refused(tmp_path, text, match):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        levelplot.load_results([path])
