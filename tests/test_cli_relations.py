"""The relations the lab commands declare between their options (``ap.relate``: ``Exclusive``, ``Requires``,
``AtMost``): a command line that breaks one is refused while parsing, exit 2, one line on stderr that begins with
the option refused; a valid combination of the same options still parses. Only the parse runs: ``Parser.parse_args``
is wrapped to stop right after it, so no command does its work here."""

from __future__ import annotations

import importlib

import pytest

from atr_llm import cli


class _Parsed(Exception):
    def __init__(self, parser, namespace):
        super().__init__()
        self.parser, self.namespace = parser, namespace


@pytest.fixture
def parse_only(monkeypatch):
    """``Parser.parse_args`` as it is (relations checked), then stop: the command's work never starts."""
    original = cli.Parser.parse_args

    def stop(self, args=None, namespace=None):
        raise _Parsed(self, original(self, args, namespace))

    monkeypatch.setattr(cli.Parser, "parse_args", stop)


# command | the relation the command line breaks | the command line ({tmp}: a fresh folder) | the option refused
BREAKS = """
sims.verify_theorems | Exclusive('quick', 'n') | --quick --n 50000 | --n
benchmarks.loss_overhead | Exclusive('no_compile', 'compiled') | --no-compile --compiled | --compiled
benchmarks.loss_overhead | Requires('compiled', 'time_only') | --compiled | --compiled
benchmarks.loss_overhead | Requires('modes', 'time_only') | --modes eager | --modes
benchmarks.loss_overhead | Exclusive('modes', 'compiled') | --time-only --modes eager --compiled | --compiled
benchmarks.loss_overhead | Exclusive('time_only', 'no_compile') | --time-only --no-compile | --no-compile
benchmarks.loss_overhead | Exclusive('time_only', 'quick') | --quick --time-only | --quick
benchmarks.loss_overhead | Exclusive('quick', 'repeats') | --quick --repeats 3 | --repeats
benchmarks.decode_attention | Exclusive('quick', 'batch') | --quick --batch 4 | --batch
benchmarks.decode_attention | Requires('generate_steps', 'generate_layers') | --generate-steps 4 | --generate-steps
benchmarks.decode_attention | Requires('generate_steps', 'generate_layers') | --generate-layers 0 --generate-steps 4 | --generate-steps
experiments.cpu_table.driver | AtMost('save_steps', 'max_steps') | --save-steps 5 --max-steps 4 | --save-steps
experiments.cpu_table.driver | AtMost('at_step', 'max_steps') | --max-steps 4 --at-step 8 | --at-step
tools.gpu_wheels | Exclusive('table', 'trl') | --table --trl | --trl
tools.gpu_wheels | Requires('slim', 'download') | --slim | --slim
tools.gpu_wheels | Exclusive('table', 'slim') | --table --slim --download {tmp} | --slim
tools.gpu_wheels | Exclusive('trl', 'slim') | --trl --slim --download {tmp} | --slim
tools.mutation_fresh_process | Exclusive('sample', 'names', 'functions') | --sample 3 --names m.f__mutmut_1 | --names
tools.mutation_fresh_process | Exclusive('sample', 'names', 'functions') | --functions f --names m.f__mutmut_1 | --functions
tools.mutation_fresh_process | Requires('seed', 'sample') | --seed 3 | --seed
"""
BROKEN = [tuple(cell.strip() for cell in row.split("|")) for row in BREAKS.strip().splitlines()]

# command: command lines with the same options in a valid combination
VALID = {
    "sims.verify_theorems": ["--quick", "--n 50000"],
    "benchmarks.loss_overhead": [
        "--time-only --compiled --repeats 3",
        "--time-only --modes eager compiled",
        "--quick --no-compile",
        "--repeats 3",
    ],
    "benchmarks.decode_attention": ["--quick --generate-layers 1 --generate-steps 2", "--batch 4"],
    "experiments.cpu_table.driver": [
        "--quick --max-steps 4 --save-steps 2 --at-step 4",
        "--save-steps 4 --max-steps 4",
    ],
    "tools.gpu_wheels": ["--trl --download {tmp}", "--slim --download {tmp}"],
    "tools.mutation_fresh_process": ["--sample 3 --seed 1", "--names m.f__mutmut_1", "--functions f g"],
}
ACCEPTED = [(module, line) for module, lines in VALID.items() for line in lines]


def _argv(line: str, tmp_path) -> list[str]:
    return [a.format(tmp=str(tmp_path)) for a in line.split()]


@pytest.mark.parametrize("module,relation,line,option", BROKEN, ids=[f"{m} {line}" for m, _, line, _ in BROKEN])
def test_a_command_line_that_breaks_a_relation_is_refused_naming_the_option(
    module, relation, line, option, tmp_path, capsys, parse_only
):
    with pytest.raises(SystemExit) as refused:
        importlib.import_module(module).main(_argv(line, tmp_path))
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith((f"error: {option} ", f"error: {option}: ")), err
    assert "Traceback" not in err


@pytest.mark.parametrize("module,line", ACCEPTED, ids=[f"{m} {line}" for m, line in ACCEPTED])
def test_a_valid_combination_still_parses(module, line, tmp_path, parse_only):
    with pytest.raises(_Parsed):
        importlib.import_module(module).main(_argv(line, tmp_path))


@pytest.mark.parametrize("module", sorted({module for module, *_ in BROKEN}))
def test_each_declared_relation_has_a_case_here(module, parse_only):
    """The relations a command declares are those this file breaks (a new one needs its case above)."""
    with pytest.raises(_Parsed) as parsed:
        importlib.import_module(module).main([])
    declared = {repr(r) for r in parsed.value.parser.relations}
    assert declared == {relation for command, relation, *_ in BROKEN if command == module}
