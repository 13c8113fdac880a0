"""The declared argument types of every command (``atr_llm.command_line``'s convention): each parses a value, checks its
domain while the command line is read (argparse then refuses ``--flag VALUE: expected ...``, exit 2), checks an
already-typed value (``check``: a YAML config's), describes its domain in ``--help``, and lists the bad values the
fuzzer (tests/test_command_line_fuzz.py) expects it to refuse. They build on ``atr_llm.command_line``'s checks.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
from pathlib import Path
from typing import Any

from .command_line import (
    UsageError,
    existing_directory,
    existing_file,
    one_line,
    output_directory,
    output_file,
    torch_device,
)
from .relations import SET, AtMost, Exclusive, Holds, Relation, Requires  # noqa: F401 - declared beside the types


class Declared:
    """An argument's declaration: ``__call__`` turns the command-line text into the value or raises
    ``argparse.ArgumentTypeError`` (argparse then refuses ``argument --flag: <text>: <expected>``, exit 2);
    ``check`` does the same for a value that arrived already typed (a YAML config); ``valid_text`` is one accepted
    value and ``bad_texts`` the values the fuzzer (tests/test_command_line_fuzz.py) expects to be refused; ``role`` says
    whether it is a number, a text or a path to read or to write."""

    role = "value"

    def __call__(self, text: str) -> Any:  # pragma: no cover - each subclass defines it
        raise NotImplementedError

    def check(self, value: Any) -> Any:
        """An already-typed ``value`` (from a config file) checked against the same domain."""
        return self(str(value))

    def parse(self, text: str) -> Any:
        """``text`` turned into a value of this type, its domain not checked (an entry point whose config checks
        it, ``python -m atr_llm.train``, parses with this); text that is no such value is refused as ``__call__``
        refuses it."""
        return str(text)

    def refusal(self, text: Any, expected: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"{one_line(str(text))[:120]}: {expected}")

    def valid_text(self, scratch: Path) -> str:  # pragma: no cover
        raise NotImplementedError

    def bad_texts(self, scratch: Path) -> list[str]:  # pragma: no cover
        raise NotImplementedError

    def describe(self) -> str:
        return self.role


class Integer(Declared):
    """An integer in ``[low, high]`` (decimal digits only: ``1.5``, ``1e3``, ``nan`` are refused). ``high`` defaults to
    2^31 - 1, so a mistyped huge count is refused instead of overflowing a generator or a tensor later."""

    role = "integer"

    def __init__(self, low: int | None = 0, high: int = 2**31 - 1):
        self.low, self.high = low, high
        self.__name__ = "integer"

    def expected(self, value: int | None = None) -> str:
        """``expected an integer >= low``; the whole interval when the upper bound is not the default or is what
        ``value`` exceeds."""
        if self.low is not None and self.high == 2**31 - 1 and (value is None or value <= self.high):
            return f"expected an integer >= {self.low}"
        return f"expected an integer in [{'-inf' if self.low is None else self.low}, {self.high}]"

    def __call__(self, text: str) -> int:
        raw = str(text).strip()
        if not re.fullmatch(r"[+-]?\d+", raw):
            raise self.refusal(text, self.expected())
        value = int(raw)
        if (self.low is not None and value < self.low) or value > self.high:
            raise self.refusal(text, self.expected(value))
        return value

    def parse(self, text: str) -> int:
        if not re.fullmatch(r"[+-]?\d+", str(text).strip()):
            raise self.refusal(text, self.expected())
        return int(str(text).strip())

    def check(self, value: Any) -> int:
        if isinstance(value, str):
            return self(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.refusal(value, self.expected())
        return self(str(value))

    def valid_text(self, scratch: Path) -> str:
        return str(max(self.low if self.low is not None else 0, min(1, self.high)))

    def bad_texts(self, scratch: Path) -> list[str]:
        bad = ["abc", "1.5", "nan", "inf", "", "1e3x", str(self.high + 1), "9" * 40]
        if self.low is not None:
            bad += [str(self.low - 1), str(self.low - 10**6)]
        return bad

    def describe(self) -> str:
        return self.expected().removeprefix("expected ")


class Real(Declared):
    """A finite number in ``[low, high]`` (``(low, ...`` with ``open_low``, ``..., high)`` with ``open_high``); NaN and
    infinities are refused whatever the bounds."""

    role = "number"

    def __init__(
        self, low: float | None = None, high: float | None = None, *, open_low: bool = False, open_high: bool = False
    ):
        self.low, self.high, self.open_low, self.open_high = low, high, open_low, open_high
        self.__name__ = "number"

    def expected(self) -> str:
        lo = "" if self.low is None else (f"> {self.low:g}" if self.open_low else f">= {self.low:g}")
        hi = "" if self.high is None else (f"< {self.high:g}" if self.open_high else f"<= {self.high:g}")
        return f"expected a finite number {' and '.join(x for x in (lo, hi) if x)}".strip()

    def inside(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    def __call__(self, text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise self.refusal(text, self.expected()) from None
        if not self.inside(value):
            raise self.refusal(text, self.expected())
        return value

    def parse(self, text: str) -> float:
        try:
            return float(str(text).strip())
        except ValueError:
            raise self.refusal(text, self.expected()) from None

    def check(self, value: Any) -> float:
        if isinstance(value, str):
            return self(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.refusal(value, self.expected())
        try:
            return self(repr(float(value)))
        except OverflowError:  # an integer beyond any float (10**400)
            raise self.refusal(value, self.expected()) from None

    def valid_text(self, scratch: Path) -> str:
        lo = self.low if self.low is not None else (self.high - 1.0 if self.high is not None else 0.0)
        hi = self.high if self.high is not None else lo + 2.0
        return repr((lo + hi) / 2)

    def bad_texts(self, scratch: Path) -> list[str]:
        bad = ["abc", "nan", "inf", "-inf", "1e400", "", "0x1p3z"]
        if self.low is not None:
            bad += [
                repr(self.low - 1.0),
                repr(self.low) if self.open_low else repr(self.low - 1e-3 * (abs(self.low) + 1)),
            ]
        if self.high is not None:
            bad += [
                repr(self.high + 1.0),
                repr(self.high) if self.open_high else repr(self.high + 1e-3 * (abs(self.high) + 1)),
            ]
        return bad

    def describe(self) -> str:
        return self.expected().removeprefix("expected ")


MIN_SAMPLING_TEMPERATURE = 1e-5
"""The smallest temperature a sampler divides logits by: vLLM samples greedily below it (``_SAMPLING_EPS`` of
``vllm/v1/sample/sampler.py``), and transformers' ``logits / T`` overflows float32 to inf (``torch.multinomial``
then fails on NaN probabilities) for a temperature as small as 1e-320."""


class Temperature(Real):
    """A sampling temperature a sampler can use: a finite number >= ``MIN_SAMPLING_TEMPERATURE`` (and 0, greedy
    decoding, where ``greedy`` is True)."""

    def __init__(self, *, greedy: bool = False):
        super().__init__(MIN_SAMPLING_TEMPERATURE)
        self.greedy = greedy
        self.__name__ = "temperature"

    def expected(self) -> str:
        low = f"a finite number >= {MIN_SAMPLING_TEMPERATURE:g} (a smaller one overflows the logits)"
        return f"expected 0 (greedy) or {low}" if self.greedy else f"expected {low}"

    def inside(self, value: float) -> bool:
        return (self.greedy and value == 0.0) or super().inside(value)

    def bad_texts(self, scratch: Path) -> list[str]:
        return super().bad_texts(scratch) + ["1e-320", "5e-6"] + ([] if self.greedy else ["0"])


class Steps(Real):
    """A number of steps as transformers reads it: a fraction of the run in (0, 1), or a whole number of steps >= 1
    (transformers refuses 2.5 save / logging / eval steps late, and truncates 2.5 warm-up steps to 2); 0 too where
    ``zero`` (no warm-up)."""

    def __init__(self, *, zero: bool = False):
        super().__init__(0, open_low=not zero)
        self.zero = zero
        self.__name__ = "steps"

    def expected(self) -> str:
        return (
            f"expected {'0, ' if self.zero else ''}a fraction of the run in (0, 1) or a whole number of steps in "
            "[1, 2147483647]"
        )

    def inside(self, value: float) -> bool:  # a whole number of steps is at most 2^31 - 1, as Integer's
        return super().inside(value) and (value < 1 or (float(value).is_integer() and value <= 2**31 - 1))

    def bad_texts(self, scratch: Path) -> list[str]:
        return super().bad_texts(scratch) + ["2.5", "1.5"]


class Text(Declared):
    """Free text (a label, a name the command looks up itself): any non-empty text of at most ``max_length``
    characters on one line."""

    role = "text"

    def __init__(self, max_length: int = 200):
        self.max_length = max_length
        self.__name__ = "text"

    def __call__(self, text: str) -> str:
        if not text.strip() or len(text) > self.max_length or "\n" in text:
            raise self.refusal(text, f"expected a non-empty line of at most {self.max_length} characters")
        return text

    def valid_text(self, scratch: Path) -> str:
        return "name"

    def describe(self) -> str:
        return f"text, at most {self.max_length} characters"

    def bad_texts(self, scratch: Path) -> list[str]:
        return ["", "   ", "x" * (self.max_length + 1), "two\nlines"]


def scratch_paths(scratch: Path) -> dict[str, Path]:
    """The fuzzer's fixtures below ``scratch``: a file, a folder, a missing path, a path below a file."""
    a_file, a_folder = scratch / "a_file.txt", scratch / "a_folder"
    if not a_file.exists():
        a_file.write_text("x\n")
    a_folder.mkdir(exist_ok=True)
    return {
        "file": a_file,
        "folder": a_folder,
        "missing": scratch / "missing" / "nothing.txt",
        "below_file": a_file / "x",
    }


