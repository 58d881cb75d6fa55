"""Bad input to the hb.* routines: every refusal is a TypeError or ValueError whose message names the
argument and the value given, raised before anything is written: a, b and c keep their bytes."""
import numpy as np
import pytest

import hybridblas as hb
from blas_cases import random_matrix

CPU = hb.Context("cpu")


def _arrays(rng, dtype=np.complex128, n=4, k=3):
    """a, b (n x k) and c (n x n), random."""
    return random_matrix(rng, (n, k), dtype), random_matrix(rng, (n, k), dtype), random_matrix(rng, (n, n), dtype)


def _plain(call):
    """A case on the standard random a, b, c: call(a, b, c)."""
    def build(rng):
        a, b, c = _arrays(rng)
        return (lambda: call(a, b, c)), [a, b, c]
    return build


def _square_a(call):
    """A case whose c is (a view of) the square operand a: call(a, b)."""
    def build(rng):
        a, b, _ = _arrays(rng, k=4)
        return (lambda: call(a, b)), [a, b]
    return build


def _shared_buffer(call):
    """A case on views of one buffer: call(buf) builds the operands and C from it."""
    def build(rng):
        buf = random_matrix(rng, (4, 12), np.complex128)
        return (lambda: call(buf)), [buf]
    return build


CASES = {
    # c: an array or None, nothing else
    "c-list": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c.tolist(), context=CPU)), TypeError,
               "c must be a numpy.ndarray or cupy.ndarray .*got list"),
    "c-tuple": (_plain(lambda a, b, c: hb.syrk(1.0, a, 0.0, tuple(map(tuple, c)), context=CPU)), TypeError,
                "c must be .*got tuple"),
    "c-scalar": (_plain(lambda a, b, c: hb.gemm(1.0, a, b.T, 0.0, 0.0, context=CPU)), TypeError,
                 "c must be .*got float"),
    "c-shape": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c[:3, :3], context=CPU)), ValueError,
                r"c has shape \(3, 3\), expected \(4, 4\)"),
    "c-not-square": (_plain(lambda a, b, c: hb.syrk(1.0, a, 0.0, c[:, :3], context=CPU)), ValueError,
                     r"c must be square, got shape \(4, 3\)"),
    "c-dtype": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c.astype(np.complex64), context=CPU)), TypeError,
                "c has dtype complex64 but a has complex128"),
    # lower
    "lower-no": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c, lower="no", context=CPU)), ValueError,
                 r"lower must be .* got 'no'"),
    "lower-2": (_plain(lambda a, b, c: hb.syrk(1.0, a, 0.0, c, lower=2, context=CPU)), ValueError,
                "lower must be .* got 2$"),
    "lower-float": (_plain(lambda a, b, c: hb.her2k(1.0, a, b, 0.0, c, lower=1.0, context=CPU)), ValueError,
                    r"lower must be .* got 1\.0"),
    "lower-none": (_plain(lambda a, b, c: hb.gemmt(1.0, a, b.T, 0.0, c, lower=None, context=CPU)), ValueError,
                   "lower must be .* got None"),
    "lower-positional": (_plain(lambda a, b, c: hb.syr2k(1.0, a, b, 0.0, c, "N", "X", context=CPU)), ValueError,
                         "lower must be .* got 'X'"),
    # trans: exactly what this routine and dtype allow
    "herk-trans-1": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c, trans=1, context=CPU)), ValueError,
                     r"^trans must be 'N' or 'C' \(0 or 2\) for complex herk, got 1$"),
    "herk-trans-T": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c, "T", context=CPU)), ValueError,
                     r"trans must be 'N' or 'C' \(0 or 2\) for complex herk, got 'T'"),
    "herk-trans-bool": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c, trans=True, context=CPU)), ValueError,
                        "trans must be .* got True"),
    "herk-trans-float": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c, trans=2.0, context=CPU)), ValueError,
                         r"trans must be .* got 2\.0"),
    "herk-trans-word": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c, trans="NC", context=CPU)), ValueError,
                        "trans must be .* got 'NC'"),
    "herk-real-trans-3": (_plain(lambda a, b, c: hb.herk(1.0, a.real.copy(), 0.0, c.real.copy(), trans=3,
                                                         context=CPU)), ValueError,
                          r"trans must be 'N', 'T' or 'C' \(0, 1 or 2\) for real herk, got 3"),
    "syrk-trans-C": (_plain(lambda a, b, c: hb.syrk(1.0, a, 0.0, c, trans="C", context=CPU)), ValueError,
                     r"trans must be 'N' or 'T' \(0 or 1\) for complex syrk, got 'C'"),
    "her2k-trans-T": (_plain(lambda a, b, c: hb.her2k(1.0, a, b, 0.0, c, "t", context=CPU)), ValueError,
                      r"trans must be 'N' or 'C' \(0 or 2\) for complex her2k, got 't'"),
    "syr2k-trans-2": (_plain(lambda a, b, c: hb.syr2k(1.0, a, b, 0.0, c, 2, context=CPU)), ValueError,
                      r"trans must be 'N' or 'T' \(0 or 1\) for complex syr2k, got 2"),
    "herkx-trans-T": (_plain(lambda a, b, c: hb.herkx(1.0, a, b, 0.0, c, "T", context=CPU)), ValueError,
                      r"trans must be 'N' or 'C' \(0 or 2\) for complex herkx, got 'T'"),
    "gemm-transa": (_plain(lambda a, b, c: hb.gemm(1.0, a, b, 0.0, None, "Q", context=CPU)), ValueError,
                    r"transa must be 'N', 'T' or 'C' \(0, 1 or 2\) for gemm, got 'Q'"),
    "gemm-transb": (_plain(lambda a, b, c: hb.gemm(1.0, a, b, 0.0, None, "T", -1, context=CPU)), ValueError,
                    "transb must be .* for gemm, got -1"),
    "gemm-trans_a": (_plain(lambda a, b, c: hb.gemm(1.0, a, b, trans_a="H", context=CPU)), ValueError,
                     "trans_a must be .* for gemm, got 'H'"),
    "gemm-both-spellings": (_plain(lambda a, b, c: hb.gemm(1.0, a, b, transa="T", trans_a="C", context=CPU)),
                            TypeError, "gemm got both transa='T' and trans_a='C'"),
    "gemmt-transb": (_plain(lambda a, b, c: hb.gemmt(1.0, a, b, 0.0, c, "N", None, context=CPU)), ValueError,
                     "transb must be .* for gemmt, got None"),
    # overwrite_c
    "overwrite-2": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c, "N", True, 2, context=CPU)), ValueError,
                    "overwrite_c must be .* got 2"),
    "overwrite-str": (_plain(lambda a, b, c: hb.gemm(1.0, a, b.T, 0.0, c, overwrite_c="no", context=CPU)),
                      ValueError, "overwrite_c must be .* got 'no'"),
    # c sharing memory with an operand it would overwrite
    "herk-c-is-a": (_square_a(lambda a, b: hb.herk(1.0, a, 0.0, a, context=CPU)), ValueError,
                    "c shares memory with a"),
    "syrk-c-is-a-transposed": (_square_a(lambda a, b: hb.syrk(1.0, a, 1.0, a.T, context=CPU)), ValueError,
                               "c shares memory with a"),
    "her2k-c-is-b": (_square_a(lambda a, b: hb.her2k(1.0, a, b, 0.0, b, context=CPU)), ValueError,
                     "c shares memory with b"),
    "gemm-c-overlaps-b": (_shared_buffer(lambda buf: hb.gemm(1.0, buf[:, :4], buf[:, 2:6], 0.0, buf[:, 4:8],
                                                             context=CPU)), ValueError, "c shares memory with b"),
    "gemmt-c-overlaps-a": (_shared_buffer(lambda buf: hb.gemmt(1.0, buf[:, 3:7], buf[:, 8:12], 0.0, buf[:, :4],
                                                               transb="T", context=CPU)), ValueError,
                           "c shares memory with a"),
    # read-only c written in place
    "c-read-only": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, np.lib.stride_tricks.as_strided(c, writeable=False),
                                                   context=CPU)), ValueError, "c is read-only"),
    # operands, scalars, context
    "a-none": (_plain(lambda a, b, c: hb.herk(1.0, None, 0.0, c, context=CPU)), TypeError,
               "a must be an array, got None"),
    "a-1d": (_plain(lambda a, b, c: hb.herk(1.0, a[:, 0], 0.0, c, context=CPU)), ValueError,
             r"a must be 2-D, got 1-D array of shape \(4,\)"),
    "a-int": (_plain(lambda a, b, c: hb.syrk(1.0, np.ones((4, 3), np.int64), 0.0, c, context=CPU)), TypeError,
              "a has dtype int64"),
    "b-dtype": (_plain(lambda a, b, c: hb.her2k(1.0, a, b.astype(np.complex64), 0.0, c, context=CPU)), TypeError,
                "b has dtype complex64 but a has complex128"),
    "b-shape": (_plain(lambda a, b, c: hb.syr2k(1.0, a, b[:, :2], 0.0, c, context=CPU)), ValueError,
                r"a and b must have the same shape, got \(4, 3\) and \(4, 2\)"),
    "gemm-inner": (_plain(lambda a, b, c: hb.gemm(1.0, a, b, 0.0, None, context=CPU)), ValueError,
                   "inner dimensions differ: op.a. is 4x3 but op.b. is 4x3"),
    "alpha-str": (_plain(lambda a, b, c: hb.herk("x", a, 0.0, c, context=CPU)), TypeError,
                  "alpha must be a scalar, got 'x'"),
    "alpha-not-a-number": (_plain(lambda a, b, c: hb.herk(np.array("x"), a, 0.0, c, context=CPU)), TypeError,
                           r"alpha must be a real or complex number, got array\('x'"),
    "beta-too-large": (_plain(lambda a, b, c: hb.syrk(1.0, a, 10 ** 400, c, context=CPU)), ValueError,
                       "beta is beyond the range of a float, got 1000"),
    "alpha-complex-herk": (_plain(lambda a, b, c: hb.herk(1j, a, 0.0, c, context=CPU)), ValueError,
                           "alpha must be real for this routine, got 1j"),
    "beta-complex-her2k": (_plain(lambda a, b, c: hb.her2k(1.0, a, b, 2j, c, context=CPU)), ValueError,
                           "beta must be real for this routine, got 2j"),
    "context-str": (_plain(lambda a, b, c: hb.herk(1.0, a, 0.0, c, context="cpu")), TypeError,
                    "context must be a hybridblas.Context or None, got 'cpu'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_naming_argument_and_value_with_arrays_untouched(case, rng):
    build, exc, match = CASES[case]
    call, arrays = build(rng)
    before = [x.tobytes() for x in arrays]
    with pytest.raises(exc, match=match):
        call()
    for i, (x, saved) in enumerate(zip(arrays, before)):
        assert x.tobytes() == saved, f"array {i} changed by a refused call ({case})"


def test_refusals_touch_no_bytes_of_a_c_that_holds_nan(rng):
    """A poisoned C stays poisoned bit for bit when the call is refused late (after every shape check)."""
    a = random_matrix(rng, (4, 4), np.complex128)
    c = np.full((4, 4), np.nan + 1j * np.nan)
    saved = c.tobytes()
    with pytest.raises(ValueError, match="lower must be .* got 'upper-ish'"):
        hb.herk(1.0, a, 0.0, c, lower="upper-ish", context=CPU)
    assert c.tobytes() == saved


@pytest.mark.parametrize("value,lower", [(True, True), (False, False), ("L", True), ("u", False), ("Lower", True),
                                         ("UPPER", False), (1, True), (0, False), (np.int64(1), True),
                                         (np.bool_(False), False)])
def test_lower_spellings_accepted(value, lower, rng):
    a = random_matrix(rng, (5, 3), np.complex128)
    got = hb.herk(1.0, a, 0.0, np.zeros((5, 5), complex), lower=value, context=CPU)
    want = a @ a.conj().T
    mask = np.tril(np.ones((5, 5), bool)) if lower else np.triu(np.ones((5, 5), bool))
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-13, atol=1e-13)
    assert (got[~mask] == 0).all()


