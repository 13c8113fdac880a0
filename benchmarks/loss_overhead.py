"""Cost of ``policy_loss`` for every method against an inline PPO-clip, and the memory of the full-KL path.

Part 1 (time): forward + backward of every per-token method (a rule that reads the top-K with K = ``TOPK`` other
tokens per position, ``make_topk_inputs``) against a minimal PPO-clip written the way TRL
writes it, side by side in one process (interleaved, median of repeats), at several (B, T):
  * ``eager``: ``policy_loss`` as called by default (values validated);
  * ``nosync``: ``policy_loss(..., validate=False)`` (no host reads);
  * ``compiled``: ``torch.compile(fullgraph=True)`` of the ``validate=False`` call against the compiled
    inline PPO-clip (clip_cov is not compilable in one graph and is left out);
  * ``compiled_cuda_graphs`` (``--modes``): the same with ``mode="reduce-overhead"`` on both sides (CUDA graphs
    replayed, so kernel-launch overhead no longer dominates; on a CPU the same as ``compiled``).
``part1.<method>.ratio`` is the eager ratio at the largest size (the layout older runs wrote).
Part 2 (memory): the full-distribution methods (tr_ppo, truly_ppo) through ``head_kl_chunked`` (hidden
states + LM head, one chunk of V at a time) against the (B, T, V) log-softmax path, at several B x T and V,
forward + backward, each case in a fresh process (CPU: growth of peak RSS; CUDA: max_memory_allocated).

    python -m benchmarks.loss_overhead [--quick] [--out figures/bench/cpu/loss_overhead.json]
    python -m benchmarks.loss_overhead --time-only --compiled --out figures/bench/cpu/loss_overhead_time.json  # + compiled
    python -m benchmarks.loss_overhead --device cuda    # figures/bench/<card>/loss_overhead.json
    python -m benchmarks.loss_overhead --device cuda --time-only --compiled --methods trgppo kl_cov atr clip
    python -m benchmarks.loss_overhead --device cuda --time-only --modes compiled  # the compiled mode alone

Parity, beside every timed row (no timing of its own): ``compiled`` rows carry the compiled call's loss and
gradient against the eager ``validate=False`` call on the same device (``max_abs_loss_diff``,
``max_abs_grad_diff``, ``max_abs_grad``); on a GPU, ``eager`` rows carry the device's loss and gradient against
the same float32 inputs on the CPU (``vs_cpu``; clip_cov draws its random subset from the device's generator,
so its CPU difference is not a rounding difference). Part 1's JSON is re-written after every row, so a run
stopped by a time limit keeps the rows it measured.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

import torch

import atr_theory as at
from atr_llm.huge_pages import HUGE_PAGES_VARIABLE, enable_huge_pages_for_large_cpu_tensors
from benchmarks._machine import default_output
from benchmarks._memory import MMAP_ENV, reset_rss_peak_mib, rss_mib
from sims._common import png_text_metadata


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


TOPK = at.methods.vocab_topk_masks.DEFAULT_TOPK


def make_topk_inputs(logp, old, k=TOPK, seed=1):
    """For a rule that reads the top-K (``dppo_topk_*``): both policies' log-probs of ``k`` other tokens, (B, T, k),
    sharing each position's remaining mass (``1 - p``) with a rest bucket, the new policy's moved by ``0.3`` in logit
    space: what a trainer would store at generation (old) and gather when it scores the batch (new); contiguous, as
    ``atr_theory.topk_logps`` returns them."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*old.shape, k + 1, generator=g).to(old.device)
    moved = z + 0.3 * torch.randn(*old.shape, k + 1, generator=g).to(old.device)

    def share(base, logits):
        return (torch.log(-torch.expm1(base))[..., None] + torch.log_softmax(logits, -1))[..., :k].contiguous()

    return {"old_topk_logp": share(old, z), "topk_logp": share(logp.detach(), moved)}


