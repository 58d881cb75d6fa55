"""Reader for KSHELL ``.snt`` interaction files (format: shared/data/interactions/README.md).

Besides the syntax, a file is refused (naming the file and line) where its numbers could not describe a
Hamiltonian: an energy, A0 or p that is not finite (A0 <= 0), an orbit or core with a negative label, an orbit
without a single-particle energy, a two-body element that changes the charge or the parity, whose J is outside
either pair's range or odd for two like nucleons in one orbit, one given twice with different values, or fewer
or more two-body lines than the header announces.
"""
import math
from dataclasses import dataclass, field
from pathlib import Path


class InteractionFileError(ValueError):
    """A malformed or unsupported .snt file; the message names the file and the line."""


@dataclass(frozen=True)
class Orbit:
    index: int      # 0-based position in the file (k - 1)
    n: int
    l: int
    twoj: int
    twotz: int      # -1 proton, +1 neutron

    @property
    def is_proton(self):
        return self.twotz == -1


@dataclass
class Interaction:
    """One-body energies and J-coupled TBMEs, exactly as written in the file (unscaled)."""
    path: str
    orbits: list
    core_z: int
    core_n: int
    spe: dict                       # orbit index -> energy (MeV)
    tbme: dict = field(default_factory=dict)   # (a, b, c, d, J) -> V, both Hermitian orders stored
    mass_a0: float = 0.0
    mass_p: float = 0.0
    scaled: bool = False            # method2 == 1: TBMEs times (A/A0)^p

    def tbme_factor(self, mass):
        """(A/A0)^p for method 1, else 1; SPEs are never scaled."""
        return (mass / self.mass_a0) ** self.mass_p if self.scaled else 1.0

    @property
    def proton_orbits(self):
        return [o for o in self.orbits if o.is_proton]

    @property
    def neutron_orbits(self):
        return [o for o in self.orbits if not o.is_proton]