def test_trans_spellings_accepted(rng):
    a = random_matrix(rng, (6, 3), np.complex128)
    want = a.conj().T @ a
    for t in ("C", "c", 2, np.int32(2)):
        got = hb.herk(1.0, a, trans=t, context=CPU)
        np.testing.assert_allclose(np.tril(got), np.tril(want), rtol=1e-13, atol=1e-13)


def test_operands_may_alias_each_other(rng):
    """a and b only read: the same array, or overlapping views, is fine; so is c beside them in a buffer."""
    a = random_matrix(rng, (5, 3), np.complex128)
    got = hb.her2k(0.5, a, a, context=CPU)
    np.testing.assert_allclose(np.tril(got), np.tril(a @ a.conj().T), rtol=1e-13, atol=1e-13)
    buf = random_matrix(rng, (5, 14), np.complex128)
    x, y = buf[:, :5], buf[:, 2:7]
    want = x @ y + 0.0
    got = hb.gemm(1.0, x, y, 0.0, buf[:, 9:14], context=CPU)          # c beside both operands
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_interleaved_views_are_not_overlap(rng):
    """c on the odd columns, a on the even ones of one buffer: their address ranges overlap, their
    elements do not; the exact check lets the call through."""
    buf = random_matrix(rng, (6, 12), np.complex128)
    a, c = buf[:, 0::2], buf[:, 1::2]
    a0 = a.copy()
    got = hb.syrk(1.0, a, 0.0, c, context=CPU)
    assert got is c
    np.testing.assert_allclose(np.tril(c), np.tril(a0 @ a0.T), rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(a, a0)


def test_overlap_too_costly_to_decide_is_refused(rng, monkeypatch):
    """Where numpy's exact overlap solver gives up, the overlap is assumed and the call refused."""
    from hybridblas import problem
    monkeypatch.setattr(problem, "_EXACT_OVERLAP_WORK", 0)
    buf = random_matrix(rng, (6, 12), np.complex128)
    a, c = buf[:, 0::2], buf[:, 1::2]
    saved = buf.tobytes()
    with pytest.raises(ValueError, match="c may share memory with a"):
        hb.syrk(1.0, a, 0.0, c, context=CPU)
    assert buf.tobytes() == saved


def test_overwrite_false_allows_c_that_is_an_operand(rng):
    a = random_matrix(rng, (4, 4), np.complex128)
    a0 = a.copy()
    got = hb.herk(1.0, a, 0.5, a, overwrite_c=False, context=CPU)
    np.testing.assert_array_equal(a, a0)
    want = a0 @ a0.conj().T + 0.5 * a0
    np.fill_diagonal(want, want.diagonal().real)
    np.testing.assert_allclose(np.tril(got), np.tril(want), rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(np.triu(got, 1), np.triu(a0, 1))


@pytest.mark.gpu
def test_cupy_c_sharing_memory_refused(rng):
    import cupy
    a = cupy.asarray(random_matrix(rng, (4, 4), np.complex128))
    saved = a.get().tobytes()
    with pytest.raises(ValueError, match="c shares memory with a"):
        hb.herk(1.0, a, 0.0, a, context=hb.Context(devices=["cuda:0"]))
    assert a.get().tobytes() == saved
    with pytest.raises(TypeError, match="c must be a numpy.ndarray or cupy.ndarray .*got list"):
        hb.herk(1.0, a, 0.0, [[0] * 4] * 4, context=hb.Context(devices=["cuda:0"]))