def method_inputs(name, logp, old) -> dict:
    """What ``name`` reads besides the sampled tokens (the top-K at ``TOPK``; nothing for the other per-token rules)."""
    return make_topk_inputs(logp, old) if at.METHODS[name].needs_topk else {}


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


def side_by_side(fn, peer, logp0, repeats):
    """Median times of ``fn`` and ``peer`` (forward + backward), interleaved so drift hits both alike, and the median
    of the ratios of the back-to-back pairs (less sensitive to load that changes during the run)."""
    for _ in range(3):  # warm-up (and compilation)
        time_call(fn, logp0), time_call(peer, logp0)
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(time_call(fn, logp0))
        theirs.append(time_call(peer, logp0))
    paired = statistics.median(a / b for a, b in zip(ours, theirs))
    return statistics.median(ours), statistics.median(theirs), paired


# torch.compile's mode for each compiled mode of part 1: "compiled_cuda_graphs" replays CUDA graphs (launch overhead
# removed; the same as "compiled" on a CPU)
COMPILE_MODES = {"compiled": "default", "compiled_cuda_graphs": "reduce-overhead"}

PER_TOKEN = [n for n in at.method_names(aliases=False) if not at.METHODS[n].needs_full_distributions]


def loss_and_grad_difference(fn, reference, logp0, logp0_reference=None) -> dict:
    """Max |loss difference| and max |gradient difference| of ``fn`` against ``reference`` (forward + backward of
    each on a fresh leaf; ``logp0_reference`` the reference's copy of the inputs, e.g. on another device), with the
    reference gradient's max |value| for scale. Non-finite gradient entries are compared as zeros.

    A token whose ratio lies within rounding of a bound can be kept by one computation and frozen by the other
    (e.g. ATR at k3 = 0.0700000130 in float32): its gradient then differs by its whole size.
    ``tokens_grad_differs`` counts the tokens whose gradients differ by more than 1e-3 of the largest, and
    ``max_abs_grad_diff_other_tokens`` is the largest difference on all other tokens (rounding)."""
    results = []
    for f, x in ((fn, logp0), (reference, logp0 if logp0_reference is None else logp0_reference)):
        leaf = x.clone().requires_grad_(True)
        loss = f(leaf)
        (grad,) = torch.autograd.grad(loss, leaf)
        results.append((loss.detach().double().cpu(), torch.nan_to_num(grad).double().cpu()))
    (l1, g1), (l0, g0) = results
    diff = (g1 - g0).abs()
    differs = diff > 1e-3 * g0.abs().max()
    return {
        "max_abs_loss_diff": float((l1 - l0).abs()),
        "max_abs_grad_diff": float(diff.max()),
        "max_abs_grad": float(g0.abs().max()),
        "tokens_grad_differs": int(differs.sum()),
        "max_abs_grad_diff_other_tokens": float(diff[~differs].max()) if bool((~differs).any()) else 0.0,
    }


def resolve_methods(names) -> list[str]:
    """The per-token methods to time, in the order given (``None``: all, in registration order); a name that is
    not a registered per-token method is refused, naming it."""
    if names is None:
        return list(PER_TOKEN)
    unknown = [n for n in names if n not in PER_TOKEN]
    if unknown:
        from atr_llm.command_line import refuse

        raise refuse("--methods", " ".join(unknown), f"not per-token methods; expected some of {', '.join(PER_TOKEN)}")
    return list(dict.fromkeys(names))


