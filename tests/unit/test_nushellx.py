"""cisolver.shellmodel.nushellx: .snt interactions written out in NuShellX form (isospin V_JT, and the 'upn'
proton-neutron form) from the README's conventions, read back, must give the same matrix elements and the README's
reference spectra. Lines are written in random pair order and Hermitian order, so the reader's phases are exercised."""
import logging
from math import sqrt

import numpy as np
import pytest

from cisolver.shellmodel import hamiltonian, nushellx, snt
from cisolver.shellmodel.snt import InteractionFileError
from ci_data import DATA, needs_data


REF = {"usdb.snt": (2, 2, 640, [-40.472331, -38.725641, -36.297059]),        # 20Ne (README)
       "ckpot.snt": (4, 4, 51, [-71.044671, -66.397028, -58.595516])}       # 12C


def _swap(twoj_a, twoj_b, jj, t):
    """|ba; JT> = phase |ab; JT> (two nucleons of isospin 1/2)."""
    return -((-1) ** ((twoj_a + twoj_b) // 2 - jj + 1 - t))


def _isospin_elements(inter):
    """{(a, b, c, d, J, T): V_JT} (isospin labels, a <= b, c <= d) of an isospin-conserving .snt interaction:
    V_(J,1) = V_pp, V_(J,0) = V_pn / (f_ab f_cd) - V_(J,1) (the README's relation, solved for T = 0)."""
    n = len(inter.proton_orbits)
    out = {(a, b, c, d, jj, 1): v for (a, b, c, d, jj), v in inter.tbme.items() if b < n}
    for (a, b, c, d, jj), v in inter.tbme.items():
        if a < n <= b and a <= b - n and c <= d - n:
            b, d = b - n, d - n
            f = (1.0 if a == b else sqrt(0.5)) * (1.0 if c == d else sqrt(0.5))
            v0 = v / f - out.get((a, b, c, d, jj, 1), 0.0)
            if (a == b or c == d) and jj % 2 == 0:      # no T = 0 pair in one orbit at even J: the files' rounding
                assert abs(v0) < 1e-5
                continue
            out[(a, b, c, d, jj, 0)] = v0
    return out


def _component(iso, twoj, a, b, c, d, jj, t):
    phase = 1.0
    if a > b:
        a, b, phase = b, a, phase * _swap(twoj[a], twoj[b], jj, t)
    if c > d:
        c, d, phase = d, c, phase * _swap(twoj[c], twoj[d], jj, t)
    v = iso.get((a, b, c, d, jj, t), iso.get((c, d, a, b, jj, t)))
    return None if v is None else phase * v


def _write(inter, folder, rng, formalism, stem="x", scale=True):
    """<stem>.sp and <stem>.int in NuShellX form; returns the .int path."""
    n = len(inter.proton_orbits)
    orb = inter.proton_orbits
    twoj = [o.twoj for o in orb] * 2
    iso = _isospin_elements(inter)
    lines = []

    def emit(a, b, c, d, jj, t, v):
        if rng.random() < 0.5:
            a, b, c, d = c, d, a, b
        if rng.random() < 0.3 and a != b:
            a, b, v = b, a, v * _swap(twoj[a], twoj[b], jj, t)
        if rng.random() < 0.3 and c != d:
            c, d, v = d, c, v * _swap(twoj[c], twoj[d], jj, t)
        lines.append(f"{a + 1:3d} {b + 1:3d} {c + 1:3d} {d + 1:3d}  {jj:2d} {t}  {v:.10f}")

    sp = ["! written by the test", formalism, f"{inter.core_z + inter.core_n} {inter.core_z}"]
    if formalism == "t":
        sp += [str(n), f"1 {n}"] + [f"{k + 1} {o.n + 1} {o.l} {o.twoj}" for k, o in enumerate(orb)]
        for (a, b, c, d, jj, t), v in iso.items():
            if (a, b) <= (c, d):
                emit(a, b, c, d, jj, t, v)
        spe = [inter.spe[k] for k in range(n)]
    else:
        sp += [str(2 * n), f"2 {n} {n}"] + [f"{k + 1} {o.n + 1} {o.l} {o.twoj}" for k, o in enumerate(orb + orb)]
        for (a, b, c, d, jj), v in inter.tbme.items():
            if (a, b) <= (c, d) and (b < n or a >= n):            # pp and nn lines
                emit(a, b, c, d, jj, 1, v)
        for a in range(n):                                         # pn: one line per isospin component
            for b in range(n):
                for c in range(n):
                    for d in range(n):
                        if (a, b) > (c, d):
                            continue
                        for jj in range(0, max(twoj) + 1):
                            for t in (0, 1):
                                v = _component(iso, twoj, a, b, c, d, jj, t)
                                if v is not None:
                                    emit(a, b + n, c, d + n, jj, t, v)
        spe = [inter.spe[k] for k in range(2 * n)]
    scaled = scale and inter.scaled
    head = f"{-len(lines) if scaled else len(lines)} " + " ".join(f"{e:.6f}" for e in spe)
    if scaled:
        head += f"  {inter.core_z + inter.core_n} {inter.mass_a0:g} {-inter.mass_p:g}"
    (folder / f"{stem}.sp").write_text("\n".join(sp) + "\n")
    (folder / f"{stem}.int").write_text("! converted\n" + head + "\n" + "\n".join(lines) + "\n")
    return folder / f"{stem}.int"


def _same_tbme(a, b, pn=False):
    """Largest difference of the like-particle (pn=False) or proton-neutron elements."""
    protons = {o.index for o in a.orbits if o.is_proton}
    keys = [k for k in set(a.tbme) | set(b.tbme) if ((k[0] in protons) != (k[1] in protons)) == pn]
    return max(abs(a.tbme.get(k, 0.0) - b.tbme.get(k, 0.0)) for k in keys)


@needs_data
@pytest.mark.parametrize("name", sorted(REF))
@pytest.mark.parametrize("formalism", ["t", "pn"])
def test_round_trip_gives_the_snt_elements_and_spectrum(tmp_path, rng, name, formalism):
    ref = snt.read_snt(DATA / name)
    path = _write(ref, tmp_path, rng, formalism)
    got = nushellx.read_interaction(path)
    assert [(o.index, o.n, o.l, o.twoj, o.twotz) for o in got.orbits] == \
           [(o.index, o.n, o.l, o.twoj, o.twotz) for o in ref.orbits]
    assert (got.core_z, got.core_n) == (ref.core_z, ref.core_n)
    assert got.spe == pytest.approx(ref.spe, abs=1e-12)
    assert _same_tbme(got, ref) < 1e-9
    # pn elements are rebuilt from V_T0 + V_T1; the .snt values are rounded to 4-5 decimals, so those of a pair in
    # one orbit at even J (T = 1 only) carry the file's rounding (up to 3e-6 in ckpot)
    assert _same_tbme(got, ref, pn=True) < 5e-6
    assert got.tbme_factor(20) == pytest.approx(ref.tbme_factor(20), rel=1e-12)
    assert nushellx.read_interaction(path.with_suffix(".sp")).tbme == got.tbme
    z, n, dim, energies = REF[name]
    prob = hamiltonian.ShellModelProblem(got, z, n)
    assert prob.dimension == dim
    w = np.linalg.eigvalsh(prob.build()[0].toarray())
    np.testing.assert_allclose(w[:3], energies, atol=2e-5, rtol=0)


@needs_data
def test_isospin_and_upn_files_agree(tmp_path, rng):
    """The same interaction in both NuShellX formalisms (different line orders) reads to identical elements, and
    a .sp given explicitly overrides the pairing by name."""
    ref = snt.read_snt(DATA / "usdb.snt")
    iso = nushellx.read_nushellx(_write(ref, tmp_path, rng, "t", stem="iso"))
    upn = nushellx.read_nushellx(_write(ref, tmp_path, rng, "pn", stem="upn"))
    assert _same_tbme(iso, upn) < 1e-9 and _same_tbme(iso, upn, pn=True) < 1e-9
    (tmp_path / "other.int").write_text((tmp_path / "iso.int").read_text())
    assert nushellx.read_nushellx(tmp_path / "other.int", sp_path=tmp_path / "iso.sp").tbme == iso.tbme


@needs_data
def test_extension_picks_the_reader(tmp_path, rng):
    assert nushellx.read_interaction(DATA / "usdb.snt").tbme == snt.read_snt(DATA / "usdb.snt").tbme
    path = _write(snt.read_snt(DATA / "ckpot.snt"), tmp_path, rng, "t", stem="ck")
    assert nushellx.read_interaction(path).path == str(path)
    (tmp_path / "ck.sp").unlink()
    with pytest.raises(FileNotFoundError, match="ck.sp"):
        nushellx.read_interaction(path)


@needs_data
def test_positive_count_means_no_scaling(tmp_path, rng, caplog):
    ref = snt.read_snt(DATA / "usdb.snt")
    path = _write(ref, tmp_path, rng, "t", scale=False)
    text = path.read_text().splitlines()
    text[1] += "  16 18 0.3"                     # OXBASH: only a negative count asks for the scaling
    path.write_text("\n".join(text) + "\n")
    with caplog.at_level(logging.WARNING, logger="cisolver.shellmodel.nushellx"):
        got = nushellx.read_interaction(path)
    assert not got.scaled and got.tbme_factor(24) == 1.0
    assert "not applied as a mass scaling" in caplog.text


SP = "t\n16 8\n3\n1 3\n1 1 2 3\n2 1 2 5\n3 2 0 1\n"


@pytest.mark.parametrize("sp,int_text,match", [
    ("x\n16 8\n3\n1 3\n1 1 2 3\n2 1 2 5\n3 2 0 1\n", "1 0 0 0\n1 1 1 1 0 1 -1.0\n", "must be 't' .* or 'pn'"),
    ("t\n16 8\n3\n1 2\n1 1 2 3\n2 1 2 5\n3 2 0 1\n", "1 0 0 0\n", "adding up to 3"),
    ("t\n16 8\n3\n1 3\n1 0 2 3\n2 1 2 5\n3 2 0 1\n", "1 0 0 0\n", "NuShellX counts n from 1"),
    ("t\n16 8\n3\n1 3\n1 1 2 3\n2 1 2 5\n", "1 0 0 0\n", "file ends before orbit 3"),
    (SP, "2 0 0 0\n1 1 1 1 0 1 -1.0\n", "2 TBME lines announced, 1 found"),
    (SP, "2 0 0 0\n1 1 1 1 0 1 -1.0\n1 1 1 1 0 1 -1.5\n", "given twice with different values"),
    (SP, "1 0 0 0\n1 1 1 1 1 1 -1.0\n", "J \\+ T odd"),
    (SP, "1 0 0 0\n1 3 1 1 3 1 -1.0\n", "J=3 is not allowed"),
    (SP, "1 0 0 0\n1 1 1 1 0 2 -1.0\n", "T must be 0 or 1"),
    (SP, "1 0 0 0\n1 4 1 1 0 1 -1.0\n", "orbit out of range"),
    (SP, "-1 0 0 0 40 18 0.3\n1 1 1 1 0 1 -1.0\n", "core mass 40 differs"),
    (SP, "1 0 0\n", "file ends inside the SPE line"),
    (SP, "-2 0 0 0 16 18 0.3\n1 1 1 1 0 1 -1.0\n", r"2 TBME lines announced \(count -2\), 1 found"),
    (SP, "-1 0 0 0 16 18 0.3\n1 1 1 1 0 1 -1.0\n1 1 2 2 0 1 -0.5\n", r"1 TBME lines announced \(count -1\), 2 found"),
    (SP, "-1 0 0 0 16 0 0.3\n1 1 1 1 0 1 -1.0\n", "the scaling's A0 must be > 0, got 0"),
    (SP, "1 0 nan 0\n1 1 1 1 0 1 -1.0\n", "the SPE line must hold finite numbers"),
    (SP, "1 0 0 0\n1 1 1 1 0 1 inf\n", "the TBME value must be finite, got 'inf'"),
    (SP, "1 0 0 0\n1 1 1 1 inf 1 -1.0\n", "a TBME line must be an integer, got 'inf'"),
    ("pn\n16 8\n6\n2 3 3\n1 1 2 3\n2 1 2 5\n3 2 0 1\n4 1 2 3\n5 1 2 5\n6 2 0 1\n",
     "1 0 0 0 0 0 0\n1 4 1 1 2 1 -1.0\n", "changes the charge"),
    ("pn\n16 8\n6\n2 3 3\n1 1 2 3\n2 1 2 5\n3 2 0 1\n4 1 2 3\n5 1 2 5\n6 2 0 1\n",
     "1 0 0 0 0 0 0\n1 2 1 2 1 0 -1.0\n", "must have T = 1"),
])
def test_bad_files_are_refused_with_the_line(tmp_path, sp, int_text, match):
    (tmp_path / "bad.sp").write_text(sp)
    (tmp_path / "bad.int").write_text(int_text)
    with pytest.raises(InteractionFileError, match=match):
        nushellx.read_interaction(tmp_path / "bad.int")


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="interaction file not found"):
        nushellx.read_interaction(tmp_path / "none.int")
    with pytest.raises(FileNotFoundError, match="model-space file not found"):
        nushellx.read_sp(tmp_path / "none.sp")


@needs_data
def test_compute_spectrum_reads_a_nushellx_file(tmp_path, rng):
    from cisolver import compute_spectrum
    path = _write(snt.read_snt(DATA / "usdb.snt"), tmp_path, rng, "t", stem="usdb")
    out = compute_spectrum(str(path), 2, 2, nev=3, tol=1e-10, observables=False)
    assert out["dimension"] == 640 and out["interaction"] == str(path)
    np.testing.assert_allclose(out["energies"], REF["usdb.snt"][3], atol=2e-5, rtol=0)
