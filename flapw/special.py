"""Spherical harmonics Y_lm and spherical Bessel functions j_l for every l <= lmax at once, by recurrences
over arrays of points (rows: l or (l, m); columns: points), for the LAPW matching coefficients.

Each point's values come from that point's data alone by elementwise arithmetic (no trigonometric functions
for Y_lm, no sums over points), so they are the same, bit for bit, however the points are split into pieces.
"""
import numpy as np

__all__ = ["direction_cosines", "legendre_all", "azimuthal_all", "spherical_harmonics", "spherical_jn_all"]

SERIES_BELOW = 1.0      # j_l(x) by its power series for x below this, by the downward recurrence above
SERIES_TERMS = 12       # enough for x < 1: the 10th term is below 1e-19 of the first
JN_LMAX = 100           # up to this lmax the downward recurrence grows by < 1e230 from its start to l = 0 (x >= 1)
MILLER_MARGIN = 14      # the downward recurrence starts at l = max(lmax+1, floor x) + MILLER_MARGIN + floor(x)//2
P00 = 1 / np.sqrt(4 * np.pi)    # Y_00


def _check_lmax(lmax):
    if isinstance(lmax, bool) or not isinstance(lmax, (int, np.integer)) or lmax < 0:
        raise ValueError(f"lmax must be a non-negative integer, got {lmax!r}")


def direction_cosines(vectors):
    """cos θ, sin θ, cos φ, sin φ of the rows of an (N, 3) array, from the components (no angles formed; each
    row first scaled by a power of 2, exactly, to a largest component in [0.5, 1)).
    θ = φ = 0 for the zero vector, φ = 0 on the z axis. Within 45° of the z axis cos θ is formed as
    ±(1 - ρ²/(r(r + |z|))), whose error is that of the last subtraction: there Y_lm(cos θ) is most sensitive
    to it (dP_l/dx = l(l+1)/2 at x = 1)."""
    v = np.asarray(vectors, float)
    if v.ndim != 2 or v.shape[1] != 3:
        raise ValueError(f"vectors must be an (N, 3) array, got shape {v.shape}")
    _, exponent = np.frexp(np.abs(v).max(axis=1, initial=0.0))
    x, y, z = np.ldexp(v, -exponent[:, None]).T                          # exact scaling by 2^-e: no under/overflow
    rho2 = x * x + y * y
    rho, r, az = np.sqrt(rho2), np.sqrt(rho2 + z * z), np.abs(z)
    cos_t = np.divide(z, r, out=np.ones_like(r), where=r > 0)
    polar = az > rho
    near = 1 - rho2[polar] / (r[polar] * (r[polar] + az[polar]))
    cos_t[polar] = np.copysign(near, z[polar])
    sin_t = np.divide(rho, r, out=np.zeros_like(r), where=r > 0)
    cos_p = np.divide(x, rho, out=np.ones_like(r), where=rho > 0)
    sin_p = np.divide(y, rho, out=np.zeros_like(r), where=rho > 0)
    return cos_t, sin_t, cos_p, sin_p


