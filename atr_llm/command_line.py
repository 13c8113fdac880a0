"""One convention for every command: bad input is refused before any work starts, in one line, with exit status 2.

A refusal names the argument, the value and what was expected (``error: --k 4 exceeds --n 2: Pass@k needs k <= n
samples per problem``), never a traceback. Commands check paths, files, numbers and combinations with the helpers
here before they build a model, write a file or start a worker, and run their ``main`` through ``run_command``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_USAGE = 2


class UsageError(ValueError):
    """A bad command-line input (a ValueError, so library callers can catch it as one): ``argument``, ``value`` and
    what was ``expected``, when ``refuse`` made it."""

    argument: str | None = None
    value: Any = None
    expected: str | None = None


def refuse(argument: str, value: Any, expected: str) -> UsageError:
    """The refusal of ``argument = value``: ``"<argument> <value>: <expected>"``; raise what it returns."""
    shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
    if isinstance(value, str):
        shown = value if value.strip() else repr(value)
    if not isinstance(value, str) and len(str(shown)) > 80:  # a huge number or list; a path or name is kept whole
        shown = str(shown)[:77] + "..."
    error = UsageError(f"{argument} {shown}: {expected}")
    error.argument, error.value, error.expected = argument, value, expected
    return error


def one_line(message: str) -> str:
    """``message`` on one line (a refusal is one line whatever the exception text held)."""
    return " ".join(str(message).split())


def command_name(script: str | None = None) -> str | None:
    """How the running command is typed: ``python -m sims.delta_sweep`` for a module of this project (run as
    ``python -m`` or as ``python sims/delta_sweep.py``), else None (argparse's own name)."""
    script = sys.argv[0] if script is None else script
    root = Path(__file__).resolve().parents[1]
    try:
        relative = Path(script).resolve().relative_to(root)
    except (ValueError, OSError):
        return None
    if relative.suffix != ".py":
        return None
    return "python -m " + ".".join(relative.with_suffix("").parts).removesuffix(".__main__")


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (unknown option, a value of the wrong type, a bad choice) are one line
    ``error: ...`` on stderr and exit status 2, without the usage block (``--help`` still shows it).

    An option must be spelled out: ``allow_abbrev`` is off, so a typo that happens to be a prefix (``--see`` for
    ``--seed``, ``--seed`` for ``--seeds``) is refused instead of silently taken for another option. Every argument
    that takes a value is declared with one of the types below (or ``choices``): its domain is checked while parsing,
    before any work, and the refusal names the option as the user typed it."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("prog", command_name())
        super().__init__(*args, **kwargs)
        self.relations: list = []

    def relate(self, *relations) -> None:
        """Declare relations between this command's arguments (``atr_llm.cli_types``: ``Exclusive``, ``Requires``,
        ``AtMost``), named by their ``dest``; ``parse_args`` refuses a command line that breaks one, naming the
        option, and the fuzzer builds command lines that break each."""
        known = {a.dest for a in self._actions}
        for relation in relations:
            unknown = [n for n in relation.names if n not in known]
            if unknown:
                raise ValueError(f"relation {relation!r} names {unknown}, which this parser does not declare")
        self.relations.extend(relations)

    def add_argument(self, *args, **kwargs):  # noqa: D102 - argparse's, with the declared domain in --help
        declared = kwargs.get("type")  # a declared type (atr_llm.cli_types) describes its domain
        if hasattr(declared, "describe") and kwargs.get("help") != argparse.SUPPRESS:
            kwargs["help"] = "; ".join(x for x in (kwargs.get("help"), declared.describe()) if x)
        return super().add_argument(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's, with unknown options first
        argv = negative_values_attached(sys.argv[1:] if args is None else list(args))
        self.typed = argv
        refuse_unknown_options(self, argv)
        given = options_given(self, argv)
        repeated = next((uses for uses in given.values() if len(uses) > 1 and not _collects(uses[0][0])), None)
        if repeated is not None:
            self.error(given_twice(repeated))
        parsed = super().parse_args(argv, namespace)
        for action in self._actions:  # an option that collects values (NAME=FILE): no name twice
            keyed = getattr(action.type, "key", None)
            values = getattr(parsed, action.dest, None) if _collects(action) and keyed else None
            keys = [keyed(v) for v in values or []]
            twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
            if twice is not None:
                typed = given[action.dest][0][1]
                self.error(
                    f"{typed} {twice}: given twice ({', '.join(v for v in values if keyed(v) == twice)}); give each name once"
                )
        from .relations import check_relations, shown_value

        flags = {dest: uses[0][1] for dest, uses in given.items()}
        shown = lambda dest: flags.get(dest) or self._flag_of(dest)  # noqa: E731
        broken = check_relations(self.relations, lambda d: d in given, lambda d: getattr(parsed, d, None), shown)
        if broken is not None:
            name, why = broken
            typed = given[name][0][2] if name in given else shown_value(getattr(parsed, name))
            said = shown(name) if not typed else f"{shown(name)} {typed}"  # a flag: its name alone
            self.exit(EXIT_USAGE, f"error: {one_line(f'{said}: {why}')}\n")
        return parsed

    def _flag_of(self, dest: str) -> str:
        """How argument ``dest`` is spelled: its longest option string, or its name for a positional."""
        for action in self._actions:
            if action.dest == dest:
                return max(action.option_strings, key=len) if action.option_strings else (action.metavar or dest)
        return dest

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(EXIT_USAGE, f"error: {reworded(message, getattr(self, 'typed', []))}\n")


ARGPARSE_OWN = ("invalid ", "expected ", "ignored ", "not allowed", "the following", "one of the")
"""How argparse's own messages about an argument begin (its declared types' refusals begin with the value)."""


def reworded(message: str, argv: list[str]) -> str:
    """argparse's ``argument --a/--b: TEXT`` as this package's refusals read: ``--b VALUE: expected ...`` for a
    declared type's refusal, ``--b: invalid choice ...`` for argparse's own, naming the spelling the user typed
    (of an option's aliases, the one in ``argv``); on one line."""
    message = one_line(message)
    m = re.match(r"argument (\S+?): (.*)", message)
    if m is None:
        return message
    names, rest = m.group(1).split("/"), m.group(2)
    typed = next((n for n in names if any(a == n or a.startswith(n + "=") for a in argv)), names[0])
    return f"{typed}: {rest}" if rest.startswith(ARGPARSE_OWN) else f"{typed} {rest}"


NEGATIVE_NUMBER = re.compile(r"-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|-inf(?:inity)?|-nan", re.IGNORECASE)
"""A token that is a negative number (``-1``, ``-1e-4``, ``-.5``, ``-inf``), matched whole (``fullmatch``): a value,
never an option. The one definition, for every command (``Parser``) and ``python -m atr_llm.train``."""


def negative_values_attached(argv: list[str]) -> list[str]:
    """``--flag -1e-4`` as ``--flag=-1e-4``: argparse reads a token that starts with ``-`` and is not a plain
    negative integer or decimal (``-1e-4``, ``-inf``) as an option, so ``--x -1e-4`` and ``--x=-1e-4`` would differ."""
    out: list[str] = []
    for token in argv:
        if out and NEGATIVE_NUMBER.fullmatch(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _collects(action: argparse.Action) -> bool:
    """Whether an option is meant to be given several times (argparse's append / count / extend actions)."""
    return isinstance(action, (argparse._AppendAction, argparse._CountAction, argparse._ExtendAction))


def options_given(
    parser: argparse.ArgumentParser, argv: list[str]
) -> dict[str, list[tuple[argparse.Action, str, str]]]:
    """``{dest: [(action, option as typed, value as typed), ...]}`` for every option of ``parser`` in ``argv``, in
    order (``--x=v`` and ``--x v`` alike; a value is the tokens up to the next option). An option's aliases share
    one dest, so ``--tiny-model A --tiny_model B`` gives it twice. Read before parsing, to refuse an option given
    twice: argparse keeps the last value silently."""
    by_option = {o: a for a in parser._actions for o in a.option_strings}
    found: dict[str, list] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            break
        name, eq, inline = token.partition("=")
        action = by_option.get(name if token.startswith("--") else token)
        if action is None:
            i += 1
            continue
        if eq or action.nargs == 0:
            value, i = inline, i + 1
        else:
            j = i + 1
            while j < len(argv) and not (argv[j].startswith("-") and not NEGATIVE_NUMBER.fullmatch(argv[j])):
                j += 1
                if action.nargs in (None, "?"):
                    break
            value, i = " ".join(argv[i + 1 : j]), j
        found.setdefault(action.dest, []).append((action, name if token.startswith("--") else token, value))
    return found


def given_twice(uses: list[tuple[argparse.Action, str, str]]) -> str:
    """The refusal of one option given more than once: each place it was given, in order."""
    shown = ", then ".join(f"{option} {value}".strip() for _, option, value in uses)
    return f"{uses[0][1]}: given {len(uses)} times ({shown}); give it once"


def refuse_unknown_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Refuse the first option of ``argv`` that ``parser`` does not declare, naming it (with the closest declared
    one), before any value is converted: argparse would otherwise report the value that follows it as a bad
    positional (``argument page: 1: no such file`` for ``--seed 1``)."""
    known = [o for action in parser._actions for o in action.option_strings]
    for token in argv:
        if token == "--":
            return
        if not token.startswith("-") or token == "-" or NEGATIVE_NUMBER.fullmatch(token):
            continue
        name = token.split("=", 1)[0]
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            parser.error(f"unrecognized arguments: {token}{hint}")


def run_command(main: Callable[..., Any], argv: list[str] | None = None) -> None:
    """Run a command's ``main``; a ``UsageError`` (or another ``ValueError``, the configuration errors of the
    libraries below) becomes one line on stderr and exit status 2."""
    try:
        main(argv)
    except ValueError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


# ---------------------------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------------------------
def positive_int(argument: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``, else refused."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise refuse(argument, value, f"expected an integer >= {minimum}")
    return value


def finite_number(
    argument: str, value: Any, *, low: float | None = None, high: float | None = None, open_low: bool = False
) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, high]`` with ``open_low``), else refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low is None or (value > low if open_low else value >= low)) and (high is None or value <= high)
    if not ok:
        lo = "" if low is None else (f"> {low:g}" if open_low else f">= {low:g}")
        hi = "" if high is None else f"<= {high:g}"
        raise refuse(argument, value, f"expected a finite number {' and '.join(x for x in (lo, hi) if x)}".strip())
    return float(value)


def existing_file(argument: str, path: str | Path) -> Path:
    """``path`` if it is a readable, non-empty file, else refused naming why."""
    p = Path(path)
    if not p.exists():
        raise refuse(argument, str(path), "no such file")
    if not p.is_file():
        raise refuse(argument, str(path), "not a file")
    try:
        with p.open("rb") as f:
            first = f.read(1)
    except OSError as e:
        raise refuse(argument, str(path), f"cannot be read ({e.strerror})") from None
    if not first:
        raise refuse(argument, str(path), "the file is empty")
    return p


def existing_directory(argument: str, path: str | Path, *, holding: str | None = None, what: str = "") -> Path:
    """``path`` if it is a directory (holding the file ``holding``, when given), else refused."""
    p = Path(path)
    if not p.is_dir():
        raise refuse(argument, str(path), "no such directory" if not p.exists() else "not a directory")
    if holding is not None and not (p / holding).exists():
        raise refuse(argument, str(path), f"not {what or 'the expected folder'}: it has no {holding}")
    return p


def output_file(argument: str, path: str | Path) -> Path:
    """``path`` if a file can be written there: not a directory, no part of its folder a file, not a symlink to a
    missing target, and its nearest existing folder writable by a probe (``writable_where_it_lands``); else refused.
    Nothing is left behind."""
    p = Path(path)
    if p.is_dir():
        raise refuse(argument, str(path), "a directory, not a file to write")
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise refuse(argument, str(path), f"{parent} is a file, not a folder")
    if len(p.name.encode()) > 255:
        raise refuse(argument, str(path)[:60] + "...", "a file name longer than 255 bytes")
    if p.is_symlink() and not p.exists():
        raise refuse(argument, str(path), "a symlink to a missing target")
    writable_where_it_lands(argument, path, p.parent)
    return p


def writable_where_it_lands(argument: str, path: str | Path, folder: Path) -> None:
    """Refuse ``path`` unless a file can really be written where it would land: in ``folder``'s nearest existing
    folder a probe file is created and removed (``os.access`` says yes to root under /proc and on a read-only mount;
    only writing tells), and no part of the way there is a symlink to a missing target."""
    import tempfile

    for q in (folder, *folder.parents):
        if q.is_symlink() and not q.exists():
            raise refuse(argument, str(path), f"{q} is a symlink to a missing target")
    existing = next((q for q in (folder, *folder.parents) if q.exists()), Path("."))
    try:
        handle, probe = tempfile.mkstemp(prefix=".atr-write-probe-", dir=existing)
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        raise refuse(argument, str(path), f"{existing} is not writable ({e.strerror or e})") from None


def output_directory(argument: str, path: str | Path) -> Path:
    """``path`` if a folder can be made or written there: not a file, no part of it a file, no name longer than
    255 bytes, no symlink to a missing target, and its nearest existing folder writable by a probe file created and
    removed there (``writable_where_it_lands``); else refused. Nothing is left behind."""
    p = Path(path)
    for part in p.parts:
        if len(part.encode()) > 255:
            raise refuse(argument, str(path)[:60] + "...", "a folder name longer than 255 bytes")
    if p.exists() and not p.is_dir():
        raise refuse(argument, str(path), "a file, not a folder")
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise refuse(argument, str(path), f"{parent} is a file, not a folder")
    if p.is_symlink() and not p.exists():
        raise refuse(argument, str(path), "a symlink to a missing target")
    writable_where_it_lands(argument, path, p)
    return p


def torch_device(argument: str, value: str) -> str:
    """``value`` if torch can compute there ("cpu", "cuda" or "cuda:N" with that GPU present), else refused."""
    import re

    if value == "cpu":
        return value
    m = re.fullmatch(r"cuda(?::(\d+))?", value)
    if m is None:
        raise refuse(argument, value, "expected cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise refuse(argument, value, "no CUDA device is available here")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise refuse(argument, value, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    return value


def jsonl_rows(argument: str, path: str | Path) -> list[tuple[int, dict]]:
    """The rows of a JSON Lines file as ``(line number, object)``, blank lines skipped; the first line that is not a
    JSON object is refused with its number."""
    p = existing_file(argument, path)
    rows = []
    with p.open(encoding="utf-8", errors="strict") as f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    raise refuse(argument, str(path), f"line {number} is not JSON ({e.msg})") from None
                if not isinstance(value, dict):
                    raise refuse(argument, str(path), f"line {number} is not a JSON object: {line.strip()[:60]!r}")
                rows.append((number, value))
        except UnicodeDecodeError:
            raise refuse(argument, str(path), "not UTF-8 text (a JSON Lines file was expected)") from None
    if not rows:
        raise refuse(argument, str(path), "holds no rows")
    return rows
