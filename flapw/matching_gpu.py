"""The k-only matching factors of ``matching.k_only_factors`` computed on a GPU, one thread per G vector.

One kernel launch per k-point forms Y_lm(K̂), j_l(|K|R) and j_l'(|K|R) of every species by the recurrences of
``special`` and writes (4π/√Ω) i^l Y*_lm a_l(|K|) and the same with b_l straight into the (N_G, N_L) arrays
of every species. The host work left per k-point is a handful of whole-array numpy operations (sin and cos of
|K|R, packing) and two copies: nothing that holds the GIL for long, so k-points built side by side on several
GPUs in one process no longer queue for it. NaCl Kmax 3.0 (N_G = 4414, two species, lmax 6) on an H100: the
stage takes 0.7–1.0 ms; the host recurrences took 7–11 ms of a 37 ms k-point, 44 ms of the first when two ran at
once.

The kernel does the host's arithmetic in the host's order, compiled without fused multiply-adds (--fmad=false),
with the host's constants (recurrence coefficients, 1/(2l+1)!!, sin and cos of |K|R) computed by numpy and
passed in; the values agree with the host path to rounding (the tests hold them to 1e-14 relative).

Each thread keeps its P_lm, cos mφ, sin mφ and j_l in local memory: NVRTC reports 464 bytes a thread at lmax 6,
1168 at lmax 12. The driver may set that much aside for every thread a GPU can hold at once (an estimate for an
H100: 125 and 316 MB, outside CuPy's pool).
"""
import functools

import numpy as np

from .matching import prefactor_constants
from .special import (JN_LMAX, MILLER_MARGIN, P00, SERIES_BELOW, SERIES_TERMS, _check_lmax, _double_factorials,
                      legendre_factors)

__all__ = ["k_only_factors_gpu"]

BLOCK = 128                # threads per block