def legendre_all(lmax, cos_t, sin_t):
    """P̄_lm(cos θ) for 0 <= m <= l <= lmax, normalised so that Y_lm = P̄_lm e^{imφ} (Condon–Shortley phase
    included): a ((lmax+1)(lmax+2)/2, N) array, row l(l+1)/2 + m. By the recurrences
    P̄_mm = -√((2m+1)/2m) sin θ P̄_{m-1,m-1}, P̄_{m+1,m} = √(2m+3) cos θ P̄_mm and, for m <= l-2,
    P̄_lm = a_lm (cos θ P̄_{l-1,m} - b_lm P̄_{l-2,m}), a_lm = √((4l²-1)/(l²-m²)), b_lm = √(((l-1)²-m²)/(4(l-1)²-1))."""
    _check_lmax(lmax)
    p = np.empty(((lmax + 1) * (lmax + 2) // 2, len(cos_t)))
    scratch = np.empty((max(lmax - 1, 0), len(cos_t)))
    p[0] = P00
    for l in range(1, lmax + 1):
        row, up, up2 = l * (l + 1) // 2, (l - 1) * l // 2, (l - 2) * (l - 1) // 2
        a, b, d, e = legendre_factors(l)
        if l >= 2:
            dst, tmp = p[row:row + l - 1], scratch[:l - 1]
            np.multiply(p[up:up + l - 1], cos_t, out=dst)
            np.multiply(p[up2:up2 + l - 1], b[:, None], out=tmp)
            np.subtract(dst, tmp, out=dst)
            np.multiply(dst, a[:, None], out=dst)
        np.multiply(p[up + l - 1], cos_t, out=p[row + l - 1])
        p[row + l - 1] *= d
        np.multiply(p[up + l - 1], sin_t, out=p[row + l])
        p[row + l] *= e
    return p


def legendre_factors(l):
    """The factors of legendre_all's row l (l >= 1): a_lm and b_lm for m = 0..l-2 (arrays), √(2l+1) and
    -√((2l+1)/2l)."""
    m = np.arange(max(l - 1, 0))
    a = np.sqrt((4.0 * l * l - 1) / (l * l - m * m))
    b = np.sqrt(((l - 1.0) ** 2 - m * m) / (4.0 * (l - 1) ** 2 - 1))
    return a, b, np.sqrt(2.0 * l + 1), -np.sqrt((2.0 * l + 1) / (2.0 * l))


def azimuthal_all(lmax, cos_p, sin_p):
    """cos mφ and sin mφ for m = 0..lmax, two (lmax+1, N) arrays, by e^{imφ} = e^{ihφ} e^{i(m-h)φ}, h = m//2
    (rounding errors grow as log m, not m)."""
    _check_lmax(lmax)
    c, s = np.empty((lmax + 1, len(cos_p))), np.empty((lmax + 1, len(cos_p)))
    tmp = np.empty(len(cos_p))
    c[0], s[0] = 1.0, 0.0
    if lmax:
        c[1], s[1] = cos_p, sin_p
    for m in range(2, lmax + 1):
        h, k = m // 2, m - m // 2
        np.multiply(c[h], c[k], out=c[m])
        np.multiply(s[h], s[k], out=tmp)
        np.subtract(c[m], tmp, out=c[m])
        np.multiply(s[h], c[k], out=s[m])
        np.multiply(c[h], s[k], out=tmp)
        np.add(s[m], tmp, out=s[m])
    return c, s


def spherical_harmonics(lmax, vectors):
    """Y_lm of the directions of the rows of an (N, 3) array (ẑ for the zero vector): an ((lmax+1)², N)
    complex array, row L = l² + l + m, with Y_{l,-m} = (-1)^m Y*_lm (the convention of
    scipy.special.sph_harm_y)."""
    cos_t, sin_t, cos_p, sin_p = direction_cosines(vectors)
    p = legendre_all(lmax, cos_t, sin_t)
    c, s = azimuthal_all(lmax, cos_p, sin_p)
    y = np.empty(((lmax + 1) ** 2, len(cos_t)), complex)
    re, im = y.real, y.imag
    for l in range(lmax + 1):
        pl, mid = p[l * (l + 1) // 2: (l + 1) * (l + 2) // 2], l * l + l
        np.multiply(pl, c[:l + 1], out=re[mid:mid + l + 1])              # m = 0..l
        np.multiply(pl, s[:l + 1], out=im[mid:mid + l + 1])
        if l:                                                            # m = -1..-l: rows mid-1 down to l²
            sign = np.where(np.arange(1, l + 1) % 2, -1.0, 1.0)[:, None]
            neg = slice(mid - 1, l * l - 1, -1)
            np.multiply(re[mid + 1:mid + l + 1], sign, out=re[neg])
            np.multiply(im[mid + 1:mid + l + 1], -sign, out=im[neg])
    return y


def _double_factorials(n):
    """(2l+1)!! for l = 0..n-1."""
    return np.cumprod(2.0 * np.arange(n) + 1)


def _jn_series(lmax, x, j, dj):
    """j_l(x) (l <= lmax+1) and j_l'(x) (l <= lmax) by j_l = x^l s_l(x),
    s_l = Σ_k (-x²/2)^k / (k! (2l+1)!! (2l+3)(2l+5)···(2l+2k+1)), and j_l' = l x^{l-1} s_l - x^{l+1} s_{l+1}."""
    n_l = lmax + 2
    two_l = 2.0 * np.arange(n_l)[:, None]
    s = np.empty((n_l, len(x)))
    s[:] = (1 / _double_factorials(n_l))[:, None]
    term, z = s.copy(), -0.5 * x * x
    for k in range(1, SERIES_TERMS + 1):
        term *= z
        term /= k * (two_l + 2 * k + 1)
        s += term
    power = np.empty((n_l, len(x)))                                      # x^l, l = 0..lmax+1
    power[0] = 1.0
    for l in range(1, n_l):
        np.multiply(power[l - 1], x, out=power[l])
    np.multiply(power[:n_l], s, out=j)
    np.multiply(power[:n_l - 2], s[1:n_l - 1], out=dj[1:])               # l x^{l-1} s_l, l >= 1
    dj[1:] *= np.arange(1, n_l - 1)[:, None]
    dj[0] = 0.0
    dj -= power[1:n_l] * s[1:]                                           # - x^{l+1} s_{l+1}


def _jn_downward(lmax, x, j, dj):
    """j_l(x) (l <= lmax+1) and j_l'(x) (l <= lmax) for x > 0 by the downward recurrence
    j_{l-1} = (2l+1)/x j_l - j_{l+1} (Miller), started with 1, 0 at a level set by each point's own x (the top of
    the loop, the largest start, changes nothing: points stay exactly 0 above their start), scaled to
    j_0 = sin x / x or j_1 = (j_0 - cos x)/x, whichever is larger; then j_l' = (l/x) j_l - j_{l+1}."""
    n_l = lmax + 2
    whole = np.floor(x).astype(np.int64)
    start = np.maximum(n_l - 1, whole) + MILLER_MARGIN + whole // 2
    top = int(start.max())
    above = np.zeros((3, len(x)))                                        # j_i for i > lmax+1: row i % 3

    def row(i):
        return j[i] if i < n_l else above[i % 3]
    for l in range(top, -1, -1):
        cur, one, two = row(l), row(l + 1), row(l + 2)
        np.divide(one, x, out=cur)
        cur *= 2 * l + 3
        cur -= two
        if l >= start.min():
            cur[start == l] = 1.0
    sin_x, cos_x = np.sin(x), np.cos(x)
    j0 = sin_x / x
    j1 = (j0 - cos_x) / x
    by_j0 = np.abs(j[0]) >= np.abs(j[1])
    scale = np.divide(j0, j[0], out=np.empty_like(x), where=by_j0)
    np.divide(j1, j[1], out=scale, where=~by_j0)
    j *= scale
    np.divide(j[:n_l - 1], x, out=dj)
    dj *= np.arange(n_l - 1)[:, None]
    dj -= j[1:]


def spherical_jn_all(lmax, x):
    """j_l(x) and j_l'(x) for l = 0..lmax and x >= 0 (a 1-D array): two (lmax+1, N) arrays.
    Power series below x = SERIES_BELOW (x = 0 exact: j_0 = 1, j_1' = 1/3, all else 0), the downward recurrence
    above; within 1e-13 (relative, or 1e-15 absolute near zeros) of scipy.special.spherical_jn for x <= 30."""
    _check_lmax(lmax)
    if lmax > JN_LMAX:
        raise ValueError(f"lmax must be at most {JN_LMAX} for spherical_jn_all, got {lmax!r}")
    x = np.asarray(x, float)
    if x.ndim != 1:
        raise ValueError(f"x must be a 1-D array, got shape {x.shape}")
    if not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"x must be finite and >= 0, got values in [{x.min()}, {x.max()}]")
    j, dj = np.empty((lmax + 2, len(x))), np.empty((lmax + 1, len(x)))
    small = x < SERIES_BELOW
    for method, pick in ((_jn_series, small), (_jn_downward, ~small)):
        if not pick.any():
            continue
        if pick.all():
            method(lmax, x, j, dj)
        else:
            jp, djp = np.empty((lmax + 2, pick.sum())), np.empty((lmax + 1, pick.sum()))
            method(lmax, x[pick], jp, djp)
            j[:, pick], dj[:, pick] = jp, djp
    return j[:lmax + 1], dj
