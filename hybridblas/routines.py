"""The public level-3 routines: validate, normalise, plan, run, return C where it lives.

The argument order is scipy.linalg.blas's (``herk(alpha, a, beta, c, trans, lower, overwrite_c)``), so
scipy's routines are drop-in references; the differences are listed in each routine's docstring and in
README.md ("Use").
"""
from typing import Any, Optional, Union

from . import problem as _p
from . import scheduler, triangle
from .context import Context, default_context

Array = Any                      # a numpy.ndarray (host) or cupy.ndarray (GPU); cupy is optional
Trans = Union[str, int]          # 'N', 'T', 'C' (either case) or scipy's 0, 1, 2
Lower = Union[bool, str, int]    # True/False, 'L'/'U', 'lower'/'upper', or scipy's 1/0

_HERK_TRANS = (_p.N, _p.C)
_SYRK_TRANS = (_p.N, _p.T)
_ALL_TRANS = (_p.N, _p.T, _p.C)


def _trans_for(kind, value):
    """The ops of a rank-k routine as a function of the data's dtype: herk/her2k take N or C (T too for
    real data), syrk/syr2k take N or T (C too for real data); ``kind`` names the routine in messages."""
    def ops(dtype):
        real = dtype.kind != "c"
        allowed = _ALL_TRANS if real else (_HERK_TRANS if kind.startswith("her") else _SYRK_TRANS)
        op = _p.parse_trans(value, "trans", allowed, f"{'real' if real else 'complex'} {kind}")
        if op != _p.N:                     # the second factor's transpose is the routine's own
            op = _p.C if kind.startswith("her") else _p.T
        return [op] * (2 if kind.endswith("2k") else 1)
    return ops


def _gemm_trans(kind, transa, transb, trans_a, trans_b):
    """transa/transb, or scipy's names for them (trans_a/trans_b); giving both spellings is refused."""
    ops = []
    for name, value, alias, alias_value in (("transa", transa, "trans_a", trans_a),
                                            ("transb", transb, "trans_b", trans_b)):
        if alias_value is not None:
            if not (isinstance(value, str) and value == "N"):
                raise TypeError(f"{kind} got both {name}={value!r} and {alias}={alias_value!r}: give one")
            name, value = alias, alias_value
        ops.append(_p.parse_trans(value, name, _ALL_TRANS, kind))
    return ops


def _context(context):
    if context is None:
        return default_context()
    if not isinstance(context, Context):
        raise TypeError(f"context must be a hybridblas.Context or None, got {context!r} ({type(context).__name__})")
    return context


def _call(kind, alpha, operands, beta, c, ops, lower, overwrite_c, context):
    """Check every argument, then run the call and return C (nothing is written before the checks)."""
    lower = _p.parse_lower(lower)
    overwrite_c = _p.parse_flag(overwrite_c, "overwrite_c")
    ctx = _context(context)
    prob = _p.build_problem(kind, alpha, operands, beta, c, ops, lower, None, overwrite_c=overwrite_c)
    ctx.check_open()
    if prob.m and prob.n:
        if prob.alpha == 0 or prob.k == 0:
            if prob.beta != 1:
                triangle.scale(prob)
        else:
            scheduler.execute(prob, ctx)
    if prob.writeback is not None:
        prob.writeback[...] = prob.c
    return prob.out


