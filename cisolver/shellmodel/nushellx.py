"""Reader for NuShellX / OXBASH interactions: a model-space file ``.sp`` and an interaction file ``.int``, into the
same :class:`~cisolver.shellmodel.snt.Interaction` the ``.snt`` reader returns (explicit-pn TBMEs, KSHELL order).

``.sp`` (``!`` or ``#`` starts a comment; commas count as blanks):
    t | pn              isospin formalism, or proton-neutron formalism
    A_core Z_core
    n_orbits
    n_shells k1 k2 ...  (t: orbits per major shell, summing to n_orbits)   |   2 n_proton_orbits n_neutron_orbits (pn)
    i n l 2j            n_orbits lines, i = 1, 2, ...; n counts from 1 (NuShellX), stored from 0 as in .snt
``.int``:
    count e_1 ... e_n [A_core A0 x]   SPEs of the n orbits of the .sp (the line may continue on the next ones).
                        count < 0: |count| TBME lines, and every TBME is multiplied by (A0/A)^x (A = core + valence);
                        count > 0: count lines, no scaling (OXBASH's rule; trailing numbers are then ignored);
                        count = 0 or no count: TBME lines up to the end of the file.
    a b c d J T V       V = <ab; JT | V | cd; JT>, normalised antisymmetrised two-nucleon states.
Isospin formalism: pp = nn = V_(J,T=1); pn(a_p b_n, c_p d_n) = f_ab f_cd Σ_T V_JT(ab, cd), f = 1/√2 when the two
orbits differ, else 1 (the README's explicit-pn relation). Proton-neutron formalism: the pn lines are NuShellX's
"unnormalised" pn elements (BIGSTICK's ``upn``): each line is one isospin component V_JT(a_p b_n, c_p d_n), the
components of a pn quadruple are summed and multiplied by the same f_ab f_cd (f from the n l j of the two orbits);
the pp and nn lines are normalised like-particle elements (T = 1). A pair listed in the other order is brought to
the stored one with |ba; JT> = -(-1)^(j_a + j_b - J + 1 - T) |ab; JT>.
"""
import logging
from math import isfinite, sqrt
from pathlib import Path

from .snt import AGREE, Interaction, InteractionFileError, Orbit, check_coupling, data_lines, read_snt

log = logging.getLogger(__name__)


def read_interaction(path):
    """An interaction file by its extension: ``.int`` or ``.sp`` (NuShellX, paired by stem), else KSHELL ``.snt``."""
    path = Path(path)
    if path.suffix.lower() in (".int", ".sp"):
        return read_nushellx(path)
    return read_snt(path)


def _integer(path, number, text, what):
    try:
        x = float(text)
    except ValueError:
        raise InteractionFileError(f"{path}:{number}: cannot read {what} from {text!r}") from None
    if not isfinite(x) or x != int(x):
        raise InteractionFileError(f"{path}:{number}: {what} must be an integer, got {text!r}")
    return int(x)


