"""Relations between a command's (or a config's) arguments, declared once: an option that excludes another
(``Exclusive``), needs another (``Requires``), is bounded by another (``AtMost``), or a condition of no other shape
(``Holds``). ``atr_llm.command_line.Parser.relate`` declares them for a command and refuses a command line that breaks one;
``atr_llm.config.fields`` declares the trainer's, checked when its configs are built; the fuzzer
(tests/test_command_line_fuzz.py) builds inputs that break each.
"""

from __future__ import annotations

from typing import Any

SET = object()
"""``Requires``'s default condition: the needed argument is set (given, or away from its default)."""


class Relation:
    """A rule between arguments (an option that excludes or needs another, a value bounded by another's), declared
    once where the entry point declares its arguments. ``violation(is_set, value)`` returns ``(name, text)`` of the
    first argument it refuses and why, or None; ``is_set(name)`` says whether an argument was given (on a command
    line) or differs from its default (a config built in Python), ``value(name)`` its value. ``names`` are the
    arguments it involves (the fuzzer builds command lines that break each relation from them)."""

    names: tuple[str, ...] = ()

    def violation(self, is_set, value) -> tuple[str, str] | None:  # pragma: no cover - each subclass defines it
        raise NotImplementedError


class Exclusive(Relation):
    """At most one of ``names`` may be set: with two, one would be ignored or contradict the other (``why`` says
    which and how)."""

    def __init__(self, *names: str, why: str = ""):
        if len(names) < 2:
            raise ValueError(f"Exclusive needs two or more arguments, got {names}")
        self.names, self.why = names, why

    def violation(self, is_set, value):
        given = [n for n in self.names if is_set(n)]
        if len(given) < 2:
            return None
        return given[1], f"cannot be used with {{{given[0]}}}{': ' + self.why if self.why else ''}; give one of them"

    def __repr__(self) -> str:
        return f"Exclusive{self.names}"


class Requires(Relation):
    """``name`` set needs ``needed`` set (``equals`` left out), or ``needed``'s value to be ``equals`` (one of them,
    for a tuple), or to pass ``test`` (described by ``words``, e.g. ``"> 0"``): without it ``name`` would be ignored or
    contradicted (``why`` says which; ``{other}`` in it names another argument as the user knows it)."""

    def __init__(self, name: str, needed: str, *, equals: Any = SET, test=None, words: str = "", why: str = ""):
        self.name, self.needed, self.equals, self.test, self.words, self.why = name, needed, equals, test, words, why
        self.names = (name, needed)

    def satisfied(self, is_set, value) -> bool:
        if self.test is not None:
            return bool(self.test(value(self.needed)))
        if self.equals is SET:
            return is_set(self.needed)
        allowed = self.equals if isinstance(self.equals, tuple) else (self.equals,)
        return value(self.needed) in allowed

    def needs(self) -> str:
        """The condition in words, ``{needed}`` standing for the argument's name."""
        if self.test is not None:
            return "{" + self.needed + "} " + self.words
        if self.equals is SET:
            return "{" + self.needed + "}"
        allowed = self.equals if isinstance(self.equals, tuple) else (self.equals,)
        return (
            "{" + self.needed + "} " + " or ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in allowed)
        )

    def violation(self, is_set, value):
        if not is_set(self.name) or self.satisfied(is_set, value):
            return None
        return self.name, f"needs {self.needs()}{' (' + self.why + ')' if self.why else ''}"

    def __repr__(self) -> str:
        return f"Requires({self.name!r}, {self.needed!r})"


class AtMost(Relation):
    """``value(name) <= value(bound)`` whenever both are numbers (unset: not None); ``applies(value)`` narrows it to
    the configurations where it means something."""

    def __init__(self, name: str, bound: str, *, why: str = "", applies=None):
        self.name, self.bound, self.why, self.applies = name, bound, why, applies
        self.names = (name, bound)

    def violation(self, is_set, value):
        mine, theirs = value(self.name), value(self.bound)
        if mine is None or theirs is None or (self.applies is not None and not self.applies(value)):
            return None
        if mine <= theirs:
            return None
        return self.name, f"exceeds {{{self.bound}}} {theirs}{': ' + self.why if self.why else ''}"

    def __repr__(self) -> str:
        return f"AtMost({self.name!r}, {self.bound!r})"


class Holds(Relation):
    """A condition between arguments of no other shape: ``holds(value, is_set)`` False refuses ``name`` with ``why`` (a
    text, or a function of ``value`` giving one; its ``{other}`` placeholders name the others)."""

    def __init__(self, name: str, *others: str, holds, why):
        self.name, self.holds, self.why = name, holds, why
        self.names = (name, *others)

    def violation(self, is_set, value):
        if self.holds(value, is_set):
            return None
        return self.name, self.why(value) if callable(self.why) else self.why

    def __repr__(self) -> str:
        return f"Holds{self.names}"


def check_relations(relations, is_set, value, shown) -> tuple[str, str] | None:
    """The first violated relation of ``relations`` as ``(name, why)``: the argument to name and the reason, its
    ``{other}`` placeholders replaced by ``shown(other)``, how the user knows that argument (``--flag``, a YAML
    key). A refusal reads ``<shown(name)> <value>: <why>``."""
    for relation in relations:
        found = relation.violation(is_set, value)
        if found is None:
            continue
        name, text = found
        for other in relation.names:
            text = text.replace("{" + other + "}", shown(other))
        return name, text
    return None


def shown_value(value: Any) -> str:
    """A value as a refusal shows it: ``true`` / ``false`` for a flag, else its text."""
    return str(value).lower() if isinstance(value, bool) else str(value)
