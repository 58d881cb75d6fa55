"""cisolver: LOBPCG for configuration-interaction (shell-model) Hamiltonians on CPUs and GPUs.

    from cisolver import compute_spectrum
    out = compute_spectrum("usdb", 2, 2, nev=5)       # 20Ne: energies (MeV), J, timings

Pieces: shellmodel/ (KSHELL .snt reader, bit-string M-scheme basis, vectorised H build, J²),
lobpcg (Algorithm 1), dense (hybridblas Gram products, CholQR2, Rayleigh–Ritz), operators (SpMM),
preconditioner (block-diagonal tiles). cupy is imported only when a GPU is asked for.
"""
import hybridblas_launcher as _launcher

with _launcher.loading(__name__):   # `python -m cisolver` only: Ctrl-C ends the tool (one line, 130)
    from hybridblas import __version__   # one version for the whole distribution

    from .solver import LobpcgResult, lobpcg
    from .operators import SymmetricOperator
    from .spectrum import compute_spectrum
del _launcher

__all__ = ["lobpcg", "LobpcgResult", "SymmetricOperator", "compute_spectrum"]
