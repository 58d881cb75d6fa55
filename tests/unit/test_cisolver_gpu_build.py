"""The GPU build's host side, on numpy (cisolver.gpu_build): the rows cut into one range per device (equal
nonzeros, at group edges), each range filled by the array-generic fill into arrays of its own equals the
host build's rows byte for byte (full and upper, float64 and float32, several group sizes), and so does an MPI
rank's row range planned alone; the GPU's compaction route, the fit test, the memory estimate of a run whose
GPUs build H (one process, or each rank its rows), and DistributedOperator's checks of rows given on a GPU."""
import re
import types

import numpy as np
import pytest

from cisolver import estimate, gpu_build, gpu_fill
from cisolver.distributed import DistributedOperator, local_rows
from cisolver.gpu_spmm import MultiDeviceCsr
from cisolver.shellmodel import hamiltonian, rowblocks, snt
from ci_data import DATA, needs_data

pytestmark = needs_data


@pytest.fixture(scope="module")
def problems():
    """24Mg in usdb (4 protons, 4 neutrons) and 45V in kb3g (3 protons, 2 neutrons)."""
    return {name: hamiltonian.ShellModelProblem(snt.read_snt(DATA / f"{name}.snt"), z, n)
            for name, z, n in (("usdb", 4, 4), ("kb3g", 3, 2))}


def _filled_parts(problem, storage, dtype, group_entries, parts):
    """Each part's rows filled into arrays of its own (poisoned first), as a GPU fills them."""
    plans, indptr = problem.plan_rows(storage, n_threads=2)
    out = []
    for groups, r0, r1, s0, s1 in gpu_build.device_ranges(
            plans, hamiltonian.row_groups(plans, indptr, group_entries), parts):
        data, indices = np.full(s1 - s0, np.nan, dtype), np.full(s1 - s0, -1, np.int32)
        gpu_build.fill_range(plans, groups, s0, data, indices, types.SimpleNamespace())
        out.append((r0, r1, indptr[r0:r1 + 1] - s0, indices, data))
    return out


def _filled_planned_parts(problem, dtype, group_entries, parts, rows=None):
    """The parts of gpu_build.plan_parts (what build_rows_on_gpus fills), each filled apart on numpy."""
    plans, ranges, _ = gpu_build.plan_parts(problem, parts, n_threads=2, group_entries=group_entries, rows=rows)
    out = []
    for groups, r0, r1, s0, s1, indptr in ranges:
        data, indices = np.full(s1 - s0, np.nan, dtype), np.full(s1 - s0, -1, np.int32)
        gpu_build.fill_range(plans, groups, s0, data, indices, types.SimpleNamespace())
        out.append((r0, r1, indptr, indices, data))
    return out


def _rank(rank, size):
    """A stand-in communicator: what distributed.local_rows asks of one."""
    return types.SimpleNamespace(Get_rank=lambda: rank, Get_size=lambda: size)


@pytest.mark.parametrize("name", ["usdb", "kb3g"])
@pytest.mark.parametrize("storage", ["full", "upper"])
def test_ranges_filled_apart_are_the_host_rows(problems, name, storage):
    problem = problems[name]
    for dtype in (np.float64, np.float32):
        h = problem.build(storage, dtype=dtype, n_threads=2)[0]
        for group_entries, parts in ((5_000, 3), (300_000, 2), (1 << 24, 1), (1 << 24, 2)):
            got = (_filled_planned_parts(problem, dtype, group_entries, parts) if storage == "full"
                   else _filled_parts(problem, storage, dtype, group_entries, parts))
            assert got[0][0] == 0 and got[-1][1] == problem.dimension
            assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
            for r0, r1, ptr, indices, data in got:
                rows = h[r0:r1]
                assert np.array_equal(ptr, rows.indptr) and np.array_equal(indices, rows.indices)
                assert data.dtype == dtype and data.tobytes() == rows.data.tobytes(), (group_entries, parts, r0)


