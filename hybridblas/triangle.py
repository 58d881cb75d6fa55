"""Whole-triangle updates done outside BLAS: beta-scaling (alpha = 0 or k = 0) and split-K reductions.

They walk C in column blocks so that no n x n mask is ever formed (a 24576^2 mask would be 600 MB).
"""
_NB = 512


def _blocks(n, lower, nb=_NB):
    """(rows, cols, diag) slices covering one triangle of an n x n matrix."""
    for j0 in range(0, n, nb):
        j1 = min(j0 + nb, n)
        yield slice(j0, j1), slice(j0, j1), True
        rest = slice(j1, n) if lower else slice(0, j0)
        if rest.stop > rest.start:
            yield rest, slice(j0, j1), False


def _assign(xp, view, diag, lower, value):
    if not diag:
        view[...] = value
        return
    rows, cols = (xp.tril_indices if lower else xp.triu_indices)(view.shape[0])
    view[rows, cols] = value[rows, cols]


def _blocks_of(problem):
    if problem.triangular:
        return _blocks(problem.m, problem.lower)
    return [(slice(0, problem.m), slice(j0, min(j0 + _NB, problem.n)), False)
            for j0 in range(0, problem.n, _NB)]


def scale(problem):
    """C[tri] <- beta C[tri] (beta = 0 writes zeros without reading C); real diagonal for herk/her2k."""
    xp, c, beta = problem.xp, problem.c, problem.beta
    for rows, cols, diag in _blocks_of(problem):
        view = c[rows, cols]
        new = xp.zeros_like(view) if beta == 0 else beta * view
        _assign(xp, view, diag, problem.lower, new)
    real_diagonal(problem)


def reduce_partials(problem, partials):
    """C[tri] <- beta C[tri] + sum of the devices' split-K partial sums, in a fixed order."""
    xp, c, beta = problem.xp, problem.c, problem.beta
    for rows, cols, diag in _blocks_of(problem):
        view = c[rows, cols]
        total = sum(xp.asarray(p[rows, cols]) for p in partials[1:])
        total = xp.asarray(partials[0][rows, cols]) + total
        if beta != 0:
            total = total + beta * view
        _assign(xp, view, diag, problem.lower, total)
    real_diagonal(problem)


def real_diagonal(problem):
    if problem.hermitian and problem.complex and problem.m:
        xp = problem.xp
        idx = xp.arange(problem.m)
        problem.c[idx, idx] = problem.c[idx, idx].real
