"""The house plan holds: no import cycle (at any level: a package and its own submodules included, imports inside
functions counted), data flows one way (math -> product -> studies), no sys.path edits, no module of the installable
packages over 600 lines and no function of them over 120 lines of code, and the project speaks of itself only."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("atr_theory", "atr_llm", "sims", "experiments", "benchmarks", "tools")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every project module ``name`` imports, at module level or inside a function (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names]
            targets = [t for t in names if t in known]  # ``from package import submodule``: the submodule only
            if len(targets) < len(names):
                targets.append(base)
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph():
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def test_no_module_imports_itself_through_a_cycle():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack, node, nxt]))
            if not state.get(nxt):
                visit(nxt, [*stack, node])
        state[node] = 2

    for node in graph:
        if not state.get(node):
            visit(node, [])


def test_data_flows_one_way():
    for name, targets in _graph().items():
        top = name.split(".")[0]
        above = {
            "atr_theory": set(PACKAGES) - {"atr_theory"},
            "atr_llm": {"sims", "experiments", "benchmarks", "tools"},
        }
        bad = {t for t in targets if t.split(".")[0] in above.get(top, set())}
        assert not bad, f"{name} imports {bad}"


def test_the_core_imports_no_llm_or_plotting_library():
    for path in (ROOT / "atr_theory").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(import|from) (transformers|trl|peft|matplotlib|datasets)\b", text, re.M), path


def test_nothing_edits_sys_path():
    for package in (*PACKAGES, "tests"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "test_layout.py":
                continue
            assert "sys.path.insert" not in path.read_text() and "sys.path.append" not in path.read_text(), path


def test_no_installable_module_is_over_600_lines():
    for package in ("atr_theory", "atr_llm", "sims"):
        for path in (ROOT / package).rglob("*.py"):
            assert len(path.read_text().splitlines()) <= 600, path


def test_no_installable_function_is_over_120_lines():
    """Counted from ``def`` to the function's last line, its docstring included (a function that reads in one screen,
    whatever its parts)."""
    long = []
    for package in ("atr_theory", "atr_llm", "sims"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                lines = node.end_lineno - node.lineno + 1
                if lines > 120:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_the_project_speaks_of_itself_only():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    # the words are spelled with a character class so that this file does not contain them itself
    words = re.compile(r"\b(sess[i]ons?|lea[s]es?|len[t] machine)\b|\bissues? #?\d+\b", re.I)
    for name in files:
        if name.startswith("figures/") or not name.endswith((".py", ".md", ".yaml", ".toml", ".yml")):
            continue
        found = words.search((ROOT / name).read_text())
        assert not found, f"{name}: {found.group(0)!r}"


def test_importing_the_packages_leaves_the_environment_alone():
    import json
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    # the libraries first (TRL's import sets TORCHINDUCTOR_CACHE_DIR itself), then ours: only ours is judged
    code = (
        "import os, json, torch, transformers, trl; from trl import GRPOTrainer; before = dict(os.environ); "
        "import atr_theory, atr_llm, atr_llm.trainer, atr_llm.train; print(json.dumps(dict(os.environ) == before))"
    )
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(res.stdout.strip().splitlines()[-1]) is True


def test_importing_an_installable_module_patches_no_library():
    """Every module of the installable packages, imported in a fresh process, leaves
    ``torch.distributed.init_process_group`` as it was (the verl CPU support replaces it only when its ``register()``
    is called, by the end-to-end test's hook in tests/verl_support/)."""
    script = (
        "import importlib, pkgutil, torch.distributed as dist\n"
        "before = dist.init_process_group\n"
        "import atr_theory, atr_llm, sims\n"
        "names = [i.name for p in (atr_theory, atr_llm, sims) for i in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
        "for name in names:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        pass  # an optional extra (vllm, unsloth, verl) is not installed here\n"
        "assert dist.init_process_group is before\n"
        "assert 'atr_llm.verl.plugin' in names and 'atr_llm.verl.cpu' not in names\n"
        "print('OK', len(names))\n"
    )
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


def test_the_wheel_holds_the_product_only(tmp_path):
    """``pip install`` ships ``atr_theory`` and ``atr_llm``: not the lab (sims, experiments, benchmarks, tools), not
    the tests' verl CPU harness (``tests/verl_support/verl_cpu.py``). The wheel is built from this tree, as pip would."""
    import zipfile

    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        str(ROOT),
        "-w",
        str(tmp_path),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"atr_theory", "atr_llm"}, top
    assert "atr_llm/verl/plugin.py" in names and not any(n.endswith("verl_cpu.py") or "/cpu.py" in n for n in names)


def test_the_lab_stands_on_the_products_public_names():
    """sims, experiments, benchmarks and tools import no name of atr_theory / atr_llm that starts with ``_`` (module or
    attribute). experiments/investigations/ is the one exception: an investigation measures a product internal (each
    names the one it probes in its docstring)."""
    hits = []
    for package in ("sims", "experiments", "benchmarks", "tools"):
        for path in (ROOT / package).rglob("*.py"):
            if "investigations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("atr_theory", "atr_llm"):
                    names = [node.module, *(a.name for a in node.names)]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names if a.name.split(".")[0] in ("atr_theory", "atr_llm")]
                else:
                    continue
                if any(part.startswith("_") for name in names for part in name.split(".")):
                    hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {names}")
    assert not hits, "\n".join(hits)


def test_the_product_imports_no_underscore_name_from_another_module():
    """A helper that several modules of atr_theory / atr_llm share is public where it lives (a private module such as
    ``methods._ratio`` may hold it): ``from X import _name`` across modules is refused. Importing a private module
    itself (``from . import _reference``) is allowed."""
    hits = []
    for package in ("atr_theory", "atr_llm"):
        modules = {path.stem for path in (ROOT / package).rglob("_*.py")}  # private modules, imported whole
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                    continue
                private = [a.name for a in node.names if a.name.startswith("_") and a.name not in modules]
                if private:
                    hits.append(
                        f"{path.relative_to(ROOT)}:{node.lineno}: from {'.' * node.level}{node.module or ''} {private}"
                    )
    assert not hits, "\n".join(hits)


def test_every_experiments_module_is_used_by_a_page_or_a_study():
    """experiments/ keeps only what the docs run: each module is named on a page (``python -m experiments.x`` or its
    path), or imported by a module that is (a package's ``__init__`` and ``__main__`` go with it)."""
    pages = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
    graph = _graph()
    modules = {name for name in graph if name.startswith("experiments")}
    used = {
        name
        for name in modules
        if name in pages or str(_modules()[name].relative_to(ROOT)) in pages or name == "experiments"
    }
    while True:
        more = {dep for name in used for dep in graph[name] if dep in modules} - used
        more |= {name for name in modules if name.rpartition(".")[0] in used and name.endswith("__main__")} - used
        if not more:
            break
        used |= more
    assert modules - used == set(), sorted(modules - used)
