"""The observables in the ``cisolver spectrum`` command: its options and the text it prints."""
from hybridblas import console

from .transitions import TransitionOptions

_DEFAULTS = TransitionOptions()


def add_arguments(parser):
    """--eff-charge, --gl, --gs, --b / --hbar-omega and --no-observables, with the defaults in the help."""
    g = parser.add_argument_group("observables (occupations, parity, isospin, E2/M1 transitions and moments)")
    g.add_argument("--no-observables", action="store_true", help="energies and J only")
    g.add_argument("--eff-charge", nargs=2, type=float, metavar=("EP", "EN"), default=_DEFAULTS.eff_charge,
                   help="E2 effective charges of protons and neutrons (default %(default)s)")
    g.add_argument("--gl", nargs=2, type=float, metavar=("GP", "GN"), default=_DEFAULTS.gl,
                   help="orbital g-factors (default %(default)s: free nucleons)")
    g.add_argument("--gs", nargs=2, type=float, metavar=("GP", "GN"), default=_DEFAULTS.gs,
                   help="spin g-factors (default %(default)s: free nucleons; quenched, e.g. 0.75 x free: 4.19 -2.87)")
    length = g.add_mutually_exclusive_group()
    length.add_argument("--b", type=console.positive_float, default=None,
                        help="oscillator length in fm (default from hbar omega)")
    length.add_argument("--hbar-omega", type=console.positive_float, default=None,
                        help="oscillator energy in MeV (default 45 A^-1/3 - 25 A^-2/3)")


def spectrum_keywords(args):
    """compute_spectrum's observable keywords from the parsed options."""
    return {"observables": not args.no_observables, "eff_charge": tuple(args.eff_charge), "gl": tuple(args.gl),
            "gs": tuple(args.gs), "b": args.b, "hbar_omega": args.hbar_omega}


def _j_label(twice_j):
    return str(twice_j // 2) if twice_j % 2 == 0 else f"{twice_j}/2"


def _state_label(out, i):
    j = out["j"][i]
    parity = out["observables"]["parity"][i]
    return (_j_label(int(round(2 * j))) if j is not None else "?") + {1: "+", -1: "-"}.get(parity, "")


def _number(x, fmt):
    return "-" if x is None else format(x, fmt)


def report_lines(out):
    """Lines of text: the options, per state J^π, T, Q, mu and the occupations, then B(E2) and B(M1) of the
    downward transitions between the computed states that the selection rules allow."""
    obs = out["observables"]
    o = obs["options"]
    lines = [f"observables: e_p {o['eff_charge'][0]:g} e_n {o['eff_charge'][1]:g}  g_l {o['gl'][0]:g} {o['gl'][1]:g}"
             f"  g_s {o['gs'][0]:g} {o['gs'][1]:g}  b {o['b_fm']:.4f} fm (hbar omega {o['hbar_omega_mev']:.3f} MeV)",
             f"  {o['convention']}"]
    orbits = [f"p{x}" for x in obs["orbits"]["proton"]] + [f"n{x}" for x in obs["orbits"]["neutron"]]
    lines.append(f"{'#':>3} {'E_x (MeV)':>10} {'J^pi':>6} {'T':>4} {'Q(e fm2)':>9} {'mu(mu_N)':>9}  "
                 + " ".join(f"{x:>7}" for x in orbits))
    energies = out["energies"]
    ground = min(energies)
    t = obs["t"]
    for i, e in enumerate(energies):
        occ = obs["occupations"]["proton"][i] + obs["occupations"]["neutron"][i]
        t_label = "-" if t is None else _j_label(int(round(2 * t[i])))
        lines.append(f"{i + 1:>3} {e - ground:>10.3f} {_state_label(out, i):>6} {t_label:>4} "
                     f"{_number(obs['e2']['moment'][i], '9.3f'):>9} {_number(obs['m1']['moment'][i], '9.3f'):>9}  "
                     + " ".join(f"{x:7.3f}" for x in occ))
    rows = []
    for i, ei in enumerate(energies):
        for f, ef in enumerate(energies):
            if ef >= ei or out["j"][i] is None or out["j"][f] is None:
                continue
            dj = abs(out["j"][i] - out["j"][f])
            zero = out["j"][i] == 0 and out["j"][f] == 0
            e2 = obs["e2"]["b"][i][f] if dj <= 2 and not zero else None
            m1 = obs["m1"]["b"][i][f] if dj <= 1 and not zero else None
            if e2 is not None or m1 is not None:
                rows.append(f"{i + 1:>3} -> {f + 1:<3} {_state_label(out, i):>5} -> {_state_label(out, f):<5} "
                            f"{ei - ef:>9.3f} {_number(e2, '13.4f'):>13} {_number(m1, '13.5f'):>13}")
    if rows:
        lines.append(f"{'i':>3}    {'f':<3} {'J_i':>5}    {'J_f':<5} {'E_g (MeV)':>9} {'B(E2) e2fm4':>13} "
                     f"{'B(M1) mu_N2':>13}")
        lines += rows
    return lines
