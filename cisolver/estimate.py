"""Sizes of a shell-model run worked out before anything is built, so that a run that cannot fit is refused
in seconds instead of failing an hour in.

``count(interaction, Z, N, twice_m)`` counts determinants with generating functions: the determinants of n
particles in a species' m-states, by 2M, are the coefficients of prod_i (1 + y x^{m_i}) (exact integers). From
them, without enumerating a determinant:
  * the M-scheme dimension (exact) and the 2M values that have states;
  * the nonzeros of H, an upper bound that is exact but for matrix elements that vanish: per proton-2M row
    block B (protons in group a, neutrons in a' = 2M - a) the diagonal, the proton moves with neutron
    spectators (one-body jumps a -> a and two-particle moves that stay in a, times the neutron determinants),
    the mirror, and the pn moves (proton jumps c -> a times neutron jumps c' -> a', over every group c).
    Every such move reaches a different determinant, so these are the structural nonzeros of the build
    (cisolver.shellmodel.hamiltonian) before exact zeros of v-bar are dropped.
A state removed from the product (a particle moved out, a hole filled) is a polynomial division, so each
count is a few small array operations per distinct set of m values: 56Ni in the fp shell (dimension
1 087 455 228) takes well under a second, where ShellModelProblem's species matrices, which
``row_block_weights`` needs, take about 50 s.

``memory(...)`` turns the sizes into bytes per process and per GPU for the run's phases (build, solve, <J^2>)
and ``check_memory`` refuses through hybridblas.memory.require, naming the estimate, the limit and what to
change.
"""
from dataclasses import dataclass, field

import numpy as np

import hybridblas as hb

from .gpu_build import fill_scratch_bytes

__all__ = ["Counts", "count", "allowed_twice_m", "MemoryEstimate", "memory", "check_memory"]


# ---- counting ------------------------------------------------------------------------------------------
def _m_states(orbits):
    """2m of every m-state of these orbits (orbit by orbit, m ascending: SingleParticleSpace's order)."""
    return np.array([tm for o in orbits for tm in range(-o.twoj, o.twoj + 1, 2)], dtype=np.int64)


def _shift(v, m):
    """v times x^m: index i -> i + m, zeros shifted in (the supports never reach the ends)."""
    out = np.zeros_like(v)
    if m >= 0:
        out[..., m:] = v[..., :v.shape[-1] - m]
    else:
        out[..., :m] = v[..., -m:]
    return out


