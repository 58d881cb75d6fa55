"""``cisolver spectrum --interaction usdb --protons 2 --neutrons 2 --nev 5`` (also ``python -m cisolver``).

Every option is checked, the M-scheme dimension counted and the memory estimated before anything is built
(cisolver.spectrum.prepare). Exit codes: 0 converged, 1 not converged (text and --json alike) or an
unexpected failure, 2 bad input or a run refused (too big for the memory), 130 interrupted.
"""
import csv
import json
import logging

import hybridblas as hb
from hybridblas import console

from . import levelplot
from .observables import report

PROG = "cisolver"
log = logging.getLogger(PROG)

# compute_spectrum's parameters as the options name them, for the messages
OPTIONS = {"interaction": "--interaction", "n_protons": "--protons", "n_neutrons": "--neutrons",
           "twice_m": "--twice-m", "nev": "--nev", "tol": "--tol", "maxiter": "--maxiter", "devices": "--devices",
           "dtype": "--dtype", "storage": "--storage", "precond": "--precond", "block_size": "--block-size",
           "seed": "--seed", "n_threads": "--threads", "layout": "--layout", "observables": "--no-observables",
           "eff_charge": "--eff-charge", "gl": "--gl", "gs": "--gs", "b": "--b", "hbar_omega": "--hbar-omega"}
OUTPUT_KINDS = (".json", ".csv")


def _j_label(j):
    return str(int(j)) if float(j).is_integer() else f"{int(round(2 * j))}/2"


def _parser():
    ap, sub = console.tool_parser(PROG, "Shell-model CI spectra with LOBPCG")
    s = sub.add_parser("spectrum", help="lowest eigenvalues of an M-scheme shell-model Hamiltonian")
    console.add_common_options(s)
    s.add_argument("--interaction", required=True,
                   help=".snt file, a NuShellX .int (with the .sp of the same name), or a shipped name: usdb, ckpot, "
                        "gxpf1a, kb3g ($CISOLVER_DATA is searched first)")
    s.add_argument("--protons", type=console.nonnegative_int, required=True, help="valence protons")
    s.add_argument("--neutrons", type=console.nonnegative_int, required=True, help="valence neutrons")
    s.add_argument("--twice-m", type=int, default=None, help="2M (default 0 for even A, 1 for odd A)")
    s.add_argument("--nev", type=console.positive_int, default=5, help="number of eigenpairs")
    s.add_argument("--tol", type=console.positive_float, default=None,
                   help="relative residual tolerance (default: 1e-8 for float64, 1e-5 for float32)")
    s.add_argument("--maxiter", type=console.nonnegative_int, default=300)
    s.add_argument("--block-size", type=console.positive_int, default=None,
                   help="LOBPCG block size, >= --nev (default nev+3)")
    s.add_argument("--devices", default="cpu",
                   help="cpu, gpu, all (every GPU, else the cores), GPU ids like 0,1 or cuda:0,cuda:1")
    s.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    s.add_argument("--storage", choices=["upper", "full"], default="upper",
                   help="how the host stores H: its upper triangle or full rows. With --devices on GPUs (no MPI, "
                        "--precond none) the GPUs build and hold H's full rows themselves where they fit")
    s.add_argument("--precond", choices=["none", "tiles"], default="none")
    s.add_argument("--layout", choices=["rows", "triangular"], default="rows",
                   help="under mpiexec: 1-D row blocks, or MFDn's triangular layout (n_d(n_d+1)/2 ranks)")
    s.add_argument("--seed", type=console.nonnegative_int, default=0)
    s.add_argument("--threads", type=console.positive_int, default=None,
                   help="threads for the Hamiltonian build (its counting on the host when the GPUs build H)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--output", metavar="FILE",
                   help="also write the results to FILE: .json (the --json object) or .csv (one row per state)")
    report.add_arguments(s)
    levelplot.add_parser(sub)
    return ap


def _check_output(path):
    p = console.check_output_path(path, "--output")
    if p is not None and p.suffix.lower() not in OUTPUT_KINDS:
        raise console.CLIError(f"--output {path!r} must end in {' or '.join(OUTPUT_KINDS)}, "
                               f"got {p.suffix or 'no suffix'!r}")
    return p


