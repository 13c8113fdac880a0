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
