"""Observables of shell-model eigenstates from their M-scheme vectors: occupations per orbit, parity, isospin,
B(E2), B(M1), quadrupole and magnetic moments (conventions in ``transitions``).

    from cisolver.observables import compute_observables, TransitionOptions
    obs = compute_observables(problem, vectors, TransitionOptions(eff_charge=(1.5, 0.5)))

The vectors may be numpy arrays or CuPy arrays on a GPU: the work is done where they are (``mscheme``).
"""
import contextlib

import numpy as np

from ..arrays import is_device
from .states import isospin_squared, normalised, occupations, parity_expectation
from .transitions import TransitionOptions, electromagnetic

__all__ = ["compute_observables", "TransitionOptions", "orbit_label", "nucleus_name", "PARITY_TOLERANCE"]

PARTS = ("transitions", "states")     # compute_observables' work as MPI ranks share it: E2/M1; the rest
PARITY_TOLERANCE = 1e-6     # |<π>| below 1 - this: the state mixes parities (reported as 0)
_L_LETTERS = "spdfghiklmnoqrtuv"
_ELEMENTS = ("n H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr "
             "Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb "
             "Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No Lr Rf Db "
             "Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og").split()


def nucleus_name(z, a):
    """'20Ne' for Z = 10, A = 20 ('300(Z=130)' beyond the named elements)."""
    return f"{a}{_ELEMENTS[z]}" if 0 <= z < len(_ELEMENTS) else f"{a}(Z={z})"


def orbit_label(orbit):
    """'0d5/2' for n = 0, l = 2, 2j = 5."""
    return f"{orbit.n}{_L_LETTERS[orbit.l]}{orbit.twoj}/2"


def _json(x):
    """Arrays to nested lists with NaN as None."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        return None if not np.isfinite(a) else float(a)
    return [_json(row) for row in a]


def compute_observables(problem, vectors, options=None, comm=None):
    """Every observable of the states (columns of ``vectors``, in ``problem.basis``) as a JSON-ready dict:
    occupations, parity (+1, -1, or 0 for a state of mixed parity), <T²> and T (None when the proton and neutron
    orbits differ), E2 and M1 B values [initial][final], reduced matrix elements, moments and the options used.
    ``vectors``: numpy, or CuPy (float32 or float64) on the GPU where the work then runs, in float64.
    ``comm``: an MPI communicator whose every rank holds the same whole vectors (a gathered LOBPCG result): its
    ranks share the work (PARTS, round robin) and every rank returns the whole dict, equal to one rank's own."""
    opts = options if options is not None else TransitionOptions()
    size = 1 if comm is None else comm.Get_size()
    mine = PARTS[comm.Get_rank()::size] if size > 1 else PARTS
    got = {}
    with _device_of(vectors):
        states = normalised(problem, vectors)
        if "transitions" in mine:
            got["em"] = electromagnetic(problem, states, opts)
        if "states" in mine:
            got["occ"] = occupations(problem, states)
            got["par"] = parity_expectation(problem, states)
            got["t2"] = isospin_squared(problem, states)
    if size > 1:
        for part in comm.allgather(got):
            got.update(part)
    (occ_p, occ_n), par, t2, em = got["occ"], got["par"], got["t2"], got["em"]
    parity = [int(np.sign(p)) if abs(p) >= 1.0 - PARITY_TOLERANCE else 0 for p in par]
    inter = problem.interaction
    z, n = inter.core_z + problem.n_protons, inter.core_n + problem.n_neutrons
    out = {
        "nucleus": {"z": z, "n": n, "a": z + n, "name": nucleus_name(z, z + n)},
        "options": {"eff_charge": list(opts.eff_charge), "gl": list(opts.gl), "gs": list(opts.gs),
                    "b_fm": em["b"], "hbar_omega_mev": em["hbar_omega"],
                    "convention": "B(L; i->f) = |<f||T_L||i>|^2 / (2 J_i + 1) (Bohr-Mottelson); "
                                  "B(E2) e^2 fm^4, B(M1) mu_N^2, Q e fm^2, mu mu_N; [initial][final]"},
        "orbits": {"proton": [orbit_label(o) for o in problem.pspace.orbits],
                   "neutron": [orbit_label(o) for o in problem.nspace.orbits]},
        "occupations": {"proton": _json(occ_p), "neutron": _json(occ_n)},
        "parity": parity, "parity_expectation": _json(par),
        "t2": None if t2 is None else _json(t2),
        "t": None if t2 is None else _json(_t_from_t2(t2)),
        "j2": _json(em["j2"]),
    }
    for name in ("e2", "m1"):
        part = em[name]
        out[name] = {"b": _json(part["b"]), "reduced": _json(part["reduced"]), "moment": _json(part["moment"]),
                     "wigner_eckart_residual": float(part["wigner_eckart_residual"])}
    return out


def _device_of(vectors):
    """The GPU of CuPy ``vectors`` as the current device (no change for host arrays)."""
    if not is_device(vectors):
        return contextlib.nullcontext()
    import cupy
    return cupy.cuda.Device(vectors.device.id)


def _t_from_t2(t2):
    t = (-1.0 + np.sqrt(1.0 + 4.0 * np.maximum(np.asarray(t2), 0.0))) / 2.0
    return np.round(2.0 * t) / 2.0
