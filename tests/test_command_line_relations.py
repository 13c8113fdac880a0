"""The relations the lab commands declare between their options (``ap.relate``: ``Exclusive``, ``Requires``,
``AtMost``, ``Holds``): a command line that breaks one is refused while parsing, exit 2, one line on stderr that
begins with the option refused; a valid combination of the same options still parses. Only the parse runs:
``Parser.parse_args`` is wrapped to stop right after it, so no command does its work here.

The other refusals before any work (a declared type that reads a file, a check of the parsed values in ``main``,
an option a command does not declare) are run through ``main`` with its first piece of work replaced by a stop."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from atr_llm import command_line


class _Parsed(Exception):
    def __init__(self, parser, namespace):
        super().__init__()
        self.parser, self.namespace = parser, namespace


@pytest.fixture
def parse_only(monkeypatch):
    """``Parser.parse_args`` as it is (relations checked), then stop: the command's work never starts."""
    original = command_line.Parser.parse_args

    def stop(self, args=None, namespace=None):
        raise _Parsed(self, original(self, args, namespace))

    monkeypatch.setattr(command_line.Parser, "parse_args", stop)


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
benchmarks.loss_overhead | Requires('update', 'time_only') | --update --methods clip | --update
benchmarks.loss_overhead | Requires('update', 'methods') | --time-only --update | --update
benchmarks.decode_attention | Exclusive('quick', 'batch') | --quick --batch 4 | --batch
benchmarks.decode_attention | Requires('generate_steps', 'generate_layers') | --generate-steps 4 | --generate-steps
benchmarks.decode_attention | Requires('generate_steps', 'generate_layers') | --generate-layers 0 --generate-steps 4 | --generate-steps
benchmarks.decode_attention | Holds('allowances', 'quick') | --quick --allowances 256,128 | --allowances
experiments.cpu_table.driver | Holds('save_steps', 'max_steps', 'quick') | --save-steps 5 --max-steps 4 | --save-steps
experiments.cpu_table.driver | Holds('save_steps', 'max_steps', 'quick') | --quick --save-steps 10 | --save-steps
experiments.cpu_table.driver | Holds('save_steps', 'max_steps', 'quick') | --save-steps 1001 | --save-steps
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
    "benchmarks.decode_attention": [
        "--quick --generate-layers 1 --generate-steps 2",
        "--batch 4",
        "--quick --allowances 256",
        "--allowances 256,128",
    ],
    "experiments.cpu_table.driver": [
        "--quick --max-steps 4 --save-steps 2 --at-step 4",
        "--save-steps 4 --max-steps 4",
        "--quick --save-steps 4",
        "--quick --max-steps 10 --save-steps 10",
        "--save-steps 1000",
    ],
    "tools.mutant_differential": ["--mutants-dir {tmp}/mutants name"],
    "tools.gpu_wheels": ["--trl --download {tmp}", "--slim --download {tmp}"],
    "tools.mutation_fresh_process": [
        "--sample 3 --seed 1",
        "--names m.f__mutmut_1",
        "--functions f g",
        "--root {tmp}/mutmut_project --sample 3",
    ],
}
ACCEPTED = [(module, line) for module, lines in VALID.items() for line in lines]


def _argv(line: str, tmp_path) -> list[str]:
    """``line``'s words, ``{tmp}`` replaced by ``tmp_path``, which holds the folders the lines name: an empty one, a
    mutmut ``mutants/`` copy, a project whose ``pyproject.toml`` sets mutmut up and one whose does not."""
    (tmp_path / "empty").mkdir(exist_ok=True)
    (tmp_path / "mutants" / "atr_theory").mkdir(parents=True, exist_ok=True)
    (tmp_path / "mutants" / "atr_theory" / "__init__.py").touch()
    for name, toml in (
        ("mutmut_project", "[tool.mutmut]\npytest_add_cli_args = []\npytest_add_cli_args_test_selection = []\n"),
        ("other_project", '[project]\nname = "other"\n'),
    ):
        (tmp_path / name / "mutants" / "atr_theory").mkdir(parents=True, exist_ok=True)
        (tmp_path / name / "pyproject.toml").write_text(toml)
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


