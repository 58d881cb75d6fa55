"""H's full rows built on the GPUs themselves: each GPU fills its own row range of H (both triangles) straight
into its CSR arrays, so that nothing is uploaded or transposed after the build.

The host plans the rows as its own build does (ShellModelProblem.plan_rows: every row's stored entries counted
from the jump lists and v̄'s pattern, the pieces of every row block), cuts them into groups of about
GROUP_ENTRIES stored entries (hamiltonian.row_groups) and the groups into one contiguous range per GPU of
about equal entries (``device_ranges``). Each GPU gets its CSR arrays, then, driven by a host thread of its own
while the others work, the pieces of the row blocks its range touches (rowblocks.RowBlock.to_device, one row
block at a time) and fills its groups with the host's element formulas in the host's order (``fill_range``), so
that its arrays equal the host build's rows bit for bit (tests/gpu/test_gpu_build.py checks that on GPUs). The
same works for a row range of H alone (``rows=``): under MPI each rank builds its own rows on its own GPU.
"""
import time
import types

import numpy as np

from hybridblas import workers

from .arrays import module_of
from .gpu_spmm import INT32_MAX, PEAK_FRACTION, RESERVE_FRACTION, balanced_bounds, csr_bytes, require_on_gpu
from .shellmodel import hamiltonian

# stored entries of a group of rows that a GPU fills at once: the largest that leaves room (fewer, larger groups
# cost less host time: 48Cr's fill is 89 groups of at most 2^24 entries, 34 of 2^26); GROUP_ENTRIES, the
# smallest, is what a build needs at least
GROUP_CHOICES = (1 << 26, 1 << 25, 1 << 24)
GROUP_ENTRIES = GROUP_CHOICES[-1]
# a group's scratch per stored entry: the fill's uncompacted values, columns, flags and the pieces' index
# arithmetic (their peak under numpy: 22 B for float64 with groups of 4M entries in gxpf1a 2+4, usdb 4+4, kb3g
# 3+2) and the GPU's compaction positions (24 B), rounded up
FILL_BYTES_PER_ENTRY = 64


def fill_scratch_bytes(group_entries=None):
    """The most a GPU's fill takes beside its CSR arrays: one group's scratch."""
    return (group_entries or GROUP_ENTRIES) * FILL_BYTES_PER_ENTRY


