"""Clebsch–Gordan coefficients (Condon–Shortley phase) from Racah's formula, in twice-units."""
from functools import lru_cache
from math import factorial, sqrt


@lru_cache(maxsize=None)
def clebsch_gordan(tj1, tm1, tj2, tm2, tj, tm):
    """<j1 m1 j2 m2 | j m>, every argument given as twice its value."""
    if tm1 + tm2 != tm or abs(tm1) > tj1 or abs(tm2) > tj2 or abs(tm) > tj:
        return 0.0
    if (tj1 + tm1) % 2 or (tj2 + tm2) % 2 or (tj + tm) % 2:
        return 0.0
    if tj < abs(tj1 - tj2) or tj > tj1 + tj2 or (tj1 + tj2 + tj) % 2:
        return 0.0
    a = (tj1 + tj2 - tj) // 2
    b = (tj1 - tj2 + tj) // 2
    c = (-tj1 + tj2 + tj) // 2
    d = (tj1 + tj2 + tj) // 2 + 1
    pre = (tj + 1) * factorial(a) * factorial(b) * factorial(c) / factorial(d)
    pre *= (factorial((tj1 + tm1) // 2) * factorial((tj1 - tm1) // 2) * factorial((tj2 + tm2) // 2)
            * factorial((tj2 - tm2) // 2) * factorial((tj + tm) // 2) * factorial((tj - tm) // 2))
    total = 0.0
    for k in range(0, a + 1):
        denominators = (a - k, (tj1 - tm1) // 2 - k, (tj2 + tm2) // 2 - k,
                        (tj - tj2 + tm1) // 2 + k, (tj - tj1 - tm2) // 2 + k)
        if min(denominators) < 0:
            continue
        den = factorial(k)
        for x in denominators:
            den *= factorial(x)
        total += (-1) ** k / den
    return sqrt(pre) * total