def part1(sizes, repeats, device="cpu", modes=("eager", "nosync", "compiled"), methods=None, on_row=None):
    """``{mode: {method: [{"B", "T", "ms", "peer_ms", "ratio", parity...}, ...]}}``; ``compiled`` at the largest
    size only (one compilation per method). ``on_row(out)`` is called after every row (to save partial results)."""
    methods = resolve_methods(methods)
    out: dict = {mode: {} for mode in modes}
    on_gpu = torch.device(device).type == "cuda"
    for B, T in sizes:
        here = [m for m in modes if m not in COMPILE_MODES or (B, T) == tuple(sizes[-1])]
        logp0, old, adv, mask = make_inputs(B, T, device=device)
        cpu_inputs = make_inputs(B, T, device="cpu") if on_gpu else None
        maskf = mask.float()
        peer = lambda lp: inline_ppo_clip(lp, old, adv, maskf)  # noqa: E731
        for mode in here:
            if mode in COMPILE_MODES:
                torch._dynamo.reset()
                compiled_peer = torch.compile(inline_ppo_clip, fullgraph=True, mode=COMPILE_MODES[mode])
            for name in methods:
                if mode in COMPILE_MODES and name == "clip_cov":
                    continue
                validate = mode == "eager"
                extra = method_inputs(name, logp0, old)

                def call(lp, name=name, validate=validate, extra=extra):
                    return at.policy_loss(lp, old, adv, mask, method=name, validate=validate, **extra).loss

                if mode in COMPILE_MODES:
                    torch._dynamo.reset()
                    fn = torch.compile(call, fullgraph=True, mode=COMPILE_MODES[mode])
                    their = lambda lp: compiled_peer(lp, old, adv, maskf)  # noqa: E731
                else:
                    fn, their = call, peer
                m_ours, m_peer, paired = side_by_side(fn, their, logp0, repeats)
                row = {"B": B, "T": T, "ms": 1e3 * m_ours, "peer_ms": 1e3 * m_peer, "ratio": m_ours / m_peer}
                row["paired_ratio"] = paired
                if mode in COMPILE_MODES:
                    row.update(loss_and_grad_difference(fn, lambda lp, name=name: call(lp, name, False), logp0))
                elif mode == "eager" and on_gpu:
                    lp_cpu, old_cpu, adv_cpu, mask_cpu = cpu_inputs
                    extra_cpu = {k: v.cpu() for k, v in extra.items()}

                    def on_cpu(lp, name=name, extra_cpu=extra_cpu):
                        return at.policy_loss(lp, old_cpu, adv_cpu, mask_cpu, method=name, **extra_cpu).loss

                    row["vs_cpu"] = loss_and_grad_difference(call, on_cpu, logp0, lp_cpu)
                out[mode].setdefault(name, []).append(row)
                if on_row is not None:
                    on_row(out)
                print(
                    f"{mode:8s} ({B:3d}, {T:5d}) {name:12s} {row['ms']:9.3f} ms  PPO-clip {row['peer_ms']:8.3f} ms"
                    f"  ratio {row['ratio']:6.2f}",
                    flush=True,
                )
    return out


# --------------------------------------------------------------------------------------------
# part 2: memory of the full-distribution path
# --------------------------------------------------------------------------------------------
def _peak_worker(path, B, T, V, H, chunk, device, q):
    """One forward + backward of truly_ppo (KL with gradient: the costlier of the two) by ``path``."""
    torch.manual_seed(0)
    dev = torch.device(device)
    weight = 0.05 * torch.randn(V, H, device=dev)  # frozen, as with LoRA: what remains is the V-sized activations
    hidden = torch.randn(B, T, H, device=dev, requires_grad=True)
    old_hidden = hidden.detach() + 0.1 * torch.randn(B, T, H, device=dev)
    tok = torch.randint(0, V, (B, T), device=dev)
    adv = torch.randn(B, device=dev)
    mask = torch.ones(B, T, dtype=torch.bool, device=dev)
    with torch.no_grad():
        old_logp = at.head_kl_chunked(old_hidden, old_hidden, weight, tok, chunk_size=chunk).logp

    def step():
        if path == "chunked":
            s = at.head_kl_chunked(hidden, old_hidden, weight, tok, chunk_size=chunk)
            loss = at.policy_loss(s.logp, old_logp, adv, mask, method="truly_ppo", position_kl=s.kl).loss
        else:  # the (B, T, V) log-softmax of both policies, as the trainer did before
            full = torch.log_softmax(hidden @ weight.T, -1)
            with torch.no_grad():
                old_full = torch.log_softmax(old_hidden @ weight.T, -1)
            logp = full.gather(-1, tok[..., None])[..., 0]
            kw = dict(old_full_logp=old_full, full_logp=full, kl_chunk_size=chunk)
            loss = at.policy_loss(logp, old_logp, adv, mask, method="truly_ppo", **kw).loss
        loss.backward()
        return loss

    if dev.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:  # the process's resident high-water mark, reset just before the step (Linux: clear_refs 5)
        base = reset_rss_peak_mib()
        t0 = time.perf_counter()
        step()
        elapsed = time.perf_counter() - t0
        extra = rss_mib("VmHWM") - base
    q.put({"extra_peak_MiB": extra, "ms": 1e3 * elapsed})


