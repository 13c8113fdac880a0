"""One decode step's attention at the paper's geometry: transformers' SDPA against ``packed_gqa_attention``.

A decode step of Qwen3-1.7B (28 layers, 16 query heads on 8 key/value heads of 128 dims) over a static KV cache of
``max_completion_length`` + the prompt allowance reads every cached key and value once per layer. transformers' SDPA
path, when the step is compiled (transformers 5.24 packs the heads itself only when not compiling; 5.17 never does),
first copies them ``n_rep`` times (``repeat_kv``): per layer a write and a read of ``n_rep`` times the cache, on top
of the read attention needs. ``atr_llm.fast_generation.packed_gqa_attention`` attends on the cached heads as they
are. This times one layer's attention of one decode step, both functions side by side (interleaved, median of
repeats), eager and ``torch.compile``-d, at each cache length, and records whether ``repeat_kv`` ran, the bytes each
path moves by that count, and each output's largest difference from transformers' eager output.

    python -m benchmarks.decode_attention                     # CPU: figures/bench/cpu/decode_attention.json
    python -m benchmarks.decode_attention --device cuda       # figures/bench/<card>/decode_attention.json
    python -m benchmarks.decode_attention --quick             # a small batch (smoke test)
    python -m benchmarks.decode_attention --generate-layers 2 # + whole decode steps of compiled generate

``per_decode_step_ms`` is one layer's time x ``--layers``: the attention share of a decode step, without the
weights' matrix products.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks._machine import default_output
from benchmarks._timing import synchronizer

IMPLEMENTATIONS = ("sdpa", "packed_gqa")


class _Attention(torch.nn.Module):
    """The attributes of a transformers attention module that the two attention functions read."""

    def __init__(self, n_rep: int):
        super().__init__()
        self.num_key_value_groups = n_rep
        self.is_causal = True


def _function(name: str):
    from transformers.integrations import sdpa_attention

    from atr_llm.fast_generation import packed_gqa_attention

    return sdpa_attention.sdpa_attention_forward if name == "sdpa" else packed_gqa_attention


def decode_inputs(batch, heads, kv_heads, head_dim, cache_len, valid, dtype, device, seed=0):
    """One decode step's query ``(B, H, 1, D)``, a static cache's keys and values ``(B, H_kv, L, D)`` and its mask
    ``(B, 1, 1, L)``: the first ``valid`` positions True (the prompt and the tokens decoded so far)."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, 1, head_dim, generator=g).to(device, dtype)
    key, value = (torch.randn(batch, kv_heads, cache_len, head_dim, generator=g).to(device, dtype) for _ in range(2))
    mask = torch.zeros(batch, 1, 1, cache_len, dtype=torch.bool, device=device)
    mask[..., :valid] = True
    return query, key, value, mask


def repeat_kv_calls(fn, *args) -> int:
    """How many times ``fn(*args)`` calls transformers' ``repeat_kv`` (counted in a fresh trace when ``fn`` is
    compiled: the copy is then part of the compiled step)."""
    from transformers.integrations import sdpa_attention

    calls = []
    real = sdpa_attention.repeat_kv

    def counted(hidden_states, n_rep):
        calls.append(n_rep)
        return real(hidden_states, n_rep)

    sdpa_attention.repeat_kv = counted
    try:
        fn(*args)
    finally:
        sdpa_attention.repeat_kv = real
    return len(calls)


