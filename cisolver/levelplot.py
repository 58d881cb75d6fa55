"""Level-scheme figures (``cisolver plot``) from the JSON that ``cisolver spectrum --json`` prints or ``--output``
writes: one column per nucleus, a line per level at its excitation energy (relative to the lowest computed state),
J^π on the right and E_x on the left, labels moved apart where levels crowd. matplotlib is imported only here and
only when a figure is drawn (``pip install "hybridblas[plot]"``).
"""
import json
import math
from pathlib import Path

from hybridblas import console

FORMATS = (".png", ".pdf", ".svg")
def jpi_label(j, parity=None):
    """'2+', '3/2-', '0' (parity unknown), '?' (no J)."""
    if j is None:
        return "?"
    twice = int(round(2 * float(j)))
    text = str(twice // 2) if twice % 2 == 0 else f"{twice}/2"
    return text + {1: "+", -1: "-"}.get(parity, "")


def load_results(paths):
    """The spectrum results in the given JSON files (each one result, or a list of them), in order."""
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise FileNotFoundError(f"spectrum file not found: {str(path)!r}")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a JSON file written by 'cisolver spectrum --json' ({exc})") from None
        items = data if isinstance(data, list) else [data]
        if not items:
            raise ValueError(f"{path}: no result in it (an empty list); 'cisolver spectrum --json' writes one")
        for item in items:
            _check_result(path, item)
            out.append(item)
    return out


def _check_result(path, item):
    """One result as 'cisolver spectrum --json' writes it: finite energies, and J, parities (where given) one
    per energy."""
    energies = item.get("energies") if isinstance(item, dict) else None
    if not isinstance(energies, list) or not energies or \
            not all(isinstance(e, (int, float)) and not isinstance(e, bool) and math.isfinite(e) for e in energies):
        raise ValueError(f"{path}: a result needs a non-empty list 'energies' of finite numbers (MeV), as "
                         f"'cisolver spectrum --json' writes it")
    observables = item.get("observables")
    if observables is not None and not isinstance(observables, dict):
        raise ValueError(f"{path}: 'observables' must be an object, got {type(observables).__name__}")
    for name, values, kinds in (("j", item.get("j"), (int, float)),
                                ("observables.parity", (observables or {}).get("parity"), (int, float, str))):
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != len(energies) or \
                not all(v is None or (isinstance(v, kinds) and not isinstance(v, bool)) for v in values):
            raise ValueError(f"{path}: '{name}' must be a list of {len(energies)} values, one per energy, got "
                             f"{str(values)[:60]}")


def levels(result, max_energy=None):
    """[(E_x in MeV, 'J^π' label)] of one result, by energy, E_x from its lowest state, up to ``max_energy``."""
    energies = [float(e) for e in result["energies"]]
    js = result.get("j") or [None] * len(energies)
    parities = (result.get("observables") or {}).get("parity") or [None] * len(energies)
    ground = min(energies)
    rows = sorted((e - ground, jpi_label(j, p)) for e, j, p in zip(energies, js, parities))
    return [r for r in rows if max_energy is None or r[0] <= max_energy]


def column_title(result):
    obs = result.get("observables") or {}
    nucleus = obs.get("nucleus") or {}
    if "name" in nucleus:
        name = nucleus["name"]
    else:
        name = f"A={result.get('mass', '?')} (Z_v={result.get('protons', '?')}, N_v={result.get('neutrons', '?')})"
    inter = Path(str(result.get("interaction", ""))).stem
    return f"{name}\n{inter}" if inter else name


def spread(positions, gap):
    """Label heights near ``positions`` (ascending) at least ``gap`` apart: overlapping labels form groups, each
    centred on the mean of its levels; groups merge until none overlap. Order is kept."""
    groups = []                    # [first index, count, centre]
    for i, y in enumerate(positions):
        groups.append([i, 1, float(y)])
        while len(groups) > 1:
            a, b = groups[-2], groups[-1]
            top_a = a[2] + (a[1] - 1) * gap / 2
            bottom_b = b[2] - (b[1] - 1) * gap / 2
            if bottom_b - top_a >= gap - 1e-12:
                break
            first, count = a[0], a[1] + b[1]
            centre = sum(positions[first:first + count]) / count
            groups[-2:] = [[first, count, centre]]
    out = []
    for first, count, centre in groups:
        out += [centre + (k - (count - 1) / 2) * gap for k in range(count)]
    return out


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ModuleNotFoundError('the level-scheme figure needs matplotlib: pip install "hybridblas[plot]"') from None
    return plt


def plot_level_scheme(results, path, max_energy=None, title=None):
    """Draw the level schemes of ``results`` (spectrum result dicts) side by side into ``path`` (.png, .pdf, .svg)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"output must end in one of {', '.join(FORMATS)}, got {str(path)!r}")
    if max_energy is not None and not max_energy > 0:
        raise ValueError(f"max_energy must be a positive number of MeV, got {max_energy!r}")
    columns = [levels(r, max_energy) for r in results]
    plt = _pyplot()
    top = max([max(e for e, _ in col) for col in columns if col] + [1.0])
    height = 6.0
    fig, ax = plt.subplots(figsize=(1.0 + 2.6 * len(columns), height))
    gap = 0.028 * top * 1.1
    for c, (col, result) in enumerate(zip(columns, results)):
        x0, x1 = 3.0 * c + 0.6, 3.0 * c + 2.0
        energies = [e for e, _ in col]
        ys = spread(energies, gap)
        for (e, label), y in zip(col, ys):
            ax.plot([x0, x1], [e, e], color="black", lw=1.2)
            ax.plot([x1, x1 + 0.2], [e, y], color="0.5", lw=0.6)
            ax.text(x1 + 0.25, y, label, va="center", ha="left", fontsize=9)
            ax.plot([x0 - 0.2, x0], [y, e], color="0.5", lw=0.6)
            ax.text(x0 - 0.25, y, f"{e:.3f}", va="center", ha="right", fontsize=8)
        ax.text((x0 + x1) / 2, -0.07 * top, column_title(result), ha="center", va="top", fontsize=10)
    ax.set_xlim(-0.4, 3.0 * len(columns) + 0.1)
    ax.set_ylim(-0.22 * top, top * 1.08)
    ax.set_xticks([])
    ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= top * 1.0001])
    ax.set_ylabel("E_x (MeV)")
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.spines["left"].set_bounds(0, top)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def add_parser(subparsers):
    """The ``plot`` subcommand of the cisolver CLI."""
    p = subparsers.add_parser("plot", help="level-scheme figure from 'cisolver spectrum --json' output",
                              description="Draw the level scheme(s) of one or more spectrum JSON files side by side "
                                          "(energies relative to each nucleus' lowest computed state).")
    p.add_argument("inputs", nargs="+", help="JSON files written by 'cisolver spectrum --json' (or --output)")
    p.add_argument("-o", "--output", required=True, help="figure file: .png, .pdf or .svg")
    p.add_argument("--max-energy", type=console.positive_float, default=None, help="highest E_x shown (MeV)")
    p.add_argument("--title", default=None)
    return p


def run(args):
    """Body of ``cisolver plot``: check the output path, read the inputs, draw."""
    if Path(args.output).suffix.lower() not in FORMATS:
        raise console.CLIError(f"--output must end in one of {', '.join(FORMATS)}, got {args.output!r}")
    console.check_output_path(args.output, "--output")
    results = load_results(args.inputs)
    try:
        plot_level_scheme(results, args.output, max_energy=args.max_energy, title=args.title)
    except ModuleNotFoundError as exc:
        raise console.CLIError(str(exc)) from None
    print(f"wrote {args.output}")
    return 0