class PathDeclared(Declared):
    """A path argument: the value is the text as typed (a ``Path`` with ``as_path=True``), once ``check_path`` (one
    of ``atr_llm.command_line``'s path checks) passes; an empty path is refused as ``empty`` says (None: left to the check)."""

    empty: str | None = None

    def __init__(self, *, as_path: bool = False):
        self.as_path = as_path

    def check_path(self, text: str) -> None:  # pragma: no cover - each subclass defines it
        raise NotImplementedError

    def __call__(self, text: str) -> str | Path:
        if self.empty is not None and not str(text).strip():
            raise self.refusal(text, self.empty)
        try:
            self.check_path(text)
        except UsageError as e:
            raise self.refusal(text, str(e).split(": ", 1)[-1]) from None
        return Path(text) if self.as_path else str(text)


class ReadFile(PathDeclared):
    """A path to read: a readable, non-empty file (not a folder, not missing)."""

    role = "file to read"

    def __init__(self, *, as_path: bool = False):
        super().__init__(as_path=as_path)
        self.__name__ = "file"

    def check_path(self, text: str) -> None:
        existing_file("", text)

    def valid_text(self, scratch: Path) -> str:
        return str(scratch_paths(scratch)["file"])

    def bad_texts(self, scratch: Path) -> list[str]:
        p = scratch_paths(scratch)
        return [str(p["folder"]), str(p["missing"]), str(p["below_file"]), ""]


