"""k_axis: which axis of a factor's column-major base is the inner dimension (used by the GPU paths)."""
from hybridblas.problem import C, N, T, k_axis


def test_k_axis_left_and_right_factors():
    # left factor op(X) is m x k: X itself m x k (k on axis 1), or X^T / X^H stored k x m (axis 0)
    assert [k_axis("herk", 0, op) for op in (N, T, C)] == [1, 0, 0]
    assert k_axis("her2k", 1, N) == 1          # both her2k factors are "left" ones
    # right factor of gemm/gemmt, op(Y) k x n: Y itself k x n (axis 0), or stored n x k (axis 1)
    assert [k_axis("gemmt", 1, op) for op in (N, T, C)] == [0, 1, 1]
    assert k_axis("gemm", 0, N) == 1