def write_output(path, out):
    """``out`` (compute_spectrum's result) to ``path``: JSON, or CSV with one row per state."""
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(out, indent=1) + "\n")
        return
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["index", "energy", "J", "J2", "residual"])
        for i, row in enumerate(zip(out["energies"], out["j"], out["j2"], out["residuals"]), 1):
            w.writerow([i, *(repr(float(x)) for x in row)])


class _BuildProgress:
    """compute_spectrum's progress(done, total) as a console progress bar (only on a terminal)."""

    def __init__(self, enabled):
        self.enabled, self.bar = enabled, None

    def __call__(self, done, total):
        if self.bar is None:
            self.bar = console.progress(total, "building H (row blocks)", enabled=self.enabled)
        self.bar.update(1)
        if done >= total:
            self.bar.close()


def _print_table(out):
    print(f"interaction {out['interaction']}  Z_v={out['protons']} N_v={out['neutrons']}  A={out['mass']}  "
          f"2M={out['twice_m']}  TBME factor {out['tbme_factor']:.6f}")
    ranks = f"   {out['ranks']} MPI ranks" if "ranks" in out else ""
    print(f"M-scheme dimension {out['dimension']}   stored nonzeros {out['nnz_stored']} ({out['storage']}){ranks}")
    print(f"{'#':>3} {'E (MeV)':>14} {'J':>5} {'<J^2>':>9} {'rel. residual':>14}")
    for i, (e, j, j2, r) in enumerate(zip(out["energies"], out["j"], out["j2"], out["residuals"]), 1):
        print(f"{i:>3} {e:>14.6f} {_j_label(j):>5} {j2:>9.4f} {r:>14.2e}")
    if "observables" in out:
        print("\n".join(report.report_lines(out)))
    sec = out["seconds"]
    queued = ("" if out.get("devices") == "cpu" or not out["iterations"]
              else "queued on the GPU" if out.get("queued") else "waiting at host trips")
    print(f"iterations {out['iterations']} (converged: {out['converged']}){', ' + queued if queued else ''}")
    print("time: " + "  ".join(f"{k} {v:.2f}s" for k, v in sec.items() if isinstance(v, float)))
    print("solve: " + "  ".join(f"{k} {v:.2f}s" for k, v in sec["solve_detail"].items()))


def _body(args):
    if args.command == "plot":
        return levelplot.run(args)
    from . import spectrum
    from .distributed import world
    output = _check_output(args.output)
    comm = world()
    rank = comm.Get_rank() if comm is not None else 0
    request = spectrum.prepare(args.interaction, args.protons, args.neutrons, args.nev, twice_m=args.twice_m,
                               tol=args.tol, maxiter=args.maxiter, devices=args.devices, dtype=args.dtype,
                               storage=args.storage, precond=args.precond, block_size=args.block_size,
                               seed=args.seed, n_threads=args.threads, comm=comm, layout=args.layout,
                               names=OPTIONS, **report.spectrum_keywords(args))
    if rank == 0:
        mem = request.memory
        log.info(f"{mem.describe()}: about {hb.memory.format_bytes(mem.host)} of host memory at the peak"
                 + (" per rank" if comm is not None else ""))
    progress = _BuildProgress(not args.quiet) if comm is None else None
    out = spectrum.run(request, progress=progress)
    code = 0 if out["converged"] else 1
    if rank != 0:
        return code
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        _print_table(out)
    if output is not None:
        write_output(output, out)
        log.info(f"results written to {output}")
    if not out["converged"]:
        log.warning(f"LOBPCG did not converge to --tol {request.tol:g} in {out['iterations']} iterations "
                    f"(largest residual {max(out['residuals']):.2e}); raise --maxiter or --tol")
    return code


def main(argv=None):
    """``cisolver spectrum|plot ...``; returns the exit code (0 converged, 1 not converged or failed, 2 bad input
    or refused, 130 Ctrl-C). A caller's current GPU is current again on return; a caller that had none keeps the
    first GPU of the run (console.gpu_kept)."""
    with console.gpu_kept():
        return console.run_main(PROG, _body, argv, _parser())