def herk(alpha: float, a: Array, beta: float = 0.0, c: Optional[Array] = None, trans: Trans = "N",
         lower: Lower = True, overwrite_c: Union[bool, int] = True, *, context: Optional[Context] = None) -> Array:
    """Hermitian rank-k update: one triangle of C <- alpha op(A) op(A)^H + beta C.

    trans='N': C <- alpha A A^H + beta C with A n x k; trans='C': C <- alpha A^H A + beta C with A k x n.

    Parameters
    ----------
    alpha, beta : float
        Real scalars (a complex value with a non-zero imaginary part is refused for complex data).
    a : numpy.ndarray or cupy.ndarray, shape (n, k) or (k, n)
        float32, float64, complex64 or complex128, any memory order or strides. Only read.
    c : numpy.ndarray or cupy.ndarray, shape (n, n), optional
        Same dtype and kind of array as ``a``. Only the ``lower`` (else upper) triangle is read and
        written; the other triangle is left exactly as it is. None: a new zero C (column-major), and
        ``beta`` is ignored.
    trans : {'N', 'C'} or {0, 2}
        'N'/0 or 'C'/2 (either case); for real data 'T'/1 is accepted too and means 'C'.
    lower : bool, 'L'/'U', 'lower'/'upper' or 1/0, default True
        Which triangle of C is computed.
    overwrite_c : bool or 1/0, default True
        True: a given ``c`` is updated in place and returned (BLAS's own contract). False: ``c`` is left
        untouched and a new array holding the result is returned.
    context : hybridblas.Context, optional
        Devices and strategy; the default context uses every CPU core and GPU.

    Returns
    -------
    numpy.ndarray or cupy.ndarray, shape (n, n)
        ``c`` itself (overwrite_c=True), its updated copy, or the new C; it lives where ``a`` lives. A new C
        is C-ordered when ``a`` is (then no conjugated copy of ``a`` is made), else Fortran-ordered.

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype (``c`` must be an array: lists and tuples are refused).
    ValueError
        Bad shapes or values; ``c`` read-only or sharing memory with ``a`` (unless overwrite_c=False).

    Notes
    -----
    The netlib reference contract: beta = 0 does not read C (NaN there is overwritten), the diagonal
    of the result is exactly real, and alpha = 0 or k = 0 with beta = 1 returns C untouched (netlib's
    quick return: the diagonal is not touched either). For real data herk is syrk.

    Differences from ``scipy.linalg.blas.zherk``/``cherk``:

    * ``lower`` defaults to True (the lower triangle); scipy's ``lower=0`` computes the upper one.
    * ``overwrite_c`` defaults to True: a given ``c`` is updated in place (scipy returns a new array
      by default, and copies even with ``overwrite_c=1`` when ``c`` is not Fortran-ordered).
    * ``c`` must be an array of exactly ``a``'s dtype and shape (scipy converts and casts); ``a``
      is never cast either, and real dtypes are accepted (scipy has no real herk).
    * ``c`` may not share memory with ``a`` unless overwrite_c=False.
    * ``trans`` and ``lower`` also take letters; host and GPU arrays of any size and layout (calls
      beyond BLAS's 32-bit integers are cut into several).
    """
    return _call("herk", alpha, [a], beta, c, _trans_for("herk", trans), lower, overwrite_c, context)


def her2k(alpha: complex, a: Array, b: Array, beta: float = 0.0, c: Optional[Array] = None, trans: Trans = "N",
          lower: Lower = True, overwrite_c: Union[bool, int] = True, *,
          context: Optional[Context] = None) -> Array:
    """Hermitian rank-2k update: one triangle of C <- alpha op(A) op(B)^H + conj(alpha) op(B) op(A)^H + beta C.

    trans='N': A, B are n x k (C <- alpha A B^H + conj(alpha) B A^H + beta C); trans='C': A, B are
    k x n (C <- alpha A^H B + conj(alpha) B^H A + beta C).

    Parameters
    ----------
    alpha : complex
        Complex for complex data (real for real data).
    a, b : numpy.ndarray or cupy.ndarray, same shape (n, k) or (k, n)
        One dtype (float32, float64, complex64, complex128), any memory order or strides; only read, and
        ``a`` and ``b`` may be the same array.
    beta : float
        Real (a complex value with a non-zero imaginary part is refused for complex data).
    c : numpy.ndarray or cupy.ndarray, shape (n, n), optional
        Same dtype as ``a``. Only the ``lower`` (else upper) triangle is read and written. None: a new
        zero C, ``beta`` ignored.
    trans : {'N', 'C'} or {0, 2}
        'N'/0 or 'C'/2 (either case); for real data 'T'/1 is accepted too and means 'C'.
    lower : bool, 'L'/'U', 'lower'/'upper' or 1/0, default True
        Which triangle of C is computed.
    overwrite_c : bool or 1/0, default True
        True: a given ``c`` is updated in place and returned. False: ``c`` is left untouched and a new
        array is returned.
    context : hybridblas.Context, optional
        Devices and strategy.

    Returns
    -------
    numpy.ndarray or cupy.ndarray, shape (n, n)
        ``c`` itself (overwrite_c=True), its updated copy, or the new C (C-ordered when ``a`` and ``b`` are,
        else Fortran-ordered).

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype (``c`` must be an array).
    ValueError
        Bad shapes or values; ``c`` read-only or sharing memory with ``a`` or ``b`` (unless
        overwrite_c=False).

    Notes
    -----
    beta = 0 does not read C; the diagonal of the result is exactly real; alpha = 0 or k = 0 with
    beta = 1 returns C untouched. For real data her2k is syr2k.

    Differences from ``scipy.linalg.blas.zher2k``/``cher2k``: ``lower`` defaults to True (scipy: upper);
    ``overwrite_c`` defaults to True (in place; scipy: a new array); ``c`` must be an array of exactly
    the operands' dtype and shape and ``a``, ``b`` must share one dtype (scipy casts); ``c`` may not
    share memory with ``a`` or ``b`` unless overwrite_c=False; letters for ``trans``/``lower``; host
    and GPU arrays of any size and layout.
    """
    return _call("her2k", alpha, [a, b], beta, c, _trans_for("her2k", trans), lower, overwrite_c, context)


