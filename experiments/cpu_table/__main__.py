"""``python -m experiments.cpu_table``: see :mod:`experiments.cpu_table.driver`."""

import sys

from .driver import main

main(sys.argv[1:])