# command | the command line ({tmp}: as in _argv) | the option named | words of the refusal
REFUSED = """
atr_llm.evaluate | --model m --temperature 0 --top_p 0.5 | --top_p | --top_p 0.5: greedy decoding (--temperature 0) ignores top-p
atr_llm.evaluate | --model m --temperature 0 --top_p=1 | --top_p | --top_p 1.0: greedy decoding
atr_llm.evaluate | --model m --benchmarks arith,arith | --benchmarks | --benchmarks arith,arith: names 'arith' twice
atr_llm.evaluate | --model m --benchmarks amc23,aime24,amc23 | --benchmarks | names 'amc23' twice
sims.clip_ranges | --quick --seed 3 --out {tmp}/out | --seed | unrecognized arguments: --seed
sims.trust_regions | --quick --seed 3 --out {tmp}/out | --seed | unrecognized arguments: --seed
benchmarks.gpu_step | --tiny --backends unsloth --kinds atr --out {tmp}/g.json | --backends | --backends unsloth: Unsloth needs a CUDA GPU
benchmarks.gpu_step | --tiny --backends trl,unsloth --out {tmp}/g.json | --backends | --backends trl,unsloth: Unsloth needs
experiments.cpu_table.driver | --quick --runs atr atr --runs-dir {tmp}/runs --out {tmp}/t | --runs | --runs atr atr: lists atr twice
experiments.cpu_table.driver | --runs clip atr clip --runs-dir {tmp}/runs --out {tmp}/t | --runs | lists clip twice
tools.mutant_differential | --mutants-dir {tmp}/empty name | --mutants-dir | not mutmut's mutants folder
tools.mutation_fresh_process | --root {tmp}/other_project --sample 3 | --root | has no [tool.mutmut] table
"""
REFUSALS = [tuple(cell.strip() for cell in row.split(" | ")) for row in REFUSED.strip().splitlines()]

# command: command lines that pass the same checks (their work starts)
PASSED = {
    "atr_llm.evaluate": ["--model m --temperature 0", "--model m --top_p 0.5", "--model m --benchmarks amc23,aime24"],
    "benchmarks.gpu_step": ["--tiny --backends trl --out {tmp}/g.json"],
    "experiments.cpu_table.driver": ["--quick --runs atr clip --runs-dir {tmp}/runs --out {tmp}/t"],
    "tools.mutation_fresh_process": ["--root {tmp}/mutmut_project --sample 3"],
}
STARTS = [(module, line) for module, lines in PASSED.items() for line in lines]

WORK = {  # the first piece of work of each command, after every check
    "atr_llm.evaluate": "load_benchmark",
    "sims.clip_ranges": "save_figure",
    "sims.trust_regions": "region_rows",
    "benchmarks.gpu_step": "copy_bandwidth_gbps",
    "experiments.cpu_table.driver": "ProcessPoolExecutor",
    "tools.mutant_differential": "judge",
    "tools.mutation_fresh_process": "all_mutant_names",
}


class _WorkStarted(Exception):
    pass


def _run_until_work(module: str, argv: list[str], monkeypatch):
    """``main(argv)`` as ``python -m`` runs it (``run_command``: a ValueError is one line and exit 2), its first
    piece of work replaced by ``_WorkStarted``."""
    from atr_llm import command_line

    target = importlib.import_module(module)

    def work(*args, **kwargs):
        raise _WorkStarted(module)

    monkeypatch.setattr(target, WORK[module], work)
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)  # set by the commands for torch; restored afterwards
    command_line.run_command(target.main, argv)


@pytest.mark.parametrize("module,line,option,words", REFUSALS, ids=[f"{m} {line}" for m, line, *_ in REFUSALS])
def test_a_command_line_checked_outside_the_relations_is_refused_before_any_work(
    module, line, option, words, tmp_path, capsys, monkeypatch
):
    with pytest.raises(SystemExit) as refused:
        _run_until_work(module, _argv(line, tmp_path), monkeypatch)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and option in err and words in err, err
    assert "Traceback" not in err
    assert not any((tmp_path / name).exists() for name in ("out", "g.json", "runs", "t")), "written before refusing"


@pytest.mark.parametrize("module,line", STARTS, ids=[f"{m} {line}" for m, line in STARTS])
def test_a_command_line_that_passes_those_checks_starts_its_work(module, line, tmp_path, monkeypatch):
    with pytest.raises(_WorkStarted):
        _run_until_work(module, _argv(line, tmp_path), monkeypatch)


def test_a_sims_script_declares_seed_exactly_when_it_draws(parse_only):
    """``--seed`` is offered by the scripts that read it (``args.seed``), and refused as unknown by those that draw
    nothing (``sims/_common.py``'s ``parse_args(seed=False)``): a seed that changes nothing is not taken silently."""
    root = Path(__file__).resolve().parents[1] / "sims"
    scripts = [p for p in sorted(root.glob("*.py")) if re.search(r'^if __name__ == "__main__":', p.read_text(), re.M)]
    assert {p.stem for p in scripts} >= {"clip_ranges", "trust_regions", "delta_sweep", "verify_theorems"}
    for script in scripts:
        with pytest.raises(_Parsed) as parsed:
            importlib.import_module(f"sims.{script.stem}").main([])
        declared = any("--seed" in action.option_strings for action in parsed.value.parser._actions)
        assert declared == ("args.seed" in script.read_text()), script.name
