"""Compute one task's block of C from the normalised problem, on any backend.

A backend offers ``gemm(c, alpha, x, y, beta)`` and ``rank_k(kind, c, lower, alpha, factors, beta)`` on
column-major views of its own arrays, plus ``xp`` (numpy or cupy) for scratch. The host BLAS and each
CUDA device are backends, so tiles, diagonals and gemmt's recursion are written once.
"""
GEMMT_LEAF = 64   # gemmt diagonal blocks at most this size go through a small scratch gemm


def compute_block(backend, problem, task, out, beta, factors=None):
    """out <- sum_t coef_t op(X_t)[I, K] op(Y_t)[K, J] + beta * out, only the triangle on a diagonal block.

    ``out`` is the C block of the task (or a partial-sum buffer of that shape); ``factors`` lets a device
    pass its own copies of the operands (same ops, same index space), default the problem's.
    """
    factors = problem.factors if factors is None else factors
    terms = problem.terms(factors)
    i0, i1, j0, j1, k0, k1 = task.i0, task.i1, task.j0, task.j1, task.k0, task.k1
    if task.diag and problem.kind != "gemmt":
        blocks = [f.block(i0, i1, k0, k1) for f in factors]
        backend.rank_k(problem.kind, out, problem.lower, problem.alpha, blocks, beta)
    elif task.diag:
        _gemmt_diag(backend, problem, terms, i0, i1, k0, k1, out, beta)
    else:
        rect_block(backend, terms, i0, i1, j0, j1, k0, k1, out, beta)


def rect_block(backend, terms, i0, i1, j0, j1, k0, k1, out, beta):
    for coef, x, y in terms:
        backend.gemm(out, coef, x.block(i0, i1, k0, k1), y.block(k0, k1, j0, j1), beta)
        beta = 1.0


def _gemmt_diag(backend, problem, terms, i0, i1, k0, k1, out, beta):
    """Triangle of a square diagonal block from gemm panels: halve until small, then one scratch gemm."""
    size = i1 - i0
    if size <= GEMMT_LEAF:
        xp = backend.xp
        scratch = xp.zeros((size, size), dtype=out.dtype, order="F")
        rect_block(backend, terms, i0, i1, i0, i1, k0, k1, scratch, 0.0)
        rows, cols = (xp.tril_indices if problem.lower else xp.triu_indices)(size)
        if beta == 0:
            out[rows, cols] = scratch[rows, cols]
        else:
            out[rows, cols] = scratch[rows, cols] + beta * out[rows, cols]
        return
    h = size // 2
    _gemmt_diag(backend, problem, terms, i0, i0 + h, k0, k1, out[:h, :h], beta)
    _gemmt_diag(backend, problem, terms, i0 + h, i1, k0, k1, out[h:, h:], beta)
    if problem.lower:
        rect_block(backend, terms, i0 + h, i1, i0, i0 + h, k0, k1, out[h:, :h], beta)
    else:
        rect_block(backend, terms, i0, i0 + h, i0 + h, i1, k0, k1, out[:h, h:], beta)
