"""The ``--config FILE.yaml`` of ``python -m atr_llm.train``: text -> values, as the command line turns its text.

A file that is missing, a folder, unreadable, not YAML, not a mapping, with a key that is not an option name or is
given twice, or with a value that is no plain YAML scalar (``!!binary``, a timestamp, a set), is refused in one line
naming it. Each value is typed by the option's own declaration (``Declared.parse``: the same text-to-value rule as
on the command line); the configs' constructors then check every value (``atr_llm.config``). Nothing read from the
file runs as code (``yaml.SafeLoader``)."""

from __future__ import annotations

import argparse
import os
import re

from .command_line import refuse


class YamlKeyError(ValueError):
    """A ``--config`` file's key that is not an option name, or a name given twice."""


def _strict_mapping(loader, node, deep=False):
    """A YAML mapping whose keys are names (strings), each written once; else ``YamlKeyError`` naming the line(s).
    A merge key's (``<<: *base``) entries are not written here: a key written beside it overrides them, as YAML's
    merge says."""
    import yaml

    written = [(k, v) for k, v in node.value if k.tag != "tag:yaml.org,2002:merge"]
    loader.flatten_mapping(node)
    keys = {id(k) for k, _ in written}
    seen: dict[str, int] = {}
    for key_node, _ in [*written, *((k, v) for k, v in node.value if id(k) not in keys)]:
        key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise YamlKeyError(f"key {key!r} (line {line}) is not an option name")
        if key in seen and id(key_node) in keys:
            raise YamlKeyError(f"key {key} is given twice (lines {seen[key]} and {line}); give it once")
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_PLAIN_INTEGER = re.compile(r"[-+]?(0|[1-9][0-9]*)")


def _number_as_written(loader, node):
    """A YAML 1.1 number in a form the command line does not read (``0x10``, ``0o17``, ``0b101``, ``010`` (octal in
    YAML 1.1), ``1_000``, ``1:30``) kept as its text, which the option's own parser then reads as it reads the
    command line's text (``--seed 0x10`` is refused, so ``seed: 0x10`` is too; YAML read it as 16). Plain decimal
    integers and floats are built as PyYAML builds them."""
    import yaml

    text = loader.construct_scalar(node)
    if node.tag.endswith(":int"):
        return int(text) if _PLAIN_INTEGER.fullmatch(text) else text
    return text if ("_" in text or ":" in text) else yaml.SafeLoader.construct_yaml_float(loader, node)


def read_config_file(path: str) -> dict:
    """The mapping of option: value in the YAML file ``path``; a file that is missing, a folder, unreadable, not YAML,
    not a mapping, or with a key that is not a name or is given twice, is refused in one line naming it."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)
    StrictLoader.add_constructor("tag:yaml.org,2002:int", _number_as_written)
    StrictLoader.add_constructor("tag:yaml.org,2002:float", _number_as_written)
    if not os.path.exists(path):
        raise refuse("--config", path, "no such file")
    if not os.path.isfile(path):  # a folder, or a device, pipe or socket (/dev/null)
        what = "a folder" if os.path.isdir(path) else "no regular file (a device, pipe or socket)"
        raise refuse("--config", path, f"expected a YAML file, got {what}")
    try:
        with open(path, encoding="utf-8") as handle:
            content = yaml.load(handle, Loader=StrictLoader)  # noqa: S506 - a SafeLoader
    except YamlKeyError as e:
        raise refuse("--config", path, str(e)) from None
    except yaml.MarkedYAMLError as e:  # PyYAML's own words and place (a tag it will not build: nothing ran)
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        said = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise refuse("--config", path, f"not a readable YAML file: {said}{where}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise refuse("--config", path, f"not a readable YAML file ({type(e).__name__})") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise refuse("--config", path, f"expected a YAML mapping of option: value, got a {type(content).__name__}")
    for key, value in content.items():
        odd = _not_plain(value)
        if odd is not None:  # !!binary, a timestamp, !!set: read as their text they named a folder b'run'
            raise refuse(
                "--config",
                path,
                f"key {key}: a YAML {type(odd).__name__} ({odd!r}); options take text, numbers, "
                "true / false, null, and lists or mappings of them",
            )
    return content


def _not_plain(value: object) -> object | None:
    """The first value in ``value`` (a YAML value, lists and mappings walked) that is not text, a number, a bool or
    null, else None."""
    if isinstance(value, (list, tuple)):
        return next((odd for v in value if (odd := _not_plain(v)) is not None), None)
    if isinstance(value, dict):
        return next((odd for v in [*value, *value.values()] if (odd := _not_plain(v)) is not None), None)
    return None if value is None or isinstance(value, (str, int, float, bool)) else value


def config_path(argv: list[str]) -> str | None:
    """The FILE of ``--config FILE`` / ``--config=FILE`` in ``argv``, None without one."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _yaml_value(action, value, annotations: dict):
    """A ``--config`` file's ``value`` for ``action``'s field, turned into its type as the command line turns text
    (``action.type``, its choices), or ``ValueError`` saying what was expected: null only where the field's default is
    None, a list only for a field of several values, a mapping only for a field that takes one."""
    annotation = str(annotations.get(action.dest, ""))
    if value is None:
        if action.default is None:
            return None
        raise ValueError("null: expected a value (the field has no 'unset')")
    if isinstance(value, dict):
        if "dict" in annotation:
            return value
        raise ValueError(f"a mapping: expected one value{_expected(action)}")
    if isinstance(value, list):
        if action.nargs not in ("+", "*") and "list" not in annotation:
            raise ValueError(f"a list {value}: expected one value{_expected(action)}")
        return [_yaml_scalar(action, item) for item in value]
    return _yaml_scalar(action, value)


