r"""Tabular softmax bandit / one-step MDP simulator, vectorised over seeds, states and arms.

Logits ``theta`` have shape (N, S, K): N independent runs (seeds), S states visited uniformly
(``d(s) = 1/S``), K actions. ``pi(a|s) = softmax(theta[n, s])``. The surrogate of every method is
computed by ``atr_theory.policy_loss`` -- the simulator has no clipping formula of its own:
each (run, state) is one "sequence" and each action (exact mode) or sampled action (sampled mode)
one "token".

* exact mode (the paper's Sec. 4 analysis):
  ``J_n(theta) = sum_s d(s) sum_a pi_old(a|s) f(w(s,a), A(s,a))`` -- a finite sum, whose autograd
  gradient is the exact full-batch policy gradient of the clipped objective.
* sampled mode: G actions per state drawn from ``pi_old``, GRPO (group mean and std) or Dr.GRPO
  (group mean only) advantages from the reward table.

``theta_old`` stays fixed while ``theta`` takes ``inner_steps`` gradient steps on the same batch,
so the ratio ``w`` moves away from 1 and clipping acts, as in PPO-style reuse of a rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from .divergence import entropy_from_log_probs, full_kl
from .loss import LOG_RATIO_CLAMP, LossOutput, policy_loss, rule_generator
from .methods import get_method
from .methods.vocab_topk_masks import DEFAULT_TOPK, topk_logps

__all__ = [
    "entropy",
    "kl_divergence",
    "expected_return",
    "exact_advantages",
    "exact_surrogate",
    "exact_gradient",
    "sampled_surrogate",
    "gradient_step",
    "TrainHistory",
    "train",
    "zipf_logits",
    "sum_mod_success_probability",
    "train_episodic",
]


def entropy(theta: torch.Tensor) -> torch.Tensor:
    """``H(pi) = -sum_a pi log pi`` over the last axis, from logits (stable for any K)."""
    return entropy_from_log_probs(torch.log_softmax(theta, -1))


def kl_divergence(theta_old: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``KL(pi_old || pi)`` over the last axis, from logits (``atr_theory.divergence.full_kl``)."""
    return full_kl(theta_old, theta)