class ReadDir(PathDeclared):
    """A folder to read (holding the file ``holding`` when given)."""

    empty = "expected a folder, got an empty path"
    role = "folder to read"

    def __init__(self, holding: str | None = None, what: str = "", *, as_path: bool = False):
        super().__init__(as_path=as_path)
        self.holding, self.what = holding, what
        self.__name__ = "folder"

    def check_path(self, text: str) -> None:
        existing_directory("", text, holding=self.holding, what=self.what)

    def valid_text(self, scratch: Path) -> str:
        folder = scratch_paths(scratch)["folder"]
        if self.holding:
            (folder / self.holding).parent.mkdir(parents=True, exist_ok=True)
            (folder / self.holding).touch()
        return str(folder)

    def bad_texts(self, scratch: Path) -> list[str]:
        p = scratch_paths(scratch)
        bad = [str(p["file"]), str(p["missing"]), str(p["below_file"]), ""]
        if self.holding:
            bad.append(str(scratch))  # a folder without what it must hold
        return bad


class WriteFile(PathDeclared):
    """A path to write a file to: not a folder, no part of its folder a file. Nothing is created while parsing."""

    empty = "expected a file to write, got an empty path"
    role = "file to write"

    def __init__(self, *, as_path: bool = False):
        super().__init__(as_path=as_path)
        self.__name__ = "output file"

    def check_path(self, text: str) -> None:
        output_file("", text)

    def valid_text(self, scratch: Path) -> str:
        return str(scratch / "out" / "written.json")

    def bad_texts(self, scratch: Path) -> list[str]:
        p = scratch_paths(scratch)
        return [str(p["folder"]), str(p["below_file"]), str(p["file"] / "deeper" / "x.json"), ""]


