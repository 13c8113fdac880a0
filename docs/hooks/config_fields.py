"""mkdocs hook: the API page's table of ``ATRGRPOConfig``'s method fields, written from the registry at build time.

``ATRGRPOConfig`` gets one field per parameter of every registered rule when ``atr_llm.config`` is imported
(``atr_llm.config.trainer_config.with_method_fields``), so the fields are in no source file for mkdocstrings to read.
This hook replaces the marker ``<!-- method fields -->`` of ``docs/api.md`` with one row per field (its anchor
``atr_llm.config.ATRGRPOConfig.<field>``, its default and help), from the same function the config reads.
"""

from __future__ import annotations

MARKER = "<!-- method fields -->"


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
    return markdown.replace(MARKER, method_fields_markdown())
