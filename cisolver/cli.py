"""``cisolver spectrum --interaction usdb --protons 2 --neutrons 2 --nev 5`` (also ``python -m cisolver``)."""
import argparse
import json
import sys

from hybridblas.console import CLIError

from . import levelplot
from .observables import report
from .shellmodel.snt import InteractionFileError


def _j_label(j):
    return str(int(j)) if float(j).is_integer() else f"{int(round(2 * j))}/2"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="cisolver", description="Shell-model CI spectra with LOBPCG")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("spectrum", help="lowest eigenvalues of an M-scheme shell-model Hamiltonian")
    s.add_argument("--interaction", required=True,
                   help=".snt file, a NuShellX .int (with the .sp of the same name), or a name in the shared data folder")
    s.add_argument("--protons", type=int, required=True, help="valence protons")
    s.add_argument("--neutrons", type=int, required=True, help="valence neutrons")
    s.add_argument("--twice-m", type=int, default=None, help="2M (default 0 for even A, 1 for odd A)")
    s.add_argument("--nev", type=int, default=5, help="number of eigenpairs")
    s.add_argument("--tol", type=float, default=1e-8, help="relative residual tolerance")
    s.add_argument("--maxiter", type=int, default=300)
    s.add_argument("--block-size", type=int, default=None, help="LOBPCG block size (default nev+3)")
    s.add_argument("--devices", default="cpu", help="cpu, all, or CUDA ids like 0,1")
    s.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    s.add_argument("--storage", choices=["upper", "full"], default="upper")
    s.add_argument("--precond", choices=["none", "tiles"], default="none")
    s.add_argument("--layout", choices=["rows", "triangular"], default="rows",
                   help="under mpiexec: 1-D row blocks, or MFDn's triangular layout (n_d(n_d+1)/2 ranks)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=int, default=None, help="threads for the Hamiltonian build")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    report.add_arguments(s)
    levelplot.add_parser(sub)
    args = ap.parse_args(argv)
    if args.command == "plot":
        try:
            return levelplot.run(args)
        except (ValueError, OSError, CLIError) as exc:
            print(f"cisolver: error: {exc}", file=sys.stderr)
            return 2

    from .distributed import world
    from .spectrum import compute_spectrum
    comm = world()
    rank = comm.Get_rank() if comm is not None else 0
    def show_progress(done, total):
        print(f"\r  building H: {done}/{total} row blocks", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    progress = show_progress if not args.json and comm is None else None
    try:
        out = compute_spectrum(args.interaction, args.protons, args.neutrons, args.nev,
                               twice_m=args.twice_m, tol=args.tol, maxiter=args.maxiter,
                               devices=args.devices, dtype=args.dtype, storage=args.storage,
                               precond=args.precond, block_size=args.block_size, seed=args.seed,
                               n_threads=args.threads, progress=progress, comm=comm, layout=args.layout,
                               **report.spectrum_keywords(args))
    except (ValueError, TypeError, FileNotFoundError, InteractionFileError) as exc:
        print(f"cisolver: error: {exc}", file=sys.stderr)
        return 2
    if rank != 0:
        return 0 if out["converged"] else 1
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
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
    return 0 if out["converged"] else 1
