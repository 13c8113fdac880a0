"""Studies that use the atr-grpo package (not part of it): run from the repository root with ``python -m``."""