@pytest.mark.parametrize("name", ["usdb", "kb3g"])
@pytest.mark.parametrize("n_ranks", [2, 3])
def test_a_ranks_rows_filled_apart_are_its_host_rows(problems, name, n_ranks):
    """The rows of every MPI rank (distributed.local_rows, cut between proton determinants, inside blocks for
    3 ranks), planned alone and filled on one device or two, byte for byte the host build of those rows."""
    problem = problems[name]
    ranges = [local_rows(problem, _rank(r, n_ranks)) for r in range(n_ranks)]
    assert ranges[0][0] == 0 and ranges[-1][1] == problem.dimension and all(hi > lo for lo, hi in ranges)
    offsets = {b.offset for b in problem.basis.blocks}
    if n_ranks == 3:
        assert any(lo not in offsets for lo, _ in ranges[1:])        # a rank's rows start inside a block
    for dtype in (np.float64, np.float32):
        for lo, hi in ranges:
            h = problem.build("full", dtype=dtype, n_threads=2, rows=(lo, hi))[0]
            for group_entries, parts in ((5_000, 2), (1 << 24, 1)):
                got = _filled_planned_parts(problem, dtype, group_entries, parts, rows=(lo, hi))
                assert got[0][0] == lo and got[-1][1] == hi and all(a[1] == b[0] for a, b in zip(got, got[1:]))
                for r0, r1, ptr, indices, data in got:
                    rows = h[r0 - lo:r1 - lo]
                    assert ptr.dtype == np.int64 and np.array_equal(ptr, rows.indptr)
                    assert np.array_equal(indices, rows.indices)
                    assert data.dtype == dtype and data.tobytes() == rows.data.tobytes(), (lo, hi, parts, r0)
                    assert indices.max() >= hi or indices.min() < lo             # global columns


def test_an_empty_row_range_plans_an_empty_part(problems):
    problem = problems["kb3g"]
    lo = problem.basis.blocks[1].offset
    (groups, r0, r1, s0, s1, ptr), = gpu_build.plan_parts(problem, 1, n_threads=1, rows=(lo, lo))[1]
    assert (groups, r0, r1, s0, s1, ptr.tolist()) == ([], lo, lo, 0, 0, [0])


def test_distributed_operator_counts_its_rows_and_refuses_device_rows_it_cannot_use(problems, rng):
    problem = problems["kb3g"]
    lo, hi = local_rows(problem, _rank(1, 2))
    h = problem.build("full", rows=(lo, hi))[0]
    one_rank = types.SimpleNamespace(allgather=lambda x: [x])          # rank 0 of 1, given rows 0:hi - lo
    op = DistributedOperator(h, 0, hi - lo, problem.dimension, one_rank)
    assert op.nnz == h.nnz > 0 and op.h is h and op.gpu is None
    csr = (h.indptr, h.indices, h.data)            # numpy arrays stand in for CuPy ones: refused before any use
    with pytest.raises(ValueError, match=r"rows given as device arrays \(indptr, indices, data\) need their "
                                         r"device, got device=None"):
        DistributedOperator(csr, lo, hi, problem.dimension, one_rank)
    with pytest.raises(ValueError, match=rf"h_local holds {hi - lo} rows of float64, rows {lo}:{hi + 1} of "
                                         r"float64 asked"):
        DistributedOperator(csr, lo, hi + 1, problem.dimension, one_rank, device=0)
    with pytest.raises(ValueError, match=rf"h_local holds {hi - lo} rows of float64, rows {lo}:{hi} of "
                                         r"float32 asked"):
        DistributedOperator(csr, lo, hi, problem.dimension, one_rank, dtype=np.float32, device=0)


