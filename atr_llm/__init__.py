"""The LLM half of atr-grpo: GRPO with atr_theory's clipping methods on TRL (``python -m atr_llm.train``).

Importing the package changes nothing in the process or its environment; the command-line entry points set what
they need (``atr_llm.huge_pages.enable_huge_pages_for_large_cpu_tensors``).
"""
