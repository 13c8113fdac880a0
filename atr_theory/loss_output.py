"""What ``policy_loss`` returns: ``LossOutput`` (the loss, the per-token objective and the metrics, computed on first
access), and the pieces of those metrics: nearest-rank quantiles and where the min and mask forms part
(``outside_by_advantage``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from .divergence import kl3_from_log_ratio
from .methods import MethodResult

__all__ = ["LossOutput", "RATIO_NOISE_TOL", "nearest_rank_quantiles", "outside_by_advantage"]

RATIO_NOISE_TOL = 1e-4
"""``|log w|`` below this counts as "ratio 1 up to forward-pass noise" (metric ``frac_ratio_moved``): two float32
forward passes of the same parameters differ by ~1e-6 in log-probability."""


def nearest_rank_quantiles(
    values: torch.Tensor, fractions: tuple[float, ...], *, selection: str = "auto"
) -> list[float]:
    """``sorted(values)[round(f (n - 1))]`` for each fraction ``f`` of a non-empty 1-D tensor (nearest rank, no
    interpolation), found by selection rather than a sort: ``numpy.partition`` on CPU (``selection="auto"`` or
    ``"partition"``; one call for every rank, ~5x faster than ``torch.sort`` at 1e5-1e6 values), ``torch.kthvalue``
    on other devices (or ``selection="kthvalue"``). The same values as indexing the sorted tensor
    (``tests/test_loss.py``); ``torch.quantile`` refuses more than 2^24 elements."""
    n = values.numel()
    if values.dim() != 1 or n == 0:
        raise ValueError(f"nearest_rank_quantiles needs a non-empty 1-D tensor, got shape {tuple(values.shape)}")
    if selection not in ("auto", "partition", "kthvalue"):
        raise ValueError(f"selection must be 'auto', 'partition' or 'kthvalue', got {selection!r}")
    ranks = [min(n - 1, max(0, round(f * (n - 1)))) for f in fractions]
    values = values.detach()
    if selection == "partition" or (selection == "auto" and values.device.type == "cpu"):
        part = np.partition(values.cpu().numpy(), sorted(set(ranks)))
        return [float(part[r]) for r in ranks]
    return [float(torch.kthvalue(values, r + 1).values) for r in ranks]


@dataclass
class LossOutput:
    """Result of ``policy_loss``. ``metrics`` is computed on first access (no cost if unused)."""

    loss: torch.Tensor
    per_token: torch.Tensor
    result: MethodResult = field(repr=False)
    log_ratio: torch.Tensor = field(repr=False)
    mask: torch.Tensor = field(repr=False)
    dropped: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    """Tokens each layer removed from the loss (``"sequence_mask"``, ``"entropy_mask"``), (B, T) or (B, 1) bool."""
    advantages: torch.Tensor | None = field(default=None, repr=False)
    """(B, T) the advantages the rule saw (zero on padding)."""
    mask_form_kept: Callable[[], torch.Tensor] | None = field(default=None, repr=False)
    """The tokens the rule's mask form keeps, (B, T) bool, computed when called from the call's one evaluation of the
    rule (``MethodResult.mask_form_kept``; ``None``: a rule without a mask form, or ``clip_cov`` run in its min
    form)."""

    @cached_property
    def outside(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``outside_by_advantage`` of this call, ``(against, with)``, computed once (the metrics and the trainer's
        true-KL summary both read it); ``None`` where ``mask_form_kept`` is."""
        if self.mask_form_kept is None:
            return None
        return outside_by_advantage(self.mask_form_kept(), self.log_ratio, self.advantages, self.mask)

    @cached_property
    def metrics(self) -> dict[str, float]:
        """Fractions of valid tokens kept / masked / clipped low / clipped high / whose ratio moved away from 1
        (``|log w| > RATIO_NOISE_TOL``), mean k3, ratio quantiles; for a rule with a mask form, the fractions outside
        its range against and with their advantage (``outside_by_advantage``)."""
        with torch.no_grad():
            m = self.mask
            n = int(m.sum())
            out: dict[str, float] = {"n_tokens": float(n)}
            if n == 0:
                keys = (
                    "frac_kept",
                    "frac_masked",
                    "frac_clipped_low",
                    "frac_clipped_high",
                    "frac_ratio_moved",
                    "mean_k3",
                )
                out.update({k: 0.0 for k in keys})
                out.update(
                    {k: 1.0 for k in ("ratio_mean", "ratio_min", "ratio_p05", "ratio_p50", "ratio_p95", "ratio_max")}
                )
                if self.mask_form_kept is not None:
                    out.update(frac_outside_against_advantage=0.0, frac_outside_with_advantage=0.0)
                return out
            frac = lambda b: float((b & m).sum()) / n  # noqa: E731
            y = self.log_ratio[m].double()
            w = torch.exp(y)
            q = nearest_rank_quantiles(w, (0.05, 0.5, 0.95))
            out.update(
                frac_kept=frac(self.result.kept),
                frac_masked=1.0 - frac(self.result.kept),
                frac_clipped_low=frac(self.result.clipped_low),
                frac_clipped_high=frac(self.result.clipped_high),
                frac_ratio_moved=float((y.abs() > RATIO_NOISE_TOL).double().mean()),
                mean_k3=float(kl3_from_log_ratio(y).mean()),
                ratio_mean=float(w.mean()),
                ratio_min=float(w.min()),
                ratio_p05=float(q[0]),
                ratio_p50=float(q[1]),
                ratio_p95=float(q[2]),
                ratio_max=float(w.max()),
            )
            for name, dropped in self.dropped.items():
                out[f"frac_dropped_{name}"] = float((dropped.expand_as(m) & m).sum()) / n
            if self.outside is not None:
                against, with_ = self.outside
                out.update(frac_outside_against_advantage=frac(against), frac_outside_with_advantage=frac(with_))
            return out


def outside_by_advantage(
    kept: torch.Tensor, log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(against, with)``, (B, T) bool: the valid tokens outside the rule's range (not ``kept`` by its mask form)
    on the side against their advantage (``A > 0`` and ``w <= 1``, as ``w < low``; ``A < 0`` and ``w > 1``, as
    ``w > high``) and on the side with it (``A > 0`` and ``w > 1``; ``A < 0`` and ``w <= 1``). A token of ``A = 0``
    is in neither. ``w = 1`` counts as "fell" as DPPO's min form reads it (a ratio range always holds 1; a top-K
    divergence can put a token of ratio 1 outside).

    Where the two forms part: a token outside with its advantage loses its gradient in both (PPO's min takes the
    clipped term); one outside against it keeps ``A w grad log pi`` in the min form (pulled back) and loses it in
    the mask form. So with no token against, the two forms give the same gradient; their losses then differ by a
    constant on the tokens outside with the advantage (the mask form freezes ``w`` at 1, the min form at the bound)
    (``tests/test_loss_forms.py``). One tie: ``tr_ppo``'s min form ``min(w A, A)`` at ``w = 1`` exactly (outside by
    the full KL) gives each term half its gradient (``torch.minimum``), on either side."""
    outside = mask & ~kept
    a = torch.broadcast_to(advantages, mask.shape)
    rose = log_ratio > 0
    against = outside & (((a > 0) & ~rose) | ((a < 0) & rose))
    with_ = outside & (((a > 0) & rose) | ((a < 0) & ~rose))
    return against, with_