def measure(args, cache_len: int) -> list[dict]:
    """Every implementation x (eager, compiled) at one cache length, timed interleaved."""
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    n_rep = args.heads // args.kv_heads
    valid = min(cache_len, args.prompt_tokens + args.completion // 2)  # mid-generation
    q, k, v, mask = decode_inputs(args.batch, args.heads, args.kv_heads, args.head_dim, cache_len, valid, dtype, device)
    module = _Attention(n_rep)
    sync = synchronizer(device)
    cases = {}
    for name in IMPLEMENTATIONS:
        fn = _function(name)

        def call(q, k, v, mask, fn=fn):
            return fn(module, q, k, v, mask, scaling=args.head_dim**-0.5)[0]

        torch._dynamo.reset()
        compiled = torch.compile(call, dynamic=False, fullgraph=True)
        cases[name, "eager"] = (call, repeat_kv_calls(call, q, k, v, mask))
        cases[name, "compiled"] = (compiled, repeat_kv_calls(compiled, q, k, v, mask))
    reference = cases["sdpa", "eager"][0](q, k, v, mask).float()
    times = {key: [] for key in cases}
    for fn, _ in cases.values():  # warm-up (the compiled functions have traced already)
        fn(q, k, v, mask)
    sync()
    for _ in range(args.repeats):
        for key, (fn, _) in cases.items():
            sync()
            t0 = time.perf_counter()
            fn(q, k, v, mask)
            sync()
            times[key].append(time.perf_counter() - t0)
    element = torch.finfo(dtype).bits // 8
    kv_read = 2 * args.batch * args.kv_heads * cache_len * args.head_dim * element
    rows = []
    for (name, how), (fn, copies) in cases.items():
        ms = statistics.median(times[name, how]) * 1e3
        moved = kv_read * (1 + 2 * n_rep) if copies else kv_read  # a copy: n_rep x the cache written, then read
        rows.append(
            {
                "attention": name,
                "how": how,
                "cache_len": cache_len,
                "valid_positions": valid,
                "repeat_kv_calls": copies,
                "ms_per_layer": ms,
                "per_decode_step_ms": ms * args.layers,
                "kv_read_GB": kv_read / 1e9,
                "bytes_moved_GB": moved / 1e9,
                "GBps_at_that_count": moved / 1e9 / (ms / 1e3),
                "max_abs_diff_vs_sdpa_eager": float((fn(q, k, v, mask).float() - reference).abs().max()),
            }
        )
    for row in rows:
        same = next(r for r in rows if r["attention"] == "sdpa" and r["how"] == row["how"])
        row["sdpa_ms_over_this"] = same["ms_per_layer"] / row["ms_per_layer"]
    return rows


def generate_decode_ms(args, allowance: int) -> list[dict]:
    """A whole decode step through transformers' compiled ``generate`` (the trainer's ``compiled`` mode: static
    cache of ``--completion`` + ``allowance``, ``atr_llm.fast_generation``'s generation config and context) of a
    model with Qwen3-1.7B's attention and MLP shapes but ``--generate-layers`` layers and a 1,024-token vocabulary
    (the LM head's cost is not the question), for each attention. A decode step's time is the difference of the
    fastest of three generations of 8 + N and of 8 tokens over N (prefill and fixed costs cancel), the two
    attentions' generations interleaved."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    from atr_llm.fast_generation import compiled_generation_config, generation_context

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=args.heads * args.head_dim,
        intermediate_size=6144,
        num_hidden_layers=args.generate_layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.completion + allowance,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    ids = torch.randint(3, 1024, (args.batch, args.prompt_tokens), device=device)
    sync = synchronizer(device)
    base = GenerationConfig(max_new_tokens=args.completion, do_sample=False, pad_token_id=0, eos_token_id=None)
    base = compiled_generation_config(base, device=device, prompt_allowance=allowance)  # the trainer's cache

    def seconds(attention, n):
        config = copy.deepcopy(base)
        config.max_new_tokens = config.min_new_tokens = n
        sync()
        t0 = time.perf_counter()
        with torch.no_grad(), generation_context("compiled", model, attention):
            model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        sync()
        return time.perf_counter() - t0

    torch._dynamo.reset()
    first = {attention: seconds(attention, 8) for attention in IMPLEMENTATIONS}  # each compiles its decode step
    short, long = ({a: [] for a in IMPLEMENTATIONS} for _ in range(2))
    for _ in range(3):  # interleaved: both compiled steps stay cached (dynamo guards on the attention's name)
        for attention in IMPLEMENTATIONS:
            short[attention].append(seconds(attention, 8))
            long[attention].append(seconds(attention, 8 + args.generate_steps))
    rows = [
        {
            "attention": attention,
            "cache_len": args.completion + allowance,
            "layers": args.generate_layers,
            "decode_ms_per_step": (min(long[attention]) - min(short[attention])) / args.generate_steps * 1e3,
            "first_generation_s": first[attention],
        }
        for attention in IMPLEMENTATIONS
    ]
    rows[1]["sdpa_ms_over_this"] = rows[0]["decode_ms_per_step"] / rows[1]["decode_ms_per_step"]
    return rows


def environment(device: str) -> dict:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads()}
    env["device"] = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    return env


def allowance_count(value) -> int:
    """How many allowances ``value`` names: a parsed list, or its comma text (the fuzzer's candidate value)."""
    return len(value.split(",")) if isinstance(value, str) else len(value)


def main(argv=None) -> dict:
    from atr_llm.cli_types import CommaList, Device, Exclusive, Holds, Integer, Requires, WriteFile
    from atr_llm.command_line import Parser, UsageError

    class Allowances(CommaList):
        """Prompt allowances: a comma list of integers >= 1, whose example has two (the default's shape), so the
        fuzzer can break the relation of --quick and --allowances with it."""

        def valid_text(self, scratch) -> str:
            return "512,128"

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=Device(), default="cpu", help="cpu or cuda")
    ap.add_argument("--batch", type=Integer(1), default=32, help="completions decoded together (Table 4: 32)")
    ap.add_argument("--heads", type=Integer(1), default=16, help="query heads (Qwen3-1.7B: 16)")
    ap.add_argument("--kv-heads", type=Integer(1), default=8, help="key/value heads (Qwen3-1.7B: 8)")
    ap.add_argument("--head-dim", type=Integer(1), default=128)
    ap.add_argument("--layers", type=Integer(1), default=28, help="layers of a decode step (Qwen3-1.7B: 28)")
    ap.add_argument("--completion", type=Integer(1), default=1536, help="max_completion_length (Table 4: 1536)")
    ap.add_argument(
        "--allowances",
        type=Allowances(item=Integer(1)),
        default=[512, 128],
        help="prompt allowances of the static cache, comma list (default 512,128)",
    )
    ap.add_argument("--prompt-tokens", type=Integer(1), default=64, help="the prompt's length in the mask")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--repeats", type=Integer(1), default=5)
    ap.add_argument(
        "--generate-layers",
        type=Integer(0),
        default=0,
        metavar="N",
        help="also time whole decode steps of compiled generate with a model of N such layers (0: not done)",
    )
    ap.add_argument(
        "--generate-steps", type=Integer(1), default=8, help="decode steps timed per generation (default 8)"
    )
    ap.add_argument("--quick", action="store_true", help="batch 2, one allowance: a smoke test")
    ap.add_argument("--out", type=WriteFile(), help="default: figures/bench/<machine>/decode_attention.json")
    ap.relate(
        Exclusive("quick", "batch", why="--quick decodes a batch of 2"),
        Holds(
            "allowances",
            "quick",
            holds=lambda value, is_set: (
                not value("quick") or not is_set("allowances") or allowance_count(value("allowances")) == 1
            ),
            why="{quick} measures one allowance (it would keep the first and drop the others); give one, or leave "
            "{quick} out",
        ),
        Requires(
            "generate_steps",
            "generate_layers",
            test=lambda layers: layers > 0,
            words="> 0",
            why="it counts the decode steps timed in those generations",
        ),
    )
    args = ap.parse_args(argv)
    if args.heads % args.kv_heads:
        raise UsageError(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    allowances = list(args.allowances)
    if args.quick:
        args.batch, allowances = 2, allowances[:1]
    out = Path(args.out) if args.out else default_output("decode_attention.json", args.device)
    result = {
        "command": " ".join(["python -m benchmarks.decode_attention", *(sys.argv[1:] if argv is None else argv)]),
        "environment": environment(args.device),
        "geometry": {k: getattr(args, k) for k in ("batch", "heads", "kv_heads", "head_dim", "layers", "completion")},
        "dtype": args.dtype,
        "rows": [],
    }
    for allowance in allowances:
        result["rows"] += measure(args, args.completion + allowance)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if args.generate_layers:
        result["generate"] = []
        for allowance in allowances:
            result["generate"] += generate_decode_ms(args, allowance)
            out.write_text(json.dumps(result, indent=1) + "\n")
    for r in result["rows"]:
        print(
            f"L={r['cache_len']:5d} {r['attention']:10s} {r['how']:8s} repeat_kv={r['repeat_kv_calls']} "
            f"{r['ms_per_layer']:8.2f} ms/layer  x{r['sdpa_ms_over_this']:.2f}  diff {r['max_abs_diff_vs_sdpa_eager']:.1e}"
        )
    for r in result.get("generate", []):
        print(
            f"generate L={r['cache_len']:5d} {r['layers']} layers {r['attention']:10s} {r['decode_ms_per_step']:8.1f} ms/step"
        )
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
