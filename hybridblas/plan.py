"""Cut a normalised problem into tasks: blocks of C (and, for tall-skinny products, ranges of k).

A task names rows [i0, i1), columns [j0, j1) and inner range [k0, k1) of the normalised column-major
problem, with its LAWN 41 flop count. ``diag`` blocks sit on C's diagonal and update only the triangle;
``split`` tasks add into a per-device partial sum that is reduced at the end (split-K).
"""
import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Task:
    i0: int
    i1: int
    j0: int
    j1: int
    k0: int
    k1: int
    flops: float
    diag: bool = False
    split: bool = False


def make_task(problem, i0, i1, j0, j1, k0, k1, diag=False, split=False):
    flops = problem.tile_flops(i1 - i0, j1 - j0, k1 - k0, diag=diag)
    return Task(i0, i1, j0, j1, k0, k1, flops, diag, split)


def whole(problem):
    """The entire call as one task (one device, or a split-K slice of it)."""
    return make_task(problem, 0, problem.m, 0, problem.n, 0, problem.k, diag=problem.triangular)


def _edges(total, step):
    step = max(1, int(step))
    return list(range(0, total, step)) + [total]


def tiles(problem, nb, k_block=None):
    """All nb x nb blocks of C's triangle (or of all of C for gemm), each over k (or k chunks)."""
    out = []
    ks = _edges(problem.k, k_block) if k_block else [0, problem.k]
    split = len(ks) > 2
    rows, cols = _edges(problem.m, nb), _edges(problem.n, nb)
    for k0, k1 in zip(ks, ks[1:]):
        for bj, (j0, j1) in enumerate(zip(cols, cols[1:])):
            for bi, (i0, i1) in enumerate(zip(rows, rows[1:])):
                if problem.triangular and (bi < bj if problem.lower else bi > bj):
                    continue
                out.append(make_task(problem, i0, i1, j0, j1, k0, k1,
                                 diag=problem.triangular and bi == bj, split=split))
    return out


def k_chunks(problem, pieces):
    """The whole C over consecutive ranges of k, one per piece."""
    bounds = [round(problem.k * i / pieces) for i in range(pieces + 1)]
    return [make_task(problem, 0, problem.m, 0, problem.n, k0, k1, diag=problem.triangular, split=True)
            for k0, k1 in zip(bounds, bounds[1:]) if k1 > k0]


def band_edges(n, shares, triangular):
    """Boundaries of contiguous bands whose flops follow ``shares`` (the paper's n_g, generalised).

    For a triangle the work of the first g rows grows like g^2: g = n * sqrt(cumulative share).
    """
    total = sum(shares)
    edges, acc = [0], 0.0
    for s in shares[:-1]:
        acc += s / total
        g = n * (math.sqrt(acc) if triangular else acc)
        edges.append(min(n, max(edges[-1], int(round(g)))))
    edges.append(n)
    return edges


def band(problem, g0, g1):
    """Tasks of one band: rows [g0, g1) of a lower triangle (columns of an upper one), or of gemm's C."""
    if g1 <= g0:
        return []
    if not problem.triangular:
        return [make_task(problem, 0, problem.m, g0, g1, 0, problem.k)]
    out = [make_task(problem, g0, g1, g0, g1, 0, problem.k, diag=True)]
    if g0 > 0:
        rect = (g0, g1, 0, g0) if problem.lower else (0, g0, g0, g1)
        out.insert(0, make_task(problem, *rect, 0, problem.k))
    return out


def grid(lo, hi, nb):
    """Edges of [lo, hi) cut at the multiples of nb (the same grid for every device of a call)."""
    edges = [lo] + [x for x in range((lo // nb + 1) * nb, hi, nb)] + [hi]
    return list(zip(edges, edges[1:]))


def subtiles(problem, task, nb):
    """Tiles of ``task`` on the nb grid, row panel by row panel (so each row panel is reused in a row)."""
    out = []
    for i0, i1 in grid(task.i0, task.i1, nb):
        for j0, j1 in grid(task.j0, task.j1, nb):
            diag = task.diag and i0 == j0
            if task.diag and not diag and (i0 < j0 if problem.lower else i0 > j0):
                continue
            out.append(make_task(problem, i0, i1, j0, j1, task.k0, task.k1, diag=diag, split=task.split))
    return out


def split_task(problem, task):
    """Cut a task into about four smaller ones (the tail of the dynamic queue)."""
    if task.split or min(task.i1 - task.i0, task.j1 - task.j0) < 2:
        return [task]
    im = (task.i0 + task.i1) // 2
    jm = (task.j0 + task.j1) // 2
    if not task.diag:
        parts = [(a, b, c, d) for a, b in ((task.i0, im), (im, task.i1)) for c, d in ((task.j0, jm), (jm, task.j1))]
        return [make_task(problem, a, b, c, d, task.k0, task.k1) for a, b, c, d in parts]
    rect = (im, task.i1, task.i0, im) if problem.lower else (task.i0, im, im, task.i1)
    return [make_task(problem, *rect, task.k0, task.k1),
            make_task(problem, task.i0, im, task.i0, im, task.k0, task.k1, diag=True),
            make_task(problem, im, task.i1, im, task.i1, task.k0, task.k1, diag=True)]


def dynamic_order(problem, tasks, tail_fraction):
    """Big tasks first; the last ``tail_fraction`` of the flops cut smaller so devices finish together."""
    ordered = sorted(tasks, key=lambda t: -t.flops)
    total = sum(t.flops for t in ordered)
    head, acc = [], 0.0
    for idx, t in enumerate(ordered):
        if acc + t.flops > (1.0 - tail_fraction) * total and idx > 0:
            tail = [s for t2 in ordered[idx:] for s in split_task(problem, t2)]
            return head + sorted(tail, key=lambda t: -t.flops)
        head.append(t)
        acc += t.flops
    return head


def with_k(task, problem, k0, k1):
    return replace(task, k0=k0, k1=k1, flops=problem.tile_flops(task.i1 - task.i0, task.j1 - task.j0,
                                                                 k1 - k0, diag=task.diag))
