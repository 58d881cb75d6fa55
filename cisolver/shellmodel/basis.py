"""M-scheme basis: proton and neutron Slater determinants (uint64 bit strings) with total 2M fixed.

Determinants of one species are sorted by (2M_species, bit string), so every fixed-2M group is a
contiguous range and any determinant is found by ``searchsorted`` on one combined key.
The many-body basis is ordered by proton 2Mp block, then proton determinant, then neutron
determinant: index = offset[block] + i_p * n_neutrons_in_block + i_n (the p-n factorisation).
"""
from dataclasses import dataclass

import numpy as np

from . import bits


class SingleParticleSpace:
    """m-states of one species: orbit by orbit, m ascending (bit i = state i)."""

    def __init__(self, orbits):
        self.orbits = list(orbits)
        orbit_of, twom, twoj = [], [], []
        for local, orb in enumerate(self.orbits):
            for tm in range(-orb.twoj, orb.twoj + 1, 2):
                orbit_of.append(local)
                twom.append(tm)
                twoj.append(orb.twoj)
        self.orbit = np.array(orbit_of, dtype=np.int64)
        self.twom = np.array(twom, dtype=np.int64)
        self.twoj = np.array(twoj, dtype=np.int64)
        self.size = len(twom)


class SpeciesDeterminants:
    """All determinants of one species with a given particle number, sorted by (2M, bits)."""

    def __init__(self, space, n_particles):
        self.space = space
        self.n_particles = n_particles
        states = bits.all_determinants(space.size, n_particles)
        occ = bits.occupations(states, space.size)
        twom = (occ @ space.twom).round().astype(np.int64)
        order = np.lexsort((states, twom))
        self.states = states[order]
        self.twom = twom[order]
        self.occ = occ[order]
        self.twom_min = int(self.twom.min())
        groups, starts, counts = np.unique(self.twom, return_index=True, return_counts=True)
        self.group_start = {int(g): int(s) for g, s in zip(groups, starts)}
        self.group_size = {int(g): int(c) for g, c in zip(groups, counts)}
        # one sortable uint64 key (2M block above the bit string) where both fit in 64 bits, else per 2M block
        self.keyed = space.size + int(self.twom.max() - self.twom_min).bit_length() <= 64
        self.keys = self.key(self.states, self.twom) if self.keyed else None

    def key(self, states, twom):
        """Sortable uint64 key (2M block, then bit string); only where ``keyed``."""
        shift = np.uint64(self.space.size)
        return (np.asarray(twom - self.twom_min, dtype=np.uint64) << shift) | np.asarray(states, np.uint64)

    def lookup(self, states, twom):
        """Positions of the given determinants (which must exist)."""
        if self.keyed:
            return np.searchsorted(self.keys, self.key(states, twom))
        states, twom = np.asarray(states, np.uint64), np.asarray(twom)
        pos = np.empty(states.shape, dtype=np.int64)
        for g in np.unique(twom):           # the states of one 2M block are sorted
            sel = twom == g
            start, size = self.group(g)
            pos[sel] = start + np.searchsorted(self.states[start:start + size], states[sel])
        return pos

    def group(self, twom):
        start = self.group_start.get(int(twom), 0)
        return start, self.group_size.get(int(twom), 0)

    def __len__(self):
        return len(self.states)


@dataclass
class Block:
    twom_p: int
    p_start: int      # first proton determinant of the block (species index)
    n_p: int
    n_start: int
    n_n: int
    offset: int       # first many-body index

    @property
    def size(self):
        return self.n_p * self.n_n


class MSchemeBasis:
    """Product basis of proton x neutron determinants with 2Mp + 2Mn = twice_m."""

    def __init__(self, protons, neutrons, twice_m):
        self.protons = protons
        self.neutrons = neutrons
        self.twice_m = int(twice_m)
        self.blocks = []
        offset = 0
        for twom_p in sorted(protons.group_start):
            ps, pn = protons.group(twom_p)
            ns, nn = neutrons.group(self.twice_m - twom_p)
            if pn and nn:
                self.blocks.append(Block(twom_p, ps, pn, ns, nn, offset))
                offset += pn * nn
        self.dim = offset
        self.block_of_twom = {b.twom_p: i for i, b in enumerate(self.blocks)}

    def index(self, block, ip_local, in_local):
        b = self.blocks[block]
        return b.offset + ip_local * b.n_n + in_local
