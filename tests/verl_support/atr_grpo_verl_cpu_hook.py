"""Imported by every verl process of the end-to-end test (``VERL_USE_EXTERNAL_MODULES``, this folder on
``PYTHONPATH``): registers what verl lacks on a CPU (``verl_cpu.register``, beside this file). Test support, not installed."""

import verl_cpu as cpu

cpu.register()