_SOURCE = r"""
#define LMAX %(lmax)d
#define NL ((LMAX + 1) * (LMAX + 1))
#define NJ (LMAX + 2)
#define NP ((LMAX + 1) * (LMAX + 2) / 2)
#define SERIES_BELOW %(series_below)r
#define SERIES_TERMS %(series_terms)d
#define MILLER_MARGIN %(miller_margin)d
#define PER_SPECIES (1 + 5 * (LMAX + 1))

// j_l(x), l < NJ, and j_l'(x), l <= LMAX: special._jn_series / special._jn_downward, operation for operation.
__device__ void bessel(double x, double sin_x, double cos_x, const double* dfinv, double* j, double* dj)
{
    if (x < SERIES_BELOW) {
        double s[NJ], term[NJ], power[NJ];
        double z = -0.5 * x * x;
        for (int l = 0; l < NJ; ++l) { s[l] = dfinv[l]; term[l] = dfinv[l]; }
        for (int k = 1; k <= SERIES_TERMS; ++k)
            for (int l = 0; l < NJ; ++l) {
                term[l] *= z;
                term[l] /= (double)k * (2.0 * l + 2 * k + 1);
                s[l] += term[l];
            }
        power[0] = 1.0;
        for (int l = 1; l < NJ; ++l) power[l] = power[l - 1] * x;
        for (int l = 0; l < NJ; ++l) j[l] = power[l] * s[l];
        dj[0] = 0.0;
        for (int l = 1; l < NJ - 1; ++l) dj[l] = power[l - 1] * s[l] * (double)l;
        for (int l = 0; l < NJ - 1; ++l) dj[l] -= power[l + 1] * s[l + 1];
        return;
    }
    long long whole = (long long)floor(x);
    long long start = (NJ - 1 > whole ? NJ - 1 : whole) + MILLER_MARGIN + whole / 2;
    double one = 0.0, two = 0.0;                              // j_{l+1}, j_{l+2}
    for (long long l = start; l >= 0; --l) {
        double cur = 1.0;
        if (l != start) { cur = one / x; cur *= (double)(2 * l + 3); cur -= two; }
        if (l < NJ) j[l] = cur;
        two = one; one = cur;
    }
    double j0 = sin_x / x;
    double j1 = (j0 - cos_x) / x;
    double scale = fabs(j[0]) >= fabs(j[1]) ? j0 / j[0] : j1 / j[1];
    for (int l = 0; l < NJ; ++l) j[l] *= scale;
    for (int l = 0; l < NJ - 1; ++l) { dj[l] = j[l] / x; dj[l] *= (double)l; dj[l] -= j[l + 1]; }
}

// data: K (n x 3), |K| (n), then sin |K|R_s and cos |K|R_s (n each) per species.
// table: (4 pi / sqrt(Omega)) i^l per L (re, im), P_00, the Legendre coefficients a_lm, b_lm (by row l(l+1)/2+m),
// sqrt(2l+1), -sqrt((2l+1)/2l), 1/(2l+1)!! (l < NJ), then per species R, u'dot, udot', u', u, W (LMAX+1 each).
// out: per species the (n, NL) arrays f_a, f_b.
extern "C" __global__ void k_only_factors(const double* __restrict__ data, const double* __restrict__ table,
                                          double2* const* __restrict__ out, int n, int n_species)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n) return;
    const double* pref = table;
    const double* la = table + 2 * NL + 1;
    const double* lb = la + NP;
    const double* ld = lb + NP;
    const double* le = ld + (LMAX + 1);
    const double* dfinv = le + (LMAX + 1);
    const double* radial = dfinv + NJ;

    // special.direction_cosines
    double vx = data[3 * g], vy = data[3 * g + 1], vz = data[3 * g + 2];
    int e;
    frexp(fmax(fmax(fabs(vx), fabs(vy)), fabs(vz)), &e);
    double x = ldexp(vx, -e), y = ldexp(vy, -e), z = ldexp(vz, -e);
    double rho2 = x * x + y * y;
    double rho = sqrt(rho2), r = sqrt(rho2 + z * z), az = fabs(z);
    double ct = r > 0 ? z / r : 1.0;
    if (az > rho) ct = copysign(1.0 - rho2 / (r * (r + az)), z);
    double st = r > 0 ? rho / r : 0.0;
    double cp = rho > 0 ? x / rho : 1.0, sp = rho > 0 ? y / rho : 0.0;

    // special.legendre_all and special.azimuthal_all
    double p[NP], c[LMAX + 1], s[LMAX + 1];
    p[0] = table[2 * NL];
    for (int l = 1; l <= LMAX; ++l) {
        int row = l * (l + 1) / 2, up = (l - 1) * l / 2, up2 = (l - 2) * (l - 1) / 2;
        for (int m = 0; m < l - 1; ++m) {
            double v = p[up + m] * ct;
            v -= p[up2 + m] * lb[row + m];
            p[row + m] = v * la[row + m];
        }
        p[row + l - 1] = p[up + l - 1] * ct * ld[l];
        p[row + l] = p[up + l - 1] * st * le[l];
    }
    c[0] = 1.0; s[0] = 0.0;
    if (LMAX >= 1) { c[1] = cp; s[1] = sp; }
    for (int m = 2; m <= LMAX; ++m) {
        int h = m / 2, k = m - m / 2;
        c[m] = c[h] * c[k] - s[h] * s[k];
        s[m] = s[h] * c[k] + c[h] * s[k];
    }

    double kk = data[3 * n + g];
    for (int sp_i = 0; sp_i < n_species; ++sp_i) {
        const double* rad = radial + sp_i * PER_SPECIES;
        const double *udot = rad + 1, *dudot = udot + (LMAX + 1), *du = dudot + (LMAX + 1);
        const double *u = du + (LMAX + 1), *w = u + (LMAX + 1);
        double j[NJ], dj[LMAX + 1];
        bessel(kk * rad[0], data[(4 + 2 * sp_i) * n + g], data[(5 + 2 * sp_i) * n + g], dfinv, j, dj);
        double2* fa = out[2 * sp_i] + (size_t)g * NL;
        double2* fb = out[2 * sp_i + 1] + (size_t)g * NL;
        for (int l = 0; l <= LMAX; ++l) {
            double djk = dj[l] * kk;                          // matching._ab
            double a = (udot[l] * djk - dudot[l] * j[l]) / w[l];
            double b = (du[l] * j[l] - u[l] * djk) / w[l];
            for (int m = -l; m <= l; ++m) {                   // Y*_lm (Condon-Shortley, scipy's Y_{l,-m})
                int am = m < 0 ? -m : m, L = l * l + l + m;
                double pl = p[l * (l + 1) / 2 + am];
                double yr = pl * c[am], yi = pl * s[am];
                if (m < 0) { double sign = (am & 1) ? -1.0 : 1.0; yr *= sign; yi *= -sign; }
                yi = -yi;
                double cr = pref[2 * L], ci = pref[2 * L + 1];
                double qr = yr * cr - yi * ci, qi = yr * ci + yi * cr;
                fa[L] = make_double2(qr * a, qi * a);
                fb[L] = make_double2(qr * b, qi * b);
            }
        }
    }
}
"""