class _Species:
    """Determinant counts of ``n`` particles in m-states with 2m values ``twoms``: gf[k, 2M + off] is the number
    of k-particle determinants with total 2M (k = 0..n)."""

    def __init__(self, twoms, n):
        self.twoms, self.n = twoms, n
        self.off = int(np.abs(twoms).sum())
        gf = np.zeros((n + 1, 2 * self.off + 1), dtype=np.int64)
        gf[0, self.off] = 1
        for m in twoms:
            gf[1:] += _shift(gf[:-1], int(m))
        self.gf = gf
        self._removed = {}

    @property
    def by_m(self):
        """Determinants of the full n particles per 2M index."""
        return self.gf[self.n]

    def without(self, ms):
        """gf of the space with one state of each 2m in ``ms`` taken out (a division by (1 + y x^m) each)."""
        key = tuple(sorted(ms))
        if not key:
            return self.gf
        if key not in self._removed:
            g = self.without(key[1:])
            h = np.empty_like(g)
            h[0] = g[0]
            for k in range(1, len(g)):
                h[k] = g[k] - _shift(h[k - 1], key[0])
            self._removed[key] = h
        return self._removed[key]

    def jumps(self):
        """J[a, b]: one-body jumps c+_alpha c_gamma (alpha != gamma, alpha empty, gamma filled) from the
        determinants of 2M index a, landing in index b."""
        width = len(self.by_m)
        out = np.zeros((width, width))
        if self.n == 0 or len(self.twoms) < 2:
            return out
        values, mult = np.unique(self.twoms, return_counts=True)
        idx = np.arange(width)
        for mg, cg in zip(values, mult):
            for ma, ca in zip(values, mult):
                pairs = cg * ca - (cg if mg == ma else 0)       # ordered state pairs gamma != alpha
                if pairs == 0:
                    continue
                rest = self.without((int(mg), int(ma)))[self.n - 1]     # the other n - 1 particles, by 2M'
                nz = idx[rest != 0]
                out[nz + mg, nz + ma] += pairs * rest[nz].astype(np.float64)
        return out

    def pair_moves(self):
        """T[a]: moves of two particles (gamma, delta filled -> alpha, beta empty, all four different) that keep
        2M, summed over the determinants of 2M index a."""
        width = len(self.by_m)
        out = np.zeros(width)
        nsp = len(self.twoms)
        if self.n < 2 or nsp < 4:
            return out
        pa, pb = np.triu_indices(nsp, k=1)
        pm = self.twoms[pa] + self.twoms[pb]
        keys = []
        for m in np.unique(pm):            # ordered (removed pair, added pair) with the same 2m sum, disjoint
            sel = np.nonzero(pm == m)[0]
            p, q = np.meshgrid(sel, sel, indexing="ij")
            p, q = p.ravel(), q.ravel()
            ok = (pa[p] != pa[q]) & (pa[p] != pb[q]) & (pb[p] != pa[q]) & (pb[p] != pb[q])
            p, q = p[ok], q[ok]
            ms = np.sort(np.stack([self.twoms[pa[p]], self.twoms[pb[p]], self.twoms[pa[q]], self.twoms[pb[q]]],
                                  axis=1), axis=1)
            keys.append(np.concatenate([ms, np.full((len(p), 1), m)], axis=1))
        keys = np.concatenate(keys)
        if not len(keys):
            return out
        uniq, mult = np.unique(keys, axis=0, return_counts=True)
        idx = np.arange(width)
        for row, c in zip(uniq, mult):
            rest = self.without(tuple(int(x) for x in row[:4]))[self.n - 2]
            nz = idx[rest != 0]
            out[nz + int(row[4])] += c * rest[nz].astype(np.float64)
        return out


@dataclass
class Counts:
    """What ``count`` found: the dimension (exact) and the nonzeros of H (structural upper bound)."""
    dimension: int
    twice_m: int
    nnz_full: float                 # both triangles, diagonal included
    largest_block: dict             # storage -> the most entries the build generates for one proton-2M row block
    blocks: list = field(default_factory=list)    # (2Mp, proton determinants, neutron determinants)

    @property
    def nnz_upper(self):
        return (self.nnz_full + self.dimension) / 2

    def nnz(self, storage):
        return self.nnz_upper if storage == "upper" else self.nnz_full


def _species(interaction, n_protons, n_neutrons):
    return (_Species(_m_states(interaction.proton_orbits), n_protons),
            _Species(_m_states(interaction.neutron_orbits), n_neutrons))


def allowed_twice_m(interaction, n_protons, n_neutrons):
    """The largest 2M that has M-scheme states (2M then runs over -largest..largest in steps of 2)."""
    p, n = _species(interaction, n_protons, n_neutrons)
    return int(np.nonzero(p.by_m)[0].max() - p.off + np.nonzero(n.by_m)[0].max() - n.off)


