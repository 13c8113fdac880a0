"""Figure and report scripts: ``python sims/<name>.py`` or ``from sims import <name>``; each has ``main(argv)``."""
