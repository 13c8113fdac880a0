r"""sympy derivations behind Thm 3.2: derivative and convexity of k3, the Lambert-W roots, and the
series of the range in sqrt(delta) that shows the asymmetry at leading order."""

from __future__ import annotations

import sympy as sp

__all__ = ["w", "delta", "k3_expr", "k3_derivatives", "lambert_roots_solve_k3", "range_series"]

w, delta, s = sp.symbols("w delta s", positive=True)
k3_expr = w - 1 - sp.log(w)


def k3_derivatives() -> tuple[sp.Expr, sp.Expr]:
    """``(dk3/dw, d2k3/dw2) = (1 - 1/w, 1/w^2)``: k3 is strictly convex on (0, inf), minimal at w = 1."""
    d1 = sp.simplify(sp.diff(k3_expr, w))
    d2 = sp.simplify(sp.diff(k3_expr, w, 2))
    return d1, d2


def lambert_roots_solve_k3(branch: int) -> sp.Expr:
    """``k3(-W_k(-e^{-1-delta})) - delta`` simplified with ``W e^W = z``; returns 0 for k = 0 and -1."""
    W = sp.LambertW(-sp.exp(-1 - delta), branch)
    root = -W
    expr = k3_expr.subs(w, root) - delta
    # log(-W(z)) = log(-z) - W(z) for the real branches on (-1/e, 0): substitute the defining identity
    expr = expr.subs(sp.log(-W), sp.log(sp.exp(-1 - delta)) - W)
    return sp.simplify(sp.expand(expr))


def range_series(order: int = 4) -> tuple[sp.Expr, sp.Expr]:
    r"""Series of ``l`` and ``u`` in ``s = sqrt(delta)``, by inverting ``k3(1 + x) = s^2`` order by order.

    ``u = 1 + sqrt(2) s + (2/3) s^2 + ...``, ``l = 1 - sqrt(2) s + (2/3) s^2 - ...``: the
    ``(2/3) delta`` term has the same sign on both sides, so ``(u - 1) - (1 - l) = (4/3) delta + O(delta^2)``
    -- the asymmetry of Thm 3.2 (2) at leading order.
    """
    x = sp.symbols("x")
    k3_series = sp.series(x - sp.log(1 + x), x, 0, order + 2).removeO()
    out = []
    for sign in (-1, 1):
        coeffs = sp.symbols(f"c1:{order + 1}")
        ansatz = sum(c * s**i for i, c in enumerate(coeffs, start=1))
        eq = sp.expand(sp.series(k3_series.subs(x, ansatz), s, 0, order + 2).removeO() - s**2)
        sol = {}
        for i in range(2, order + 2):
            ci = sp.expand(eq.coeff(s, i)).subs(sol)
            c = coeffs[i - 2]
            roots = sp.solve(ci, c)
            if i == 2:
                roots = [r for r in roots if sp.sign(r) == sign]
            sol[c] = roots[0]
        out.append(1 + ansatz.subs(sol))
    return out[0], out[1]
