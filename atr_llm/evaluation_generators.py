"""The generators ``atr_llm.evaluate`` samples with: a callable from a batch of chat prompts to completions.

``HFGenerator``: transformers' ``generate`` in batches (CPU or GPU), the chat template applied. ``VLLMGenerator``:
vLLM (a GPU, the ``[gpu]`` extra), with an optional LoRA adapter. ``vllm_available`` says whether the second can run.
"""

from __future__ import annotations


def vllm_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import vllm  # noqa: F401

        return True
    except ImportError:
        return False


class HFGenerator:
    """transformers ``generate`` in batches (CPU or GPU), chat template applied."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        batch_size: int = 16,
        seed: int = 0,
        thinking: bool | None = None,
    ):
        import torch

        self.model, self.tok = model.eval(), tokenizer
        self.template_kw = {} if thinking is None else {"enable_thinking": thinking}
        self.kw = dict(
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=top_p,
            max_new_tokens=max_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        self.batch_size = batch_size
        self.torch = torch
        torch.manual_seed(seed)

    def __call__(self, prompts: list[list[dict]]) -> list[str]:
        torch = self.torch
        texts = [
            self.tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **self.template_kw)
            for p in prompts
        ]
        out = []
        self.tok.padding_side = "left"
        for i in range(0, len(texts), self.batch_size):
            enc = self.tok(texts[i : i + self.batch_size], return_tensors="pt", padding=True).to(self.model.device)
            with torch.no_grad():
                gen = self.model.generate(**enc, **self.kw)
            out += self.tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        return out


class VLLMGenerator:  # pragma: no cover - needs a GPU
    def __init__(
        self,
        model_path: str,
        adapter: str | None,
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int = 0,
        thinking: bool | None = None,
    ):
        from vllm import LLM, SamplingParams

        self.chat_kw = {} if thinking is None else {"chat_template_kwargs": {"enable_thinking": thinking}}
        self.llm = LLM(model=model_path, enable_lora=adapter is not None, seed=seed)
        self.params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
        self.lora = None
        if adapter:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, adapter)

    def __call__(self, prompts: list[list[dict]]) -> list[str]:
        outs = self.llm.chat(prompts, self.params, lora_request=self.lora, use_tqdm=False, **self.chat_kw)
        return [o.outputs[0].text for o in outs]
