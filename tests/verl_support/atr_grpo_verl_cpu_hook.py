"""Imported by every verl process of the end-to-end test (``VERL_USE_EXTERNAL_MODULES``, this folder on
``PYTHONPATH``): registers what verl lacks on a CPU (``atr_llm.verl.cpu.register``). Test support, not installed."""

from atr_llm.verl import cpu

cpu.register()