def test_device_ranges_share_the_nonzeros_at_group_edges(problems):
    problem = problems["usdb"]
    plans, indptr = problem.plan_rows("full", n_threads=2)
    nnz = int(indptr[-1])
    for group_entries in (20_000, 400_000):
        groups = hamiltonian.row_groups(plans, indptr, group_entries)
        starts = {g[5] for g in groups}
        largest = max(g[6] - g[5] for g in groups)
        for parts in (1, 2, 3):
            ranges = gpu_build.device_ranges(plans, groups, parts)
            assert len(ranges) == parts
            assert [g for rng in ranges for g in rng[0]] == groups             # every group once, in order
            assert ranges[0][1] == ranges[0][3] == 0 and ranges[-1][2] == problem.dimension
            assert ranges[-1][4] == nnz
            for (_, _, r1, _, s1), (_, r0, _, s0, _) in zip(ranges, ranges[1:]):
                assert (r1, s1) == (r0, s0) and s0 in starts
            for grp, r0, r1, s0, s1 in ranges:
                assert s0 == indptr[r0] and s1 == indptr[r1]
                assert abs((s1 - s0) - nnz / parts) <= largest               # equal shares, to one group
                assert grp and (grp[0][5], grp[-1][6]) == (s0, s1)


def test_a_device_gets_no_rows_when_there_are_few(tmp_path):
    """One proton in usdb at 2M = 5: a single row (the d5/2 m = 5/2 state), one group, three devices."""
    problem = hamiltonian.ShellModelProblem(snt.read_snt(DATA / "usdb.snt"), 1, 0, 5)
    assert problem.dimension == 1
    plans, indptr = problem.plan_rows("full")
    ranges = gpu_build.device_ranges(plans, hamiltonian.row_groups(plans, indptr, 1 << 24), 3)
    assert [(r0, r1, s0, s1) for _, r0, r1, s0, s1 in ranges] == [(0, 1, 0, 1), (1, 1, 1, 1), (1, 1, 1, 1)]
    assert ranges[1][0] == ranges[2][0] == []
    h = problem.build("full")[0]
    data, indices = np.full(0, np.nan), np.full(0, -1, np.int32)
    gpu_build.fill_range(plans, [], 1, data, indices, types.SimpleNamespace())        # nothing to do
    data, indices = np.full(1, np.nan), np.full(1, -1, np.int32)
    gpu_build.fill_range(plans, ranges[0][0], 0, data, indices, types.SimpleNamespace())
    assert indices.tolist() == [0] and data.tobytes() == h.data.tobytes()


def _emulated_kernel(name, grid, threads, args):
    """The kernels of cisolver.gpu_fill written out in numpy, entry by entry as the CUDA code does them."""
    if name == "fill_jump_grid":
        (ne, ns, e0, s0, q0, g0, ng, width, rank, ctarget, place, starget, lead, tab2, ld, ia, ib2, sign, csource,
         col_base, starts, val, col, keep) = args
        for i in range(int(ne * ns)):
            e, s = e0 + i // ns, s0 + i % ns
            at = width[e] * rank[s] + starts.ravel()[(ctarget[e] - q0) * ng + (starget[s] - g0)] + place[e]
            if not isinstance(lead, np.uint64):
                at += lead[s]
            v = tab2.ravel()[ia[s] * ld + ib2[e]] * sign[s]
            val[at], col[at] = v, csource[e] + col_base[s]
            if not isinstance(keep, np.uint64):
                keep[at] = v != 0
    elif name == "fill_own_column":
        (nq, ns, q0, s0, g0, ng, b, jumps_before, starget, rank, own_place, is_jump, base, sign, y, ld_y, column,
         col_base, starts, val, col, keep) = args
        for i in range(int(nq * ns)):
            ql, s = i // ns, s0 + i % ns
            q = q0 + ql
            at = b[q] * jumps_before[s] + starts.ravel()[ql * ng + (starget[s] - g0)] + rank[s] + own_place[q] * is_jump[s]
            val[at], col[at] = base[s] + sign[s] * y.ravel()[q * ld_y + column[s]], q + col_base[s]
            if not isinstance(keep, np.uint64):
                keep[at] = True
    elif name == "fill_own_piece":
        (ne, ngg, e0, g0, q0, ctarget, place, base, sign, column, y_n, ld_yn, is_own, diag, ld_diag, csource,
         col_base, starts, val, col, keep) = args
        for i in range(int(ne * ngg)):
            e, gl = e0 + i // ngg, i % ngg
            g, q = g0 + gl, ctarget[e]
            at = starts.ravel()[(q - q0) * ngg + gl] + place[e]
            v = diag.ravel()[q * ld_diag + g] if is_own[e] else base[e] + sign[e] * y_n.ravel()[column[e] * ld_yn + g]
            val[at], col[at] = v, csource[e] + col_base[g]
            if not isinstance(keep, np.uint64):
                keep[at] = True
    elif name == "keep_counts":
        n, keep, counts = args
        counts[:] = [keep[t * gpu_fill.TILE:min(n, (t + 1) * gpu_fill.TILE)].sum() for t in range(len(counts))]
    elif name == "keep_starts":
        nb, counts, starts = args
        starts[0], starts[1:] = 0, np.cumsum(counts[:nb])
    elif name == "keep_compact":
        n, keep, val, col, starts, limit, data, indices = args
        at = np.flatnonzero(keep[:n])
        data[:len(at)], indices[:len(at)] = val[at], col[at]
    else:
        raise AssertionError(name)