def part2(cases, H, chunk, device="cpu"):
    os.environ.update(MMAP_ENV)  # inherited by the spawned workers (see benchmarks/_memory.py)
    ctx = mp.get_context("spawn")
    rows = []
    for path, B, T, V in cases:
        q = ctx.Queue()
        p = ctx.Process(target=_peak_worker, args=(path, B, T, V, H, chunk, device, q))
        p.start()
        res = q.get()
        p.join()
        row = {"path": path, "B": B, "T": T, "V": V, "H": H, "chunk": chunk, **res}
        row["one_BTV_fp32_MiB"] = B * T * V * 4 / 2**20
        row["one_chunk_fp32_MiB"] = chunk * V * 4 / 2**20
        rows.append(row)
        print(
            f"{path:8s} B*T={B * T:6d} V={V:7d}  extra peak {res['extra_peak_MiB']:9.1f} MiB"
            f"  (one (B,T,V) fp32: {row['one_BTV_fp32_MiB']:8.1f} MiB, one chunk: {row['one_chunk_fp32_MiB']:.1f})"
            f"  {res['ms']:9.1f} ms",
            flush=True,
        )
    return rows


def plot(result, out_png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for mode, style in (("eager", "-"), ("compiled", "--")):
        for name, rows in result["part1_by_mode"].get(mode, {}).items():
            if name in ("atr", "clip", "trgppo", "dcpo", "sapo", "kl_cov"):
                xs, ys = [r["B"] * r["T"] for r in rows], [r["ratio"] for r in rows]
                ax.plot(xs, ys, style, marker="o" if mode == "eager" else "s", label=f"{name} {mode}")
    ax.axhline(1.2, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="B x T", ylabel="time / inline PPO-clip", title=f"fwd+bwd ({result['device']})")
    ax.legend(fontsize=6, ncol=2)
    ax = axes[1]
    for path, marker in (("chunked", "o"), ("full", "x")):
        for V in sorted({r["V"] for r in result["part2_sweep"]}):
            rows = [r for r in result["part2_sweep"] if r["path"] == path and r["V"] == V]
            if rows:
                xs, ys = [r["B"] * r["T"] for r in rows], [max(r["extra_peak_MiB"], 0.1) for r in rows]
                ax.plot(xs, ys, marker=marker, label=f"{path} V={V}")
    ax.set(xscale="log", yscale="log", xlabel="B x T", ylabel="extra peak MiB", title="truly_ppo fwd+bwd memory")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120, metadata=png_text_metadata(fig, 120))


def topk_floor(repeats: int, device: str = "cpu", size=(64, 4096)) -> dict:
    """The least an eager top-K rule computes, against the inline PPO-clip timed beside it, at ``TOPK``: both
    policies' top-K probabilities summed (``exp`` then ``sum`` of ``old_topk_logp`` and of ``topk_logp``: the rest
    bucket ``1 - p_s - sum_k p_k`` of either divergence needs them), forward + backward through ``logp``'s sum.
    ``read_ratio``: reading the two tensors once (their sums), no ``exp``."""
    logp0, old, adv, mask = make_inputs(*size, device=device)
    extra = make_topk_inputs(logp0, old)
    o, n = extra["old_topk_logp"], extra["topk_logp"]
    maskf = mask.float()
    peer = lambda lp: inline_ppo_clip(lp, old, adv, maskf)  # noqa: E731
    ms, peer_ms, _ = side_by_side(lambda lp: o.exp().sum() + n.exp().sum() + lp.sum(), peer, logp0, repeats)
    read_ms, read_peer_ms, _ = side_by_side(lambda lp: o.sum() + n.sum() + lp.sum(), peer, logp0, repeats)
    return {
        "K": TOPK, "B": size[0], "T": size[1], "ms": 1e3 * ms, "peer_ms": 1e3 * peer_ms, "ratio": ms / peer_ms,
        "read_ratio": read_ms / read_peer_ms,
    }  # fmt: skip


