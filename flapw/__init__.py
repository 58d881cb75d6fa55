"""flapw: LAPW Hamiltonian and Overlap matrices of real crystals, built with hybridblas.

    import flapw
    cell = flapw.System.preset("TiO2", kmax=3.0, k=(0.1234, 0.2345, 0.3456))
    H, S = flapw.build_hs(cell, method="refined", context=None, interstitial=False)
    H, S = flapw.build_hs(cell, interstitial=True, lower_only=True)   # the lower triangles: what solvers read
    E = flapw.solve(H, S, 8)                                           # lowest 8 eigenvalues (Ha), where H lives
    flapw.write_hs("hs.h5", cell, H, S, method="refined", interstitial=False)   # or hs.npz; flapw.read_hs

    cell = flapw.System.from_file("Si.cif", kmax=3.0)            # any crystal ase.io.read reads (needs ase)
    H, S = flapw.hs_from_coefficients(a, b, taa, tab, tbb, u)     # your own A, B, T and U

Hartree atomic units (bohr, Ha, Kmax in 1/bohr). See docs/flapw.md for the conventions and the file layout.
"""
import hybridblas_launcher as _launcher

with _launcher.loading(__name__):   # `python -m flapw` only: Ctrl-C ends the tool (one line, 130)
    from hybridblas import __version__   # one version for the whole distribution

    from .coefficients import hs_from_coefficients
    from .eigen import solve
    from .hsdla import METHODS, Workspace, build_bytes, build_hs, build_hs_with_fallback, hermitian_fill
    from .output import HSWriter, read_hs, write_hs
    from .report import BuildReport
    from .structures import PRESETS, Species, Structure
    from .system import DEFAULT_K, System
    from .wigner import gaunt, wigner3j
del _launcher

__all__ = ["System", "Structure", "Species", "build_hs", "build_hs_with_fallback", "build_bytes",
           "hs_from_coefficients", "BuildReport", "PRESETS", "METHODS", "DEFAULT_K", "hermitian_fill",
           "HSWriter", "write_hs", "read_hs", "gaunt", "wigner3j", "solve", "Workspace"]

