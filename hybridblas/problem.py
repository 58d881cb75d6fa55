"""Validate a user call and normalise it into one column-major problem.

Every routine becomes   C[tri] <- sum_t coef_t * op(X_t) * op(Y_t) + beta * C[tri]
with C a column-major (BLAS) view and each X, Y an ``Operand``: a column-major base array and an op.
Ops are two bits, transpose (1) and conjugate (2), so composing two ops is an XOR:

    N = 0   x          T = 1   x^T          R = 2   conj(x)          C = 3   x^H

Row-major arrays are the transposes of column-major ones, and a row-major C is handled by transposing the
whole equation (lower <-> upper), so no operand is copied unless its layout cannot be described to BLAS
(neither stride is one, negative strides) or it would need a conjugate without a transpose, which BLAS
cannot express.
"""
from dataclasses import dataclass, field
from numbers import Integral, Number

import numpy as np

N, T, R, C = 0, 1, 2, 3
OP_CHAR = {N: "N", T: "T", C: "C"}
_TRANS_LETTERS = {"N": N, "T": T, "C": C}
_TRANS_CODES = {0: N, 1: T, 2: C}            # scipy.linalg.blas's trans integers
_OP_CODE = {op: code for code, op in _TRANS_CODES.items()}
_UPLO_WORDS = {"l": True, "lower": True, "u": False, "upper": False}

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64),
                    np.dtype(np.complex64), np.dtype(np.complex128))

_EXACT_OVERLAP_WORK = 1 << 20       # numpy's overlap solver effort; beyond it an overlap is assumed
_CUPY_EXACT_OVERLAP = 1 << 22       # cupy decides exactly by sorting every element's address: small arrays only


def array_module(x, name="x"):
    """The array module of ``x``: numpy for a numpy array, cupy for a cupy array (CuPy is imported only when
    such an array is passed), so one code path serves host and GPU data. TypeError for anything else, naming
    the argument as ``name``."""
    if isinstance(x, np.ndarray):
        return np
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        import cupy
        return cupy
    raise TypeError(f"{name} must be a numpy or cupy array, got {type(x).__name__} {x!r:.60}")


def _is_integer(value):
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def _either(words):
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def parse_trans(value, name, allowed, routine=None):
    """Map 'N'/'T'/'C' (either case) or scipy's 0/1/2 to an op code legal for the routine (``allowed``);
    anything else is refused with what ``routine`` (e.g. "complex herk") accepts."""
    op = None
    if isinstance(value, str):
        op = _TRANS_LETTERS.get(value.upper())
    elif _is_integer(value):
        op = _TRANS_CODES.get(int(value))
    if op is None or op not in allowed:
        letters = _either([repr(OP_CHAR[o]) for o in allowed])
        codes = _either([str(_OP_CODE[o]) for o in allowed])
        where = f" for {routine}" if routine else ""
        raise ValueError(f"{name} must be {letters} ({codes}){where}, got {value!r}")
    return op


def parse_lower(value):
    """The triangle flag: a bool, 'L'/'U' or 'lower'/'upper' (any case), or scipy's 1/0."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str) and value.lower() in _UPLO_WORDS:
        return _UPLO_WORDS[value.lower()]
    if _is_integer(value) and int(value) in (0, 1):
        return bool(value)
    raise ValueError(f"lower must be True/False, 'L'/'U' ('lower'/'upper') or 1/0, got {value!r}")


def parse_flag(value, name):
    """A yes/no argument: a bool or scipy's 0/1."""
    if isinstance(value, (bool, np.bool_)) or (_is_integer(value) and int(value) in (0, 1)):
        return bool(value)
    raise ValueError(f"{name} must be True/False (or 1/0), got {value!r}")


def _overlap(xp, x, y):
    """None when x and y share no memory, else how sure that is: "shares" or "may share" (an exact
    answer would cost too much, so the overlap is assumed)."""
    if not xp.may_share_memory(x, y):          # address bounds only: cheap
        return None
    if xp is np:
        try:
            return "shares" if np.shares_memory(x, y, max_work=_EXACT_OVERLAP_WORK) else None
        except getattr(np, "exceptions", np).TooHardError:
            return "may share"
    if x.size + y.size <= _CUPY_EXACT_OVERLAP:
        return "shares" if xp.shares_memory(x, y) else None
    return "may share"