def part1_result(r1: dict, sizes, repeats: int, device: str) -> dict:
    """The JSON of part 1: run metadata, ``part1.<method>`` = the eager row at the largest size, every mode's rows."""
    return {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "huge_pages": os.environ.get(HUGE_PAGES_VARIABLE) == "1",  # tensors of 2 MiB and more (the top-K inputs)
        "repeats": repeats,
        "sizes": {"part1": [list(s) for s in sizes]},
        "part1": {name: rows[-1] for name, rows in r1.get("eager", {}).items()},
        "part1_by_mode": r1,
    }


def merged_result(previous: dict, new: dict) -> dict:
    """``previous`` (a ``--time-only`` JSON) with ``new``'s rows in place of or beside its own, method by method
    (each row's ratio pairs the method with the inline PPO-clip timed beside it, in its own run); the methods of
    each later run are listed under ``updated`` with their repeats, threads and torch. Refused when the two runs
    timed other sizes, modes or devices, naming what differs."""
    for key in ("device", "sizes"):
        if previous.get(key) != new.get(key):
            raise ValueError(
                f"--update: the existing file's {key} {previous.get(key)!r} differs from this run's {new[key]!r}"
            )
    if set(previous["part1_by_mode"]) != set(new["part1_by_mode"]):
        raise ValueError(
            f"--update: the existing file timed the modes {sorted(previous['part1_by_mode'])}, this run "
            f"{sorted(new['part1_by_mode'])}: give the same --compiled / --modes"
        )
    out = json.loads(json.dumps(previous))
    for mode, rows in new["part1_by_mode"].items():
        out["part1_by_mode"][mode].update(rows)
    out["part1"].update(new["part1"])
    runs = out.setdefault("updated", [])
    runs.append({k: new[k] for k in ("torch", "threads", "huge_pages", "repeats")} | {"methods": sorted(new["part1"])})
    return out


