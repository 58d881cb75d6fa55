"""Bit-string operations on Slater determinants stored as numpy uint64 (one bit per m-state)."""
import itertools

import numpy as np

_BYTE_COUNTS = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def popcount(x):
    """Number of set bits of each uint64 element."""
    x = np.ascontiguousarray(x, dtype=np.uint64)
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x).astype(np.int64)
    return _BYTE_COUNTS[x.view(np.uint8).reshape(x.shape + (8,))].sum(axis=-1, dtype=np.int64)


def parity_below(states, positions):
    """(-1)^(number of set bits of ``states`` strictly below bit ``positions``), as int8 +-1."""
    mask = (np.uint64(1) << positions.astype(np.uint64)) - np.uint64(1)
    return (1 - 2 * (popcount(states & mask) & 1)).astype(np.int8)


def bit(positions):
    return np.uint64(1) << np.asarray(positions, dtype=np.uint64)


def all_determinants(n_states, n_particles):
    """Every n_particles-subset of n_states single-particle states, as sorted uint64 bit strings."""
    if not 0 <= n_particles <= n_states:
        raise ValueError(f"cannot place {n_particles} particles in {n_states} single-particle states")
    if n_states > 63:
        raise ValueError(f"at most 63 single-particle states per species are supported, got {n_states}")
    if n_particles == 0:
        return np.zeros(1, dtype=np.uint64)        # the empty determinant (no -1 reshape of 0 columns)
    combos = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n_states), n_particles)),
                         dtype=np.int64, count=-1).reshape(-1, n_particles)
    states = np.bitwise_or.reduce(np.uint64(1) << combos.astype(np.uint64), axis=1)
    return np.sort(states)


def occupations(states, n_states):
    """Dense 0/1 occupation matrix (n_det x n_states), float64."""
    shifts = np.arange(n_states, dtype=np.uint64)
    return ((states[:, None] >> shifts[None, :]) & np.uint64(1)).astype(np.float64)


def occupied_lists(states, n_states, n_particles):
    """Indices of the occupied states of each determinant, ascending (n_det x n_particles)."""
    occ = occupations(states, n_states).astype(bool)
    idx = np.nonzero(occ)[1].reshape(len(states), n_particles)
    return idx
