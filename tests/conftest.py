"""Test isolation: a script's main() may set torch's default dtype (the sims work in float64); no test
may see what an earlier one left behind."""

import os

# the test process allocates like the entry points it tests (atr_llm.huge_pages): before torch's first large tensor
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import Phase, settings

# tests/verl_support/ holds modules verl's processes import (the CPU support's hook): they register into verl on
# import, so --doctest-modules must not import them where verl is absent
collect_ignore = ["verl_support", "verl_oracle_support.py"]  # the latter imports verl: its test files skip without it

# `make mutation` (mutmut): a first failing example kills a mutant; shrinking it would only cost time
settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate], database=None)


SLOW_TESTS = os.path.join(os.path.dirname(__file__), "slow_tests.txt")


def slow_test_ids() -> set[str]:
    """The node ids ``tests/slow_tests.txt`` lists (``tools.slow_tests`` writes it from a measured run)."""
    with open(SLOW_TESTS) as f:
        return {line.split("  # ")[0].strip() for line in f if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before -m / -k deselect: the mark must be on the item when they look
def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test ``tests/slow_tests.txt`` lists, so ``make test`` (``-m "not slow"``) leaves it to
    ``make test-slow``. When the whole ``tests`` folder is collected, a listed id that matches no test (renamed,
    removed, its parameters changed) is an error naming it: the list must not silently stop marking anything."""
    listed = slow_test_ids()
    found = set()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
            found.add(item.nodeid)
    tests = os.path.dirname(os.path.abspath(__file__))
    whole = any(os.path.abspath(str(config.rootpath / a)) == tests for a in config.args)
    if whole and listed - found:
        raise pytest.UsageError(
            f"tests/slow_tests.txt names tests that do not exist: {sorted(listed - found)}; "
            "rewrite it with python -m tools.slow_tests"
        )


@pytest.fixture(scope="module")
def tok():
    """The tiny offline tokenizer every trainer test uses (``atr_llm.tiny``), built once per test module."""
    from atr_llm import tiny

    return tiny.build_tiny_tokenizer()


@pytest.fixture(autouse=True)
def _restore_torch_default_dtype():
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)


WRITTEN_RULE = '''"""A rule written as one new module by a test (tests/conftest.py: written_rule_module), then removed."""

import torch

from ..registry import MethodResult, Param, TokenBatch, unclipped_result, register


@register(
    "zz_written_rule",
    params={"zz_sharpness": Param(2.0, gt=0, help="written rule: the divisor of w A")},
    default_form="none",
    forms=("none",),
    reference="tests/conftest.py",
)
def zz_written_rule(batch: TokenBatch, zz_sharpness: float) -> MethodResult:
    """``w A / zz_sharpness``, every token kept."""
    return unclipped_result(torch.exp(batch.log_ratio) * batch.advantages / zz_sharpness, batch)
'''


@pytest.fixture
def written_rule_module():
    """A new family module in ``atr_theory/methods/`` (named to sort last, so the built-in rules keep their order),
    removed after the test; the rule ``zz_written_rule`` with the parameter ``zz_sharpness`` (default 2) exists in
    any *new* process that imports ``atr_theory`` meanwhile."""
    from pathlib import Path

    import atr_theory.methods

    path = Path(atr_theory.methods.__file__).with_name(f"zz_written_rule_{os.getpid()}.py")
    path.write_text(WRITTEN_RULE)
    try:
        yield path
    finally:
        path.unlink()
