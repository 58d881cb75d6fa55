"""cisolver's KSHELL .snt reader refuses files whose numbers cannot describe a Hamiltonian (naming the file and
line), and NuShellX files whose TBME count disagrees with their lines or whose numbers are not finite; a
species whose 2M range and bit strings need more than 64 bits is looked up block by block."""
import numpy as np
import pytest

from cisolver.shellmodel import basis, hamiltonian, snt
from cisolver.shellmodel.snt import InteractionFileError
from ci_data import DATA, needs_data

# two proton orbits (d5/2, p1/2) and one neutron orbit (d5/2): a small, valid file
GOOD = """! a test space
2 1 8 8
1 0 2 5 -1
2 0 1 1 -1
3 0 2 5  1
3 0
1 1 -3.9
2 2 -3.2
3 3 -3.9
5 0
1 1 1 1 0 -2.0
1 1 2 2 0 -0.5
2 2 2 2 0 -1.5
1 3 1 3 1 -1.0
1 3 1 3 2 -0.7
"""


def _file(tmp_path, text):
    path = tmp_path / "t.snt"
    path.write_text(text)
    return path


def test_the_good_file_is_read_with_both_hermitian_orders(tmp_path):
    inter = snt.read_snt(_file(tmp_path, GOOD))
    assert inter.spe == {0: -3.9, 1: -3.2, 2: -3.9}
    assert inter.tbme[(0, 0, 1, 1, 0)] == inter.tbme[(1, 1, 0, 0, 0)] == -0.5
    assert len(inter.tbme) == 2 * 5 - 4       # four diagonal elements are their own partners


CASES = {
    "odd J in one orbit": (("1 1 1 1 0 -2.0", "1 1 1 1 1 -2.0"), r":11: two like nucleons in one orbit cannot couple "
                                                                 r"to odd J=1 \(TBME 1 1 1 1\)"),
    "parity": (("1 1 2 2 0 -0.5", "1 1 1 2 2 -0.5"), r":12: TBME 1 1 1 2 changes parity"),
    "J out of range": (("2 2 2 2 0 -1.5", "2 2 2 2 2 -1.5"), r":13: J=2 is not allowed for the pair 2j = 1, 1"),
    "duplicate": (("1 3 1 3 2 -0.7", "1 3 1 3 1 -0.9"), r":15: TBME 1 3 1 3 J=1 is given twice with different "
                                                        r"values \(-1.0 and -0.9\)"),
    "NaN element": (("1 3 1 3 2 -0.7", "1 3 1 3 2 nan"), r":15: a TBME line 'i j k l J V' must be finite numbers"),
    "infinite energy": (("2 2 -3.2", "2 2 inf"), r":8: a one-body line 'i j e' must be finite numbers"),
    "missing energy": (("3 0\n1 1 -3.9\n2 2 -3.2\n3 3 -3.9", "2 0\n1 1 -3.9\n2 2 -3.2"),
                       r":8: no single-particle energy for orbit\(s\) \[3\]"),
    "count too small": (("5 0\n", "4 0\n"), r":15: data after the 4 two-body lines the header announces"),
    "count too large": (("5 0\n", "6 0\n"), r"file ends before a TBME line"),
    "negative count": (("5 0\n", "-5 0\n"), r":10: the number of two-body lines must not be negative, got -5"),
    "A0 zero": (("5 0\n", "5 1 0 -0.3\n"), r":10: the scaling's A0 must be > 0, got 0.0"),
    "negative core": (("2 1 8 8", "2 1 -8 8"), r":2: the model-space header 'Np Nn Zc Nc' must not be negative"),
    "negative n": (("2 0 1 1 -1", "2 -1 1 1 -1"), r":4: bad orbit line k=2 n=-1"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_file_that_is_no_hamiltonian_is_refused_with_its_line(tmp_path, case):
    (old, new), match = CASES[case]
    assert old in GOOD
    with pytest.raises(InteractionFileError, match=match):
        snt.read_snt(_file(tmp_path, GOOD.replace(old, new, 1)))


def test_a_forbidden_element_of_value_zero_is_harmless(tmp_path):
    inter = snt.read_snt(_file(tmp_path, GOOD.replace("5 0\n", "6 0\n") + "1 1 1 1 1 0.0\n"))
    assert inter.tbme[(0, 0, 0, 0, 1)] == 0.0


@needs_data
def test_blockwise_lookup_finds_what_the_keys_find():
    """The per-2M-block lookup (for species beyond 64 key bits) returns the keyed lookup's positions."""
    problem = hamiltonian.ShellModelProblem(snt.read_snt(DATA / "usdb.snt"), 4, 4)
    dets = basis.SpeciesDeterminants(problem.pspace, 4)
    assert dets.keyed
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(dets), 500)
    keyed = dets.lookup(dets.states[pick], dets.twom[pick])
    dets.keyed = False
    np.testing.assert_array_equal(dets.lookup(dets.states[pick], dets.twom[pick]), keyed)
    np.testing.assert_array_equal(keyed, pick)
