"""Judge the mutants mutmut cannot: those of code that runs when a module is imported.

mutmut 3 switches a mutant on (``MUTANT_UNDER_TEST``) in a process that has already imported the package, so a
mutant of a function that runs only at import time -- ``atr_theory.methods.register`` (every ``@register(...)``
decorator), ``Param.with_default`` (called in those decorators' arguments) and ``token_bounds._float32_bits`` (module
constants) -- is never executed and always "survives". Here each such mutant is switched on *before* Python
starts, so the registry is built by the mutated code, and the test selection of ``[tool.mutmut]`` runs against it (``-x``: the first failure kills it).

    python -m mutmut run ...                                  # (or make mutation) writes mutants/
    python -m tools.mutation_fresh_process [--out figures/tools/mutation/mutation_fresh_process.txt]

Needs a ``mutants/`` directory written by mutmut 3.8.1 (``make mutation``; ``--generate`` writes one without
running anything). Prints and writes one line per mutant: ``killed`` (a test failed or collection broke),
``survived`` (every test passed) or ``timeout``; ``--names`` judges chosen mutants of any function the same way
(a check of mutmut's own verdict), and verdicts already in ``--out`` are kept, so an interrupted run resumes.

``--sample N [--seed S]`` judges a uniform random sample of N of *all* the mutants the same way and states the
killed fraction with its 95% Wilson interval: an unbiased estimate of the whole run's score where the whole run
(hours on 2 cores) cannot be afforded (mutant sampling; e.g. Wong & Mathur 1995, Zhang et al. 2010).

    python -m tools.mutation_fresh_process --generate --sample 100 --out figures/tools/mutation/mutation_sample.txt
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from scipy.stats import binomtest

from atr_llm.cli_types import ReadDir
from atr_llm.command_line import refuse

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

IMPORT_TIME = [
    "atr_theory.methods.x_register",
    "atr_theory.methods.xǁParamǁwith_default",
    "atr_theory.token_bounds.x__float32_bits",  # module constants of the TRGPPO table's grid
]


def mutant_names(mutants_dir: Path, prefixes: list[str]) -> list[str]:
    """Names (``module.function__mutmut_N``) of the mutants in ``mutants_dir`` of the functions ``prefixes``."""
    names = set()
    for prefix in prefixes:
        module, _, func = prefix.rpartition(".")
        source = (mutants_dir / (module.replace(".", "/") + ".py")).read_text()
        names |= {f"{module}.{m}" for m in re.findall(rf"\b({re.escape(func)}__mutmut_\d+)\b", source)}
    return sorted(names, key=lambda n: (n.rpartition("__mutmut_")[0], int(n.rpartition("_")[2])))


def all_mutant_names(mutants_dir: Path) -> list[str]:
    """Every mutant mutmut generated (the keys of its ``*.py.meta`` files), in a fixed order."""
    names = []
    for meta in sorted((mutants_dir / "atr_theory").glob("*.py.meta")):
        names += json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(names)


def sample_mutants(names: list[str], size: int, seed: int) -> list[str]:
    """A uniform random sample (without replacement) of ``size`` of ``names``, in random order: the kill rate of the
    sample estimates the whole set's (mutant sampling), with a binomial confidence interval, and so does that of any
    prefix (a run stopped early still reports an unbiased estimate)."""
    if not 0 < size <= len(names):
        raise ValueError(f"sample size must be in 1..{len(names)} (the number of mutants), got {size}")
    return random.Random(seed).sample(names, size)


def sample_summary(sample: list[str], done: dict[str, str], seed: int, population: int) -> str:
    """The kill rate of the longest judged prefix of ``sample`` with its 95% Wilson (1927) interval (scipy)."""
    judged = 0
    while judged < len(sample) and sample[judged] in done:
        judged += 1
    counts = {v: sum(done[n] == v for n in sample[:judged]) for v in ("killed", "survived", "timeout")}
    head = f"# a uniform sample (seed {seed}) of {len(sample)} of {population} mutants, judged in fresh interpreters"
    if judged == 0:
        return f"{head}; none judged yet"
    killed = counts["killed"] + counts["timeout"]
    ci = binomtest(killed, judged).proportion_ci(method="wilson")
    return (
        f"{head}; the first {judged} in its random order: {counts}; killed (timeouts included) {killed / judged:.1%},"
        f" 95% Wilson interval [{ci.low:.1%}, {ci.high:.1%}]"
    )


def generate(root: Path) -> None:
    """Write ``mutants/`` with mutmut's own generator (no test runs)."""
    code = (
        "import os; from mutmut import __main__ as m; from mutmut.mutation.trampoline import set_mutant_under_test; "
        "set_mutant_under_test('mutant_generation'); os.makedirs('mutants', exist_ok=True); m.copy_src_dir(); "
        "m.copy_also_copy_files(); m.setup_source_paths(); m.store_lines_covered_by_tests(); m.create_mutants(2)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def judge(name: str, mutants_dir: Path, tests: list[str], pytest_args: list[str], timeout: float) -> str:
    """``killed`` / ``survived`` / ``timeout`` of one mutant, switched on before the interpreter starts."""
    env = {**os.environ, "MUTANT_UNDER_TEST": name, "PYTHONPATH": str(mutants_dir)}
    cmd = [sys.executable, "-m", "pytest", *tests, *pytest_args]
    try:
        rc = subprocess.run(cmd, cwd=mutants_dir, env=env, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if rc == 0 else "killed"


def check_setup(mutants_dir: Path, tests: list[str], pytest_args: list[str]) -> float:
    """mutmut's own two checks before any verdict, in this harness's fresh-interpreter setting: with no mutant
    switched on every selected test passes (else every mutant would read "killed"), and with the trampolines'
    ``fail`` switch a test fails (else the tests import an unmutated copy and every mutant would "survive").
    Returns the clean run's seconds (a survivor costs about that long)."""
    cmd = [sys.executable, "-m", "pytest", *tests, *pytest_args]
    env = {**os.environ, "PYTHONPATH": str(mutants_dir)}
    t0 = time.time()
    clean = subprocess.run(
        cmd, cwd=mutants_dir, env={**env, "MUTANT_UNDER_TEST": "none"}, capture_output=True, text=True
    )
    seconds = time.time() - t0
    if clean.returncode != 0:
        raise SystemExit(
            f"the tests fail with no mutant switched on: no verdict would mean anything\n{clean.stdout[-3000:]}"
        )
    failing = subprocess.run(
        cmd, cwd=mutants_dir, env={**env, "MUTANT_UNDER_TEST": "fail"}, capture_output=True, text=True
    )
    if failing.returncode == 0:
        raise SystemExit("the tests pass with every mutant set to fail: they import an unmutated atr_theory")
    return seconds


MUTMUT_KEYS = ("pytest_add_cli_args", "pytest_add_cli_args_test_selection")
"""The settings of ``[tool.mutmut]`` this script reads from the project's ``pyproject.toml``."""


def mutmut_settings(root: Path) -> dict:
    """``root``'s ``[tool.mutmut]`` table (``pyproject.toml``), holding ``MUTMUT_KEYS``; else a ValueError saying
    what is missing."""
    try:
        conf = tomllib.loads((root / "pyproject.toml").read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"its pyproject.toml is not TOML ({e})") from None
    tool = conf.get("tool")
    table = tool.get("mutmut") if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        raise ValueError("its pyproject.toml has no [tool.mutmut] table: not a project mutmut is set up for")
    missing = [key for key in MUTMUT_KEYS if not isinstance(table.get(key), list)]
    if missing:
        raise ValueError(f"its pyproject.toml's [tool.mutmut] has no list {', '.join(missing)}")
    return table


class ProjectRoot(ReadDir):
    """The declared type of ``--root``: a folder whose ``pyproject.toml`` sets mutmut up (``mutmut_settings``), refused
    while parsing, as ``ReadDir`` refuses a folder without ``pyproject.toml``."""

    def __init__(self):
        super().__init__(holding="pyproject.toml", what="the project's root", as_path=True)

    def check_path(self, text: str) -> None:
        super().check_path(text)
        try:
            mutmut_settings(Path(text))
        except ValueError as e:
            raise refuse("", text, str(e)) from None

    def valid_text(self, scratch: Path) -> str:
        folder = scratch / "mutmut_project"
        folder.mkdir(exist_ok=True)
        keys = "\n".join(f"{key} = []" for key in MUTMUT_KEYS)
        (folder / "pyproject.toml").write_text(f"[tool.mutmut]\n{keys}\n")
        return str(folder)

    def bad_texts(self, scratch: Path) -> list[str]:
        other = scratch / "other_project"  # the pyproject.toml of a project without mutmut's settings
        other.mkdir(exist_ok=True)
        (other / "pyproject.toml").write_text('[project]\nname = "other"\n')
        return [*super().bad_texts(scratch), str(other)]

    def describe(self) -> str:
        return "a project folder whose pyproject.toml holds [tool.mutmut]"


def main(argv=None) -> None:
    from atr_llm.cli_types import SEED, Exclusive, Integer, Real, Requires, Text, WriteFile
    from atr_llm.command_line import Parser, UsageError

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--root",
        type=ProjectRoot(),
        default=".",  # a text: argparse checks it with the type too (a folder of another project is refused)
        help="the project mutmut ran in (its mutants/ is judged)",
    )
    ap.add_argument(
        "--functions", type=Text(), nargs="+", default=IMPORT_TIME, help="judge every mutant of these functions"
    )
    ap.add_argument("--names", type=Text(), nargs="+", help="judge these mutants instead (module.function__mutmut_N)")
    ap.add_argument("--sample", type=Integer(1), help="judge a uniform random sample of this many of all the mutants")
    ap.add_argument("--seed", type=SEED, default=0, help="seed of --sample")
    ap.add_argument("--timeout", type=Real(0, open_low=True), default=600.0)
    ap.add_argument(
        "--out", type=WriteFile(as_path=True), default=Path("figures/tools/mutation/mutation_fresh_process.txt")
    )
    ap.add_argument("--generate", action="store_true", help="write mutants/ first (mutmut's generator, no tests)")
    ap.relate(
        Exclusive("sample", "names", "functions", why="each picks the mutants to judge"),
        Requires("seed", "sample", why="it seeds the draw of --sample"),
    )
    args = ap.parse_args(argv)
    if args.generate:
        generate(args.root)
    conf = mutmut_settings(args.root)
    mutants_dir = args.root / "mutants"
    if not (mutants_dir / "atr_theory").exists():
        raise UsageError(f"{mutants_dir} holds no mutated atr_theory: run `make mutation` (mutmut 3.8.1) first")
    pytest_args = [a for a in conf["pytest_add_cli_args"] if a != "--hypothesis-profile=mutation"]
    pytest_args += ["--hypothesis-profile=mutation"]
    population = all_mutant_names(mutants_dir)
    if args.sample:
        names = sample_mutants(population, args.sample, args.seed)
    else:
        names = args.names or mutant_names(mutants_dir, args.functions)
    # verdicts already in --out are kept (an interrupted run goes on where it stopped)
    done = dict(line.split(": ", 1) for line in _lines(args.out)) if args.out.exists() else {}
    tests = conf["pytest_add_cli_args_test_selection"]
    if any(name not in done for name in names):
        clean = check_setup(mutants_dir, tests, pytest_args)
        print(
            f"setup checked: the selection passes unmutated ({clean:.0f} s) and fails with the fail switch", flush=True
        )
    t0 = time.time()
    for name in names:
        if name not in done:
            done[name] = judge(name, mutants_dir, tests, pytest_args, args.timeout)
            print(f"{name}: {done[name]}", flush=True)
            progress = f"# in progress ({time.time() - t0:.0f} s this call)"
            if args.sample:
                progress += "\n" + sample_summary(names, done, args.seed, len(population))
            _write(args.out, done, progress)
    counts = {v: sum(done[n] == v for n in names) for v in ("killed", "survived", "timeout")}
    header = f"# {len(names)} mutants, each switched on before Python starts: {counts}"
    if args.sample:
        header = sample_summary(names, done, args.seed, len(population))
    _write(args.out, done, header)
    print(counts)


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def _write(path: Path, done: dict[str, str], header: str) -> None:
    path.write_text("\n".join([header, *(f"{n}: {v}" for n, v in done.items())]) + "\n")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