def syrk(alpha: complex, a: Array, beta: complex = 0.0, c: Optional[Array] = None, trans: Trans = "N",
         lower: Lower = True, overwrite_c: Union[bool, int] = True, *, context: Optional[Context] = None) -> Array:
    """Symmetric rank-k update: one triangle of C <- alpha op(A) op(A)^T + beta C.

    trans='N': C <- alpha A A^T + beta C with A n x k; trans='T': C <- alpha A^T A + beta C with A k x n.
    Plain transposes, also for complex data (no conjugation).

    Parameters
    ----------
    alpha, beta : float or complex
        Complex only for complex data.
    a : numpy.ndarray or cupy.ndarray, shape (n, k) or (k, n)
        float32, float64, complex64 or complex128, any memory order or strides. Only read.
    c : numpy.ndarray or cupy.ndarray, shape (n, n), optional
        Same dtype as ``a``. Only the ``lower`` (else upper) triangle is read and written. None: a new
        zero C, ``beta`` ignored.
    trans : {'N', 'T'} or {0, 1}
        'N'/0 or 'T'/1 (either case); for real data 'C'/2 is accepted too and means 'T'.
    lower : bool, 'L'/'U', 'lower'/'upper' or 1/0, default True
        Which triangle of C is computed.
    overwrite_c : bool or 1/0, default True
        True: a given ``c`` is updated in place and returned. False: ``c`` is left untouched and a new
        array is returned.
    context : hybridblas.Context, optional
        Devices and strategy.

    Returns
    -------
    numpy.ndarray or cupy.ndarray, shape (n, n)
        ``c`` itself (overwrite_c=True), its updated copy, or the new C.

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype (``c`` must be an array).
    ValueError
        Bad shapes or values; ``c`` read-only or sharing memory with ``a`` (unless overwrite_c=False).

    Notes
    -----
    beta = 0 does not read C; alpha = 0 or k = 0 with beta = 1 returns C untouched.

    Differences from ``scipy.linalg.blas.?syrk``: ``lower`` defaults to True (scipy: upper);
    ``overwrite_c`` defaults to True (in place; scipy: a new array); ``c`` must be an array of exactly
    ``a``'s dtype and shape (scipy casts); ``c`` may not share memory with ``a`` unless
    overwrite_c=False; letters for ``trans``/``lower``; host and GPU arrays of any size and layout.
    """
    return _call("syrk", alpha, [a], beta, c, _trans_for("syrk", trans), lower, overwrite_c, context)


