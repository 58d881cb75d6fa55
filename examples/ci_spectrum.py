"""The low-lying spectrum of 24Mg in the sd shell (USDB) with the hybrid LOBPCG, labelled by J.

    python3 examples/ci_spectrum.py [--nucleus 24Mg] [--devices cpu|all]
"""
import argparse

from cisolver.spectrum import compute_spectrum

NUCLEI = {"20Ne": (2, 2), "24Mg": (4, 4), "28Si": (6, 6)}   # valence protons, neutrons above 16O


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nucleus", default="24Mg", choices=sorted(NUCLEI))
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--nev", type=int, default=5)
    args = ap.parse_args()
    z, n = NUCLEI[args.nucleus]
    out = compute_spectrum("usdb", z, n, nev=args.nev, devices=args.devices)
    print(f"{args.nucleus} (USDB), M-scheme dimension {out['dimension']}, {out['iterations']} LOBPCG iterations")
    for e, j in zip(out["energies"], out["j"]):
        print(f"  E = {e:12.6f} MeV   J = {j:g}   Ex = {e - out['energies'][0]:8.4f} MeV")


if __name__ == "__main__":
    main()
