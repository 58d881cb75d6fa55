"""The G+k plane-wave basis of one k-point: every G with |k+G| <= Kmax."""
import numpy as np

__all__ = ["GkBasis", "reciprocal"]


def reciprocal(lattice):
    """Rows b_i with a_i · b_j = 2π δ_ij (1/bohr)."""
    return 2.0 * np.pi * np.linalg.inv(lattice).T


MAX_CANDIDATES = 2e9       # Miller indices searched for |k+G| <= kmax (N_G is about half of them)


class GkBasis:
    """G vectors (integer Miller indices of the supercell reciprocal lattice) with |k+G| <= kmax.

    k is given in fractional units of the supercell reciprocal lattice. Vectors are ordered by |k+G|
    (then by Miller index) so the order is reproducible.
    """

    def __init__(self, lattice, k, kmax):
        if not np.isfinite(kmax) or kmax <= 0:
            raise ValueError(f"kmax must be a positive number (1/bohr), got {kmax!r}")
        k = np.asarray(k, dtype=float)
        if k.shape != (3,) or not np.all(np.isfinite(k)):
            raise ValueError(f"k must be three finite fractional coordinates, got {k!r}")
        b = reciprocal(np.asarray(lattice, float))
        # |k+G| <= kmax bounds each Miller index by kmax |a_i| / 2π (a_i · (k+G) = 2π (n_i + k_i))
        lengths = np.linalg.norm(lattice, axis=1)
        span = np.ceil(kmax * lengths / (2 * np.pi) + np.abs(k)) + 1
        if not np.all(np.isfinite(span)) or np.prod(2 * span + 1) > MAX_CANDIDATES:
            raise ValueError(f"kmax={kmax!r} on this cell (|a| = {', '.join(f'{x:.4g}' for x in lengths)} bohr) "
                             f"asks for more than {MAX_CANDIDATES:.0e} plane waves to look through: far beyond "
                             f"what H and S of one node could hold; lower kmax or give a smaller cell")
        nmax = span.astype(int)
        axes = [np.arange(-n, n + 1) for n in nmax]
        grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
        kg = (grid + k) @ b
        norm = np.linalg.norm(kg, axis=1)
        keep = norm <= kmax
        grid, kg, norm = grid[keep], kg[keep], norm[keep]
        order = np.lexsort((grid[:, 2], grid[:, 1], grid[:, 0], np.round(norm, 12)))
        self.k = k
        self.kmax = float(kmax)
        self.miller = grid[order]
        self.kpg = kg[order]                   # Cartesian k+G (1/bohr)
        self.norm = norm[order]                # |k+G|

    @property
    def n_g(self):
        return len(self.miller)

    def rows(self, r0, r1):
        """The basis vectors r0..r1-1 as a basis of their own (views, no copies): for work in chunks."""
        part = object.__new__(GkBasis)
        part.k, part.kmax = self.k, self.kmax
        part.miller, part.kpg, part.norm = self.miller[r0:r1], self.kpg[r0:r1], self.norm[r0:r1]
        return part