def syr2k(alpha: complex, a: Array, b: Array, beta: complex = 0.0, c: Optional[Array] = None, trans: Trans = "N",
          lower: Lower = True, overwrite_c: Union[bool, int] = True, *,
          context: Optional[Context] = None) -> Array:
    """Symmetric rank-2k update: one triangle of C <- alpha op(A) op(B)^T + alpha op(B) op(A)^T + beta C.

    trans='N': A, B are n x k (C <- alpha (A B^T + B A^T) + beta C); trans='T': A, B are k x n
    (C <- alpha (A^T B + B^T A) + beta C). Plain transposes, also for complex data.

    Parameters
    ----------
    alpha, beta : float or complex
        Complex only for complex data.
    a, b : numpy.ndarray or cupy.ndarray, same shape (n, k) or (k, n)
        One dtype, any memory order or strides; only read, and they may be the same array.
    c : numpy.ndarray or cupy.ndarray, shape (n, n), optional
        Same dtype as ``a``. Only the ``lower`` (else upper) triangle is read and written. None: a new
        zero C, ``beta`` ignored.
    trans : {'N', 'T'} or {0, 1}
        'N'/0 or 'T'/1 (either case); for real data 'C'/2 is accepted too and means 'T'.
    lower : bool, 'L'/'U', 'lower'/'upper' or 1/0, default True
        Which triangle of C is computed.
    overwrite_c : bool or 1/0, default True
        True: a given ``c`` is updated in place and returned. False: ``c`` is left untouched and a new
        array is returned.
    context : hybridblas.Context, optional
        Devices and strategy.

    Returns
    -------
    numpy.ndarray or cupy.ndarray, shape (n, n)
        ``c`` itself (overwrite_c=True), its updated copy, or the new C.

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype (``c`` must be an array).
    ValueError
        Bad shapes or values; ``c`` read-only or sharing memory with ``a`` or ``b`` (unless
        overwrite_c=False).

    Notes
    -----
    beta = 0 does not read C; alpha = 0 or k = 0 with beta = 1 returns C untouched.

    Differences from ``scipy.linalg.blas.?syr2k``: ``lower`` defaults to True (scipy: upper);
    ``overwrite_c`` defaults to True (in place; scipy: a new array); ``c`` must be an array of exactly
    the operands' dtype and shape and ``a``, ``b`` must share one dtype (scipy casts); ``c`` may not
    share memory with ``a`` or ``b`` unless overwrite_c=False; letters for ``trans``/``lower``; host and
    GPU arrays of any size and layout.
    """
    return _call("syr2k", alpha, [a, b], beta, c, _trans_for("syr2k", trans), lower, overwrite_c, context)


def gemmt(alpha: complex, a: Array, b: Array, beta: complex = 0.0, c: Optional[Array] = None,
          transa: Trans = "N", transb: Trans = "N", lower: Lower = True, overwrite_c: Union[bool, int] = True,
          *, trans_a: Optional[Trans] = None, trans_b: Optional[Trans] = None,
          context: Optional[Context] = None) -> Array:
    """Triangular matrix product: one triangle of C <- alpha op(A) op(B) + beta C, op in {N, T, C}.

    op(A) is n x k and op(B) is k x n; only the requested triangle is computed (BLAS extensions' gemmt,
    e.g. MKL's and OpenBLAS's), the product need not be symmetric.

    Parameters
    ----------
    alpha, beta : float or complex
        Complex only for complex data.
    a, b : numpy.ndarray or cupy.ndarray
        One dtype (float32, float64, complex64, complex128), any memory order or strides; only read, and
        they may be the same array.
    c : numpy.ndarray or cupy.ndarray, shape (n, n), optional
        Same dtype as ``a``. Only the ``lower`` (else upper) triangle is read and written. None: a new
        zero C, ``beta`` ignored.
    transa, transb : {'N', 'T', 'C'} or {0, 1, 2}
        op(A), op(B): as is, transposed, or conjugate-transposed. ``trans_a``/``trans_b`` are accepted
        as keyword aliases (scipy's gemm spelling); give one spelling or the other.
    lower : bool, 'L'/'U', 'lower'/'upper' or 1/0, default True
        Which triangle of C is computed.
    overwrite_c : bool or 1/0, default True
        True: a given ``c`` is updated in place and returned. False: ``c`` is left untouched and a new
        array is returned.
    context : hybridblas.Context, optional
        Devices and strategy.

    Returns
    -------
    numpy.ndarray or cupy.ndarray, shape (n, n)
        ``c`` itself (overwrite_c=True), its updated copy, or the new C.

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype (``c`` must be an array).
    ValueError
        Bad shapes or values; ``c`` read-only or sharing memory with ``a`` or ``b`` (unless
        overwrite_c=False).

    Notes
    -----
    beta = 0 does not read C; alpha = 0 or k = 0 with beta = 1 returns C untouched. scipy.linalg.blas
    has no gemmt; ``scipy.linalg.blas.?gemm`` gives its reference on the chosen triangle.
    """
    ops = _gemm_trans("gemmt", transa, transb, trans_a, trans_b)
    return _call("gemmt", alpha, [a, b], beta, c, ops, lower, overwrite_c, context)


