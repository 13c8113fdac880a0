"""``head_kl_chunked`` (KL, log-probs and entropies from hidden states, one chunk of V at a time) against the
full (B, T, V) computation written out in the test, and the memory it keeps for the backward."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import atr_theory as at


def _setup(seed, B=3, T=7, H=16, V=50, bias=True, old_weight=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    old_hidden = (hidden.detach() + 0.3 * torch.randn(B, T, H, generator=g, dtype=torch.float64)).detach()
    weight = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    w_old = (weight.detach() + 0.1 * torch.randn(V, H, generator=g, dtype=torch.float64)) if old_weight else None
    tokens = torch.randint(0, V, (B, T), generator=g)
    return hidden, old_hidden, weight, b, w_old, tokens


def _reference(hidden, old_hidden, weight, b, w_old, tokens, temperature):
    """The whole (B, T, V) log-softmax, by hand: KL = sum_a p_old(a) (log p_old(a) - log p(a))."""
    logits = hidden @ weight.T + (0 if b is None else b)
    old_logits = old_hidden @ (weight if w_old is None else w_old).T + (0 if b is None else b)
    lsm = torch.log_softmax(logits / temperature, -1)
    old = torch.log_softmax(old_logits / temperature, -1).detach()
    kl = (old.exp() * (old - lsm)).sum(-1)
    logp = lsm.gather(-1, tokens[..., None])[..., 0]
    ent = -(lsm.exp() * lsm).sum(-1)
    return logp, kl, ent


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(1, 30),
    st.booleans(),
    st.booleans(),
    st.sampled_from([1.0, 0.7]),
)
def test_chunked_head_scores_equal_the_full_computation(seed, chunk, bias, old_weight, temperature):
    hidden, old_hidden, weight, b, w_old, tokens = _setup(seed, bias=bias, old_weight=old_weight)
    out = at.head_kl_chunked(
        hidden, old_hidden, weight, tokens, bias=b, old_weight=w_old, temperature=temperature, chunk_size=chunk
    )
    ref = _reference(hidden, old_hidden, weight, b, w_old, tokens, temperature)
    for got, want in zip(out, ref):
        torch.testing.assert_close(got, want.detach() if got is out.entropy else want, rtol=1e-10, atol=1e-12)
    assert not out.entropy.requires_grad
    # gradients of an arbitrary combination of log-prob and KL, w.r.t. every trainable input
    g = torch.Generator().manual_seed(seed + 1)
    c1, c2 = (
        torch.randn(out.kl.shape, generator=g, dtype=torch.float64),
        torch.randn(2, dtype=torch.float64, generator=g),
    )
    leaves = [hidden, weight] + ([b] if bias else [])
    got = torch.autograd.grad((c1 * (c2[0] * out.logp + c2[1] * out.kl)).sum(), leaves)
    want = torch.autograd.grad((c1 * (c2[0] * ref[0] + c2[1] * ref[1])).sum(), leaves)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("head", ["trainable", "frozen (LoRA on the decoder)"])
def test_the_backward_keeps_no_vocabulary_sized_tensor_beyond_one_chunk(head):
    """Every tensor autograd saves during the forward is recorded: the chunked path saves only inputs (hidden
    states, the head), the full path saves (B T, V) log-softmax outputs; also when only the hidden states need a
    gradient (a frozen LM head, as with LoRA on the decoder)."""
    B, T, H, V, chunk = 4, 32, 8, 1000, 16
    hidden, old_hidden, weight, b, _, tokens = _setup(0, B, T, H, V, bias=False)
    weight.requires_grad_(head == "trainable")

    def largest_saved(fn):
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return max(sizes)

    chunked = largest_saved(lambda: at.head_kl_chunked(hidden, old_hidden, weight, tokens, chunk_size=chunk).kl.sum())
    full = largest_saved(lambda: _reference(hidden, old_hidden, weight, None, None, tokens, 1.0)[1].sum())
    assert full >= B * T * V
    assert chunked <= max(V * H, B * T * H)  # the head and the hidden states themselves, nothing (B T, V)


@pytest.mark.parametrize("method", ["tr_ppo", "truly_ppo"])
def test_policy_loss_with_position_kl_equals_the_full_distributions(method):
    hidden, old_hidden, weight, b, _, tokens = _setup(3, T=9, bias=False)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False
    kw = dict(method=method, delta=0.02)

    scores = at.head_kl_chunked(hidden, old_hidden, weight, tokens, chunk_size=4)
    old_logp = at.head_kl_chunked(old_hidden, old_hidden, weight.detach(), tokens).logp
    a = at.policy_loss(scores.logp, old_logp, adv, mask, position_kl=scores.kl, **kw).loss
    (ga,) = torch.autograd.grad(a, hidden)

    full = torch.log_softmax(hidden @ weight.T, -1)
    old_full = torch.log_softmax(old_hidden @ weight.detach().T, -1)
    logp = full.gather(-1, tokens[..., None])[..., 0]
    b_loss = at.policy_loss(logp, old_logp, adv, mask, old_full_logp=old_full, full_logp=full, **kw).loss
    (gb,) = torch.autograd.grad(b_loss, hidden)
    torch.testing.assert_close(a, b_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)
    assert float(ga.abs().sum()) > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(chunk_size=0), r"^chunk_size must be an integer >= 1, got 0$"),
        (dict(chunk_size=2.5), r"^chunk_size must be an integer >= 1, got 2\.5$"),
        (dict(chunk_size=True), r"^chunk_size must be an integer >= 1, got True$"),
        (dict(temperature=0.0), r"^temperature must be a finite number > 0, got 0\.0$"),
        (
            dict(tokens=torch.zeros(2, 2, dtype=torch.long)),
            r"^tokens must have shape \(3, 7\), got \(2, 2\)$",
        ),
        (
            dict(old_hidden=torch.zeros(3, 6, 16, dtype=torch.float64)),
            r"^hidden and old_hidden must have the same shape \(\.\.\., H\), got \(3, 7, 16\) and \(3, 6, 16\)$",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    hidden, old_hidden, weight, _, _, tokens = _setup(0)
    args = dict(tokens=tokens, old_hidden=old_hidden)
    args.update(kwargs)
    tok, old = args.pop("tokens"), args.pop("old_hidden")
    with pytest.raises(ValueError, match=match):
        at.head_kl_chunked(hidden, old, weight, tok, **args)


def test_an_old_bias_and_two_dimensional_hidden_states_are_honoured():
    """``old_bias`` (the head's bias at generation time) enters pi_old's logits, not the current bias: against the
    log-softmax written out; and (N, H) hidden states (positions already flattened) give the (B, T, H) result."""
    hidden, old_hidden, weight, b, w_old, tokens = _setup(3, bias=True, old_weight=True)
    old_b = b.detach() + 0.5 * torch.randn(b.shape, generator=torch.Generator().manual_seed(4), dtype=b.dtype)
    out = at.head_kl_chunked(hidden, old_hidden, weight, tokens, bias=b, old_weight=w_old, old_bias=old_b, chunk_size=5)
    lsm = torch.log_softmax(hidden @ weight.T + b, -1)
    old = torch.log_softmax(old_hidden @ w_old.T + old_b, -1)
    torch.testing.assert_close(out.kl, (old.exp() * (old - lsm)).sum(-1), rtol=1e-10, atol=1e-12)
    flat = at.head_kl_chunked(
        hidden.reshape(-1, 16),
        old_hidden.reshape(-1, 16),
        weight,
        tokens.reshape(-1),
        bias=b,
        old_weight=w_old,
        old_bias=old_b,
        chunk_size=5,
    )
    for got, want in zip(flat, out):
        torch.testing.assert_close(got, want.reshape(-1), rtol=0, atol=0)