def expected_return(theta: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """``sum_s d(s) sum_a pi(a|s) r(s,a)`` per run: (N, S, K) logits, (S, K) or (N, S, K) rewards -> (N,)."""
    return (torch.softmax(theta, -1) * rewards).sum(-1).mean(-1)


def exact_advantages(theta_old: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """``A(s,a) = r(s,a) - V_old(s)`` with ``V_old(s) = sum_a pi_old(a|s) r(s,a)`` (true advantages)."""
    r = rewards.expand_as(theta_old)
    return r - (torch.softmax(theta_old, -1) * r).sum(-1, keepdim=True)


def exact_surrogate(
    theta: torch.Tensor, theta_old: torch.Tensor, advantages: torch.Tensor, method: str = "atr", **kw
) -> tuple[torch.Tensor, LossOutput]:
    r"""``-sum_n J_n(theta)`` (exact expectation over ``a ~ pi_old``) and the policy_loss output.

    The gradient of the returned scalar w.r.t. ``theta[n]`` is exactly ``-grad J_n``: runs do not mix.
    ``kw`` goes to ``policy_loss`` (``delta``, ``epsilon``, ``form``, ...).
    """
    N, S, K = theta.shape
    logp = torch.log_softmax(theta, -1).reshape(N * S, K)
    old = torch.log_softmax(theta_old.detach(), -1).reshape(N * S, K)
    out = _exact_policy_loss(logp, old, advantages.reshape(N * S, K), method, **kw)
    return out.loss * N, out


def _generator_if_drawn(method: str, kw: dict) -> dict:
    """``kw`` with its ``generator`` kept only where ``method`` draws from it (``rule_generator``): a simulation
    holds one generator for every rule, and ``policy_loss`` refuses one the rule never reads."""
    return {**kw, "generator": rule_generator(method, kw["generator"])} if "generator" in kw else kw


def _exact_policy_loss(
    logp: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, method: str, **kw
) -> LossOutput:
    """``policy_loss`` of the exact expectation: (N*S, K) log-probs, every action a token weighted by pi_old."""
    mask = torch.ones(logp.shape, dtype=torch.bool, device=logp.device)
    if get_method(method).needs_full_distributions:  # every action of a state shares one KL(pi_old || pi): O(K)
        kw = {**kw, "position_kl": full_kl(old, logp).unsqueeze(-1).expand(logp.shape)}
    actions = torch.arange(logp.shape[-1], device=logp.device).expand(logp.shape)
    kw.update(
        _topk_inputs(
            method, old.unsqueeze(1).expand(*logp.shape, -1), logp.unsqueeze(1).expand(*logp.shape, -1), actions
        )
    )
    return policy_loss(
        logp,
        old,
        advantages,
        mask,
        method=method,
        aggregation="seq_mean_token_sum",
        token_weights=old.exp(),
        **_generator_if_drawn(method, kw),
    )


def _topk_inputs(method: str, old_full: torch.Tensor, full: torch.Tensor, actions: torch.Tensor) -> dict:
    """For a rule that reads the top-K (``dppo_topk_*``): both policies' log-probs of the old policy's
    ``min(DEFAULT_TOPK, V - 1)`` most likely actions other than each sampled one (``topk_logps``), from the (.., V)
    distributions; nothing for any other rule."""
    if not get_method(method).needs_topk:
        return {}
    old_topk, topk = topk_logps(old_full, full, actions, min(DEFAULT_TOPK, old_full.shape[-1] - 1))
    return {"old_topk_logp": old_topk, "topk_logp": topk}


def exact_gradient(
    theta: torch.Tensor, theta_old: torch.Tensor, advantages: torch.Tensor, method: str = "atr", **kw
) -> tuple[torch.Tensor, LossOutput]:
    r"""Closed form of the gradient of ``exact_surrogate``'s loss w.r.t. ``theta``, without autograd.

    With ``c_a = dL/d log pi(a)`` the softmax chain rule gives ``dL/d theta_j = c_j - pi_j sum_a c_a``. For a
    method declared with ``ratio_mask_gradient`` (``atr_theory.methods.MethodSpec``: its token gradient is
    ``kept * w A grad log pi``; clip, clip_higher, dual_clip, dcpo, trgppo, atr, kl1, kl2, is_kl3, clip_cov, atr_seq,
    tr_ppo) the loss ``-(1/S) sum_{n,s,a} pi_old(a) f(w_a, A_a)`` has
    ``c_a = -(1/S) pi_old(a) w_a A_a kept_a = -(1/S) pi(a) A_a kept_a`` (``pi_old w = pi``), with ``kept`` the
    method's own flags from ``policy_loss`` (called without gradient), zero where ``|log w|`` exceeds
    ``LOG_RATIO_CLAMP`` (the clamp's gradient). One reduction over the K actions; ``torch.compile`` fuses it.
    ``tests/test_bandit.py``: equal to autograd of ``exact_surrogate`` for every such method and form.
    Returns ``(grad, out)`` like ``exact_surrogate`` returns ``(loss, out)``.
    """
    if not get_method(method).ratio_mask_gradient:
        raise ValueError(
            f"exact_gradient has a closed form only for methods declared with ratio_mask_gradient; got method "
            f"{method!r}, whose token gradient is not kept * w A grad log pi (use autograd of exact_surrogate)"
        )
    N, S, K = theta.shape
    with torch.no_grad():
        logp = torch.log_softmax(theta.detach(), -1).reshape(N * S, K)
        old = torch.log_softmax(theta_old.detach(), -1).reshape(N * S, K)
        out = _exact_policy_loss(logp, old, advantages.reshape(N * S, K), method, **kw)
        # kept from the flags themselves: the cached .kept holds a lock (Python 3.11) that torch.compile cannot trace;
        # policy_loss clamps log w to +-LOG_RATIO_CLAMP, whose gradient is zero outside
        inside = (logp - old).abs() <= LOG_RATIO_CLAMP
        pi = logp.exp()
        kept = out.result.flags()[0]  # nested where, not kept & inside: see atr_theory.methods.mask_and
        c = torch.where(kept, torch.where(inside, pi * advantages.reshape(N * S, K), 0.0), 0.0) * (-1.0 / S)
        grad = (c - pi * c.sum(-1, keepdim=True)).reshape(N, S, K)
    return grad, out


def sampled_surrogate(
    theta: torch.Tensor,
    theta_old: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    method: str = "atr",
    **kw,
) -> tuple[torch.Tensor, LossOutput]:
    """Monte-Carlo surrogate on sampled ``actions`` (N, S, G) with per-sample ``advantages`` (N, S, G)."""
    N, S, G = actions.shape
    full = torch.log_softmax(theta, -1)
    full_old = torch.log_softmax(theta_old.detach(), -1)
    logp = full.gather(-1, actions).reshape(N * S, G)
    old = full_old.gather(-1, actions).reshape(N * S, G)
    mask = torch.ones(N * S, G, dtype=torch.bool, device=theta.device)
    if get_method(method).needs_full_distributions:  # the samples of a state share one KL(pi_old || pi)
        kw = {**kw, "position_kl": full_kl(full_old, full).unsqueeze(-1).expand(N, S, G).reshape(N * S, G)}
    V = full.shape[-1]
    kw.update(
        _topk_inputs(
            method,
            full_old.unsqueeze(2).expand(N, S, G, V).reshape(N * S, G, V),
            full.unsqueeze(2).expand(N, S, G, V).reshape(N * S, G, V),
            actions.reshape(N * S, G),
        )
    )
    out = policy_loss(
        logp,
        old,
        advantages.reshape(N * S, G),
        mask,
        method=method,
        aggregation="seq_mean_token_mean",
        **_generator_if_drawn(method, kw),
    )
    return out.loss * N, out


def gradient_step(theta: torch.Tensor, loss: torch.Tensor, lr: float) -> torch.Tensor:
    """One step of gradient descent on ``loss`` (= ascent on J) with learning rate ``lr``; returns a new leaf."""
    (g,) = torch.autograd.grad(loss, theta)
    return (theta.detach() - lr * g).requires_grad_(True)


def zipf_logits(
    N: int, S: int, K: int, exponent: float = 1.1, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Long-tailed initial logits: ``pi(a) ~ rank(a)^-exponent`` with a random rank per (run, state)."""
    ranks = torch.argsort(torch.rand(N, S, K, generator=generator), -1).double() + 1.0
    return -exponent * torch.log(ranks)


@dataclass
class TrainHistory:
    """Per-iteration curves, each (iterations + 1, N): index 0 is the initial policy."""

    entropy: list[torch.Tensor] = field(default_factory=list)
    ret: list[torch.Tensor] = field(default_factory=list)
    kl: list[torch.Tensor] = field(default_factory=list)
    frac_masked: list[float] = field(default_factory=list)
    ratio_quantiles: list[tuple[float, float, float]] = field(default_factory=list)  # (p05, p50, p95) over tokens

    def as_tensors(self) -> dict[str, torch.Tensor]:
        return {"entropy": torch.stack(self.entropy), "return": torch.stack(self.ret), "kl": torch.stack(self.kl)}


def train(
    rewards: torch.Tensor,
    theta0: torch.Tensor,
    method: str = "atr",
    *,
    iterations: int = 50,
    inner_steps: int = 4,
    lr: float = 1.0,
    mode: str = "exact",
    group_size: int = 8,
    advantage: str = "dr_grpo",
    generator: torch.Generator | None = None,
    progress: bool = False,
    optimizer: str = "sgd",
    gradient: str = "auto",
    **method_params,
) -> tuple[torch.Tensor, TrainHistory]:
    r"""Run ``iterations`` outer steps of PPO-style policy optimisation with ``method``.

    Each outer step freezes ``theta_old``, builds advantages (exact: ``r - V_old``; sampled: G draws
    per state, ``advantage="grpo"`` divides by the group std, ``"dr_grpo"`` does not), then takes
    ``inner_steps`` gradient steps of size ``lr`` on the clipped surrogate: plain gradient descent
    (``optimizer="sgd"``) or ``torch.optim.Adam`` (``"adam"``, Kingma & Ba 2015, default betas and eps, its
    moments kept across outer steps; elementwise, so runs stay independent). Each inner step records the pooled ratio
    quantiles (p05, p50, p95) of the surrogate's tokens in ``ratio_quantiles``.
    ``gradient``: ``"autograd"`` (of the surrogate), ``"closed_form"`` (``exact_gradient``; exact mode and
    a ``ratio_mask_gradient`` method only) or ``"auto"`` (the closed form where it applies: same updates up to rounding).
    Returns the final logits and the history (entropy, return, KL(pi_old || pi) per outer step).
    """
    if mode not in ("exact", "sampled"):
        raise ValueError(f"mode must be 'exact' or 'sampled', got {mode!r}")
    if advantage not in ("grpo", "dr_grpo"):
        raise ValueError(f"advantage must be 'grpo' or 'dr_grpo', got {advantage!r}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    if gradient not in ("auto", "autograd", "closed_form"):
        raise ValueError(f"gradient must be 'auto', 'autograd' or 'closed_form', got {gradient!r}")
    closed_form = mode == "exact" and get_method(method).ratio_mask_gradient
    if gradient == "closed_form" and not closed_form:
        raise ValueError(
            f"gradient='closed_form' needs mode='exact' and a ratio_mask_gradient method; got mode={mode!r}, "
            f"method={method!r}"
        )
    closed_form = closed_form and gradient != "autograd"
    theta = theta0.detach().clone().requires_grad_(True)
    adam = torch.optim.Adam([theta], lr=lr) if optimizer == "adam" else None
    N, S, K = theta.shape
    r = rewards.to(theta.dtype).expand(N, S, K)
    hist = TrainHistory()
    with torch.no_grad():
        hist.entropy.append(entropy(theta).mean(-1))
        hist.ret.append(expected_return(theta, r))
        hist.kl.append(torch.zeros(N, dtype=theta.dtype))
    for _ in tqdm(range(iterations), disable=not progress, desc=method, leave=False):
        theta_old = theta.detach().clone()
        if mode == "exact":
            adv = exact_advantages(theta_old, r)
        else:
            probs = torch.softmax(theta_old, -1).reshape(N * S, K)
            actions = torch.multinomial(probs, group_size, replacement=True, generator=generator).reshape(
                N, S, group_size
            )
            rew = r.gather(-1, actions)
            adv = rew - rew.mean(-1, keepdim=True)
            if advantage == "grpo":
                adv = adv / (rew.std(-1, keepdim=True) + 1e-6)
        masked = []
        for _ in range(inner_steps):
            if closed_form:
                grad, out = exact_gradient(theta, theta_old, adv, method, generator=generator, **method_params)
            elif mode == "exact":
                loss, out = exact_surrogate(theta, theta_old, adv, method, generator=generator, **method_params)
            else:
                loss, out = sampled_surrogate(
                    theta, theta_old, actions, adv, method, generator=generator, **method_params
                )
            masked.append(1.0 - float(out.result.kept.double().mean()))
            m = out.metrics
            hist.ratio_quantiles.append((m["ratio_p05"], m["ratio_p50"], m["ratio_p95"]))
            if adam is None:
                theta = (
                    (theta.detach() - lr * grad).requires_grad_(True) if closed_form else gradient_step(theta, loss, lr)
                )
            else:  # in place on the one leaf theta
                adam.zero_grad()
                if closed_form:
                    theta.grad = grad
                else:
                    loss.backward()
                adam.step()
        with torch.no_grad():
            hist.entropy.append(entropy(theta).mean(-1))
            hist.ret.append(expected_return(theta, r))
            hist.kl.append(kl_divergence(theta_old, theta).mean(-1))
            hist.frac_masked.append(sum(masked) / len(masked))
    return theta.detach(), hist


# ----------------------------------------------------------------------------------------------
# A multi-step episodic task with a verifiable terminal reward (RLVR in miniature)
# ----------------------------------------------------------------------------------------------
def sum_mod_success_probability(theta: torch.Tensor, target: int) -> torch.Tensor:
    r"""Exact ``P(sum_t y_t = target mod V)`` for independent per-position softmax policies.

    ``theta`` (N, T, V): logits of position t. Dynamic programming over positions on the distribution
    of the partial sum mod V (a cyclic convolution per step): O(T V^2), no sampling.
    """
    N, T, V = theta.shape
    probs = torch.softmax(theta, -1)
    dist = torch.zeros(N, V, dtype=theta.dtype, device=theta.device)
    dist[:, 0] = 1.0
    idx = (torch.arange(V)[:, None] + torch.arange(V)[None, :]) % V  # idx[s, y] = (s + y) mod V
    for t in range(T):
        new = torch.zeros_like(dist)
        new.scatter_add_(1, idx.reshape(1, -1).expand(N, -1), (dist[:, :, None] * probs[:, t, None, :]).reshape(N, -1))
        dist = new
    return dist[:, target % V]


def train_episodic(
    theta0: torch.Tensor,
    target: int,
    method: str = "atr",
    *,
    iterations: int = 50,
    inner_steps: int = 4,
    lr: float = 1.0,
    group_size: int = 16,
    aggregation: str = "dr_grpo",
    generator: torch.Generator | None = None,
    **method_params,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""RLVR on a toy sequence task: T token choices from V, reward 1 iff ``sum y_t = target (mod V)``.

    The policy is tabular per position: ``pi(y_t) = softmax(theta[n, t])`` (N runs). Each outer step
    samples G sequences per run, gives each the Dr.GRPO advantage ``r - mean_G r``, and takes
    ``inner_steps`` gradient steps on ``policy_loss`` with B = N * G sequences of T tokens -- so
    sequence-level methods (gspo, atr_seq) act on real sequences here.
    Returns the final logits and the history: exact success probability, mean per-position entropy,
    fraction of tokens masked, each (iterations + 1, N) (masked: (iterations, N)).
    """
    theta = theta0.detach().clone().requires_grad_(True)
    N, T, V = theta.shape
    spec = get_method(method)
    hist = {
        "success": [sum_mod_success_probability(theta.detach(), target)],
        "entropy": [entropy(theta.detach()).mean(-1)],
    }
    masked_hist = []
    for _ in range(iterations):
        theta_old = theta.detach().clone()
        probs = torch.softmax(theta_old, -1)  # (N, T, V)
        flat = probs.unsqueeze(1).expand(N, group_size, T, V).reshape(-1, V)
        y = torch.multinomial(flat, 1, generator=generator).reshape(N, group_size, T)
        reward = ((y.sum(-1) % V) == (target % V)).to(theta.dtype)  # (N, G)
        adv = (reward - reward.mean(-1, keepdim=True)).reshape(N * group_size)
        masked = torch.zeros(N, dtype=theta.dtype)
        for _ in range(inner_steps):
            full = torch.log_softmax(theta, -1).unsqueeze(1).expand(N, group_size, T, V)
            full_old = torch.log_softmax(theta_old, -1).unsqueeze(1).expand(N, group_size, T, V)
            logp = full.gather(-1, y.unsqueeze(-1)).squeeze(-1).reshape(N * group_size, T)
            old = full_old.gather(-1, y.unsqueeze(-1)).squeeze(-1).reshape(N * group_size, T)
            kw = dict(method_params)
            if spec.needs_full_distributions:
                kw.update(
                    full_logp=full.reshape(N * group_size, T, V), old_full_logp=full_old.reshape(N * group_size, T, V)
                )
            kw.update(
                _topk_inputs(
                    method,
                    full_old.reshape(N * group_size, T, V),
                    full.reshape(N * group_size, T, V),
                    y.reshape(N * group_size, T),
                )
            )
            mask = torch.ones(N * group_size, T, dtype=torch.bool)
            out = policy_loss(
                logp,
                old,
                adv,
                mask,
                method=method,
                aggregation=aggregation,
                generator=rule_generator(method, generator),
                **kw,
            )
            masked += 1.0 - out.result.kept.reshape(N, group_size * T).to(theta.dtype).mean(-1)
            theta = gradient_step(theta, out.loss * N, lr)
        masked_hist.append(masked / inner_steps)
        with torch.no_grad():
            hist["success"].append(sum_mod_success_probability(theta, target))
            hist["entropy"].append(entropy(theta).mean(-1))
    out_hist = {k: torch.stack(v) for k, v in hist.items()}
    out_hist["frac_masked"] = torch.stack(masked_hist) if masked_hist else torch.zeros(0, N)
    return theta.detach(), out_hist
