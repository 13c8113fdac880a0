"""mkdocs hook: the API page's table of ``ATRGRPOConfig``'s method fields, written from the registry at build time.

``ATRGRPOConfig`` gets one field per parameter of every registered rule when ``atr_llm.config`` is imported
(``atr_llm.config.trainer_config.with_method_fields``), so the fields are in no source file for mkdocstrings to read.
This hook replaces the marker ``<!-- method fields -->`` of ``docs/api.md`` with one row per field (its anchor
``atr_llm.config.ATRGRPOConfig.<field>``, its default and help), from the same function the config reads.
"""

from __future__ import annotations

MARKER = "<!-- method fields -->"
CONFIG_MARKER = "<!-- config fields -->"
LIBRARY_MARKER = "<!-- library fields -->"


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


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    if MARKER not in markdown:
        return markdown
    markdown = markdown.replace(CONFIG_MARKER, config_fields_markdown())
    markdown = markdown.replace(LIBRARY_MARKER, library_fields_markdown())
    return markdown.replace(MARKER, method_fields_markdown())
