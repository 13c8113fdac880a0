"""Exact-mode bandit updates: autograd, closed form, compiled closed form, against a per-(seed, state) Python
loop and against the machine's copy bandwidth, measured side by side in one process.

Throughput is (seeds x states x actions) per second of one exact-mode gradient (ATR, float64). Paths:

* ``autograd``: ``atr_theory.bandit.exact_surrogate`` (``policy_loss``) and ``torch.autograd.grad``;
* ``closed_form``: ``atr_theory.bandit.exact_gradient`` (``c - pi sum c`` with the method's own flags);
* ``compiled``: the same under ``torch.compile(fullgraph=True)`` (``validate=False``: no host sync);
* ``loop``: the autograd path per (seed, state), a (1, 1, K) call each.

Bandwidth: a large device copy (``torch``'s ``copy_``; on CPU also numpy's single-threaded copy, the reference of
earlier runs) in the same run, bytes read + written. "min traffic" counts the bytes each update must stream at
least: theta, theta_old, A read and the gradient written, 4 x 8 bytes per element.

Compute ceiling: the rate of the element-wise transcendentals an exact gradient cannot avoid, each timed alone on
a float64 tensor of the K = 1,000 size with the same threads. Two exponentials per element (the softmax
numerators of theta and theta_old; pi and w follow from them by products); ATR's rule, as
``atr_theory.methods.atr`` decides it since 2026-11-26 (``log w`` against the two representable roots of
``k3 = delta``), adds two comparisons and no transcendental: ``1 / (2 t_exp)`` elements per second
(``ceiling_elements_per_s`` = ``ceiling_range_test_elements_per_s``). Until then it evaluated ``expm1(y) - y``
per token (and, in float64, a 17-term series below ``|y| = 0.5``): ``1 / (2 t_exp + t_expm1)`` at best,
``ceiling_k3_test_elements_per_s``. ``min_traffic_fraction_at_compute_ceiling`` is the copy
fraction a kernel running at the ceiling would reach: the bandwidth goal is out of reach where it is below 1/3.

    python -m benchmarks.bandit_throughput [--quick] [--device cuda] [--out figures/bench/<machine>/bandit_throughput.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from atr_theory import bandit
from benchmarks._machine import default_output
from benchmarks._timing import timeit

METHOD = "atr"


def numpy_copy_bandwidth(n_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """Bytes/s of ``np.copyto`` on a large buffer (read + write counted; one thread)."""
    src = np.ones(n_bytes // 8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / min(times)


def torch_copy_bandwidth(device: str, n_bytes: int = 1 << 29, repeats: int = 7) -> float:
    """Bytes/s of ``Tensor.copy_`` on ``device`` (read + write counted; all threads on CPU): the best of ``repeats``
    after a warm-up, like ``numpy_copy_bandwidth`` (the median of 5 read 42-44 GB/s in some runs on this 2-core
    machine where the copy otherwise runs at 70-75)."""
    src = torch.ones(n_bytes // 8, dtype=torch.float64, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / timeit(dst.copy_, src, repeats=repeats, device=device, reduce=min)


def autograd_gradient(theta, theta_old, adv):
    th = theta.clone().requires_grad_(True)
    loss, _ = bandit.exact_surrogate(th, theta_old, adv, METHOD)
    return torch.autograd.grad(loss, th)[0]


def closed_form_gradient(theta, theta_old, adv):
    return bandit.exact_gradient(theta, theta_old, adv, METHOD)[0]


def _nosync_closed_form(theta, theta_old, adv):
    return bandit.exact_gradient(theta, theta_old, adv, METHOD, validate=False)[0]


def elementwise_seconds_per_element(op, n: int, device: str, repeats: int = 7) -> float:
    """Median seconds per element of ``op`` on a float64 tensor of ``n`` values in [-1, 1) (all threads)."""
    x = torch.rand(n, dtype=torch.float64, device=device) * 2 - 1
    return timeit(op, x, repeats=repeats, device=device) / n


def compute_ceiling(device: str, n: int) -> dict:
    """Elements per second of the unavoidable transcendentals of one exact ATR gradient (see the module doc)."""
    t_exp = elementwise_seconds_per_element(torch.exp, n, device)
    t_expm1 = elementwise_seconds_per_element(torch.expm1, n, device)
    return {
        "exp_elements_per_s": 1 / t_exp,
        "expm1_elements_per_s": 1 / t_expm1,
        "ceiling_elements_per_s": 1 / (2 * t_exp),
        "ceiling_range_test_elements_per_s": 1 / (2 * t_exp),
        "ceiling_k3_test_elements_per_s": 1 / (2 * t_exp + t_expm1),
    }


def loop_gradient(theta, theta_old, adv):
    out = torch.empty_like(theta)
    N, S, _ = theta.shape
    for n in range(N):
        for s in range(S):
            i = (slice(n, n + 1), slice(s, s + 1))
            out[n, s] = autograd_gradient(theta[i], theta_old[i], adv[i])[0, 0] / S  # 1/S: the batched loss's d(s)
    return out


def main(argv: list[str] | None = None):
    from atr_llm.cli_types import Device, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", type=Device(), default="cpu")
    ap.add_argument("--out", type=WriteFile(), help="default: figures/bench/<machine>/bandit_throughput.json")
    args = ap.parse_args(argv)
    dev = args.device
    cuda = torch.device(dev).type == "cuda"
    torch.set_default_dtype(torch.float64)
    bw_torch = torch_copy_bandwidth(dev, 1 << (26 if args.quick else (31 if cuda else 29)))
    bw_numpy = None if cuda else numpy_copy_bandwidth(1 << (26 if args.quick else 29))
    bw = bw_torch if cuda else bw_numpy  # CPU: numpy's copy, the reference of the earlier runs (kept comparable)
    print(f"copy bandwidth: torch {bw_torch / 1e9:.2f} GB/s" + ("" if cuda else f", numpy {bw_numpy / 1e9:.2f} GB/s"))
    ceiling = compute_ceiling(dev, 64 * 16 * 1000)
    print(
        "compute ceiling (2 exp per element, ATR's range test): "
        f"{ceiling['ceiling_elements_per_s'] / 1e6:.1f} M elem/s = {100 * 32 * ceiling['ceiling_elements_per_s'] / bw:.1f}%"
        f" of copy; with a per-token k3 (2 exp + expm1): {ceiling['ceiling_k3_test_elements_per_s'] / 1e6:.1f} M elem/s"
        f" = {100 * 32 * ceiling['ceiling_k3_test_elements_per_s'] / bw:.1f}% of copy"
    )
    out = Path(args.out) if args.out else default_output("bandit_throughput.json", dev)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "method": METHOD,
        "dtype": "float64",
        "copy_bandwidth_GBps": bw / 1e9,
        "torch_copy_bandwidth_GBps": bw_torch / 1e9,
        "threads": torch.get_num_threads(),
        "compute_ceiling": {
            **ceiling,
            "min_traffic_fraction_at_compute_ceiling": 32 * ceiling["ceiling_elements_per_s"] / bw,
            "min_traffic_fraction_at_range_test_ceiling": 32 * ceiling["ceiling_range_test_elements_per_s"] / bw,
            "min_traffic_fraction_at_k3_test_ceiling": 32 * ceiling["ceiling_k3_test_elements_per_s"] / bw,
        },
    }
    compiled = torch.compile(_nosync_closed_form, fullgraph=True, dynamic=False)
    Ks = (10, 1000, 151_936) if args.quick else (10, 100, 1000, 10_000, 151_936)
    rows = []
    for K in Ks:
        N, S = (64, 16) if K <= 1000 else ((16, 4) if K <= 10_000 else (4, 2))
        if cuda:  # enough work to fill the GPU
            N *= 16
        g = torch.Generator().manual_seed(0)
        theta_old = torch.randn(N, S, K, generator=g).to(dev)
        theta = theta_old + 0.3 * torch.randn(N, S, K, generator=g).to(dev)
        adv = torch.randn(N, S, K, generator=g).to(dev)
        reps = 3 if args.quick else 7
        t0 = time.perf_counter()
        reference = autograd_gradient(theta, theta_old, adv)
        err = {
            name: float((fn(theta, theta_old, adv) - reference).abs().max())
            for name, fn in (("closed_form", closed_form_gradient), ("compiled", compiled))
        }
        compile_s = time.perf_counter() - t0
        times = {
            "autograd": timeit(autograd_gradient, theta, theta_old, adv, repeats=reps, device=dev),
            "closed_form": timeit(closed_form_gradient, theta, theta_old, adv, repeats=reps, device=dev),
            "compiled": timeit(compiled, theta, theta_old, adv, repeats=reps, device=dev),
        }
        loop_slice = (slice(0, max(1, N // (16 if cuda else 1))),)  # the loop on a slice of the seeds (time / elem)
        t_loop = timeit(loop_gradient, *(x[loop_slice] for x in (theta, theta_old, adv)), repeats=2, device=dev)
        loop_elems = theta[loop_slice].numel()
        elems = N * S * K
        best = min(times, key=times.get)
        row = {
            "K": K,
            "N": N,
            "S": S,
            "best_path": best,
            "vectorised_elements_per_s": elems / times[best],
            "loop_elements_per_s": loop_elems / t_loop,
            "speedup_vs_loop": (t_loop / loop_elems) / (times[best] / elems),
            "min_traffic_fraction_of_bandwidth": 4 * 8 * elems / times[best] / bw,
            "min_traffic_fraction_of_torch_copy": 4 * 8 * elems / times[best] / bw_torch,
            "fraction_of_compute_ceiling": elems / times[best] / ceiling["ceiling_elements_per_s"],
            "elements_per_s": {k: elems / t for k, t in times.items()},
            "speedup_vs_autograd": {k: times["autograd"] / t for k, t in times.items()},
            "max_abs_error_vs_autograd": err,
            "first_call_s_incl_compile": compile_s,
        }
        rows.append(row)
        print(
            f"K={K:7d} N={N:4d} S={S:3d}  M elem/s: "
            + "  ".join(f"{k} {v / 1e6:8.1f}" for k, v in row["elements_per_s"].items())
            + f"  loop {row['loop_elements_per_s'] / 1e6:7.3f}  best/loop x{row['speedup_vs_loop']:6.1f}"
            f"  min-traffic {100 * row['min_traffic_fraction_of_bandwidth']:.1f}% of copy"
            f" ({100 * row['fraction_of_compute_ceiling']:.0f}% of the compute ceiling)"
            f"  |err| {max(err.values()):.1e}",
            flush=True,
        )
        out.write_text(json.dumps({**meta, "rows": rows}, indent=2))  # after every row: a stopped run keeps them
    print(f"wrote {out}")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