@dataclass
class Operand:
    """op(base) where base is column-major: unit stride along axis 0 (or a single row)."""
    base: object
    op: int
    scratch: bool = False     # base is a copy made for this call, not the caller's memory

    @property
    def trans(self):
        return bool(self.op & T)

    @property
    def rows(self):   # rows of op(base)
        return self.base.shape[1] if self.trans else self.base.shape[0]

    @property
    def cols(self):
        return self.base.shape[0] if self.trans else self.base.shape[1]

    def with_op(self, op):
        return Operand(self.base, op, self.scratch)

    def block(self, r0, r1, c0, c1):
        """The base view whose op is op(base)[r0:r1, c0:c1]."""
        if self.trans:
            return Operand(self.base[c0:c1, r0:r1], self.op, self.scratch)
        return Operand(self.base[r0:r1, c0:c1], self.op, self.scratch)


def k_axis(kind, f, op):
    """Axis of factor f's column-major base that runs along the inner dimension k: the left factor's
    op(X) is m x k, the right one's (gemm/gemmt factor 1) op(Y) is k x n."""
    right = kind in ("gemm", "gemmt") and f == 1
    return 0 if bool(op & T) != right else 1


def is_column_major(x):
    """True when BLAS can read x as a column-major matrix with a leading dimension."""
    rows, cols = x.shape
    item = x.dtype.itemsize
    s0, s1 = x.strides
    if rows > 1 and s0 != item:
        return False
    if cols > 1 and (s1 < item * max(rows, 1) or s1 % item):
        return False
    return True


def leading_dim(x):
    rows, cols = x.shape
    if cols > 1:
        return x.strides[1] // x.dtype.itemsize
    return max(rows, 1)


def to_column_major(x, op, xp):
    """Describe op(x) through a column-major base, copying only when no stride trick exists."""
    if is_column_major(x):
        return Operand(x, op)
    if is_column_major(x.T):
        return Operand(x.T, op ^ T)
    return Operand(xp.asfortranarray(x), op, scratch=True)


PARALLEL_CONJ_BYTES = 32 << 20     # host conjugated copies from this size are split over the cores


def without_lone_conj(operand, xp, allowed):
    """Copy conj(base) when the op is outside ``allowed`` (BLAS has no conjugate-only op)."""
    if operand.op in allowed:
        return operand
    return Operand(conj_copy(operand.base, xp), operand.op ^ R, scratch=True)