@functools.lru_cache(maxsize=None)
def _kernel(lmax):
    """The kernel for ``lmax`` (cupy.RawKernel: compiled on first use, once per machine in CuPy's kernel cache,
    loaded once per GPU)."""
    import cupy
    code = _SOURCE % dict(lmax=lmax, series_below=float(SERIES_BELOW), series_terms=SERIES_TERMS,
                          miller_margin=MILLER_MARGIN)
    return cupy.RawKernel(code, "k_only_factors", options=("--std=c++14", "--fmad=false"))


@functools.lru_cache(maxsize=None)
def _constants(lmax, omega):
    """The species-independent part of the kernel's table, from the host path's own functions."""
    n_p = (lmax + 1) * (lmax + 2) // 2
    la, lb = np.zeros(n_p), np.zeros(n_p)
    ld, le = np.zeros(lmax + 1), np.zeros(lmax + 1)
    for l in range(1, lmax + 1):
        row = l * (l + 1) // 2
        la[row:row + l - 1], lb[row:row + l - 1], ld[l], le[l] = legendre_factors(l)
    table = np.concatenate([prefactor_constants(lmax, omega).view(float), [P00], la, lb, ld, le,
                            1 / _double_factorials(lmax + 2)])
    table.flags.writeable = False
    return table


def k_only_factors_gpu(basis, radials, lmax, omega, out):
    """Fill ``out`` ([(fa, fb)] per radial: C-ordered complex128 (N_G, N_L) CuPy arrays on one GPU, as
    matching.k_only_factors checks them) with matching.k_only_factors' values, on that GPU, on its current
    stream (queued there, like any CuPy operation: what reads them on another stream or the host waits for that
    stream first). lmax, |K| and the radial data are checked as the host path checks them
    (ValueError) before anything runs."""
    _check_lmax(lmax)
    if lmax > JN_LMAX:
        raise ValueError(f"lmax must be at most {JN_LMAX} for spherical_jn_all, got {lmax!r}")
    if not np.all(np.isfinite(basis.norm)) or np.any(basis.norm < 0):
        raise ValueError(f"|k+G| must be finite and >= 0, got values in [{basis.norm.min()}, {basis.norm.max()}]")
    for r in radials:
        if any(np.shape(v) != (lmax + 1,) for v in (r.udot, r.dudot, r.du, r.u)):
            raise ValueError(f"radial functions must have lmax + 1 = {lmax + 1} values of u(R), u'(R), u̇(R) "
                             f"and u̇'(R), got {np.shape(r.u)}")
    import cupy
    n = basis.n_g
    device = out[0][0].device
    if n == 0:
        return out
    big = [r.mesh.r[-1] for r in radials]
    x = basis.norm[None, :] * np.array(big)[:, None]              # |K| R_s, as the host path forms it
    data = np.empty((4 + 2 * len(radials)) * n)
    data[:3 * n] = basis.kpg.ravel()
    data[3 * n:4 * n] = basis.norm
    trig = data[4 * n:].reshape(len(radials), 2, n)
    np.sin(x, out=trig[:, 0])
    np.cos(x, out=trig[:, 1])
    per_species = [np.concatenate([[r.mesh.r[-1]], r.udot, r.dudot, r.du, r.u, r.wronskian]) for r in radials]
    table = np.concatenate([_constants(lmax, float(omega))] + per_species)
    pointers = np.array([f.data.ptr for pair in out for f in pair], dtype=np.uint64)
    with device:
        kernel = _kernel(lmax)
        data_d, table_d, pointers_d = cupy.asarray(data), cupy.asarray(table), cupy.asarray(pointers)
        kernel(((n + BLOCK - 1) // BLOCK,), (BLOCK,), (data_d, table_d, pointers_d, np.int32(n),
                                                        np.int32(len(radials))))
    return out