class WriteDir(PathDeclared):
    """A folder to write into (made later if missing): not a file, no part of it a file, writable. Nothing is
    created while parsing."""

    empty = "expected a folder to write, got an empty path"
    role = "folder to write"

    def __init__(self, *, as_path: bool = False):
        super().__init__(as_path=as_path)
        self.__name__ = "output folder"

    def check_path(self, text: str) -> None:
        output_directory("", text)

    def valid_text(self, scratch: Path) -> str:
        return str(scratch / "out")

    def bad_texts(self, scratch: Path) -> list[str]:
        p = scratch_paths(scratch)
        return [str(p["file"]), str(p["below_file"]), str(p["file"] / "deeper"), "", "x" * 300]


class NamedFile(Declared):
    """``NAME=FILE``: a name, ``=``, and a readable file (a benchmark or a data source given from a local file)."""

    role = "NAME=FILE"

    def __init__(self):
        self.__name__ = "NAME=FILE"

    def __call__(self, text: str) -> str:
        name, sep, path = str(text).partition("=")
        if not sep or not name.strip() or not path:
            raise self.refusal(text, "expected NAME=FILE")
        try:
            ReadFile()(path)
        except argparse.ArgumentTypeError as e:
            raise self.refusal(text, str(e).split(": ", 1)[-1]) from None
        return text

    def key(self, value: str) -> str:
        """The NAME of ``NAME=FILE``: an option collecting these refuses a name given twice."""
        return str(value).partition("=")[0]

    def valid_text(self, scratch: Path) -> str:
        return f"mine={ReadFile().valid_text(scratch)}"

    def describe(self) -> str:
        return "NAME=FILE, the file readable"

    def bad_texts(self, scratch: Path) -> list[str]:
        return ["mine", "=x", "mine="] + [f"mine={bad}" for bad in ReadFile().bad_texts(scratch) if bad]


class Device(Declared):
    """Where torch computes: ``cpu``, ``cuda`` or ``cuda:N`` with that GPU present on this machine."""

    role = "device"

    def __init__(self):
        self.__name__ = "device"

    def __call__(self, text: str) -> str:
        try:
            return torch_device("", str(text))
        except UsageError as e:
            raise self.refusal(text, str(e).split(": ", 1)[-1]) from None

    def valid_text(self, scratch: Path) -> str:
        return "cpu"

    def describe(self) -> str:
        return "cpu, cuda or cuda:N"

    def bad_texts(self, scratch: Path) -> list[str]:
        return ["gpu", "CPU", "cuda:x", "cuda:99", "", "mps0"]