@pytest.mark.parametrize("case", ["usdb", "kb3g"])
def test_gpu_fill_plumbing_on_numpy_equals_the_host_rows(problems, case, monkeypatch):
    """cisolver.gpu_fill.fill_group with numpy standing in for CuPy and its kernels emulated entry by entry:
    every argument reaches its kernel with the dtype the kernel takes (checked), and the rows equal the host
    build's byte for byte, groups that drop zeros (compaction) and groups that do not."""
    monkeypatch.setattr(gpu_fill, "_kernel", lambda cupy, dtype, name, grid, threads, args:
                        _emulated_kernel(name, grid, threads, args))
    monkeypatch.setattr(gpu_fill, "TILE", 64)             # several compaction tiles in a small group
    fake = types.SimpleNamespace(asarray=np.asarray, empty=np.empty)
    problem = problems[case]
    h, _ = problem.build("full", np.float64, n_threads=1)
    plans, indptr = problem.plan_rows("full", n_threads=1)
    groups = hamiltonian.row_groups(plans, indptr, 3000)
    groups = groups[:12] + groups[len(groups) // 2:len(groups) // 2 + 6] + groups[-6:]    # first, middle, last blocks
    dropped = 0
    for i, g0, g1, q0, q1, s0, s1 in groups:
        block = plans[i].to_device(np)
        data, indices = np.full(s1 - s0, np.nan), np.full(s1 - s0, -1, np.int32)
        kept = gpu_fill.fill_group(fake, plans[i], block, g0, g1, q0, q1, data, indices, types.SimpleNamespace())
        dropped += kept is not None
        assert kept is None or int(kept[0]) == s1 - s0
        assert data.tobytes() == h.data[s0:s1].tobytes() and np.array_equal(indices, h.indices[s0:s1])
    assert dropped > 0                                    # groups that drop zeros went through the compaction


def test_packed_upload_gives_every_array_back():
    """RowBlock.to_device's one copy: every array (any dtype, shape, order, empty, repeated) comes back equal."""
    from cisolver.shellmodel.rowblocks import _upload_packed
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((3, 5)), np.arange(7, dtype=np.int32), np.array([True, False, True]),
              rng.standard_normal((4, 3)).T, np.zeros((0, 3)), np.arange(5, dtype=np.int64)]
    moved = _upload_packed(arrays + [arrays[0]], np)
    for a in arrays:
        b = moved[id(a)]
        assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)
        assert b.ctypes.data % 16 == moved[id(arrays[0])].ctypes.data % 16        # 16-byte aligned offsets


