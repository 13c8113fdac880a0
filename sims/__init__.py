"""Figure and report scripts: ``python -m sims.<name>`` (from the repository root) or ``from sims import <name>``; each has ``main(argv)``."""