def count(interaction, n_protons, n_neutrons, twice_m, nonzeros=True):
    """Dimension and nonzeros of the M-scheme H for ``n_protons``, ``n_neutrons`` valence particles of
    ``interaction`` (an snt.Interaction) at ``twice_m``; the arguments must already be valid. ``nonzeros=False``
    counts the dimension only."""
    p, n = _species(interaction, n_protons, n_neutrons)
    cp, cn = p.by_m, n.by_m
    blocks = []
    for ia in np.nonzero(cp)[0]:
        ib = twice_m - (ia - p.off) + n.off
        if 0 <= ib < len(cn) and cn[ib]:
            blocks.append((int(ia - p.off), int(cp[ia]), int(cn[ib])))
    dim = sum(a * b for _, a, b in blocks)
    if not nonzeros:
        return Counts(dim, twice_m, float("nan"), {}, blocks)
    jp, jn, tp, tn = p.jumps(), n.jumps(), p.pair_moves(), n.pair_moves()
    total, largest = 0.0, {"full": 0.0, "upper": 0.0}
    for i, (tmp, n_p, n_n) in enumerate(blocks):
        a, b = tmp + p.off, twice_m - tmp + n.off
        inside = float(n_p) * n_n + (jp[a, a] + tp[a]) * n_n + (jn[b, b] + tn[b]) * n_p
        pn = [jp[tcp + p.off, a] * jn[twice_m - tcp + n.off, b] for tcp, _, _ in blocks]
        total += inside + sum(pn)
        # an upper build generates the pn moves to blocks at or right of its own only, the rest in full
        largest = {"full": max(largest["full"], inside + sum(pn)),
                   "upper": max(largest["upper"], inside + sum(pn[i:]))}
    return Counts(dim, twice_m, total, largest, blocks)


# ---- memory --------------------------------------------------------------------------------------------
# per entry generated for a row block in flight: its COO pieces, their concatenation, the upper-triangle filter
# and the CSR conversion (measured on 2 threads: 51 B on 46Cr in gxpf1a and 45 B on 46V in kb3g, upper
# float64; 37 B on 27Si in usdb, upper float32)
BUILD_BYTES_PER_ENTRY = 64
# the row blocks' pieces and row counts the host keeps while the GPUs build H (measured, full storage: 1.3 B per
# stored entry in gxpf1a 2+4, 0.8 in usdb 4+4, 0.4 in gxpf1a 3+3)
PLAN_BYTES_PER_ENTRY = 1.5
J2_BYTES_PER_ENTRY = 72        # J+ as COO pieces, concatenated, then CSR (cisolver.shellmodel.angmom)


def _csr_bytes(nnz, rows, itemsize):
    idx = 4 if max(nnz, rows) < 2 ** 31 else 8
    return nnz * (itemsize + idx) + (rows + 1) * idx


def _block_bytes(rows, nev, block, itemsize):
    """LOBPCG's blocks for ``rows`` rows: S, H S and the next pair (3b columns each), R, the float64 start, W
    and the preconditioned residual, and the final X, H X and residual."""
    return rows * ((16 * block + 3 * nev) * itemsize + 8 * block)


@dataclass
class MemoryEstimate:
    """Bytes one process needs on the host (at the peak of build, solve, <J^2>) and on each of its GPUs."""
    dimension: int
    host: float
    gpu: dict                     # GPU id -> bytes
    h_bytes: float                # this process's H as stored
    nnz: float                    # this process's stored nonzeros
    vectors: float                # this process's LOBPCG blocks
    parts: dict = field(default_factory=dict)

    def describe(self):
        return (f"M-scheme dimension {self.dimension}: H with about {self.nnz:.3g} stored nonzeros ({hb.memory.format_bytes(self.h_bytes)}) and the "
                f"eigensolver's blocks ({hb.memory.format_bytes(self.vectors)})")