def read_sp(path):
    """(formalism 't' or 'pn', A_core, Z_core, [(n, l, 2j)], number of proton orbits) of a NuShellX .sp file;
    n counted from 0. In the isospin formalism every orbit is a proton and a neutron orbit."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model-space file not found: {str(path)!r}")
    lines = data_lines(path, ",")

    def take(what):
        try:
            return next(lines)
        except StopIteration:
            raise InteractionFileError(f"{path}: file ends before {what}") from None

    number, fields = take("the formalism line 't' or 'pn'")
    formalism = fields[0].lower()
    if formalism not in ("t", "pn"):
        raise InteractionFileError(f"{path}:{number}: the first line must be 't' (isospin) or 'pn', got {fields[0]!r}")
    number, fields = take("'A_core Z_core'")
    if len(fields) < 2:
        raise InteractionFileError(f"{path}:{number}: expected 'A_core Z_core', got {fields!r}")
    a_core, z_core = (_integer(path, number, f, "the core") for f in fields[:2])
    if not 0 <= z_core <= a_core:
        raise InteractionFileError(f"{path}:{number}: core Z={z_core} and A={a_core} do not make a nucleus")
    number, fields = take("the number of orbits")
    n_orbits = _integer(path, number, fields[0], "the number of orbits")
    number, fields = take("the shell line")
    counts = [_integer(path, number, f, "the shell line") for f in fields]
    if formalism == "t":
        if len(counts) < 2 or sum(counts[1:]) != n_orbits:
            raise InteractionFileError(f"{path}:{number}: the shell line {fields!r} must list orbits per shell "
                                       f"adding up to {n_orbits}")
        n_proton = n_orbits
    else:
        if len(counts) != 3 or counts[1] + counts[2] != n_orbits:
            raise InteractionFileError(f"{path}:{number}: a pn shell line must read '2 n_proton n_neutron' with "
                                       f"n_proton + n_neutron = {n_orbits}, got {fields!r}")
        n_proton = counts[1]
    orbits = []
    for k in range(n_orbits):
        number, fields = take(f"orbit {k + 1} 'i n l 2j'")
        if len(fields) < 4:
            raise InteractionFileError(f"{path}:{number}: expected 'i n l 2j', got {fields!r}")
        i, n, l, twoj = (_integer(path, number, f, "an orbit line") for f in fields[:4])
        if i != k + 1 or n < 1 or l < 0 or twoj < 1 or twoj % 2 == 0 or abs(2 * l - twoj) != 1:
            raise InteractionFileError(f"{path}:{number}: bad orbit line i={i} n={n} l={l} 2j={twoj} "
                                       f"(i = {k + 1} expected; NuShellX counts n from 1)")
        orbits.append((n - 1, l, twoj))
    return formalism, a_core, z_core, orbits, n_proton


def _header(path, lines, n_spe):
    """(count or None, SPEs, trailing numbers) of the first .int data line(s)."""
    try:
        number, fields = next(lines)
    except StopIteration:
        raise InteractionFileError(f"{path}: no data: expected the SPE line 'count e_1 ... e_{n_spe}'") from None
    count = None
    try:
        count = int(fields[0])
        fields = fields[1:]
    except ValueError:
        pass
    values = list(fields)
    needed = n_spe + (3 if count is not None and count < 0 else 0)
    while len(values) < needed:
        try:
            number, more = next(lines)
        except StopIteration:
            raise InteractionFileError(f"{path}: file ends inside the SPE line ({n_spe} SPEs expected)") from None
        values += more
    try:
        numbers = [float(x) for x in values]
    except ValueError:
        raise InteractionFileError(f"{path}:{number}: cannot read the SPE line {values!r}") from None
    if not all(isfinite(x) for x in numbers):
        raise InteractionFileError(f"{path}:{number}: the SPE line must hold finite numbers, got {values!r}")
    return count, numbers[:n_spe], numbers[n_spe:], number


def _swap_phase(twoj_a, twoj_b, jj, t):
    """|ba; JT> = phase |ab; JT>."""
    return -((-1) ** ((twoj_a + twoj_b) // 2 - jj + 1 - t))


def _store(table, key, v, path, number):
    old = table.get(key)
    if old is not None and abs(old - v) > AGREE:
        raise InteractionFileError(f"{path}:{number}: {key} given twice with different values ({old} and {v})")
    table[key] = v


def _tbme_lines(path, lines, count):
    """(line number, a, b, c, d, J, T, V) of the TBME lines, orbit labels from 0."""
    out = []
    for number, fields in lines:
        if count is not None and count > 0 and len(out) == count:
            break
        if len(fields) < 7:
            raise InteractionFileError(f"{path}:{number}: expected a TBME line 'a b c d J T V', got {fields!r}")
        a, b, c, d, jj, t = (_integer(path, number, f, "a TBME line") for f in fields[:6])
        try:
            v = float(fields[6])
        except ValueError:
            raise InteractionFileError(f"{path}:{number}: cannot read the TBME value {fields[6]!r}") from None
        if not isfinite(v):
            raise InteractionFileError(f"{path}:{number}: the TBME value must be finite, got {fields[6]!r}")
        if t not in (0, 1):
            raise InteractionFileError(f"{path}:{number}: T must be 0 or 1, got {t}")
        out.append((number, a - 1, b - 1, c - 1, d - 1, jj, t, v))
    if count is not None and count > 0 and len(out) < count:
        raise InteractionFileError(f"{path}: {count} TBME lines announced, {len(out)} found")
    if count is not None and count < 0 and len(out) != -count:
        raise InteractionFileError(f"{path}: {-count} TBME lines announced (count {count}), {len(out)} found")
    return out


def _check(path, number, labels, jj, lj):
    """Labels in range, parity conserved, J allowed by both pairs (``lj``: (l, 2j) of each orbit)."""
    if any(not 0 <= x < len(lj) for x in labels):
        raise InteractionFileError(f"{path}:{number}: orbit out of range 1..{len(lj)} in {[x + 1 for x in labels]}")
    check_coupling(path, number, lj, labels, jj)


def read_nushellx(path, sp_path=None):
    """Read ``<stem>.sp`` and ``<stem>.int`` (either may be named; ``sp_path`` overrides the pairing)."""
    path = Path(path)
    int_path = path if path.suffix.lower() != ".sp" else path.with_suffix(".int")
    sp = Path(sp_path) if sp_path is not None else int_path.with_suffix(".sp")
    for p, what in ((int_path, "interaction"), (sp, "model-space")):
        if not p.is_file():
            raise FileNotFoundError(f"NuShellX {what} file not found: {str(p)!r} (a .int is read with the .sp of "
                                    f"the same name next to it)")
    formalism, a_core, z_core, sp_orbits, n_proton = read_sp(sp)
    lines = data_lines(int_path, ",")
    count, spe, trailing, number = _header(int_path, lines, len(sp_orbits))
    if formalism == "t":
        orbits = [Orbit(k, n, l, tj, -1) for k, (n, l, tj) in enumerate(sp_orbits)]
        orbits += [Orbit(len(sp_orbits) + k, n, l, tj, 1) for k, (n, l, tj) in enumerate(sp_orbits)]
        spe_map = {k: e for k, e in enumerate(spe + spe)}
    else:
        orbits = [Orbit(k, n, l, tj, -1 if k < n_proton else 1) for k, (n, l, tj) in enumerate(sp_orbits)]
        spe_map = dict(enumerate(spe))
    inter = Interaction(str(int_path), orbits, z_core, a_core - z_core, spe_map)
    if count is not None and count < 0:
        core, a0, x = trailing[:3]
        if core != a_core:
            raise InteractionFileError(f"{int_path}:{number}: the scaling's core mass {core:g} differs from the "
                                       f"model space's A_core = {a_core} ({sp})")
        if a0 <= 0 and x != 0:
            raise InteractionFileError(f"{int_path}:{number}: the scaling's A0 must be > 0, got {a0:g}")
        if x != 0:
            inter.scaled, inter.mass_a0, inter.mass_p = True, a0, -x
    elif trailing:
        log.warning("%s: the TBME count is not negative, so the numbers %s after the SPEs are not applied as a "
                    "mass scaling (a negative count asks for (A0/A)^x)", int_path, trailing)
    tbme_lines = _tbme_lines(int_path, lines, count)
    if formalism == "t":
        _isospin_to_pn(inter, sp_orbits, tbme_lines, int_path)
    else:
        _upn_to_pn(inter, sp_orbits, n_proton, tbme_lines, int_path)
    return inter


def _canonical(table, orb, path, number, a, b, c, d, jj, t, v):
    """Store V_JT under a <= b, c <= d, (a, b) <= (c, d)."""
    if a > b:
        a, b, v = b, a, v * _swap_phase(orb[a][2], orb[b][2], jj, t)
    if c > d:
        c, d, v = d, c, v * _swap_phase(orb[c][2], orb[d][2], jj, t)
    for p, q in ((a, b), (c, d)):
        if p == q and (jj + t) % 2 == 0 and v != 0:
            raise InteractionFileError(f"{path}:{number}: two nucleons in one orbit have J + T odd; "
                                       f"J={jj} T={t} is not a state")
    if (a, b) > (c, d):
        a, b, c, d = c, d, a, b
    _store(table, (a, b, c, d, jj, t), v, path, number)


def _lookup(table, orb, a, b, c, d, jj, t):
    """V_JT(ab, cd) for labels in any order (None when the file has no such element)."""
    phase = 1.0
    if a > b:
        a, b, phase = b, a, phase * _swap_phase(orb[a][2], orb[b][2], jj, t)
    if c > d:
        c, d, phase = d, c, phase * _swap_phase(orb[c][2], orb[d][2], jj, t)
    if (a, b) > (c, d):
        a, b, c, d = c, d, a, b
    v = table.get((a, b, c, d, jj, t))
    return None if v is None else phase * v


def _isospin_to_pn(inter, orb, tbme_lines, path):
    table = {}
    lj = [(l, tj) for _, l, tj in orb]
    for number, a, b, c, d, jj, t, v in tbme_lines:
        _check(path, number, (a, b, c, d), jj, lj)
        _canonical(table, orb, path, number, a, b, c, d, jj, t, v)
    n = len(orb)
    for (a, b, c, d, jj, t), v in table.items():        # pp and nn: V_(J, T=1)
        if t == 1:
            for off in (0, n):
                inter.tbme[(a + off, b + off, c + off, d + off, jj)] = v
                inter.tbme[(c + off, d + off, a + off, b + off, jj)] = v
    pairs = [(a, b) for a in range(n) for b in range(n)]
    for a, b in pairs:
        for c, d in pairs:
            if (orb[a][1] + orb[b][1] + orb[c][1] + orb[d][1]) % 2:
                continue
            lo = max(abs(orb[a][2] - orb[b][2]), abs(orb[c][2] - orb[d][2])) // 2
            hi = min(orb[a][2] + orb[b][2], orb[c][2] + orb[d][2]) // 2
            f = (1.0 if a == b else sqrt(0.5)) * (1.0 if c == d else sqrt(0.5))
            for jj in range(lo, hi + 1):
                parts = [_lookup(table, orb, a, b, c, d, jj, t) for t in (0, 1)]
                if any(p is not None for p in parts):
                    inter.tbme[(a, b + n, c, d + n, jj)] = f * sum(p for p in parts if p is not None)


def _upn_to_pn(inter, orb, n_proton, tbme_lines, path):
    like, pn = {}, {}
    lj = [(l, tj) for _, l, tj in orb]
    for number, a, b, c, d, jj, t, v in tbme_lines:
        _check(path, number, (a, b, c, d), jj, lj)
        protons = [x < n_proton for x in (a, b, c, d)]
        if protons[0] == protons[1] and protons[2] == protons[3]:
            if protons[0] != protons[2]:
                raise InteractionFileError(f"{path}:{number}: TBME changes the charge ({a + 1} {b + 1} {c + 1} {d + 1})")
            if t != 1:
                raise InteractionFileError(f"{path}:{number}: a pp or nn element must have T = 1, got T={t}")
            _canonical(like, orb, path, number, a, b, c, d, jj, t, v)
        elif protons[0] != protons[1] and protons[2] != protons[3]:
            if not protons[0]:                            # proton orbit first in each pair
                a, b, v = b, a, v * _swap_phase(orb[a][2], orb[b][2], jj, t)
            if not protons[2]:
                c, d, v = d, c, v * _swap_phase(orb[c][2], orb[d][2], jj, t)
            if (a, b) > (c, d):
                a, b, c, d = c, d, a, b
            _store(pn, (a, b, c, d, jj, t), v, path, number)
        else:
            raise InteractionFileError(f"{path}:{number}: TBME changes the charge ({a + 1} {b + 1} {c + 1} {d + 1})")
    for (a, b, c, d, jj, t), v in like.items():
        inter.tbme[(a, b, c, d, jj)] = v
        inter.tbme[(c, d, a, b, jj)] = v
    same = lambda x, y: 1.0 if orb[x] == orb[y] else sqrt(0.5)
    summed = {}
    for (a, b, c, d, jj, t), v in pn.items():
        summed[(a, b, c, d, jj)] = summed.get((a, b, c, d, jj), 0.0) + v
    for (a, b, c, d, jj), v in summed.items():
        w = same(a, b) * same(c, d) * v
        inter.tbme[(a, b, c, d, jj)] = w
        inter.tbme[(c, d, a, b, jj)] = w
