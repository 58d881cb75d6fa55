"""MFDn's triangular layout, the bookkeeping part (no MPI): which blocks, which vector rows."""
import itertools

import pytest

from cisolver.triangular import TriangularLayout, grid_size, stored_blocks


@pytest.mark.parametrize("n_d", [1, 2, 3, 4, 5, 6])
def test_every_pair_of_blocks_is_stored_once_and_rows_and_columns_balance(n_d):
    blocks = stored_blocks(n_d)
    assert len(blocks) == n_d * (n_d + 1) // 2
    assert all((i, i) in blocks for i in range(n_d))
    for i, j in itertools.combinations(range(n_d), 2):
        assert ((i, j) in blocks) + ((j, i) in blocks) == 1, (i, j)
    per_row = [sum(1 for b in blocks if b[0] == i) for i in range(n_d)]
    per_col = [sum(1 for b in blocks if b[1] == j) for j in range(n_d)]
    assert max(per_row) - min(per_row) <= 1 and max(per_col) - min(per_col) <= 1
    assert blocks == sorted(blocks, key=lambda b: (b[1], b[0]))      # column-major rank order


def test_rank_counts_must_be_triangular_numbers():
    assert [grid_size(p) for p in (1, 3, 6, 10, 15)] == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match=r"n_d \(n_d \+ 1\) / 2 ranks .*got 4"):
        grid_size(4)


def test_segments_tile_the_vector_in_rank_order():
    sizes = [5, 9, 2, 7, 7, 3, 11, 4]
    layout = TriangularLayout(sizes, 6)
    segments = [layout.segment[r] for r in range(6)]
    assert segments[0][0] == 0 and segments[-1][1] == sum(sizes)
    assert all(a[1] == b[0] for a, b in zip(segments, segments[1:]))     # contiguous, in rank order
    for j, members in layout.column.items():                             # each W_j split over column j
        lo, hi = layout.sub[j]
        assert layout.segment[members[0]][0] == lo and layout.segment[members[-1]][1] == hi
