"""``tools.slow_tests``: the JUnit test cases it reads become the node ids pytest collects, and the list it writes is
the one ``tests/conftest.py`` marks ``slow``."""

from __future__ import annotations

import pytest

from tools.slow_tests import LIST, ROOT, node_id


@pytest.mark.parametrize(
    ("classname", "name", "want"),
    [
        ("tests.test_sims", "test_x[a-b]", "tests/test_sims.py::test_x[a-b]"),
        ("tests.studies.test_cpu_table", "test_y", "tests/studies/test_cpu_table.py::test_y"),
        ("tests.test_loss.TestSomething", "test_z", "tests/test_loss.py::TestSomething::test_z"),
        ("atr_theory.ranges", "atr_theory.ranges.kl3_clip_range", "atr_theory/ranges.py::atr_theory.ranges.kl3_clip_range"),
    ],
)
def test_a_junit_case_becomes_its_pytest_node_id(classname, name, want):
    assert node_id(classname, name) == want


def test_a_junit_class_with_no_file_is_refused_naming_it():
    with pytest.raises(ValueError, match="tests.test_nothing_here: no test file"):
        node_id("tests.test_nothing_here", "test_a")


def test_every_listed_slow_test_names_a_file_that_exists():
    """The list's ids point into files that exist (conftest's hook checks the full ids when it collects ``tests``)."""
    ids = [line.split("  # ")[0] for line in LIST.read_text().splitlines() if line and not line.startswith("#")]
    assert ids, "tests/slow_tests.txt lists no test"
    for nodeid in ids:
        assert (ROOT / nodeid.split("::")[0]).is_file(), nodeid
