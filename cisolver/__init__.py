"""cisolver: LOBPCG for configuration-interaction (shell-model) Hamiltonians on CPUs and GPUs.

    from cisolver import compute_spectrum
    out = compute_spectrum("usdb", 2, 2, nev=5)       # 20Ne: energies (MeV), J, timings

Pieces: shellmodel/ (KSHELL .snt reader, bit-string M-scheme basis, vectorised H build, J²),
lobpcg (Algorithm 1), dense (hybridblas Gram products, CholQR2, Rayleigh–Ritz), operators (SpMM),
preconditioner (block-diagonal tiles). cupy is imported only when a GPU is asked for.
"""
from hybridblas import __version__   # one version for the whole distribution

from .solver import LobpcgResult, lobpcg
from .operators import SymmetricOperator
from .spectrum import compute_spectrum

__all__ = ["lobpcg", "LobpcgResult", "SymmetricOperator", "compute_spectrum"]