class OneOf(Declared):
    """One of ``choices`` (as text), with a did-you-mean for a near miss; for fields a library declares as a plain
    string (argparse's own ``choices`` does the same for options declared here)."""

    role = "choice"

    def __init__(self, choices):
        self.choices = [str(c) for c in choices]
        self.__name__ = "choice"

    def __call__(self, text: str) -> str:
        if str(text) not in self.choices:
            close = difflib.get_close_matches(str(text), self.choices, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise self.refusal(text, f"{hint}expected one of {', '.join(self.choices)}")
        return str(text)

    def valid_text(self, scratch: Path) -> str:
        return self.choices[0]

    def describe(self) -> str:
        return f"one of {', '.join(self.choices)}"

    def bad_texts(self, scratch: Path) -> list[str]:
        bad = ["", "x" + self.choices[0]] + [c[:-1] for c in self.choices[:3] if c[:-1] not in self.choices]
        return bad + [c.upper() for c in self.choices[:3] if c.upper() not in self.choices]


class CommaList(Declared):
    """A comma-separated list, each item one of ``choices`` or accepted by the declared type ``item``; empty items
    and an empty list are refused, and a refusal names the bad item."""

    role = "list"

    def __init__(self, choices=None, item: Declared | None = None):
        self.choices, self.item = (None if choices is None else [str(c) for c in choices]), item
        self.__name__ = "comma list"

    def __call__(self, text: str) -> list:
        parts = str(text).split(",")
        if not str(text).strip() or any(not part.strip() for part in parts):
            raise self.refusal(text, "expected a comma-separated list without empty items")
        out = []
        for part in (p.strip() for p in parts):
            if self.choices is not None and part not in self.choices:
                close = difflib.get_close_matches(part, self.choices, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise self.refusal(part, f"not one of the choices; {hint}choose from {', '.join(self.choices)}")
            out.append(self.item(part) if self.item is not None else part)
        return out

    def valid_text(self, scratch: Path) -> str:
        return self.choices[0] if self.choices else self.item.valid_text(scratch)

    def describe(self) -> str:
        each = f"each one of {', '.join(self.choices)}" if self.choices else f"each {self.item.describe()}"
        return f"a comma-separated list, {each}"

    def bad_texts(self, scratch: Path) -> list[str]:
        first = self.valid_text(scratch)
        bad = ["", ",", f"{first},", f",{first}", f"{first},,{first}"]
        if self.choices:
            bad += [c + "x" for c in self.choices[:3]] + [
                c.upper() for c in self.choices[:2] if c.upper() not in self.choices
            ]
        if self.item is not None:
            bad += [f"{first},{b}" for b in self.item.bad_texts(scratch) if b and "," not in b]
        return bad


SEED = Integer(0, 2**32 - 1)
"""A random seed: numpy's generators take seeds below 2^32 (torch's below 2^64), so every command declares this."""


def declaration(action: argparse.Action) -> Declared | None:
    """The declaration an argument parses with: its type, or the ``Declared`` whose ``parse`` it is (an entry point
    whose config checks the domain, ``python -m atr_llm.train``); None for a library's own type."""
    if isinstance(action.type, Declared):
        return action.type
    owner = getattr(action.type, "__self__", None)
    return owner if isinstance(owner, Declared) else None


def undeclared_arguments(parser: argparse.ArgumentParser) -> list[str]:
    """The options of ``parser`` that take a value but have neither a declared type nor ``choices`` (an entry point
    must declare each; tests/test_command_line_fuzz.py holds every entry point to it)."""
    missing = []
    for action in parser._actions:
        if action.nargs == 0 or isinstance(action, argparse._HelpAction):
            continue
        if declaration(action) is None and action.choices is None:
            missing.append(action.option_strings[0] if action.option_strings else action.dest)
    return missing


def python_scalars(value: Any) -> Any:
    """``value`` with numpy scalars, alone or as the items of a list or tuple, as the Python bool, int or float they
    hold (``.item()``); anything else unchanged (the same object when nothing is a numpy scalar)."""

    def plain(item: Any) -> Any:
        if type(item).__module__ == "numpy" and getattr(item, "shape", None) == () and hasattr(item, "item"):
            converted = item.item()
            return converted if isinstance(converted, (bool, int, float)) else item
        return item

    if isinstance(value, (list, tuple)):
        items = [plain(v) for v in value]
        return type(value)(items) if any(a is not b for a, b in zip(items, value)) else value
    return plain(value)
