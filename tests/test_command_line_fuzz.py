"""Every command refuses bad input by construction: each ``python -m`` entry point's arguments are declared once
(``atr_llm.cli_types``), and a fuzzer mutates one argument at a time and expects exit 2, one line naming the
argument, no traceback and nothing written.

The entry points are found, not listed: every module under the packages below whose source runs ``main`` under
``if __name__ == "__main__":`` (or that is a ``__main__.py``). A new command is fuzzed the day it lands.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atr_llm import cli_types, command_line

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("atr_llm", "atr_theory", "sims", "experiments", "tools", "benchmarks")
MAIN_GUARD = re.compile(r'^if __name__ == "__main__":', re.M)


def entry_point_modules() -> list[str]:
    """Every module of PACKAGES that is a command: a ``__main__.py``, or a file with a top-level main guard."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            text = path.read_text(encoding="utf-8")
            if path.name == "__main__.py" or MAIN_GUARD.search(text):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found.append(module.removesuffix(".__main__"))
    return sorted(set(found))


ENTRY_POINTS = entry_point_modules()


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def declared_parser(module_name: str) -> argparse.ArgumentParser:
    """The parser ``module_name``'s ``main`` builds, caught at its first parse (no work is done)."""
    module = importlib.import_module(module_name)
    main = getattr(module, "main", None)
    if main is None:
        raise AssertionError(f"{module_name} runs as a command but has no main(argv)")

    def capture(self, args=None, namespace=None):
        raise _Captured(self)

    original = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = capture
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(["--help"])
    except _Captured as caught:
        return caught.parser
    except SystemExit:
        pass
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise AssertionError(f"{module_name}.main parses no arguments with argparse (declare them with atr_llm.command_line.Parser)")


