"""What the verl oracle tests share: verl 0.9.1's loss code imported with ray stubbed, padded float64 batches, our
loss and verl's on one batch, and the tolerance they agree to. Importable only where verl is (``make test-verl``)."""

from __future__ import annotations

import sys
import types

import torch
from loss_batches import loss_batch

import atr_theory as at


def import_verl():
    """``verl.trainer.ppo.core_algos`` and ``ActorConfig``, with a stub for ray (imported by verl's
    ``__init__`` through ``protocol.py``, never called by the loss functions)."""
    if "ray" not in sys.modules:

        class _Anything:
            def __init__(self, *a, **k):
                pass

            def __call__(self, *a, **k):
                return a[0] if len(a) == 1 and callable(a[0]) and not k else _Anything()

            def __getattr__(self, name):
                return _Anything()

            def __getitem__(self, item):
                return _Anything()

            def __mro_entries__(self, bases):
                return (object,)

            def __or__(self, other):
                return _Anything()

            __ror__ = __or__

        class _StubModule(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return _Anything()

        for name in ("ray", "ray.util", "ray.util.placement_group", "ray.util.scheduling_strategies", "ray.actor"):
            sys.modules[name] = _StubModule(name)
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    return core_algos, ActorConfig


core_algos, ActorConfig = import_verl()  # ImportError without verl: the test files skip (pytest.importorskip)

AGGREGATIONS = {  # ours -> verl's loss_agg_mode (dr_grpo: seq-mean-token-sum-norm with the horizon T)
    "dr_grpo": "seq-mean-token-sum-norm",
    "token_mean": "token-mean",
    "seq_mean_token_mean": "seq-mean-token-mean",
    "seq_mean_token_sum": "seq-mean-token-sum",
    "token_sum": "token-sum",
}
SEEDS = range(12)


def oracle_batch(seed: int, per_token: bool, B: int = 6, T: int = 9, scale: float = 0.5):
    """The shared batch with advantages of shape (B, T) as verl takes them (a sequence's repeated when not
    ``per_token``), every sequence at least 2 tokens long."""
    logp, old, adv, mask = loss_batch(
        seed, B, T, old_offset=0.05, scale=scale, clamp=True, per_token=per_token, min_length=2  # logp clamped at 0
    )
    return logp, old, (adv if per_token else adv[:, None].expand(B, T)).contiguous(), mask


def verl_config(loss_mode: str, **kw) -> ActorConfig:
    from verl.workers.config.actor import PolicyLossConfig

    policy_keys = {"clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta"}
    policy = PolicyLossConfig(loss_mode=loss_mode, **{k: v for k, v in kw.items() if k in policy_keys})
    actor = {k: v for k, v in kw.items() if k not in policy_keys}
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1, policy_loss=policy, **actor)


def our_loss(logp, old, adv, mask, method, aggregation, **params):
    """Our loss and gradient; ``params`` are the method's and ``atr_theory.policy_loss``'s keywords."""
    lp = logp.clone().requires_grad_(True)
    out = at.policy_loss(lp, old, adv, mask, method=method, aggregation=aggregation, **params)
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out.loss.detach(), grad


def verl_loss(logp, old, adv, mask, loss_mode, agg_mode, batch_info=None, **cfg):
    """verl's loss and gradient; ``batch_info`` goes into the config's ``global_batch_info`` (e.g. loss_scale_factor)."""
    lp = logp.clone().requires_grad_(True)
    fn = core_algos.get_policy_loss_fn(loss_mode)
    config = verl_config(loss_mode, **cfg)
    config.global_batch_info.update(batch_info or {})
    loss, metrics = fn(old, lp, adv, mask.to(torch.float64), agg_mode, config)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def agree(a, b, aggregation=None):
    """Equal to float64 rounding; verl's seq-mean-token-mean divides by ``n_tokens + 1e-8``, which moves each
    O(1) per-sequence term by up to 1e-8 (absolute; the total can be much smaller than its terms)."""
    if aggregation == "seq_mean_token_mean":
        return torch.allclose(a, b, rtol=0.0, atol=2e-8)
    return torch.allclose(a, b, rtol=1e-12, atol=1e-14)


def probability_batch(seed: int, per_token: bool):
    """``_batch`` with every log-probability <= -1e-6 (DPPO reads ``p = exp(log p)`` as a probability)."""
    logp, old, adv, mask = oracle_batch(seed, per_token, scale=1.0)
    return logp.clamp(max=-1e-6), old, adv, mask
