"""mkdocs hook: the API page's tables of ``ATRGRPOConfig``'s fields, written from the registry and the declarations at
build time, and the trainer page's table of logged metrics (``<!-- logged metrics -->``, from
``atr_llm.logged_metrics``).

``ATRGRPOConfig`` gets one field per parameter of every registered rule when ``atr_llm.config`` is imported
(``atr_llm.config.trainer_config.with_method_fields``), so the fields are in no source file for mkdocstrings to read.
This hook replaces the marker ``<!-- method fields -->`` of ``docs/api.md`` with one row per field (its anchor
``atr_llm.config.ATRGRPOConfig.<field>``, its default and help), from the same function the config reads.
"""

from __future__ import annotations

MARKER = "<!-- method fields -->"
CONFIG_MARKER = "<!-- config fields -->"
LIBRARY_MARKER = "<!-- library fields -->"
METRICS_MARKER = "<!-- logged metrics -->"
RULES_MARKER = "<!-- trainer rules -->"


def _cell(text: object) -> str:
    """``text`` for one table cell: no pipe, no line break."""
    return " ".join(str(text).replace("|", "/").split())


def config_fields_markdown() -> str:
    """One row per field ``ATRGRPOConfig`` adds to TRL's ``GRPOConfig`` besides the method fields: its name
    (anchored), type, default, domain (``atr_llm.config.fields.training_domains``, where declared) and help; read
    from the class and its declarations, so no raw source reaches the page."""
    import dataclasses
    import typing

    from trl import GRPOConfig

    from atr_llm.config import ATRGRPOConfig
    from atr_llm.config.fields import training_domains
    from atr_llm.config.trainer_config import method_fields

    trl = {f.name for f in dataclasses.fields(GRPOConfig)}
    hints, domains = typing.get_type_hints(ATRGRPOConfig), training_domains()
    rows = ["| field | type | default | domain | what it is |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(ATRGRPOConfig):
        if f.name in trl or f.name in method_fields() or f.name.startswith("_"):
            continue
        kind = getattr(hints.get(f.name), "__name__", None) or str(hints.get(f.name)).replace("typing.", "")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        domain = domains[f.name].describe() if f.name in domains else "-"
        anchor = f'<span id="atr_llm.config.ATRGRPOConfig.{f.name}"></span>`{f.name}`'
        rows.append(
            f"| {anchor} | `{_cell(kind)}` | `{_cell(repr(default))}` | {_cell(domain)} | "
            f"{_cell(f.metadata.get('help', ''))} |"
        )
    return "\n".join(rows)


def library_fields_markdown() -> str:
    """One row per field of TRL's or transformers' that the config checks when it is built, beyond its type: its
    name and domain (``training_domains``), and the mappings and texts ``atr_llm.config.library_fields`` checks."""
    import dataclasses

    from trl import GRPOConfig

    from atr_llm.config.fields import choice_fields, training_domains
    from atr_llm.config.library_fields import LIBRARY_FIELDS

    trl = {f.name for f in dataclasses.fields(GRPOConfig)}
    rows = ["| field | what the config takes |", "|---|---|"]
    for name, declaration in sorted(training_domains().items()):
        if name in trl:
            rows.append(f"| `{name}` | {_cell(declaration.describe())} |")
    for name, choices in sorted(choice_fields(GRPOConfig).items()):
        rows.append(f"| `{name}` | one of {_cell(', '.join(choices))} |")
    for name in LIBRARY_FIELDS:
        rows.append(f"| `{name}` | what the library it is passed to takes (`atr_llm.config.library_fields`) |")
    return "\n".join(rows)


def method_fields_markdown() -> str:
    """One table row per method field of ``ATRGRPOConfig``: its name (anchored), the value that means "not set" and
    the registry's help."""
    from atr_llm.config.trainer_config import method_fields

    rows = ["| field | unset | what it is |", "|---|---|---|"]
    for name, spec in method_fields().items():
        anchor = f'<span id="atr_llm.config.ATRGRPOConfig.{name}"></span>`{name}`'
        rows.append(f"| {anchor} | `{spec['default']}` | {spec['help'].replace('|', '/')} |")
    return "\n".join(rows)


def _name(text: str) -> str:
    """``text`` as code that breaks only after a '/' or a '_' (``code.name`` in ``docs/stylesheets/extra.css``)."""
    return '<code class="name">' + text.replace("/", "/<wbr>").replace("_", "_<wbr>") + "</code>"


def _text(text: str) -> str:
    """``text`` for one table cell, its pipes kept as pipes (an HTML entity, not a column break)."""
    return " ".join(str(text).replace("|", "&#124;").split())


def logged_metrics_markdown() -> str:
    """One row per key the trainer logs (``atr_llm.logged_metrics.LOGGED_METRICS``, which
    ``tests/test_logged_metrics.py`` holds to the code that logs): the key, who defines it, its meaning, its range
    and when it is logged."""
    from atr_llm.logged_metrics import LOGGED_METRICS

    rows = ["| key | defined by | what it is | range | logged |", "|---|---|---|---|---|"]
    for m in LOGGED_METRICS:
        when = m.when + (f" (not on a CPU run here: {m.cpu_absent})" if m.cpu_absent else "")
        rows.append(f"| {_name(m.key)} | {m.source} | {_text(m.meaning)} | {_text(m.value_range)} | {_text(when)} |")
    return "\n".join(rows)


def rules_markdown() -> str:
    """One row per registered rule (``atr_theory.METHODS``): its name and aliases, the command line that trains it at
    its defaults (a parameter's flag is ``atr_llm.config.trainer_config.CONFIG_FIELD``'s, else its own name), its
    forms (default first) and the peers that ship it (TRL's ``loss_type``, verl's ``loss_mode``, other code)."""
    import atr_theory as at
    from atr_llm.config.trainer_config import CONFIG_FIELD

    rows = ["| rule | to train it (its defaults) | forms | shipped by a peer as |", "|---|---|---|---|"]
    for name in at.method_names(aliases=False):
        spec = at.get_method(name)
        label = f"[{_name(name)}](methods.md#every-rule)" + "".join(f" ({_name(a)})" for a in spec.aliases)
        flags = " ".join(f"--{CONFIG_FIELD.get(k, k)} {p.default:g}" for k, p in spec.params.items())
        forms = ", ".join([spec.default_form, *[f for f in spec.forms if f != spec.default_form]])
        peers = [f"TRL `loss_type={spec.trl.loss_type}`"] if spec.trl is not None else []
        peers += [f"verl `loss_mode={spec.verl_loss_mode}`"] if spec.verl_loss_mode is not None else []
        peers += [f"{p.peer} `{_cell(p.name)}`" for p in spec.peers]
        rows.append(f"| {label} | `--method {name}{' ' + flags if flags else ''}` | {forms} | {', '.join(peers) or '-'} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    if RULES_MARKER in markdown:
        markdown = markdown.replace(RULES_MARKER, rules_markdown())
    if METRICS_MARKER in markdown:
        markdown = markdown.replace(METRICS_MARKER, logged_metrics_markdown())
    if MARKER not in markdown:
        return markdown
    markdown = markdown.replace(CONFIG_MARKER, config_fields_markdown())
    markdown = markdown.replace(LIBRARY_MARKER, library_fields_markdown())
    return markdown.replace(MARKER, method_fields_markdown())
