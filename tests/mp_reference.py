"""Reference computations in mpmath shared by the oracle tests (test_oracles.py, test_compile.py): root finding
by bisection on a divergence's definition, nothing taken from atr_theory; and the float32 input grid the TRGPPO
table tests share (test_compile.py, test_ranges.py)."""

import mpmath as mp

DPS = 40  # digits of every computation here


def bisect_log(f, a, b, dps=DPS, steps=170):
    """The sign change of f on [a, b] (0 < a < b, f(a) and f(b) of opposite signs), halving the interval in
    log scale (brackets span up to 600 decades) to ~30 significant digits (more with more ``steps``); f is
    evaluated at ``dps`` digits (a definition that cancels, e.g. at |y| ~ 1e-150, needs more than the default)."""
    with mp.workdps(dps):
        a, b = mp.mpf(a), mp.mpf(b)
        fa = f(a) > 0
        for _ in range(steps):
            m = mp.sqrt(a * b)
            if (f(m) > 0) == fa:
                a = m
            else:
                b = m
        return mp.sqrt(a * b)


def binary_kl(p, w):
    """KL(Ber(p) || Ber(p w)) (TRGPPO, Wang et al. 2019)."""
    return p * mp.log(1 / w) + (1 - p) * mp.log((1 - p) / (1 - p * w))


def binary_kl_roots(p, delta):
    """``(l_KL, u_KL)``: the extreme ratios w with binary KL(p || p w) <= delta (l_KL = 0 below 1e-300), p < 1."""
    with mp.workdps(DPS):
        p = mp.mpf(p)
        g = lambda w: binary_kl(p, w) - delta  # noqa: E731
        tiny = mp.mpf(10) ** -300
        l_kl = bisect_log(g, tiny, mp.mpf(1)) if g(tiny) > 0 else mp.mpf(0)
        u_kl = bisect_log(g, mp.mpf(1), (1 - mp.mpf(10) ** -40) / p)  # KL -> inf as p w -> 1
        return l_kl, u_kl


def float32_log_p_grid():
    """Every binade of a = -log p_old from 2^-40 to 2^8, 97 points each (ends included), plus 0 (float32 log p_old)."""
    import torch

    pts = [0.0]
    for k in range(-40, 8):
        for j in range(97):
            pts.append(-(2.0**k) * (1 + j / 96))
    return torch.tensor(pts, dtype=torch.float32)


def binary_kl_log_roots_80_digits(p: float, delta: float) -> tuple:
    """TRGPPO's (log l_KL, log u_KL) from the definition KL(Ber(p) || Ber(p w)) = p log(1/w) + q log(q / (1 - p w)),
    by bisection at 80 digits on brackets whose signs are checked (no float64 code of the package involved)."""
    with mp.workdps(80):
        p, d = mp.mpf(p), mp.mpf(delta)
        q = 1 - p

        def f(y):
            w = mp.exp(y)
            return -p * y + (q * mp.log(q / (1 - p * w)) if q > 0 else 0) - d

        def bisect(a, b):  # f(a) > 0 > f(b)
            assert f(a) > 0 > f(b)
            for _ in range(120 + int(mp.log(abs(a - b) + 2, 2))):
                m = (a + b) / 2
                a, b = (m, b) if f(m) > 0 else (a, m)
            return (a + b) / 2

        lower = bisect(2 * ((q * mp.log(q) if q > 0 else 0) - d) / p - 1, mp.mpf(0))  # f >= d there
        if q == 0:
            return lower, mp.mpf(0)
        top = -mp.log(p) * (1 - mp.mpf(10) ** -60)  # w just below 1/p, where the KL diverges
        upper = -mp.log(p) if 1 - p * mp.exp(top) == 0 or f(top) <= 0 else bisect(top, mp.mpf(0))
        return lower, upper