def _expected(action) -> str:
    describe = getattr(getattr(action.type, "__self__", None), "describe", None)
    return f" ({describe()})" if describe else ""


def _yaml_scalar(action, value):
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, (list, dict)):
        raise ValueError(f"{text}: expected one value{_expected(action)}")
    try:
        converted = action.type(text) if action.type is not None else text
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    except (TypeError, ValueError):
        raise ValueError(f"{text}: expected a {getattr(action.type, '__name__', 'value')}") from None
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"{text}: expected one of {', '.join(str(c) for c in action.choices)}")
    return converted


def file_values(parser, path: str, content: dict | None = None) -> tuple[dict, dict, dict | None]:
    """The values of the ``--config`` file ``path`` (``content``: the mapping ``read_config_file`` already read from
    it, so that a command reads its file once), each typed as the command line types its text
    (``_yaml_value``), where each came from (``("--config", path, "key NAME: VALUE")``), and its ``env:`` mapping
    (TRL's convention: variables to set for the run; None without one)."""
    import typing

    from trl import ModelConfig

    from .config import ATRGRPOConfig, ScriptArguments
    from .relations import shown_value

    content = dict(read_config_file(path) if content is None else content)
    environment = content.pop("env", None)
    if environment is not None and (
        not isinstance(environment, dict) or not all(isinstance(k, str) for k in environment)
    ):
        raise refuse("--config", path, "key env: expected a mapping of variable: value")
    dests = {}
    for action in parser._actions:  # a flag's --no_<field> complement shares its dest: keep the field's own option
        dests.setdefault(action.dest, action)
    unknown = [k for k in content if k not in dests or k == "config"]
    if unknown:
        raise refuse("--config", path, f"unknown key(s) {', '.join(unknown)}: not an option of atr_llm.train")
    annotations = {}
    for cls in (ScriptArguments, ATRGRPOConfig, ModelConfig):
        annotations.update(typing.get_type_hints(cls))
    values, where = {}, {}
    for variable, raw in (environment or {}).items():  # a refused variable is named as the file's key
        where[f"${variable}"] = ("--config", path, f"key env: {variable}: {shown_value(raw)}")
    for key, raw in content.items():
        try:
            values[key] = _yaml_value(dests[key], raw, annotations)
        except ValueError as e:
            raise refuse("--config", path, f"key {key}: {e}") from None
        where[key] = ("--config", path, f"key {key}: {shown_value(raw)}")
    return values, where, environment
