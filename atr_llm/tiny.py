"""An offline tiny Qwen3 and a locally built tokenizer: no hub access anywhere.

The tokenizer is a byte-level BPE trained in memory (``tokenizers``) on text the package generates
(the arithmetic task, its prompts and chat markup), with Qwen's chat markup as special tokens, a
pad token distinct from eos, and a ChatML chat template. The model is ``Qwen3ForCausalLM`` built
from a small ``Qwen3Config`` with ``AutoModelForCausalLM.from_config``; its generation config stops
at eos. ``python -m atr_llm.tiny --out DIR`` writes both to DIR (loadable with ``from_pretrained``).
"""

from __future__ import annotations

import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def _corpus(n: int = 3000, seed: int = 0) -> list[str]:
    from .data import SYSTEM_PROMPT, arithmetic_problem, format_completion

    rng = random.Random(seed)
    texts = [SYSTEM_PROMPT, "user", "assistant", "system", "\\boxed{}", "The answer is"]
    for _ in range(n):
        row = arithmetic_problem(rng)
        texts.append(row["problem"])
        texts.append(format_completion(row["answer"]))
    return texts


def build_tiny_tokenizer(vocab_size: int = 512, seed: int = 0):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML markup, pad != eos, trained in memory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


TINY_POSITIONS = 512
"""The tiny model's ``max_position_embeddings``: prompt and completion together fit in it."""
TINY_ARCHITECTURE = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_act": "silu",
    "intermediate_size": 128,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": TINY_POSITIONS,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
"""What ``build_tiny_model``'s defaults build, known before building it (a resume compares it with its checkpoint)."""
TOY_VOCAB_ROWS = 334
"""Rows of the toy tokenizer's vocabulary (``len(build_tiny_tokenizer())``, its BPE trained with seed 0), the tiny
model's embedding rows with ``--tiny_vocab toy`` (tests/test_config.py builds it and compares)."""


def tiny_model_identity(vocab: str) -> dict:
    """What a checkpoint records of the tiny model (``atr_llm.checkpoints.model_identity``), known before building
    it: its architecture, its vocabulary's rows and an empty name (a model built from a config)."""
    from .tokenizer import QWEN3_VOCAB_ROWS

    rows = {"toy": TOY_VOCAB_ROWS, "qwen3": QWEN3_VOCAB_ROWS}[vocab]
    return {**TINY_ARCHITECTURE, "vocab_size": rows, "name_or_path": ""}


def build_tiny_model(
    tokenizer, *, vocab_size: int | None = None, hidden_size: int = 64, layers: int = 2, seed: int = 0
):
    """A tiny ``Qwen3ForCausalLM`` matching ``tokenizer`` (``vocab_size`` embedding rows, default
    ``len(tokenizer)``; about 0.1M parameters with the toy tokenizer); eos/pad wired in."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=TINY_POSITIONS,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


def build_tokenizer_and_model(vocab: str = "toy", seed: int = 0, **model_kw):
    """``vocab="toy"``: the in-memory BPE of a few hundred tokens and a model with that many rows;
    ``vocab="qwen3"``: Qwen3's real tokenizer (``atr_llm.tokenizer.qwen3_tokenizer``) and a small
    Qwen3-architecture model with Qwen3's 151,936 embedding rows (tied to the output layer)."""
    if vocab == "toy":
        tok = build_tiny_tokenizer(seed=seed)
        return tok, build_tiny_model(tok, seed=seed, **model_kw)
    if vocab == "qwen3":
        from .tokenizer import QWEN3_VOCAB_ROWS, qwen3_tokenizer

        tok = qwen3_tokenizer()
        return tok, build_tiny_model(tok, vocab_size=QWEN3_VOCAB_ROWS, seed=seed, **model_kw)
    raise ValueError(f"tiny vocabulary must be 'toy' or 'qwen3', got {vocab!r}")


def save_tiny(out: str | Path, seed: int = 0, vocab: str = "toy") -> Path:
    """Build the tiny tokenizer and model and save both to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok, model = build_tokenizer_and_model(vocab, seed=seed)
    tok.save_pretrained(out)
    model.save_pretrained(out)
    return out


def main(argv=None) -> None:
    from .cli_types import SEED, WriteDir
    from .command_line import Parser

    ap = Parser(description=__doc__)
    ap.add_argument("--out", type=WriteDir(), default="runs/tiny-qwen3")
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--vocab", choices=("toy", "qwen3"), default="toy", help="qwen3: Qwen3's real tokenizer")
    args = ap.parse_args(argv)
    print("wrote", save_tiny(args.out, args.seed, args.vocab))


if __name__ == "__main__":
    from .command_line import run_command

    run_command(main)
