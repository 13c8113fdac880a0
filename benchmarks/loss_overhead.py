"""Forward + backward cost of ``policy_loss`` for every method, as a ratio to an inline PPO-clip.

Part 1: (B, T) = (64, 4096) float32, each method against a minimal PPO-clip written the way TRL
writes it, measured side by side in one process (interleaved, median of repeats).
Part 2: the methods that need full distributions (tr_ppo, truly_ppo) at Qwen3's vocabulary
V = 151,936 on (B, T) = (2, 512), chunked; time and peak extra memory per token against atr,
each measured in a fresh subprocess (peak RSS).

    python benchmarks/loss_overhead.py [--quick] [--out figures/loss_overhead.json]
    python benchmarks/loss_overhead.py --device cuda --part1-only --out figures/loss_overhead_cuda.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import time
from pathlib import Path

import torch

import atr_theory as at


def inline_ppo_clip(logp, old_logp, adv, mask, eps_low=0.2, eps_high=0.2):
    """TRL-style PPO clip (dr_grpo aggregation), the peer every method is compared against."""
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * adv.unsqueeze(1), coef_2 * adv.unsqueeze(1))
    return (per_token_loss * mask).sum() / (logp.size(0) * logp.size(1))


def make_inputs(B, T, seed=0, scale=0.3, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3 - 0.01
    logp = (old + scale * torch.randn(B, T, generator=g)).clamp(max=0.0)
    adv = torch.randn(B, generator=g)
    # completions of random length (T/4 .. T), padded: both sides pay for the mask
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return tuple(x.to(device) for x in (logp, old, adv, mask))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, logp0):
    logp = logp0.clone().requires_grad_(True)
    _sync(logp.device)
    t0 = time.perf_counter()
    loss = fn(logp)
    loss.backward()
    _sync(logp.device)
    return time.perf_counter() - t0


def part1(B, T, repeats, device="cpu"):
    logp0, old, adv, mask = make_inputs(B, T, device=device)
    maskf = mask.float()
    peer = lambda lp: inline_ppo_clip(lp, old, adv, maskf)
    results = {}
    names = [n for n in at.method_names(aliases=False) if not at.METHODS[n].needs_full_distributions]
    for name in names:
        fn = lambda lp, name=name: at.policy_loss(lp, old, adv, mask, method=name).loss
        reps = max(3, repeats // 5) if name == "trgppo" else repeats
        for _ in range(2):  # warm-up
            time_call(fn, logp0), time_call(peer, logp0)
        ours, theirs = [], []
        for _ in range(reps):  # interleaved so drift hits both alike
            ours.append(time_call(fn, logp0))
            theirs.append(time_call(peer, logp0))
        m_ours, m_peer = statistics.median(ours), statistics.median(theirs)
        results[name] = {"ms": 1e3 * m_ours, "peer_ms": 1e3 * m_peer, "ratio": m_ours / m_peer}
        print(
            f"{name:12s} {1e3 * m_ours:9.2f} ms  inline PPO-clip {1e3 * m_peer:7.2f} ms  ratio {m_ours / m_peer:6.2f}"
        )
    # the cost of the (lazy) metrics, for the record
    out = at.policy_loss(logp0, old, adv, mask, method="atr")
    t0 = time.perf_counter()
    _ = out.metrics
    results["_metrics_ms"] = 1e3 * (time.perf_counter() - t0)
    return results


def _full_worker(method, B, T, V, chunk, repeats, q):
    torch.manual_seed(0)
    old_full = torch.log_softmax(torch.randn(B, T, V), -1)
    new_full = torch.log_softmax(old_full + 0.05 * torch.randn(B, T, V), -1)
    tok = torch.randint(0, V, (B, T))
    old = old_full.gather(-1, tok[..., None])[..., 0]
    adv = torch.randn(B)
    mask = torch.ones(B, T, dtype=torch.bool)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        leaf = new_full.clone().requires_grad_(True)
        t0 = time.perf_counter()
        logp = leaf.gather(-1, tok[..., None])[..., 0]
        kw = dict(old_full_logp=old_full, full_logp=leaf, kl_chunk_size=chunk) if method != "atr" else {}
        loss = at.policy_loss(logp, old, adv, mask, method=method, **kw).loss
        loss.backward()
        times.append(time.perf_counter() - t0)
        del leaf, loss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    q.put({"ms": 1e3 * statistics.median(times), "extra_peak_MiB": (peak - base_rss) / 1024})


def part2(B, T, V, chunk, repeats):
    ctx = mp.get_context("spawn")
    res = {}
    for method in ("atr", "tr_ppo", "truly_ppo"):
        q = ctx.Queue()
        p = ctx.Process(target=_full_worker, args=(method, B, T, V, chunk, repeats, q))
        p.start()
        res[method] = q.get()
        p.join()
    n = B * T
    for method, r in res.items():
        r["us_per_token"] = 1e3 * r["ms"] / n
        r["KiB_per_token"] = 1024 * r["extra_peak_MiB"] / n
        r["time_ratio_vs_atr"] = r["ms"] / res["atr"]["ms"]
        print(
            f"{method:10s} {r['ms']:9.1f} ms ({r['us_per_token']:.1f} us/token, x{r['time_ratio_vs_atr']:.1f} atr)"
            f"  extra peak {r['extra_peak_MiB']:.0f} MiB ({r['KiB_per_token']:.0f} KiB/token)"
        )
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--out", default="figures/loss_overhead.json")
    ap.add_argument("--device", default="cpu", help="where part 1 runs (cuda: synchronised around each call)")
    ap.add_argument("--part1-only", action="store_true", help="skip part 2 (full distributions)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.part1_only:
        B, T = (8, 256) if args.quick else (64, 4096)
        r1 = part1(B, T, 5 if args.quick else 25, args.device)
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        result = {"sizes": {"part1": [B, T]}, "device": device, "torch": torch.__version__, "part1": r1}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
        return
    if args.quick:
        r1 = part1(8, 256, 5)
        r2 = part2(1, 16, 4096, 8, 2)
        sizes = {"part1": [8, 256], "part2": [1, 16, 4096]}
    else:
        r1 = part1(64, 4096, 25)
        r2 = part2(2, 512, 151_936, 64, 3)
        sizes = {"part1": [64, 4096], "part2": [2, 512, 151_936]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"sizes": sizes, "threads": torch.get_num_threads(), "part1": r1, "part2": r2}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