def herkx(alpha: complex, a: Array, b: Array, beta: complex = 0.0, c: Optional[Array] = None, trans: Trans = "N",
          lower: Lower = True, overwrite_c: Union[bool, int] = True, *,
          context: Optional[Context] = None) -> Array:
    """cuBLAS's herkx: one triangle of C <- alpha op(A) op(B)^H + beta C, i.e. gemmt with transb = conj(transa).

    trans='N': A, B are n x k (C <- alpha A B^H + beta C); trans='C': A, B are k x n
    (C <- alpha A^H B + beta C). Meant for products known to be Hermitian (FLAPW's H += A^H X); computed
    exactly as gemmt, so the triangle holds the product as it is (the diagonal is not made real).

    Parameters
    ----------
    alpha : float or complex
    a, b : numpy.ndarray or cupy.ndarray, same shape (n, k) or (k, n)
        One dtype, any memory order or strides; only read.
    beta : float or complex
        cuBLAS's herkx takes a real beta; computed as gemmt, a complex one is applied as given.
    c : numpy.ndarray or cupy.ndarray, shape (n, n), optional
        Same dtype as ``a``. Only the ``lower`` (else upper) triangle is read and written.
    trans : {'N', 'C'} or {0, 2}
        'N'/0 or 'C'/2; for real data 'T'/1 is accepted too and means 'C'.
    lower : bool, 'L'/'U', 'lower'/'upper' or 1/0, default True
    overwrite_c : bool or 1/0, default True
        True: a given ``c`` is updated in place and returned. False: a new array is returned.
    context : hybridblas.Context, optional

    Returns
    -------
    numpy.ndarray or cupy.ndarray, shape (n, n)

    Raises
    ------
    TypeError, ValueError
        As for gemmt.

    Notes
    -----
    beta = 0 does not read C; alpha = 0 or k = 0 with beta = 1 returns C untouched. scipy.linalg.blas
    has no herkx.
    """
    def ops(dtype):
        real = dtype.kind != "c"
        op = _p.parse_trans(trans, "trans", _ALL_TRANS if real else _HERK_TRANS,
                            f"{'real' if real else 'complex'} herkx")
        return [op, _p.C if op == _p.N else _p.N]
    return _call("gemmt", alpha, [a, b], beta, c, ops, lower, overwrite_c, context)


def gemm(alpha: complex, a: Array, b: Array, beta: complex = 0.0, c: Optional[Array] = None,
         transa: Trans = "N", transb: Trans = "N", overwrite_c: Union[bool, int] = True, *,
         trans_a: Optional[Trans] = None, trans_b: Optional[Trans] = None,
         context: Optional[Context] = None) -> Array:
    """General matrix product: C <- alpha op(A) op(B) + beta C, op in {N, T, C}.

    op(A) is m x k and op(B) is k x n.

    Parameters
    ----------
    alpha, beta : float or complex
        Complex only for complex data.
    a, b : numpy.ndarray or cupy.ndarray
        One dtype (float32, float64, complex64, complex128), any memory order or strides; only read, and
        they may be the same array.
    c : numpy.ndarray or cupy.ndarray, shape (m, n), optional
        Same dtype as ``a``; all of it is read (unless beta = 0) and written. None: a new zero C,
        ``beta`` ignored.
    transa, transb : {'N', 'T', 'C'} or {0, 1, 2}
        op(A), op(B): as is, transposed, or conjugate-transposed. ``trans_a``/``trans_b`` (scipy's
        names) are accepted as keyword aliases; give one spelling or the other.
    overwrite_c : bool or 1/0, default True
        True: a given ``c`` is updated in place and returned. False: ``c`` is left untouched and a new
        array is returned.
    context : hybridblas.Context, optional
        Devices and strategy.

    Returns
    -------
    numpy.ndarray or cupy.ndarray, shape (m, n)
        ``c`` itself (overwrite_c=True), its updated copy, or the new C.

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype (``c`` must be an array); both transa and trans_a given.
    ValueError
        Bad shapes or values; ``c`` read-only or sharing memory with ``a`` or ``b`` (unless
        overwrite_c=False).

    Notes
    -----
    beta = 0 does not read C; alpha = 0 or k = 0 with beta = 1 returns C untouched.

    Differences from ``scipy.linalg.blas.?gemm``: ``overwrite_c`` defaults to True (in place; scipy: a new
    array); ``c`` must be an array of exactly the operands' dtype and shape and ``a``, ``b`` must share one
    dtype (scipy casts); ``c`` may not share memory with ``a`` or ``b`` unless overwrite_c=False; the
    trans keywords are also spelled transa/transb and take letters; host and GPU arrays of any size and
    layout.
    """
    ops = _gemm_trans("gemm", transa, transb, trans_a, trans_b)
    return _call("gemm", alpha, [a, b], beta, c, ops, True, overwrite_c, context)
