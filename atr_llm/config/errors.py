"""``ConfigError``: the one refusal of a configuration value, whatever the way in (a config field or an environment
variable)."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A refused configuration value: ``name`` (a config field, or an environment variable), the value and what was
    ``expected``, where ``{field}`` names another field (a relation's). The message reads ``name=value: expected ...``
    with the fields' names; the command line words it with the place each value came from (``worded``: ``--flag``,
    a YAML file's key), so that one check speaks to every way in in its own words."""

    def __init__(
        self, name: str, value: Any, expected: str, *, others: tuple[str, ...] = (), message: str | None = None
    ):
        self.name, self.value, self.template, self.others = name, value, expected, others
        self.relation = None  # the relation that refused it (check_relations_of), if one did
        self.expected = self.worded(lambda other: other)
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        super().__init__(message or f"{name}={shown}: {self.expected}")

    def worded(self, shown) -> str:
        """``expected`` with each other field named as ``shown(field)`` says."""
        text = self.template
        for other in self.others:
            text = text.replace("{" + other + "}", shown(other))
        return text
