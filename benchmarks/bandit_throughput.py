"""Exact-mode bandit updates: vectorised simulator against a per-seed Python loop, and against the
machine's memory bandwidth, measured side by side in one process.

Throughput is (seeds x states x actions) per second of one exact-mode update (surrogate through
``policy_loss``, autograd, gradient step), float64. The loop does the same math per (seed, state)
with a (1, K) call. Bandwidth: a large numpy copy in the same run; the simulator's "achieved
bandwidth" counts the bytes of the tensors each update must stream at least (theta, theta_old, A read,
theta written: 4 x 8 bytes per element) and, separately, an estimate of what it really streams
(elementwise passes of the forward and backward graph, counted with torch's profiler-free rule of
thumb: 40 passes of 8 bytes).

    python benchmarks/bandit_throughput.py [--quick] [--out figures/bandit_throughput.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from atr_theory import bandit


def numpy_copy_bandwidth(n_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """Bytes/s of ``np.copyto`` on a large buffer (read + write counted)."""
    src = np.ones(n_bytes // 8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / min(times)


def vectorised_update(theta, theta_old, adv, lr=1.0):
    th = theta.clone().requires_grad_(True)
    loss, _ = bandit.exact_surrogate(th, theta_old, adv, "atr")
    return bandit.gradient_step(th, loss, lr)


def loop_update(theta, theta_old, adv, lr=1.0):
    out = torch.empty_like(theta)
    N, S, K = theta.shape
    for n in range(N):
        for s in range(S):
            th = theta[n : n + 1, s : s + 1].clone().requires_grad_(True)
            loss, _ = bandit.exact_surrogate(th, theta_old[n : n + 1, s : s + 1], adv[n : n + 1, s : s + 1], "atr")
            out[n, s] = bandit.gradient_step(th, loss, lr)[0, 0] * 1.0  # /S of the batched loss: same update up to d(s)
    return out


def timeit(fn, *args, repeats=5):
    fn(*args)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="figures/bandit_throughput.json")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    bw = numpy_copy_bandwidth(1 << (26 if args.quick else 29))
    print(f"numpy copy bandwidth: {bw / 1e9:.2f} GB/s")
    Ks = (10, 1000, 151_936) if args.quick else (10, 100, 1000, 10_000, 151_936)
    rows = []
    for K in Ks:
        N, S = (64, 16) if K <= 1000 else ((16, 4) if K <= 10_000 else (4, 2))
        g = torch.Generator().manual_seed(0)
        theta_old = torch.randn(N, S, K, generator=g)
        theta = theta_old + 0.3 * torch.randn(N, S, K, generator=g)
        adv = torch.randn(N, S, K, generator=g)
        reps = 3 if args.quick else 7
        t_vec = timeit(vectorised_update, theta, theta_old, adv, repeats=reps)
        t_loop = timeit(loop_update, theta, theta_old, adv, repeats=max(2, reps // 3))
        elems = N * S * K
        min_bytes = 4 * 8 * elems
        est_bytes = 40 * 8 * elems
        row = {
            "K": K,
            "N": N,
            "S": S,
            "vectorised_elements_per_s": elems / t_vec,
            "loop_elements_per_s": elems / t_loop,
            "speedup_vs_loop": t_loop / t_vec,
            "min_traffic_fraction_of_bandwidth": min_bytes / t_vec / bw,
            "estimated_traffic_fraction_of_bandwidth": est_bytes / t_vec / bw,
        }
        rows.append(row)
        print(
            f"K={K:7d} N={N:3d} S={S:3d}  vectorised {elems / t_vec / 1e6:8.2f} M elem/s  loop {elems / t_loop / 1e6:8.3f} M elem/s"
            f"  speedup x{t_loop / t_vec:7.1f}  bandwidth: min-traffic {100 * row['min_traffic_fraction_of_bandwidth']:.1f}%"
            f", estimated {100 * row['estimated_traffic_fraction_of_bandwidth']:.0f}%"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"copy_bandwidth_GBps": bw / 1e9, "threads": torch.get_num_threads(), "rows": rows}, indent=2)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
