"""Where KL-Cov's compiled time goes, and whether another top-k selection is cheaper (the GPU's 1.86x).

KL-Cov penalises the ``k = max(1, int(cov_ratio * n_valid))`` valid tokens of largest centred covariance; the loss
takes the top ``k_max`` indices (largest first) of the flat covariance through ``methods._top_k_indices``. This
script swaps that one helper for candidate selections, checks each returns the same covariance values in the same
order as ``torch.topk`` (so the same penalised tokens up to ties: ``ties_at_kth``), and times, side by side in one process:
  * the selection alone, eager, at several sizes (median of repeats, synchronised);
  * the whole KL-Cov loss compiled (``torch.compile(fullgraph=True)``, forward + backward) against the compiled
    inline PPO-clip, as ``loss_overhead.py`` times it, with its loss and gradient against the eager call;
  * a ``torch.profiler`` table of the compiled KL-Cov step with the current selection (top kernels).

    python -m experiments.investigations.kl_cov_topk [--device cuda] [--quick] [--out figures/kl_cov_topk.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import atr_theory as at
from atr_theory.methods import entropy_covariance as methods
from benchmarks._timing import timeit
from benchmarks.loss_overhead import inline_ppo_clip, loss_and_grad_difference, make_inputs, side_by_side


def flat_sorted(values: torch.Tensor, k: int) -> torch.Tensor:
    """``torch.topk`` of the flat tensor, sorted (the loss's selection)."""
    return torch.topk(values, k).indices


def flat_unsorted_then_sort(values: torch.Tensor, k: int) -> torch.Tensor:
    """``torch.topk(sorted=False)``, then a sort of the ``k`` values."""
    v, i = torch.topk(values, k, sorted=False)
    return i[torch.argsort(v, descending=True)]


def sort_then_slice(values: torch.Tensor, k: int) -> torch.Tensor:
    """A full descending sort, then the first ``k``."""
    return torch.sort(values, descending=True).indices[:k]


def rows_then_flat(width: int):
    """Top ``min(k, width)`` of each row of ``width`` (padding with -inf), then the top ``k`` of those candidates:
    the overall top ``k`` lies among each row's top ``k``."""

    def select(values: torch.Tensor, k: int) -> torch.Tensor:
        n = values.numel()
        rows = -(-n // width)
        padded = torch.nn.functional.pad(values, (0, rows * width - n), value=-float("inf")).view(rows, width)
        kr = min(k, width)
        v, i = torch.topk(padded, kr, dim=-1, sorted=False)
        flat_i = (i + torch.arange(rows, device=values.device)[:, None] * width).reshape(-1)
        top = torch.topk(v.reshape(-1), k).indices
        return flat_i[top]

    return select


def variants(n: int, T: int) -> dict:
    """The candidate selections for ``n`` flat values from rows of ``T``; ``rows32``: 32 rows of ``ceil(n / 32)``
    (on a GPU, few long slices and few candidates keep both of torch's top-k calls in its one-kernel path)."""
    return {
        "flat_sorted": flat_sorted,
        "flat_unsorted_then_sort": flat_unsorted_then_sort,
        "sort_then_slice": sort_then_slice,
        f"rows_{T}_then_flat": rows_then_flat(T),
        "rows32_then_flat": rows_then_flat(-(-n // 32)),
    }


def kernel_ms_per_call(fn, logp0: torch.Tensor, calls: int = 10) -> float:
    """Summed device (kernel) time of one forward + backward, from ``torch.profiler`` (CUDA only)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(logp0.clone().requires_grad_(True)).backward()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.self_device_time_total for e in kernels) / 1e3 / calls


def same_selection(values: torch.Tensor, k: int, select) -> bool:
    """The selection's values, in order, equal ``torch.topk``'s (equal values may sit at other indices)."""
    return bool(torch.equal(values[select(values, k)], torch.topk(values, k).values))


def ties_at_kth(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cov_ratio: float) -> int:
    """How many valid tokens share the covariance of the k-th selected one. Above 1, selections may penalise other
    tokens of that value (each its own ``|log w|``): the loss then differs on up to twice that many tokens."""
    m = mask.to(logp.dtype)
    zero = torch.zeros_like(logp)
    batch = methods.TokenBatch(zero, adv[:, None] * m, mask, logp * m, zero, "none")  # zero on padding, as the loss's
    n = torch.count_nonzero(mask)
    cov = methods._centred_cov(batch, n).masked_fill(~mask, -float("inf")).reshape(-1)
    k = max(1, int(cov_ratio * int(n)))
    return int((cov == torch.topk(cov, k).values[-1]).sum())


def main(argv: list[str] | None = None) -> None:
    from atr_llm.cli_types import Device, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=Device(), default="cpu")
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats (smoke test)")
    ap.add_argument("--out", type=WriteFile(), default="figures/kl_cov_topk.json")
    args = ap.parse_args(argv)
    dev = args.device
    sizes = [(8, 512), (16, 1024)] if args.quick else [(16, 4096), (64, 4096), (256, 4096)]
    B, T = sizes[-2] if not args.quick else sizes[-1]
    repeats = 5 if args.quick else 50
    cov_ratio = 2e-3
    out: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__}
    out["selection_eager_ms"] = {}
    for b, t in sizes:
        g = torch.Generator().manual_seed(0)
        values = torch.randn(b * t, generator=g).to(dev)
        k = max(1, int(cov_ratio * values.numel()))
        row = {}
        for name, select in variants(b * t, t).items():
            row[name] = {"same": same_selection(values, k, select)}
            row[name]["ms"] = 1e3 * timeit(select, values, k, repeats=repeats, device=dev)
        out["selection_eager_ms"][f"{b}x{t}"] = row
        print(b, t, {n: round(r["ms"], 4) for n, r in row.items()}, flush=True)

    logp0, old, adv, mask = make_inputs(B, T, device=dev)
    maskf = mask.float()
    compiled_peer = None  # set per compile mode below

    def their(lp):
        return compiled_peer(lp, old, adv, maskf)

    def call(lp):
        return at.policy_loss(lp, old, adv, mask, method="kl_cov", validate=False).loss

    original = methods._top_k_indices

    def eager_reference(lp):
        """The eager call with the loss's own selection (the compiled one's global is restored after)."""
        swapped = methods._top_k_indices
        methods._top_k_indices = original
        try:
            return call(lp)
        finally:
            methods._top_k_indices = swapped

    out["ties_at_kth"] = ties_at_kth(logp0, adv, mask, cov_ratio)
    compile_modes = ["default", "reduce-overhead"] if dev == "cuda" else ["default"]
    key = {"default": "compiled_loss", "reduce-overhead": "compiled_loss_cuda_graphs"}
    try:
        for mode in compile_modes:
            out[key[mode]] = {}
            torch._dynamo.reset()
            compiled_peer = torch.compile(inline_ppo_clip, fullgraph=True, mode=mode)
            for name, select in variants(B * T, T).items():
                methods._top_k_indices = select
                torch._dynamo.reset()
                fn = torch.compile(call, fullgraph=True, mode=mode)
                ms, peer_ms, paired = side_by_side(fn, their, logp0, repeats)
                row = {"B": B, "T": T, "ms": 1e3 * ms, "peer_ms": 1e3 * peer_ms, "ratio": ms / peer_ms}
                row["paired_ratio"] = paired
                row.update(loss_and_grad_difference(fn, eager_reference, logp0))
                if dev == "cuda":
                    row["kernel_ms"] = kernel_ms_per_call(fn, logp0)
                    row["peer_kernel_ms"] = kernel_ms_per_call(their, logp0)
                out[key[mode]][name] = row
                print(
                    f"{mode} kl_cov [{name}] {row['ms']:.3f} ms, PPO-clip {row['peer_ms']:.3f} ms, "
                    f"ratio {row['ratio']:.2f} (paired {paired:.2f}); kernels {row.get('kernel_ms', 0):.4f} "
                    f"vs {row.get('peer_kernel_ms', 0):.4f} ms",
                    flush=True,
                )
                Path(args.out).write_text(json.dumps(out, indent=1))
    finally:
        methods._top_k_indices = original
    torch._dynamo.reset()
    compiled_peer = torch.compile(inline_ppo_clip, fullgraph=True)
    torch._dynamo.reset()
    fn = torch.compile(call, fullgraph=True)
    side_by_side(fn, their, logp0, 3)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(10):
            lp = logp0.clone().requires_grad_(True)
            fn(lp).backward()
        if dev == "cuda":
            torch.cuda.synchronize()
    sort_by = "self_device_time_total" if dev == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=20, max_name_column_width=70)
    out["profile_compiled_flat_sorted"] = table
    print(table)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