def conj_copy(base, xp):
    """conj(base) as a new column-major array. A large host array is copied by column ranges on every core
    (one thread moves 5-10 GB/s, far below the memory's bandwidth: a 4 GiB operand took over a second)."""
    if xp is not np or base.nbytes < PARALLEL_CONJ_BYTES or base.ndim != 2 or base.shape[1] < 2:
        return xp.asfortranarray(xp.conj(base))
    from . import workers
    from .blas_threads import available_cores
    out = np.empty(base.shape, dtype=base.dtype, order="F")
    parts = min(base.shape[1], available_cores(), 32)
    edges = [base.shape[1] * p // parts for p in range(parts + 1)]
    workers.map(lambda edge: np.conjugate(base[:, edge[0]:edge[1]], out=out[:, edge[0]:edge[1]]),
                list(zip(edges, edges[1:])), parts)
    return out


def product_terms(kind, alpha, factors):
    """[(coef, X, Y)] with C += coef * op(X) op(Y) for one routine ``kind`` on Operands ``factors``.

    herk/syrk: [L]; her2k/syr2k: [L1, L2]; gemmt/gemm: [left, right]; herkx/syrkx (cuBLAS): [A, B] with
    C = alpha op(A) op(B)^H (^T).
    """
    if kind == "herk":
        (l,) = factors
        return [(alpha, l, l.with_op(l.op ^ C))]
    if kind == "her2k":
        l1, l2 = factors
        return [(alpha, l1, l2.with_op(l2.op ^ C)), (np.conj(alpha), l2, l1.with_op(l1.op ^ C))]
    if kind == "syrk":
        (l,) = factors
        return [(alpha, l, l.with_op(l.op ^ T))]
    if kind == "syr2k":
        l1, l2 = factors
        return [(alpha, l1, l2.with_op(l2.op ^ T)), (alpha, l2, l1.with_op(l1.op ^ T))]
    if kind in ("herkx", "syrkx"):
        left, right = factors
        return [(alpha, left, right.with_op(right.op ^ (C if kind == "herkx" else T)))]
    left, right = factors
    return [(alpha, left, right)]


@dataclass
class RunOptions:
    """What the scheduler tells the devices about one call, beside the call itself."""
    cancel: object = None            # threading.Event set when the call is abandoned (an error, an interrupt)
    memory_limit: int = None         # bytes a GPU may use for this call (the Context's cap), None: its free memory
    pin_host: object = False         # page-lock host operands: False, True, or "auto" (from the second sighting)
    rates: dict = field(default_factory=dict)         # device name -> expected flop/s
    caller_events: tuple = ()        # events on the caller's streams that the GPUs' work must follow
    call: object = field(default_factory=object)      # one token for the call, shared by its GPUs
    emulation: int = None            # bits kept per row and column by INT8-emulated FP64 tiles; None: native
    bands: tuple = None              # (device names, rates, layout, shared, speeds, mixes) that
                                     # devices.cuda_bands.applies() chose the band path with, for its run() on the
                                     # same devices and rates


@dataclass
class Problem:
    """One normalised level-3 call; the planner, schedulers and devices read only this."""
    kind: str            # herk her2k syrk syr2k gemmt gemm
    c: object            # column-major view of the result (caller's array or a working copy)
    lower: bool          # triangle of ``c`` (ignored for gemm)
    alpha: Number
    beta: Number
    factors: list        # herk/syrk: [L]; her2k/syr2k: [L1, L2]; gemmt/gemm: [left, right]
    m: int               # rows of C
    n: int               # cols of C
    k: int               # inner dimension
    xp: object = np      # C's module: numpy or cupy (the operands' too, unless operand_xp says otherwise)
    writeback: object = None   # caller's array when ``c`` is a working copy
    out: object = None         # the array the routine returns (the caller's c, its copy, or a new C)
    run: RunOptions = field(default_factory=RunOptions)
    operand_xp: object = None  # the operands' module where it is not C's (cupy operands, numpy C), else None

    @property
    def fxp(self):
        """The operands' array module (numpy or cupy): ``xp`` unless the operands live on a GPU and C on the host."""
        return self.xp if self.operand_xp is None else self.operand_xp

    @property
    def dtype(self):
        return self.c.dtype

    @property
    def complex(self):
        return self.c.dtype.kind == "c"

    @property
    def triangular(self):
        return self.kind != "gemm"

    @property
    def hermitian(self):
        return self.kind in ("herk", "her2k")

    def terms(self, factors=None):
        """[(coef, X, Y)] with C += coef * op(X) op(Y): the same list serves every tile.

        ``factors`` replaces the problem's own (a device's copies of them, same ops and index space).
        """
        return product_terms(self.kind, self.alpha, self.factors if factors is None else factors)

    def tile_flops(self, rows, cols, k, diag=False):
        """LAWN 41 flop count of one C block (a diagonal block counts its triangle only)."""
        per = 8 if self.complex else 2          # one complex multiply-add = 4 real ones
        n_terms = 2 if self.kind in ("her2k", "syr2k") else 1
        entries = rows * (rows + 1) / 2 if diag else rows * cols
        return per * n_terms * entries * k

    def flops(self):
        return self.tile_flops(self.m, self.n, self.k, diag=self.triangular)


def _check_array(x, name):
    if x is None:
        raise TypeError(f"{name} must be an array, got None")
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        x = np.asarray(x)
    xp = array_module(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got {x.ndim}-D array of shape {x.shape}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; supported: float32, float64, complex64, complex128")
    return x, xp


def _check_scalar(value, name, dtype, real_only):
    if not isinstance(value, Number) and not (hasattr(value, "shape") and value.shape == ()):
        raise TypeError(f"{name} must be a scalar, got {value!r:.60} ({type(value).__name__})")
    try:
        value = complex(value) if np.iscomplexobj(value) else float(value)
    except OverflowError:
        raise ValueError(f"{name} is beyond the range of a float, got {value!r:.60}") from None
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real or complex number, got {value!r:.60} ({type(value).__name__})") \
            from None
    if isinstance(value, complex):
        if value.imag == 0:
            value = value.real
        elif real_only or dtype.kind != "c":
            why = "must be real for this routine" if real_only else f"is complex but the data is {dtype}"
            raise ValueError(f"{name} {why}, got {value!r}")
    return value


def _check_output(c, xp, dtype, kind, m, n, overwrite, operands):
    """The caller's C: an array of the operands' kind, dtype and shape; written in place (``overwrite``),
    so writable and sharing no memory with an operand."""
    try:
        array_module(c)
    except TypeError:
        raise TypeError(f"c must be a numpy.ndarray or cupy.ndarray (or None), got {type(c).__name__}") from None
    c_arr, cmod = _check_array(c, "c")
    if cmod is not xp and not (cmod is np and xp.__name__ == "cupy"):
        raise TypeError(f"c lives on a different device kind ({cmod.__name__}) than a ({xp.__name__}): C may be "
                        f"on the host with the operands on a GPU, not on a GPU with host operands")
    if c_arr.dtype != dtype:
        raise TypeError(f"c has dtype {c_arr.dtype} but a has {dtype}: they must match")
    if kind != "gemm" and c_arr.shape[0] != c_arr.shape[1]:
        raise ValueError(f"c must be square, got shape {c_arr.shape}")
    if c_arr.shape != (m, n):
        raise ValueError(f"c has shape {c_arr.shape}, expected {(m, n)} from the operands")
    if not overwrite:
        return c_arr
    if getattr(getattr(c_arr, "flags", None), "writeable", True) is False:
        raise ValueError("c is read-only: it is updated in place (pass overwrite_c=False for a new array)")
    for name, x in operands if cmod is xp else ():      # a host C shares no memory with GPU operands
        how = _overlap(xp, c_arr, x)
        if how:
            raise ValueError(f"c {how} memory with {name}: c is written while {name} is read; pass a c of "
                             f"its own (or overwrite_c=False)")
    return c_arr


def build_problem(kind, alpha, operands, beta, c, ops, lower, out_shape, overwrite_c=True):
    """Validate everything, then normalise. Nothing is written before every check has passed.

    ``ops``: one op code per operand, or a function of the data's dtype that returns them (the legal
    trans values of herk and syrk depend on it). ``overwrite_c`` False computes on a copy of ``c``.
    """
    names = ["a", "b"][: len(operands)]
    arrays, xp = [], None
    for name, x in zip(names, operands):
        x, mod = _check_array(x, name)
        if xp is not None and mod is not xp:
            raise TypeError(f"{name} lives on a different device kind ({mod.__name__}) than a ({xp.__name__})")
        xp = mod
        arrays.append(x)
    dtype = arrays[0].dtype
    for name, x in zip(names[1:], arrays[1:]):
        if x.dtype != dtype:
            raise TypeError(f"{name} has dtype {x.dtype} but a has {dtype}: they must match")
    if callable(ops):
        ops = ops(dtype)
    real_alpha = kind == "herk"
    real_beta = kind in ("herk", "her2k")
    alpha = _check_scalar(alpha, "alpha", dtype, real_alpha and dtype.kind == "c")
    beta = _check_scalar(beta, "beta", dtype, real_beta and dtype.kind == "c")

    # shapes of op(a), op(b)
    shapes = []
    for x, op in zip(arrays, ops):
        r, q = x.shape
        shapes.append((q, r) if op & T else (r, q))
    m, k = shapes[0]
    if kind == "gemm" or kind == "gemmt":
        kb, n = shapes[1]
        if kb != k:
            raise ValueError(f"inner dimensions differ: op(a) is {m}x{k} but op(b) is {kb}x{n}")
        if kind == "gemmt" and n != m:
            raise ValueError(f"gemmt needs a square result: op(a) is {m}x{k} and op(b) is {kb}x{n}")
    else:
        n = m
        if len(shapes) == 2 and shapes[1] != shapes[0]:
            raise ValueError(f"a and b must have the same shape, got {arrays[0].shape} and {arrays[1].shape}")

    writeback = None
    if c is None:
        c_arr = xp.zeros((m, n), dtype=dtype, order="C" if _row_major_result(kind, dtype, arrays) else "F")
        beta = 0.0
    else:
        c_arr = _check_output(c, xp, dtype, kind, m, n, overwrite_c, list(zip(names, arrays)))
        if not overwrite_c:
            c_arr = array_module(c_arr).array(c_arr, copy=True, order="K")   # the caller's c is left as it is

    # Real data: Hermitian kinds are the symmetric ones and "C" means "T".
    if dtype.kind != "c":
        kind = {"herk": "syrk", "her2k": "syr2k"}.get(kind, kind)
        ops = [op & T for op in ops]
    return _normalise(kind, alpha, beta, arrays, ops, c_arr, lower, m, n, k, xp, writeback)


def _row_major_result(kind, dtype, arrays):
    """Whether a new C should be C-ordered: complex herk and her2k on row-major operands (numpy's and CuPy's
    default order). Their column-major form is the conjugate of every factor; with a row-major C the whole
    equation is transposed (C^T = conj(C)), which undoes it, so no operand is copied (a column-major C would
    need conj(A) in memory: a copy of every operand)."""
    return (kind in ("herk", "her2k") and dtype.kind == "c"
            and all(not is_column_major(x) and is_column_major(x.T) for x in arrays))


def _normalise(kind, alpha, beta, arrays, ops, c_arr, lower, m, n, k, xp, writeback):
    # Factors as op(array) with the arrays as given; transposing the whole equation for a row-major C.
    factors = [Operand(x, op) for x, op in zip(arrays, ops)]
    cxp = array_module(c_arr)            # xp, or numpy for a host C with the operands on a GPU
    work = c_arr
    if not is_column_major(c_arr):
        if is_column_major(c_arr.T):
            work = c_arr.T
            lower = not lower
            m, n = n, m
            if kind in ("herk", "her2k"):         # C^T = conj(C): conj every factor
                factors = [f.with_op(f.op ^ R) for f in factors]
                alpha = np.conj(alpha) if kind == "her2k" else alpha   # the two terms swap roles
            elif kind in ("gemmt", "gemm"):       # (L R)^T = R^T L^T
                left, right = factors
                factors = [right.with_op(right.op ^ T), left.with_op(left.op ^ T)]
        else:                                      # odd strides: work on a copy, write it back at the end
            work = cxp.asfortranarray(c_arr)
            writeback = c_arr

    # Describe each factor through a column-major base; BLAS can't take a conjugate without a transpose.
    if kind == "herk" or kind == "her2k":
        allowed = (N, C)     # native herk/her2k: L = M or L = M^H
    elif kind in ("syrk", "syr2k"):
        allowed = (N, T)
    else:
        allowed = (N, T, C)
    factors = [without_lone_conj(to_column_major(f.base, f.op, xp), xp, allowed) for f in factors]
    if kind in ("her2k", "syr2k") and factors[0].op != factors[1].op:
        # the 2k kernels take one trans for both factors: copy the second into the first's layout
        f = factors[1]
        want = factors[0].op
        value = {N: f.base, T: f.base.T, R: xp.conj(f.base), C: xp.conj(f.base).T}[f.op]
        base = {N: value, T: value.T, C: xp.conj(value).T}[want]
        factors[1] = Operand(xp.asfortranarray(base), want, scratch=True)
    return Problem(kind=kind, c=work, lower=lower, alpha=alpha, beta=beta, factors=factors,
                   m=m, n=n, k=k, xp=cxp, writeback=writeback, out=c_arr,
                   operand_xp=None if cxp is xp else xp)
