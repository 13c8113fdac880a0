"""The LLM half of atr-grpo: GRPO with atr_theory's clipping methods on TRL (``python -m atr_llm.train``)."""

import os

# PyTorch's CPU allocator backs tensors of 2 MiB and more with transparent huge pages when this is set (it reads
# it once, at its first such allocation, so it must be set before then). At Qwen3's 151,936-row vocabulary a CPU
# step otherwise spends most of its time in page faults: a log-softmax + backward over (32, 30, 151936) took 4.0 s
# without and 1.6 s with it on this 2-core machine. Set THP_MEM_ALLOC_ENABLE=0 to opt out.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
