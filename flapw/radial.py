"""Scalar (non-relativistic) radial functions u_l, u̇_l on a logarithmic mesh, per species.

Hartree units. With P = r u the radial equation is  -½ P'' + [l(l+1)/(2r²) + V(r) - E] P = 0 and the
energy derivative obeys  -½ Ṗ'' + [...] Ṗ = P.  On x = ln r, with y = (P, r P', Ṗ, r Ṗ'), the system is
smooth near the nucleus (r² V -> -Z r), so classical RK4 on a uniform x mesh is accurate; all l are
integrated at once (vectorised).  Potentials are analytic callables, so RK4 half-steps need no interpolation.
"""
from dataclasses import dataclass

import numpy as np

__all__ = ["RadialMesh", "RadialSolution", "solve_radial", "simpson_weights"]


def simpson_weights(n, h):
    """Composite Simpson weights on n equally spaced points (n odd), trapezoid fix-up for even n."""
    if n < 3:
        raise ValueError(f"a radial mesh needs at least 3 points, got {n}")
    w = np.zeros(n)
    m = n if n % 2 else n - 1
    w[:m:2] = 2.0
    w[1:m:2] = 4.0
    w[0] = w[m - 1] = 1.0
    w[:m] *= h / 3.0
    if m != n:                       # last interval by the trapezoid rule
        w[-2] += h / 2
        w[-1] += h / 2
    return w


@dataclass
class RadialMesh:
    r: np.ndarray          # radii, r[-1] == R exactly
    x: np.ndarray          # ln r
    h: float               # x spacing
    w: np.ndarray          # weights for ∫ f(r) dr = Σ w_i r_i f_i (Simpson in x)

    @classmethod
    def log(cls, rmt, n=1501, r0=1e-5):
        x = np.linspace(np.log(r0), np.log(rmt), n)
        r = np.exp(x)
        r[-1] = rmt
        h = x[1] - x[0]
        return cls(r, x, h, simpson_weights(n, h) * r)

    def integrate(self, f):
        """∫_0^R f(r) dr along the last axis (f ~ r^{2l+2} near 0, so the region below r0 is negligible)."""
        return f @ self.w


@dataclass
class RadialSolution:
    """Normalised u_l(E_l) and u̇_l for l = 0..lmax on a mesh (arrays are P = r u, shape (lmax+1, n))."""
    mesh: RadialMesh
    e_l: np.ndarray        # energy parameters (Ha)
    p: np.ndarray          # r u_l(r), ∫ p² dr = 1
    pdot: np.ndarray       # r u̇_l(r), orthogonal to p
    u: np.ndarray          # u_l(R)
    du: np.ndarray         # u_l'(R)
    udot: np.ndarray       # u̇_l(R)
    dudot: np.ndarray      # u̇_l'(R)
    udot_norm: np.ndarray  # ‖u̇_l‖

    @property
    def wronskian(self):
        """W = u̇(R) u'(R) - u(R) u̇'(R); R² W = 2 for exact solutions (Hartree units)."""
        return self.udot * self.du - self.u * self.dudot


def _rhs(x, y, ll, e, vfun):
    r = np.exp(x)
    c = ll + 2.0 * r * r * (vfun(r) - e)           # (l(l+1) + 2 r² (V - E)), per l
    p, q, pd, qd = y
    return np.stack([q, c * p + q, qd, c * pd + qd - 2.0 * r * r * p])


def solve_radial(vfun, lmax, e_l, mesh):
    """Integrate outward from r0 for every l at its own E_l; normalise u, orthogonalise u̇ to u."""
    e = np.broadcast_to(np.asarray(e_l, float), (lmax + 1,)).copy()
    ls = np.arange(lmax + 1, dtype=float)
    ll = ls * (ls + 1)
    n, h, x = len(mesh.r), mesh.h, mesh.x
    y = np.zeros((4, lmax + 1, n))
    r0 = mesh.r[0]
    # P ~ r^{l+1}: scale the start so large l neither underflows nor overflows; Ṗ starts at zero
    p0 = np.exp((ls + 1) * np.log(r0 / mesh.r[-1]))
    y[:, :, 0] = [p0, (ls + 1) * p0, 0.0 * p0, 0.0 * p0]
    cur = y[:, :, 0]
    for i in range(n - 1):
        xi = x[i]
        k1 = _rhs(xi, cur, ll, e, vfun)
        k2 = _rhs(xi + h / 2, cur + h / 2 * k1, ll, e, vfun)
        k3 = _rhs(xi + h / 2, cur + h / 2 * k2, ll, e, vfun)
        k4 = _rhs(xi + h, cur + h * k3, ll, e, vfun)
        cur = cur + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        y[:, :, i + 1] = cur
    p, q, pd, qd = y
    norm = np.sqrt(mesh.integrate(p * p))
    p, q, pd, qd = p / norm[:, None], q / norm[:, None], pd / norm[:, None], qd / norm[:, None]
    ov = mesh.integrate(p * pd)                      # Ṗ - <P|Ṗ> P still solves the Ṗ equation
    pd = pd - ov[:, None] * p
    qd = qd - ov[:, None] * q
    big_r = mesh.r[-1]
    # u = P/r, u' = (r P' - P)/r² with r P' = q
    u, du = p[:, -1] / big_r, (q[:, -1] - p[:, -1]) / big_r ** 2
    ud, dud = pd[:, -1] / big_r, (qd[:, -1] - pd[:, -1]) / big_r ** 2
    return RadialSolution(mesh, e, p, pd, u, du, ud, dud, np.sqrt(mesh.integrate(pd * pd)))