def own_actions(module_name: str, parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The actions the project declares: all of them, except in ``atr_llm.train``, whose parser also holds TRL's and
    transformers' own fields (theirs keep the library's type; TRL's GRPOConfig is built while parsing)."""
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    if module_name == "atr_llm.train":
        actions = [a for a in actions if cli_types.declaration(a) is not None]
    return actions


def flag(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def typos(word: str) -> list[str]:
    """A few misspellings of ``word`` (dropped, doubled, swapped and replaced letters) that differ from it."""
    out = []
    if len(word) > 1:
        out += [word[:-1], word[1:], word[0] + word[2:] if len(word) > 2 else word + "x"]
        out += [word[:1] + word[1:].swapcase(), word + word[-1], word.replace("_", "-") + "s"]
    out += [word + "x", "x" + word]
    return [t for t in dict.fromkeys(out) if t != word]


def valid_tokens(action: argparse.Action, scratch: Path) -> list[str]:
    """Accepted values for ``action``, from its declaration (as many as its ``nargs`` asks for)."""
    value = str(action.choices[0]) if action.choices else cli_types.declaration(action).valid_text(scratch)
    return [value] * (action.nargs if isinstance(action.nargs, int) else 1)


def baseline(parser: argparse.ArgumentParser, scratch: Path) -> list[tuple[argparse.Action, list[str]]]:
    """A valid command line, as ``(action, its tokens)``: a value for each required argument, from its declaration."""
    parts = []
    for action in parser._actions:
        if not action.required and (action.option_strings or action.nargs in ("?", "*")):
            declared = cli_types.declaration(action)
            if action.option_strings and declared is not None and isinstance(action.default, str):
                if action.default == argparse.SUPPRESS:  # a default the config fills in (atr_llm.train)
                    continue
                try:  # a default the declaration refuses here (a folder of this checkout's runs): give a good one
                    declared(action.default)
                except argparse.ArgumentTypeError:
                    parts.append((action, action.option_strings[:1] + valid_tokens(action, scratch)))
            continue
        parts.append((action, action.option_strings[:1] + valid_tokens(action, scratch)))
    if getattr(parser, "builds_run_config", False):  # atr_llm.train builds its configs: a CPU run into scratch
        chosen = {"use_cpu": "true", "bf16": "false", "report_to": "none", "output_dir": str(scratch / "run")}
        chosen["tiny"] = "true"  # a model to train (the offline tiny one)
        by_dest = {a.dest: a for a in reversed(parser._actions)}  # a flag's own option, not its --no_ complement
        parts += [(by_dest[dest], [by_dest[dest].option_strings[0], text]) for dest, text in chosen.items()]
    return parts


def joined(parts: list[tuple[argparse.Action, list[str]]]) -> list[str]:
    return [token for _, tokens in parts for token in tokens]


def with_mutation(parts, action: argparse.Action, tail: list[str]) -> list[str]:
    """The baseline with ``tail`` in place of ``action``'s tokens, or after them when the baseline does not give it (an
    option given twice is a refusal of its own: ``test_an_option_given_twice_is_refused_naming_both``)."""
    if action is not None and any(a is action for a, _ in parts):
        return joined([(a, tail if a is action else tokens) for a, tokens in parts])
    return joined(parts) + tail


FOREIGN_OPTIONS = (
    "--seed",
    "--seeds",
    "--out",
    "--output_dir",
    "--quick",
    "--device",
    "--steps",
    "--max-steps",
    "--max_steps",
    "--workers",
    "--runs",
    "--runs-dir",
    "--n",
    "--k",
    "--model",
    "--config",
    "--method",
    "--delta",
    "--lr",
    "--learning-rate",
    "--verbose",
    "--dry-run",
    "--force",
    "--threads",
    "--repeats",
    "--table",
    "--help-me",
    "-v",
    "-o",
    "-n",
)
"""Options of other commands (and common habits) that a user may give to the wrong one."""


def mutations(parser: argparse.ArgumentParser, actions: list[argparse.Action], scratch: Path):
    """``(the argument it names, the action it mutates or None, the tokens)`` for each one-argument mutation."""
    known = {s for a in parser._actions for s in a.option_strings}
    variadic = any(not a.option_strings and a.nargs in ("*", "+") for a in parser._actions)
    out: list[tuple[str, argparse.Action | None, list[str]]] = []
    for option in FOREIGN_OPTIONS:
        if option not in known and not any(k.startswith(option + "=") for k in known):
            out.append((option, None, [option, "1"]))
    if not variadic:
        out += [("extra", None, ["extra"]), ("stray.txt", None, ["stray.txt"])]
    for action in actions:
        name = flag(action)
        if action.option_strings:
            long_form = max(action.option_strings, key=len)
            for typo in typos(long_form.lstrip("-")):
                spelled = "--" + typo
                if spelled not in known and not any(k.startswith(spelled + "=") for k in known):
                    out.append((spelled, None, [spelled] + ([] if action.nargs == 0 else ["1"])))
        if action.nargs == 0:
            if action.option_strings and not action.option_strings[0].startswith("--no"):
                out.append((name, action, [f"{name}=yes"]))
            continue
        if action.option_strings and action.nargs in (None, 1, "+") or isinstance(action.nargs, int):
            if action.option_strings:
                out.append((name, action, [name]))  # the value is missing
        good = valid_tokens(action, scratch)
        if action.choices is not None:
            choices = [str(c) for c in action.choices]
            bad = [t for choice in choices[:3] for t in typos(choice) if t not in choices]
        elif cli_types.declaration(action) is not None:
            bad = cli_types.declaration(action).bad_texts(scratch)
        elif action.type is int:  # a library's own integer field (train only)
            bad = ["abc", "1.5", ""]
        elif action.type is float:
            bad = ["abc", ""]
        else:
            bad = []
        for value in bad:
            tokens = [value] + good[1:]  # one bad value among good ones (nargs 2: the first)
            typed = action.option_strings[0] if action.option_strings else name
            out.append((typed, action, action.option_strings[:1] + tokens))
    return out


def refusal_of(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[int, str]:
    """Exit status and stderr of taking ``argv`` as the command would before any work: parsing, and for
    ``python -m atr_llm.train`` building its configuration too (``train.parse``: the configs check the values).
    ``run_command`` turns a ValueError into ``error: ...`` and exit 2."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            if getattr(parser, "builds_run_config", False):
                from atr_llm import train

                train.parse(argv)
            else:
                parser.parse_args(argv)
        except SystemExit as e:
            return e.code, err.getvalue()
        except ValueError as e:
            return 2, err.getvalue() + f"error: {command_line.one_line(e)}\n"
    return 0, err.getvalue()


def snapshot(folder: Path) -> set[tuple[str, int]]:
    return {(str(p.relative_to(folder)), p.stat().st_size if p.is_file() else -1) for p in folder.rglob("*")}


def test_every_command_is_found_and_declares_every_argument():
    assert len(ENTRY_POINTS) >= 35, ENTRY_POINTS
    for required in (
        "atr_llm.train",
        "atr_llm.evaluate",
        "experiments.cpu_table",
        "sims.verify_theorems",
        "tools.pack_runs",
    ):
        assert required in ENTRY_POINTS
    undeclared = {}
    for module_name in ENTRY_POINTS:
        parser = declared_parser(module_name)
        assert isinstance(parser, command_line.Parser) or module_name == "atr_llm.train", module_name
        assert not parser.allow_abbrev, f"{module_name}: a prefix of an option must not be taken for it"
        names = {flag(a) for a in own_actions(module_name, parser)}
        missing = [m for m in cli_types.undeclared_arguments(parser) if m in names]
        if missing:
            undeclared[module_name] = missing
    assert not undeclared, f"arguments without a declared type: {undeclared}"


@pytest.mark.parametrize("module_name", ENTRY_POINTS)
def test_the_fuzzer_finds_no_mutation_a_command_takes(module_name, tmp_path, monkeypatch):
    """Every one-argument mutation (at least 30 per command) is refused while parsing: exit 2, one line on stderr
    that names the argument, nothing written (neither in the working folder nor beside the scratch files)."""
    parser = declared_parser(module_name)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    parts = baseline(parser, scratch)
    assert refusal_of(parser, joined(parts))[0] == 0, f"{module_name}: the declared baseline {joined(parts)} is refused"
    cases = mutations(parser, own_actions(module_name, parser), scratch)
    assert len(cases) >= 30, f"{module_name}: only {len(cases)} mutations"
    before = snapshot(tmp_path)
    accepted, unclear = [], []
    for name, action, tail in cases:
        argv = with_mutation(parts, action, tail)
        code, text = refusal_of(parser, argv)
        shown = name if action is None or action.option_strings else (action.metavar or action.dest)
        if code == 0:
            accepted.append(argv)
        elif code != 2 or len(text.strip().splitlines()) != 1 or str(shown) not in text or "Traceback" in text:
            unclear.append((argv, code, text))
    assert not accepted, f"{module_name} took bad input: {accepted[:5]}"
    assert not unclear, f"{module_name} refused unclearly: {unclear[:3]}"
    assert snapshot(tmp_path) == before, f"{module_name} wrote while parsing"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_misspellings_of_options_are_refused_by_name(data, tmp_path_factory):
    """Hypothesis edits an option's name at random (insert, delete, replace a letter): never taken for another
    option (abbreviations are off), always refused naming what was typed."""
    module_name = data.draw(
        st.sampled_from(["sims.verify_theorems", "experiments.cpu_table", "atr_llm.evaluate", "tools.pack_runs"])
    )
    parser = declared_parser(module_name)
    scratch = tmp_path_factory.mktemp("scratch")
    known = {s for a in parser._actions for s in a.option_strings}
    option = data.draw(st.sampled_from(sorted(o for o in known if o.startswith("--") and o != "--help")))
    word = option[2:]
    i = data.draw(st.integers(0, len(word)))
    letter = data.draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz-_0"))
    how = data.draw(st.sampled_from(["insert", "delete", "replace"]))
    typed = {
        "insert": word[:i] + letter + word[i:],
        "delete": word[:i] + word[i + 1 :],
        "replace": word[:i] + letter + word[i + 1 :],
    }[how]
    spelled = "--" + typed
    if spelled in known or not typed:
        return
    code, text = refusal_of(parser, joined(baseline(parser, scratch)) + [spelled, "1"])
    assert code == 2
    assert spelled in text and len(text.strip().splitlines()) == 1


SUBPROCESS_SAMPLE = [
    (["-m", "sims.verify_theorems", "--seed", "nan"], "--seed"),
    (["sims/delta_sweep.py", "--seed", "99999999999999999999999"], "--seed"),
    (["sims/range_form.py", "--out", "{file}/below"], "--out"),
    (["-m", "experiments.cpu_table", "--seeds", "200", "2O1"], "--seeds"),
    (["-m", "experiments.cpu_table", "--workers", "0"], "--workers"),
    (["-m", "experiments.trust_region_analysis", "--table", "{folder}"], "--table"),
    (["-m", "atr_llm.evaluate", "--checkpoints", "{missing}"], "--checkpoints"),
    (["-m", "atr_llm.train", "--tiny", "true", "--learning_rate", "nan"], "--learning_rate"),
    (["-m", "atr_llm.train", "--tiny", "true", "--max_stesp", "3"], "--max_stesp"),
    (["-m", "tools.pack_runs", "--part-mib", "0"], "--part-mib"),
    (["-m", "benchmarks.loss_overhead", "--repeats", "-3"], "--repeats"),
]


@pytest.mark.parametrize("argv,name", SUBPROCESS_SAMPLE, ids=[" ".join(a[:2]) for a, _ in SUBPROCESS_SAMPLE])
def test_a_sample_of_mutations_as_real_processes(tmp_path, argv, name):
    """The same refusals from a real process (``python -m`` and ``python sims/<name>.py``), from a foreign working
    folder: exit 2, one line naming the argument, no traceback, nothing written."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    paths = cli_types.scratch_paths(scratch)
    work = tmp_path / "work"
    work.mkdir()
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in argv]
    if argv[0].endswith(".py"):
        argv[0] = str(ROOT / argv[0])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = snapshot(tmp_path)
    done = subprocess.run([sys.executable, *argv], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert snapshot(tmp_path) == before


def test_every_declared_relation_of_every_command_is_refused_when_broken(tmp_path, monkeypatch):
    """Pairs of options: for each relation a command declares (``Parser.relate``), a command line that breaks it is
    found from its options' declarations (tests/fuzzing.py) and must be refused while parsing: exit 2, one line
    naming an option of the relation, nothing written."""
    from tests.fuzzing import as_text, breaking_assignment, candidates

    monkeypatch.chdir(tmp_path)
    checked = 0
    for module_name in ENTRY_POINTS:
        parser = declared_parser(module_name)
        scratch = tmp_path / module_name
        scratch.mkdir()
        parts = baseline(parser, scratch)
        namespace = vars(parser.parse_args(joined(parts))) if not getattr(parser, "builds_run_config", False) else {}
        given = {a.dest for a, _ in parts}
        actions = {a.dest: a for a in parser._actions}
        for relation in getattr(parser, "relations", []):
            options = {}
            for name in relation.names:
                action = actions[name]
                if action.nargs == 0:
                    options[name] = [action.const if action.const is not None else True]
                else:
                    options[name] = [action.choices[0]] if action.choices else candidates(
                        cli_types.declaration(action), None, scratch
                    )
            assigned = breaking_assignment(
                relation, options, namespace.get, lambda n, get, chosen: n in chosen or n in given
            )
            assert assigned is not None, f"{module_name}: no candidate breaks {relation!r}"
            tail = []
            for name, value in assigned.items():
                action = actions[name]
                tail += [action.option_strings[0]] + ([] if action.nargs == 0 else [as_text(value)])
            argv = joined([(a, t) for a, t in parts if a.dest not in assigned]) + tail
            before = snapshot(tmp_path)
            code, text = refusal_of(parser, argv)
            flags = [o for n in relation.names for o in actions[n].option_strings]
            assert code == 2 and len(text.strip().splitlines()) == 1, (module_name, argv, code, text)
            assert any(f in text for f in flags), (module_name, relation, text)
            assert snapshot(tmp_path) == before
            checked += 1
    assert checked >= 20, checked