def test_a_miscounted_group_is_refused(problems):
    problem = problems["kb3g"]
    plans, indptr = problem.plan_rows("full", n_threads=2)
    groups = hamiltonian.row_groups(plans, indptr, 1 << 24)[:1]
    i, g0, g1, q0, q1, s0, s1 = groups[0]
    short = [(i, g0, g1, q0, q1, s0, s1 - 1)]         # one entry fewer than the rows hold
    data, indices = np.empty(s1 - s0 - 1), np.empty(s1 - s0 - 1, np.int32)
    with pytest.raises(RuntimeError, match="row count mismatch"):
        gpu_build.fill_range(plans, short, s0, data, indices, types.SimpleNamespace())


def test_fits_follows_the_free_memory_and_int32():
    n, nnz = 10 ** 6, 4 * 10 ** 8
    need = gpu_build.csr_bytes(n, gpu_build.part_entries(nnz, 2), 8)
    assert gpu_build.fits(n, nnz, 8, [2 * need, 2 * need])
    assert not gpu_build.fits(n, nnz, 8, [2 * need, need])              # one GPU short
    assert not gpu_build.fits(n, nnz, 8, [1.5 * need] * 2)              # the part fits, not with the fill's scratch
    assert gpu_build.fits(n, nnz, 4, [1.5 * need] * 2)                  # float32 values: less than float64's
    assert not gpu_build.fits(n, 2 ** 32, 4, [1e15])                    # one GPU's part beyond int32 indices
    assert gpu_build.fits(n, 2 ** 32, 4, [1e15] * 3)
    assert not gpu_build.fits(2 ** 31, 2 ** 31, 4, [1e15] * 8)           # columns beyond int32


def test_memory_estimate_of_a_gpu_build():
    """The host holds no H (only the plans, then <J^2>); each GPU its share of the full rows and the fill's
    scratch."""
    c = estimate.Counts(10 ** 6, 0, 4e8, {"full": 5e7, "upper": 3e7}, [(0, 1000, 1000)])
    kw = dict(nev=5, block_size=8, dtype=np.float64, storage="upper", gpus=(0, 1))
    host_path, on_gpus = estimate.memory(c, **kw), estimate.memory(c, **kw, on_gpus=True)
    assert on_gpus.nnz == c.nnz_full and on_gpus.host < host_path.host / 2
    assert on_gpus.host >= on_gpus.parts["j2"] and on_gpus.host >= c.nnz_full * estimate.PLAN_BYTES_PER_ENTRY
    share = on_gpus.h_bytes / 2 + gpu_build.fill_scratch_bytes()
    assert on_gpus.gpu[1] == pytest.approx(share + 2 * c.dimension * 8 * 8)
    assert on_gpus.gpu[0] == pytest.approx(share + on_gpus.vectors)
    refusal = r"on_gpus=True needs GPUs \(under MPI one per rank and layout 'rows'\), got gpus=%s, ranks=%d, layout=%s"
    for gpus, ranks, layout in (((), 1, "rows"), ((0, 1), 2, "rows"), ((0,), 3, "triangular")):
        with pytest.raises(ValueError, match=refusal % (re.escape(repr(gpus)), ranks, repr(layout))):
            estimate.memory(c, nev=5, block_size=8, dtype=np.float64, storage="full", gpus=gpus, ranks=ranks,
                            layout=layout, on_gpus=True)


