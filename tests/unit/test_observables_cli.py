"""Observables through compute_spectrum and the cisolver command: options checked before any work, the text
table, the JSON, and the JSON drawn by 'cisolver plot'."""
import importlib.util
import json

import numpy as np
import pytest

from cisolver import compute_spectrum
from cisolver.cli import main
from cisolver.observables import TransitionOptions, compute_observables
from cisolver.shellmodel import hamiltonian, snt
from ci_data import DATA, needs_data



@needs_data
def test_compute_spectrum_returns_the_observables_of_its_states():
    out = compute_spectrum("usdb", 2, 2, nev=4, tol=1e-10, eff_charge=(1.4, 0.6), b=1.8)
    obs = out["observables"]
    prob = hamiltonian.ShellModelProblem(snt.read_snt(DATA / "usdb.snt"), 2, 2)
    w, v = np.linalg.eigh(prob.build()[0].toarray())
    ref = compute_observables(prob, v[:, :4], TransitionOptions(eff_charge=(1.4, 0.6), b=1.8))
    for name in ("e2", "m1"):
        np.testing.assert_allclose(np.array(obs[name]["b"], float), np.array(ref[name]["b"], float),
                                   rtol=1e-6, atol=1e-9)
    assert obs["parity"] == [1, 1, 1, 1] and obs["t"] == [0.0, 0.0, 0.0, 0.0]
    assert obs["nucleus"]["name"] == "20Ne"
    assert obs["options"]["b_fm"] == 1.8 and obs["options"]["eff_charge"] == [1.4, 0.6]
    assert "observables" in out["seconds"]
    assert "observables" not in compute_spectrum("usdb", 2, 2, nev=2, observables=False)


def test_bad_observable_options_are_refused_before_any_work():
    """The interaction named does not exist: the options are checked first."""
    for kwargs, match in [({"eff_charge": (1.5,)}, "eff_charge must be a pair"),
                          ({"b": 0.0}, "b must be a positive number"),
                          ({"b": 1.8, "hbar_omega": 12.0}, "not both"),
                          ({"gs": ("x", 1)}, "gs must be a pair")]:
        with pytest.raises(ValueError, match=match):
            compute_spectrum("no-such-interaction", 2, 2, **kwargs)


@needs_data
def test_cli_text_shows_labels_occupations_and_transitions(capsys):
    assert main(["spectrum", "--interaction", "usdb", "--protons", "2", "--neutrons", "2", "--nev", "4"]) == 0
    text = capsys.readouterr().out
    assert "e_p 1.5 e_n 0.5  g_l 1 0  g_s 5.586 -3.826  b 1.7735 fm" in text
    header = next(line for line in text.splitlines() if "J^pi" in line)
    assert "p0d5/2" in header and "n1s1/2" in header
    rows = [line.split() for line in text.splitlines() if "->" in line]
    first = next(r for r in rows if r[:3] == ["2", "->", "1"])
    assert first[3:6] == ["2+", "->", "0+"] and 50 < float(first[7]) < 80 and first[8] == "-"


@needs_data
@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed (the plot extra)")
def test_cli_json_and_plot(tmp_path, capsys):
    assert main(["spectrum", "--interaction", "usdb", "--protons", "2", "--neutrons", "3", "--nev", "3", "--json",
                 "--eff-charge", "1.3", "0.7", "--gs", "4.19", "-2.87", "--hbar-omega", "14"]) == 0
    out = json.loads(capsys.readouterr().out)
    obs = out["observables"]
    assert obs["options"]["eff_charge"] == [1.3, 0.7] and obs["options"]["gs"] == [4.19, -2.87]
    assert obs["options"]["hbar_omega_mev"] == 14
    assert obs["t"] == [0.5, 0.5, 0.5] and obs["parity"] == [1, 1, 1]
    assert len(obs["e2"]["b"]) == 3 and len(obs["occupations"]["neutron"][0]) == 3
    np.testing.assert_allclose(np.sum(obs["occupations"]["proton"], axis=1), 2, atol=1e-8)
    src = tmp_path / "21ne.json"
    src.write_text(json.dumps(out))
    assert main(["plot", str(src), "-o", str(tmp_path / "21ne.png")]) == 0
    assert (tmp_path / "21ne.png").read_bytes().startswith(b"\x89PNG")


@needs_data
@pytest.mark.parametrize("args", [["--b", "-1"], ["--b", "1.8", "--hbar-omega", "12"], ["--eff-charge", "1.5"]])
def test_cli_refuses_bad_observable_options(args, capsys):
    assert main(["spectrum", "--interaction", "usdb", "--protons", "2", "--neutrons", "2"] + args) == 2
    assert "error" in capsys.readouterr().err


@needs_data
def test_no_observables_option(capsys):
    assert main(["spectrum", "--interaction", "usdb", "--protons", "2", "--neutrons", "2", "--nev", "2", "--json",
                 "--no-observables"]) == 0
    assert "observables" not in json.loads(capsys.readouterr().out)