def data_lines(path, separators=""):
    """(line number, fields) of each line that holds data: comments after '!' or '#' cut off, fields split
    on white space and on any of ``separators`` (NuShellX files use commas too)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, raw in enumerate(fh, start=1):
            text = raw
            for mark in ("!", "#"):
                text = text.split(mark, 1)[0]
            for sep in separators:
                text = text.replace(sep, " ")
            fields = text.split()
            if fields:
                yield number, fields


AGREE = 1e-5           # an element given twice (also as its Hermitian partner) must agree to this (MeV)


def _numbers(path, number, fields, kinds, what):
    if len(fields) < len(kinds):
        raise InteractionFileError(f"{path}:{number}: expected {len(kinds)} numbers for {what}, "
                                   f"got {fields!r}")
    try:
        values = [kind(x) for kind, x in zip(kinds, fields)]
    except ValueError:
        raise InteractionFileError(f"{path}:{number}: cannot read {what} from {fields!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise InteractionFileError(f"{path}:{number}: {what} must be finite numbers, got {fields!r}")
    return values


def check_coupling(path, number, lj, labels, jj):
    """A two-body element <ab; J|V|cd; J> of orbits given as (l, 2j) by 0-based label that conserves parity,
    with J in the range of both pairs (both readers' rule)."""
    a, b, c, d = (lj[x] for x in labels)
    shown = " ".join(str(x + 1) for x in labels)
    if (a[0] + b[0] + c[0] + d[0]) % 2:
        raise InteractionFileError(f"{path}:{number}: TBME {shown} changes parity")
    for p, q in ((a, b), (c, d)):
        if not abs(p[1] - q[1]) <= 2 * jj <= p[1] + q[1]:
            raise InteractionFileError(f"{path}:{number}: J={jj} is not allowed for the pair 2j = {p[1]}, {q[1]} "
                                       f"(TBME {shown})")


def _check_pairs(path, number, lj, labels, jj, v):
    """check_coupling, and J even for two like nucleons in one orbit (unless V is 0): .snt orbits are of one
    kind of nucleon each."""
    check_coupling(path, number, lj, labels, jj)
    for x, y in (labels[:2], labels[2:]):
        if x == y and jj % 2 and v != 0:
            raise InteractionFileError(f"{path}:{number}: two like nucleons in one orbit cannot couple to odd "
                                       f"J={jj} (TBME {' '.join(str(z + 1) for z in labels)})")


def store_tbme(table, key, v, path, number):
    """table[key] = v, and its Hermitian partner; a key given before with another value is refused."""
    a, b, c, d, jj = key
    old = table.get(key)
    if old is not None and abs(old - v) > AGREE:
        raise InteractionFileError(f"{path}:{number}: TBME {a + 1} {b + 1} {c + 1} {d + 1} J={jj} is given twice "
                                   f"with different values ({old} and {v})")
    table[key] = v
    table[(c, d, a, b, jj)] = v


def read_snt(path):
    """Parse a KSHELL .snt file into an :class:`Interaction`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"interaction file not found: {str(path)!r}")
    lines = data_lines(path)

    def take(kinds, what):
        try:
            number, fields = next(lines)
        except StopIteration:
            raise InteractionFileError(f"{path}: file ends before {what}") from None
        return _numbers(path, number, fields, kinds, what), number

    (n_p, n_n, zc, nc), number = take([int] * 4, "the model-space header 'Np Nn Zc Nc'")
    if min(n_p, n_n, zc, nc) < 0:
        raise InteractionFileError(f"{path}:{number}: the model-space header 'Np Nn Zc Nc' must not be negative, "
                                   f"got {n_p} {n_n} {zc} {nc}")
    orbits = []
    for k in range(n_p + n_n):
        (idx, n, l, twoj, twotz), number = take([int] * 5, f"orbit {k + 1} 'k n l 2j 2tz'")
        if (idx != k + 1 or n < 0 or twotz not in (-1, 1) or twoj < 1 or twoj % 2 == 0
                or abs(2 * l - twoj) != 1):
            raise InteractionFileError(f"{path}:{number}: bad orbit line k={idx} n={n} l={l} 2j={twoj} 2tz={twotz}")
        if (k < n_p) != (twotz == -1):
            raise InteractionFileError(f"{path}:{number}: proton orbits must come first (orbit {idx}, 2tz={twotz})")
        orbits.append(Orbit(k, n, l, twoj, twotz))

    (n1, method1), number = take([int, int], "the one-body header 'N1 method'")
    if n1 < 0:
        raise InteractionFileError(f"{path}:{number}: the number of one-body lines must not be negative, got {n1}")
    if method1 != 0:
        raise InteractionFileError(f"{path}:{number}: one-body method {method1} is not supported (only 0)")
    spe = {}
    for _ in range(n1):
        (i, j, e), number = take([int, int, float], "a one-body line 'i j e'")
        if i != j:
            raise InteractionFileError(f"{path}:{number}: off-diagonal one-body term {i} {j} is not supported")
        if not 1 <= i <= len(orbits):
            raise InteractionFileError(f"{path}:{number}: orbit {i} out of range 1..{len(orbits)}")
        if i - 1 in spe and abs(spe[i - 1] - e) > AGREE:
            raise InteractionFileError(f"{path}:{number}: orbit {i}'s energy is given twice ({spe[i - 1]} and {e})")
        spe[i - 1] = e
    missing = [k + 1 for k in range(len(orbits)) if k not in spe]
    if missing:
        raise InteractionFileError(f"{path}:{number}: no single-particle energy for orbit(s) {missing} "
                                   f"({n1} one-body lines; write 'k k 0.0' for a zero)")

    try:
        number, fields = next(lines)
    except StopIteration:
        raise InteractionFileError(f"{path}: file ends before the two-body header") from None
    n2, method2 = _numbers(path, number, fields, [int, int], "the two-body header 'N2 method'")
    if n2 < 0:
        raise InteractionFileError(f"{path}:{number}: the number of two-body lines must not be negative, got {n2}")
    inter = Interaction(str(path), orbits, zc, nc, spe)
    if method2 == 1:
        _, _, a0, p = _numbers(path, number, fields, [int, int, float, float], "'N2 1 A0 p'")
        if a0 <= 0:
            raise InteractionFileError(f"{path}:{number}: the scaling's A0 must be > 0, got {a0}")
        inter.scaled, inter.mass_a0, inter.mass_p = True, a0, p
    elif method2 != 0:
        raise InteractionFileError(f"{path}:{number}: two-body method {method2} is not supported (0 or 1)")

    lj = [(o.l, o.twoj) for o in orbits]
    for _ in range(n2):
        (i, j, k, l, jj, v), number = take([int] * 5 + [float], "a TBME line 'i j k l J V'")
        for x in (i, j, k, l):
            if not 1 <= x <= len(orbits):
                raise InteractionFileError(f"{path}:{number}: orbit {x} out of range 1..{len(orbits)}")
        a, b, c, d = i - 1, j - 1, k - 1, l - 1
        if a > b:       # KSHELL's swap: |ba; J> = (-1)^(ja+jb-J+1) |ab; J>
            a, b = b, a
            v *= (-1) ** ((orbits[a].twoj + orbits[b].twoj) // 2 - jj + 1)
        if c > d:
            c, d = d, c
            v *= (-1) ** ((orbits[c].twoj + orbits[d].twoj) // 2 - jj + 1)
        charge_bra = orbits[a].twotz + orbits[b].twotz
        if charge_bra != orbits[c].twotz + orbits[d].twotz:
            raise InteractionFileError(f"{path}:{number}: TBME changes the charge ({i} {j} {k} {l})")
        _check_pairs(path, number, lj, (a, b, c, d), jj, v)
        store_tbme(inter.tbme, (a, b, c, d, jj), v, path, number)
    extra = next(lines, None)
    if extra is not None:
        raise InteractionFileError(f"{path}:{extra[0]}: data after the {n2} two-body lines the header announces: "
                                   f"{extra[1]!r}")
    return inter