def test_memory_estimate_of_a_rank_whose_gpu_builds_its_rows():
    """Under MPI: the rank's GPU holds its share of the full rows, the fill's scratch and the vectors (the
    gathered blocks included); its host the plans of its rows, then <J^2>, and no H."""
    c = estimate.Counts(10 ** 6, 0, 4e8, {"full": 5e7, "upper": 3e7}, [(0, 1000, 1000)])
    kw = dict(nev=5, block_size=8, dtype=np.float64, storage="upper", gpus=(1,), ranks=4, n_particles=8)
    host_path, on_gpu = estimate.memory(c, **kw), estimate.memory(c, **kw, on_gpus=True)
    assert on_gpu.nnz == host_path.nnz == c.nnz_full / 4 and on_gpu.h_bytes == host_path.h_bytes
    assert on_gpu.gpu[1] == pytest.approx(on_gpu.h_bytes + gpu_build.fill_scratch_bytes() + on_gpu.vectors)
    assert on_gpu.vectors >= 2 * c.dimension * 8 * 8                               # the gathered blocks
    assert on_gpu.host == max(c.nnz_full / 4 * estimate.PLAN_BYTES_PER_ENTRY, on_gpu.parts["j2"])
    assert on_gpu.host < host_path.host


def test_parts_that_do_not_tile_the_rows_are_refused():
    csr = (None, None, None)
    for ranges in ([(0, 5), (6, 10)], [(0, 5)], [(0, 7), (7, 5), (5, 10)], []):
        with pytest.raises(ValueError, match=r"parts must hold rows 0..10 in order, got the row ranges"):
            MultiDeviceCsr.from_parts([(d, r0, r1, csr) for d, (r0, r1) in enumerate(ranges)], 10, np.float64)


def test_int32_limit_is_refused_before_any_gpu_work(problems, monkeypatch):
    monkeypatch.setattr(gpu_build, "INT32_MAX", 1000)
    with pytest.raises(ValueError, match=r"rows 0:\d+ of H \(\d+ nonzeros, dimension \d+\) need more than the "
                                         r"int32 indices a GPU's rows hold; use more GPUs"):
        gpu_build.build_rows_on_gpus(problems["kb3g"], [0], np.float64, n_threads=1)
    with pytest.raises(TypeError, match="dtype must be float32 or float64, got int32"):
        gpu_build.build_rows_on_gpus(problems["kb3g"], [0], np.int32)
    with pytest.raises(ValueError, match="devices must name at least one GPU, got none"):
        gpu_build.build_rows_on_gpus(problems["kb3g"], [], np.float64)


def test_larger_groups_only_where_there_is_room(problems):
    """plan_parts takes the largest group size whose scratch fits beside every part, else the smallest."""
    problem = problems["kb3g"]
    asked = []

    def room(n_rows, nnz, scratch):
        asked.append(scratch)
        return scratch <= gpu_build.fill_scratch_bytes(gpu_build.GROUP_CHOICES[1])
    *_, entries = gpu_build.plan_parts(problem, 2, n_threads=1, room=room)
    assert entries == gpu_build.GROUP_CHOICES[1]
    assert gpu_build.fill_scratch_bytes(gpu_build.GROUP_CHOICES[0]) in asked
    *_, entries = gpu_build.plan_parts(problem, 2, n_threads=1, room=lambda *a: False)
    assert entries == gpu_build.GROUP_ENTRIES
    *_, entries = gpu_build.plan_parts(problem, 2, n_threads=1)
    assert entries == gpu_build.GROUP_ENTRIES


def test_build_rows_on_a_device_hands_back_the_gpu_part(problems, monkeypatch):
    """distributed.build_rows with a device takes the one part that build_rows_on_gpus returns for it."""
    from cisolver import distributed
    problem = problems["kb3g"]
    lo, hi = local_rows(problem, None)
    seen = {}

    def fake(prob, devices, dtype, n_threads=None, group_entries=None, rows=None):
        seen.update(devices=devices, rows=rows)
        return [(devices[0], rows[0], rows[1], ("indptr", "indices", "data"))], {"plans": 0.5, "fill": 0.25}
    monkeypatch.setattr(gpu_build, "build_rows_on_gpus", fake)
    h, stages = distributed.build_rows(problem, (lo, hi), np.float64, 1, device=1)
    assert h == ("indptr", "indices", "data") and seen == {"devices": [1], "rows": (lo, hi)}
    assert stages["fill"] == 0.25 and "basis" in stages
