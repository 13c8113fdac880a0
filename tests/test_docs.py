"""The front door and the docs hold: every code block of README.md and docs/ runs as written (or is marked
``<!-- notest -->`` because it needs a GPU, the hub, or hours), the generated tables are current, and every
folder under figures/ is named on the figures page with the command that writes it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "figures" not in p.relative_to(ROOT).parts[1:]]
FENCE = re.compile(r"(<!-- notest -->\n)?```(python|bash)\n(.*?)```", re.S)


def code_blocks():
    for page in PAGES:
        for i, m in enumerate(FENCE.finditer(page.read_text())):
            yield pytest.param(m.group(2), m.group(3), bool(m.group(1)), id=f"{page.relative_to(ROOT)}:{i}")


@pytest.mark.slow
@pytest.mark.parametrize("language,code,marked", list(code_blocks()))
def test_every_code_block_runs_as_written(language, code, marked):
    if marked:
        pytest.skip("marked <!-- notest -->: needs a GPU, the hub, or hours")
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
    res = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]


def test_every_marked_block_says_why_in_its_first_line_or_the_page():
    """A block left out of CI is a GPU, hub or hours-long command: its first line is a comment saying so, or the
    text just above the block says so."""
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1):
                before = text[max(0, m.start() - 300) : m.start()].lower()
                first = m.group(3).splitlines()[0].lower()
                reasons = ("gpu", "hub", "hours", "minutes", "ci ", "ray", "make")
                assert any(r in first or r in before for r in reasons), f"{page}: {m.group(3)[:80]!r}"


def test_the_performance_tables_are_the_committed_numbers():
    from tools import docs_tables

    text = docs_tables.PAGE.read_text()
    assert docs_tables.page_with_tables(text) == text, "stale tables: run `python -m tools.docs_tables`"


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_every_figures_folder_is_named_with_its_command():
    page = (ROOT / "docs" / "figures.md").read_text()
    top = {p.relative_to(ROOT / "figures").parts[0] for p in (ROOT / "figures").rglob("*") if p.is_file()}
    assert top == {"paper", "bench", "experiments", "tools"}
    second = {
        "/".join(p.relative_to(ROOT / "figures").parts[:2])
        for p in (ROOT / "figures").rglob("*")
        if p.is_file() and len(p.relative_to(ROOT / "figures").parts) > 2
    }
    for folder in second:
        head = folder.split("/")[0]
        named = f"figures/{folder}/" in page or (head == "bench" and "figures/bench/<machine>/" in page)
        assert named, f"figures/{folder}/ is not on docs/figures.md"


def test_the_api_page_shows_the_config_as_tables_of_its_declarations_not_its_source():
    """``ATRGRPOConfig``'s own fields (each with its type, default, domain and help) and the TRL / transformers fields
    checked when it is built come from the class and its declarations (the mkdocs hook), not from mkdocstrings'
    rendering of the ``field(...)`` source."""
    pytest.importorskip("trl")
    import dataclasses
    import importlib.util

    from trl import GRPOConfig

    from atr_llm.config import ATRGRPOConfig
    from atr_llm.config.fields import training_domains
    from atr_llm.config.trainer_config import method_fields

    spec = importlib.util.spec_from_file_location("config_fields_hook", ROOT / "docs" / "hooks" / "config_fields.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "api.md").read_text()
    rendered = hook.on_page_markdown(page, None)
    assert "<!-- config fields -->" in page and "<!-- library fields -->" in page and "field(" not in rendered
    assert "members: true" not in page.split("::: atr_llm.config.ATRGRPOConfig")[1].split(":::")[0]
    trl = {f.name for f in dataclasses.fields(GRPOConfig)}
    own = [f.name for f in dataclasses.fields(ATRGRPOConfig) if f.name not in trl and f.name not in method_fields()]
    assert own and all(f'id="atr_llm.config.ATRGRPOConfig.{name}"' in rendered for name in own)
    for name in ("scale_rewards", "cache_implementation", "reward_weights", "log_level", "lr_scheduler_kwargs"):
        assert f"| `{name}` |" in rendered, name
    assert training_domains()["kl_chunk_size"].describe() in rendered
