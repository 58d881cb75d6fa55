"""The public level-3 routines: validate, normalise, plan, run, return C where it lives."""
from . import problem as _p
from . import scheduler, triangle
from .context import Context, default_context

_HERK_TRANS = (_p.N, _p.C)
_SYRK_TRANS = (_p.N, _p.T)
_ALL_TRANS = (_p.N, _p.T, _p.C)


def _trans_for(kind, value, a):
    """herk/her2k take N or C (T too for real data); syrk/syr2k take N or T (C too for real data)."""
    real = getattr(a, "dtype", None) is not None and a.dtype.kind != "c"
    allowed = _ALL_TRANS if real else (_HERK_TRANS if kind.startswith("her") else _SYRK_TRANS)
    return _p.parse_trans(value, "trans", allowed)


def _context(context):
    if context is None:
        return default_context()
    if not isinstance(context, Context):
        raise TypeError(f"context must be a hybridblas.Context or None, got {type(context).__name__}")
    return context


def _run(prob, c, context):
    ctx = _context(context)
    result = c if c is not None else prob.c     # a new C is allocated column-major
    if prob.m and prob.n:
        if prob.alpha == 0 or prob.k == 0:
            if prob.beta != 1:
                triangle.scale(prob)
        else:
            scheduler.execute(prob, ctx)
    if prob.writeback is not None:
        prob.writeback[...] = prob.c
    return result


def herk(alpha, a, beta=0.0, c=None, *, trans="N", lower=True, context=None):
    """C <- alpha A A^H + beta C (trans='N', A n x k) or alpha A^H A + beta C (trans='C', A k x n).

    alpha and beta are real; only the ``lower`` (else upper) triangle of C is read and written.
    """
    op = _trans_for("herk", trans, a)
    ops = [_p.N if op == _p.N else _p.C]
    prob = _p.build_problem("herk", alpha, [a], beta, c, ops, bool(lower), None)
    return _run(prob, c, context)


def her2k(alpha, a, b, beta=0.0, c=None, *, trans="N", lower=True, context=None):
    """C <- alpha A B^H + conj(alpha) B A^H + beta C (or the A^H B form); beta real."""
    op = _trans_for("her2k", trans, a)
    op = _p.N if op == _p.N else _p.C
    prob = _p.build_problem("her2k", alpha, [a, b], beta, c, [op, op], bool(lower), None)
    return _run(prob, c, context)


def syrk(alpha, a, beta=0.0, c=None, *, trans="N", lower=True, context=None):
    """C <- alpha A A^T + beta C (or alpha A^T A + beta C): plain transposes, also for complex data."""
    op = _trans_for("syrk", trans, a)
    ops = [_p.N if op == _p.N else _p.T]
    prob = _p.build_problem("syrk", alpha, [a], beta, c, ops, bool(lower), None)
    return _run(prob, c, context)


def syr2k(alpha, a, b, beta=0.0, c=None, *, trans="N", lower=True, context=None):
    """C <- alpha A B^T + alpha B A^T + beta C (or the A^T B form)."""
    op = _trans_for("syr2k", trans, a)
    op = _p.N if op == _p.N else _p.T
    prob = _p.build_problem("syr2k", alpha, [a, b], beta, c, [op, op], bool(lower), None)
    return _run(prob, c, context)


def gemmt(alpha, a, b, beta=0.0, c=None, *, transa="N", transb="N", lower=True, context=None):
    """C[tri] <- alpha op(A) op(B) + beta C[tri], op in {N, T, C}: only one triangle is computed."""
    ops = [_p.parse_trans(transa, "transa", _ALL_TRANS), _p.parse_trans(transb, "transb", _ALL_TRANS)]
    prob = _p.build_problem("gemmt", alpha, [a, b], beta, c, ops, bool(lower), None)
    return _run(prob, c, context)


def herkx(alpha, a, b, beta=0.0, c=None, *, trans="N", lower=True, context=None):
    """cuBLAS's herkx: C[tri] <- alpha op(A) op(B)^H + beta C[tri], i.e. gemmt with transb = conj(transa).

    Meant for products known to be Hermitian (FLAPW's H += A^H X); computed exactly as gemmt.
    """
    op = _trans_for("herk", trans, a)
    opb = _p.C if op == _p.N else _p.N
    return gemmt(alpha, a, b, beta, c, transa=_p.OP_CHAR[op], transb=_p.OP_CHAR[opb], lower=lower,
                 context=context)


def gemm(alpha, a, b, beta=0.0, c=None, *, transa="N", transb="N", context=None):
    """C <- alpha op(A) op(B) + beta C, op in {N, T, C}."""
    ops = [_p.parse_trans(transa, "transa", _ALL_TRANS), _p.parse_trans(transb, "transb", _ALL_TRANS)]
    prob = _p.build_problem("gemm", alpha, [a, b], beta, c, ops, True, None)
    return _run(prob, c, context)