def part_entries(nnz, parts):
    """The most stored entries of ``nnz`` that one of ``parts`` GPUs gets: an equal share and one group more."""
    return -(-int(nnz) // parts) + GROUP_ENTRIES


def fits(n, nnz, itemsize, free):
    """Whether GPUs with ``free`` bytes each can build and keep the full rows of H (n x n, ``nnz`` stored
    entries, e.g. the structural count): int32 indices, each GPU's part at most 1 - RESERVE_FRACTION of its free
    memory and, with the fill's scratch, at most PEAK_FRACTION (the fractions of gpu_spmm.choose_storage)."""
    per = part_entries(nnz, len(free))
    part = csr_bytes(n, per, itemsize)
    return (max(n, per) <= INT32_MAX and all(part <= (1 - RESERVE_FRACTION) * f
                                             and part + fill_scratch_bytes() <= PEAK_FRACTION * f for f in free))


def device_ranges(plans, groups, parts):
    """``groups`` (hamiltonian.row_groups over ``plans``, in row order) cut at group edges into ``parts``
    contiguous runs of about equal stored entries: [(its groups, r0, r1, s0, s1)] per part, with rows r0:r1 and
    entries s0:s1 of the whole; a part may get none (r0 == r1)."""
    row0 = np.cumsum([0] + [pl.counts.size for pl in plans])
    rows = [int(row0[i]) + g0 * plans[i].shape[1] + q0 for i, g0, _, q0, _, _, _ in groups] + [int(row0[-1])]
    starts = [g[5] for g in groups] + [groups[-1][6] if groups else 0]
    bounds = balanced_bounds(starts, parts)
    return [(groups[a:b], rows[a], rows[b], starts[a], starts[b]) for a, b in zip(bounds[:-1], bounds[1:])]


def fill_range(plans, groups, s0, data, indices, scratch):
    """Fill ``groups`` (entries s0.. of the whole onwards) into ``data`` / ``indices``, their stored entries as
    numpy arrays (RowBlock.fill) or CuPy arrays on the current GPU (cisolver.gpu_fill's kernels); each row block's
    pieces go to the GPU once, as its first group comes. ``scratch``: an object whose buffers the groups share.
    RuntimeError where a group kept other entries than counted (on a GPU checked once, after the last group)."""
    if module_of(data) is np:
        for i, g0, g1, q0, q1, a, b in groups:
            plans[i].fill(g0, g1, q0, q1, data[a - s0:b - s0], indices[a - s0:b - s0], scratch)
        return
    import cupy
    from . import gpu_fill
    current, block, checks = None, None, []
    for i, g0, g1, q0, q1, a, b in groups:
        if i != current:
            current, block = i, plans[i].to_device(cupy)
        kept = gpu_fill.fill_group(cupy, plans[i], block, g0, g1, q0, q1, data[a - s0:b - s0],
                                   indices[a - s0:b - s0], scratch)
        if kept is not None:
            checks.append((kept, b - a))
    wrong = sum(abs(int(kept.get()[0]) - n) for kept, n in checks)
    if wrong:
        raise RuntimeError(f"row count mismatch in the Hamiltonian's rows built on a GPU: {wrong} entries "
                           "more or fewer than counted")


def plan_parts(problem, parts, n_threads=None, group_entries=None, rows=None, room=None):
    """The host's plan of ``problem``'s full rows ``rows`` = (lo, hi) (default: all; ends between proton
    determinants, as ShellModelProblem.build takes them) cut into ``parts`` device ranges: (plans, [(groups,
    r0, r1, s0, s1, indptr)], group_entries) with rows r0:r1 of H, entries s0:s1 of the rows asked for and the
    part's int64 indptr from 0. group_entries None: the largest of GROUP_CHOICES for which ``room(rows,
    entries, scratch bytes)`` holds for every part (without ``room``: GROUP_ENTRIES). Raises ValueError where a
    part needs more than int32 indices."""
    plans, indptr = problem.plan_rows("full", n_threads, rows=rows)
    lo, n = (0 if rows is None else int(rows[0])), problem.dimension

    def cut(entries):
        out = []
        for groups, r0, r1, s0, s1 in device_ranges(plans, hamiltonian.row_groups(plans, indptr, entries), parts):
            if max(s1 - s0, n) > INT32_MAX:
                raise ValueError(f"rows {lo + r0}:{lo + r1} of H ({s1 - s0} nonzeros, dimension {n}) need more "
                                 f"than the int32 indices a GPU's rows hold; use more GPUs")
            out.append((groups, lo + r0, lo + r1, s0, s1, indptr[r0:r1 + 1] - s0))
        return out
    ranges = cut(group_entries or GROUP_ENTRIES)
    if group_entries is None and room is not None:      # larger groups where the GPUs have room for their scratch
        for entries in GROUP_CHOICES[:-1]:
            if all(room(r1 - r0, s1 - s0, fill_scratch_bytes(entries)) for _, r0, r1, s0, s1, _ in ranges):
                return plans, cut(entries), entries
    return plans, ranges, group_entries or GROUP_ENTRIES


def build_rows_on_gpus(problem, devices, dtype, n_threads=None, group_entries=None, rows=None):
    """The full rows of ``problem``'s H (a ShellModelProblem) built on ``devices`` (CUDA ids, a contiguous row
    range of about equal nonzeros each, the first rows on the first): ([(device, r0, r1, (indptr, indices,
    data))], seconds), CuPy arrays on that device (int32 indptr from 0 and indices, values in ``dtype``: rows
    r0:r1 of ``problem.build("full", dtype)``, bit for bit), and the stage times ("plans": the host's counts and
    pieces on ``n_threads`` threads, "allocation", "fill": the GPUs at once). rows: (lo, hi), only those rows
    (their ends between proton determinants; an MPI rank's, cisolver.distributed.local_rows), the parts then
    holding ``problem.build("full", dtype, rows=(lo, hi))``'s rows with global column indices. group_entries:
    stored entries of a group filled at once (default: the largest of GROUP_CHOICES that leaves room). Raises ValueError where a GPU's part
    needs more than int32 indices and hybridblas.InsufficientMemory where it does not fit, before anything is
    filled."""
    from hybridblas import memory
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    devices = list(devices)
    if not devices:
        raise ValueError("devices must name at least one GPU, got none")
    t0 = time.perf_counter()
    free = []

    def room(n_rows, nnz, scratch):              # asked only once the int32 checks have passed
        if not free:
            free.append(min(memory.gpu_free(d) for d in devices))
        return csr_bytes(n_rows, nnz, dtype.itemsize) + scratch <= PEAK_FRACTION * free[0]
    plans, ranges, group_entries = plan_parts(problem, len(devices), n_threads, group_entries, rows, room=room)
    for dev, (_, r0, r1, s0, s1, _) in zip(devices, ranges):
        require_on_gpu(csr_bytes(r1 - r0, s1 - s0, dtype.itemsize) + fill_scratch_bytes(group_entries), dev,
                       f"rows {r0}:{r1} of H built on GPU {dev}")
    t1 = time.perf_counter()
    import cupy
    arrays = []
    for dev, (_, _, _, s0, s1, indptr) in zip(devices, ranges):
        with cupy.cuda.Device(dev):
            arrays.append((cupy.asarray(indptr.astype(np.int32)), cupy.empty(s1 - s0, np.int32),
                           cupy.empty(s1 - s0, dtype)))
    t2 = time.perf_counter()

    def fill(dev, rng, csr):
        with cupy.cuda.Device(dev):
            fill_range(plans, rng[0], rng[3], csr[2], csr[1], types.SimpleNamespace())

    workers.map(lambda job: fill(*job), list(zip(devices, ranges, arrays)), len(devices))
    t3 = time.perf_counter()
    parts = [(dev, r0, r1, csr) for dev, (_, r0, r1, _, _, _), csr in zip(devices, ranges, arrays)]
    return parts, {"plans": t1 - t0, "allocation": t2 - t1, "fill": t3 - t2}