def main(argv: list[str] | None = None):
    from atr_llm.cli_types import Device, Exclusive, Integer, Requires, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument(
        "--out",
        type=WriteFile(),
        help="default: figures/bench/<machine>/loss_overhead.json (loss_overhead_time.json with --time-only)",
    )
    ap.add_argument("--device", type=Device(), default="cpu")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile mode")
    ap.add_argument(
        "--time-only",
        action="store_true",
        help="part 1 only, eager and nosync at (64, 4096) (a few minutes; write it to its own --out)",
    )
    ap.add_argument(
        "--compiled", action="store_true", help="with --time-only: the compiled mode too (one compilation per method)"
    )
    ap.add_argument("--threads", type=Integer(1, 1024), default=None, help="torch threads (default: torch's choice)")
    ap.add_argument(
        "--repeats", type=Integer(1), default=None, help="interleaved calls per method (default 20 CPU, 50 GPU)"
    )
    ap.add_argument(
        "--methods",
        nargs="+",
        choices=PER_TOKEN,
        default=None,
        help="per-token methods of part 1, in this order (default all)",
    )
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=("eager", "nosync", *COMPILE_MODES),
        default=None,
        help="with --time-only: the modes of part 1 (default eager and nosync, plus compiled with --compiled)",
    )
    ap.add_argument(
        "--update",
        action="store_true",
        help="with --time-only and --methods: time only those methods and put their rows into --out's existing JSON "
        "(the other methods' rows kept as they were measured; the file lists each such run under 'updated')",
    )
    ap.relate(
        Requires("update", "time_only", why="it updates a --time-only JSON"),
        Requires("update", "methods", why="it times only the methods named"),
        Exclusive("no_compile", "compiled", why="--compiled adds the compiled mode, --no-compile leaves it out"),
        Requires("compiled", "time_only", why="the full run times the compiled mode already, unless --no-compile"),
        Requires("modes", "time_only", why="the full run times eager, nosync and, unless --no-compile, compiled"),
        Exclusive("modes", "compiled", why="--modes names every mode timed: add compiled to it"),
        Exclusive("time_only", "no_compile", why="--time-only compiles only with --compiled or --modes"),
        Exclusive("time_only", "quick", why="--time-only times its own size, (64, 4096)"),
        Exclusive("quick", "repeats", why="--quick times 5 repeats"),
    )
    args = ap.parse_args(argv)
    methods = resolve_methods(args.methods)
    enable_huge_pages_for_large_cpu_tensors()  # as the trainer's entry points allocate (tensors of 2 MiB and more)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = "loss_overhead_time.json" if args.time_only else "loss_overhead.json"
    out = Path(args.out) if args.out else default_output(name, args.device)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.time_only:
        sizes, repeats = [(64, 4096)], args.repeats or 50
        modes = ("eager", "nosync", "compiled") if args.compiled else ("eager", "nosync")
        modes = tuple(args.modes) if args.modes else modes

        previous = json.loads(out.read_text()) if args.update and out.exists() else None
        if args.update and previous is None:
            from atr_llm.command_line import refuse

            raise refuse("--out", str(out), "does not exist: --update adds rows to a file; time every method without it")

        def save(r1):
            result = part1_result(r1, sizes, repeats, args.device)
            out.write_text(json.dumps(result if previous is None else merged_result(previous, result), indent=2))

        r1 = part1(sizes, repeats, args.device, modes, methods, on_row=save)
        result = part1_result(r1, sizes, repeats, args.device)
        result = result if previous is None else merged_result(previous, result)
        if any(at.METHODS[m].needs_topk for m in methods):
            result["topk_floor"] = topk_floor(repeats, args.device)
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
        return
    cuda = args.device.startswith("cuda")
    modes = ("eager", "nosync") if args.no_compile else ("eager", "nosync", "compiled")
    if args.quick:
        sizes, repeats, H, chunk = [(4, 64), (8, 256)], 5, 16, 8
        cases = [(p, B, 16, V) for p in ("chunked", "full") for B in (1, 4) for V in (1024, 4096)]
    else:
        sizes, repeats, chunk = [(8, 1024), (32, 2048), (64, 4096)], args.repeats or (50 if cuda else 20), 64
        H = 2048 if cuda else 256  # the V-sized memory does not depend on H; CPU time does
        chunked_bt = (
            [(1, 256), (4, 256), (16, 256), (64, 256)] if not cuda else [(2, 512), (8, 512), (32, 512), (128, 512)]
        )
        full_bt = chunked_bt[:3]  # the (B, T, V) path at the largest would not fit next to the others
        cases = [("chunked", B, T, V) for (B, T) in chunked_bt for V in (32_768, 151_936)]
        cases += [("full", B, T, V) for (B, T) in full_bt for V in (32_768, 151_936)]

    def save(r1):
        out.write_text(json.dumps(part1_result(r1, sizes, repeats, args.device), indent=2))

    result = part1_result(part1(sizes, repeats, args.device, modes, methods, on_row=save), sizes, repeats, args.device)
    r2 = part2(cases, H, chunk, args.device)
    v_max = max(c[3] for c in cases)
    bt_ref = max(c[1] * c[2] for c in cases if c[0] == "full")  # the largest size both paths ran
    ref = [r for r in r2 if r["V"] == v_max and r["B"] * r["T"] == bt_ref]
    result.update({"part2": {f"truly_ppo_{r['path']}": r for r in ref}, "part2_sweep": r2})
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
