"""What the fuzzers of every way in share: bad Python values for a declared field (``bad_values``), candidate values
for an argument (``candidates``), and the search for an assignment that breaks a declared relation
(``breaking_assignment``): the relation's own predicate only finds the candidates, the command or the config
constructor is what the tests then hold to refusing them."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from atr_llm import cli_types
from atr_llm.relations import Relation

UNSET = object()


def bad_values(declared: cli_types.Declared, default: Any) -> list[Any]:
    """Python values a field of ``declared`` must refuse: the wrong type (a list, a mapping, a text where a number is
    meant, a number where a text is meant), None where the default is not None, and the domain's own bad values
    (out of range, NaN, infinite, fractional for an integer, a misspelt choice)."""
    bad: list[Any] = [[1], {"a": 1}]
    if default is not None:
        bad.append(None)
    if isinstance(declared, cli_types.Integer):
        bad += ["3", 1.5, float("nan"), True, declared.high + 1]
        if declared.low is not None:
            bad.append(declared.low - 1)
    elif isinstance(declared, cli_types.Real):
        bad += ["0.5", float("nan"), float("inf"), -math.inf, True]
        if declared.low is not None:
            bad.append(declared.low if declared.open_low else declared.low - 1e-3 * (abs(declared.low) + 1))
        if declared.high is not None:
            bad.append(declared.high if declared.open_high else declared.high + 1e-3 * (abs(declared.high) + 1))
        if isinstance(declared, cli_types.Temperature):
            bad += [1e-320, 0.0]
    elif isinstance(declared, cli_types.OneOf):
        bad += [3, "x" + declared.choices[0], declared.choices[0].upper() + "x"]
    elif isinstance(declared, cli_types.PathDeclared):
        bad += [3]
    return bad


def candidates(declared: cli_types.Declared | None, annotation: Any, scratch: Path) -> list[Any]:
    """A few valid values of an argument: from its declaration (the bounds and a few values inside, every choice),
    else from its annotation (a flag: both; a text: a name)."""
    if isinstance(declared, cli_types.Integer):
        low = declared.low if declared.low is not None else 0
        return [v for v in dict.fromkeys((low, low + 1, 2, 8, 1000)) if v <= declared.high]
    if isinstance(declared, cli_types.Real):
        values = (declared.low or 0.0, 0.0, 1e-5, 0.5, 1.0, 2.0, 10.0, 1000.0)  # 0 too: a greedy temperature
        return [v for v in dict.fromkeys(values) if declared.inside(v)]
    if isinstance(declared, cli_types.OneOf):
        return list(declared.choices)
    if declared is not None:
        return [declared.valid_text(scratch)]
    if annotation is bool or "bool" in str(annotation):
        return [True, False]
    return ["x"]


def breaking_assignment(
    relation: Relation, options: dict[str, list[Any]], value, is_set, required=()
) -> dict[str, Any] | None:
    """Values for some of ``relation``'s arguments (each from ``options[name]``, or left as it is: ``value(name)``)
    that break it, ``is_set(name, get, assigned)`` deciding what counts as set (``get`` reads a value with the
    assignment applied), the names of ``required`` always among them; the fewest arguments first. None if no
    combination of the candidates breaks it."""
    names = relation.names
    for size in range(1, len(names) + 1):
        for chosen in itertools.combinations(names, size):
            if not set(required) <= set(chosen):
                continue
            for values in itertools.product(*(options[n] for n in chosen)):
                assigned = dict(zip(chosen, values))
                get = lambda n: assigned.get(n, value(n))  # noqa: E731
                if relation.violation(lambda n: is_set(n, get, assigned), get) is not None:
                    return assigned
    return None


def as_text(value: Any) -> str:
    """A value as the command line takes it."""
    return str(value).lower() if isinstance(value, bool) else str(value)
