"""``python -m experiments.cpu_table``: see ``experiments.cpu_table.driver``."""

from atr_llm.command_line import run_command

from .driver import main

run_command(main)