def memory(counts, *, nev, block_size, dtype, storage, gpus=(), ranks=1, layout="rows", n_threads=1,
           n_particles=0, on_gpus=False):
    """The estimate for one process of a run over ``ranks`` MPI ranks (1: no MPI) on ``gpus`` (this process's
    GPU ids; empty: the host). Under MPI H is stored full by rows (``layout`` "rows") or by triangular
    blocks, each rank about 1/ranks of it, and every rank gathers whole blocks for the products and <J^2>.
    ``on_gpus``: the GPUs build H's full rows themselves (cisolver.gpu_build; under MPI layout "rows", each rank
    its rows on its one GPU), the host holds no H."""
    if on_gpus and (not gpus or ranks > 1 and (layout != "rows" or len(gpus) != 1)):
        raise ValueError(f"on_gpus=True needs GPUs (under MPI one per rank and layout 'rows'), got gpus={gpus!r}, "
                         f"ranks={ranks}, layout={layout!r}")
    if on_gpus:
        storage = "full"
    v = np.dtype(dtype).itemsize
    dim = counts.dimension
    if ranks > 1:
        rows = dim / ranks
        stored = counts.nnz_full / ranks if layout == "rows" else counts.nnz_upper / ranks
        build_held = stored if layout == "rows" else counts.nnz_upper / max(1, int((8 * ranks + 1) ** 0.5 - 1) // 2)
        gathered = 2 * dim * block_size * v                     # the whole W and the product's input
    else:
        rows, stored, build_held, gathered = dim, counts.nnz(storage), counts.nnz(storage), 0
    upper = storage == "upper" and ranks == 1
    h = _csr_bytes(stored, rows, v)
    held_in_build = _csr_bytes(build_held, rows, v)
    # the threads' row blocks in flight come while the finished blocks pile up; the finished blocks and
    # their stacked copy make the other peak
    in_flight = min(n_threads, len(counts.blocks)) * counts.largest_block["upper" if upper else "full"]
    build = max(2 * held_in_build, held_in_build + in_flight * BUILD_BYTES_PER_ENTRY)
    vectors = _block_bytes(rows, nev, block_size, v) + gathered
    j2 = dim * max(1, n_particles) * J2_BYTES_PER_ENTRY + 3 * dim * nev * 8
    gpu = {}
    if on_gpus:        # each GPU its share of H and the fill's scratch; the host plans the rows, then <J^2>
        per = h / len(gpus) + fill_scratch_bytes()
        gpu = {g: per + (vectors if i == 0 else 2 * dim * block_size * v) for i, g in enumerate(gpus)}
        build = stored * PLAN_BYTES_PER_ENTRY
        host = max(build, j2)
    elif gpus:
        per = h * (2 if upper else 1) / len(gpus)      # upper storage: the rows and their transpose
        gpu = {g: per + (vectors if i == 0 else 2 * dim * block_size * v) for i, g in enumerate(gpus)}
        host = max(build, (3 if upper else 2) * h, h + j2)   # the host keeps H, cuts it for the GPUs, then <J^2>
    else:
        host = max(build, 2 * h + vectors, 2 * h + j2)        # the CPU product's row pieces copy H
    return MemoryEstimate(dim, host, gpu, h, stored, vectors,
                          {"build": build, "vectors": vectors, "j2": j2, "h": h})


def check_memory(estimate, *, advice, local_ranks=1, comm=None):
    """Refuse (hybridblas.InsufficientMemory) when the host (``local_ranks`` processes like this one on the
    node) or a GPU lacks the memory. Under MPI every rank checks its node and its GPU, and all refuse with
    the first refusal's message when any does, so no rank is left waiting in a collective."""
    failure = None
    try:
        hb.memory.require(estimate.host * local_ranks, where="host", advice=advice,
                          what=(f"{estimate.describe()}, on each of {local_ranks} ranks on this node,"
                                if local_ranks > 1 else estimate.describe()))
        for gpu, need in estimate.gpu.items():
            hb.memory.require(need, where=gpu, what=f"the share of {estimate.describe()} on GPU {gpu}",
                              advice=advice)
    except hb.InsufficientMemory as exc:
        failure = exc
    if comm is not None:
        messages = [m for m in comm.allgather(None if failure is None else str(failure)) if m]
        if messages and failure is None:
            failure = hb.InsufficientMemory(messages[0])
    if failure is not None:
        raise failure
