"""MkDocs hook: the configuration reference, rendered from the settings classes themselves.

Every process has one pydantic-settings class whose fields carry attribute docstrings
(`use_attribute_docstrings`); this hook finds those classes by reading the source tree, imports
them, and replaces `<!-- settings-reference -->` in a page with one table per class: each
field's variable, type, default and docstring. Nested config models (`ARLOOP_TRAIN__*`, ...)
get a table of their own. Nothing is copied by hand, so the reference cannot go stale; a field
without a docstring is a warning, which `mkdocs build --strict` turns into a failed build.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

MARKER = "<!-- settings-reference -->"
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("deploy", "agents", "learner", "tools")
PREFIX = "ARLOOP_"
# A class statement whose bases name a settings class (`...Settings`) or BaseSettings itself.
SETTINGS_CLASS = re.compile(r"^class \w+\([^)]*(BaseSettings|Settings)\b[^)]*\):", re.MULTILINE)
log = logging.getLogger("mkdocs.hooks.settings_reference")


def settings_modules() -> list[str]:
    """Dotted names of the modules that declare a settings class, found by reading the source."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if SETTINGS_CLASS.search(path.read_text(encoding="utf-8")):
                found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def settings_classes() -> list[type[BaseSettings]]:
    """Every pydantic-settings class declared in the tree, bases before the classes that extend
    them (the order a reader meets them: what every process shares first)."""
    classes: dict[str, type[BaseSettings]] = {}
    for name in settings_modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseSettings) and cls is not BaseSettings:
                if cls.__module__ == name:
                    classes[f"{cls.__module__}.{cls.__qualname__}"] = cls
    found = list(classes.values())

    def shared(cls: type[BaseSettings]) -> bool:  # a base that other classes extend
        return any(other is not cls and issubclass(other, cls) for other in found)

    return sorted(found, key=lambda c: (not shared(c), len(c.__mro__), c.__module__, c.__name__))


def own_fields(cls: type[BaseModel]) -> dict[str, FieldInfo]:
    """The fields `cls` declares itself (inherited ones are documented with the base)."""
    inherited: set[str] = set()
    for base in cls.__mro__[1:]:
        if isinstance(base, type) and issubclass(base, BaseModel):
            inherited |= set(base.model_fields)
    return {n: f for n, f in cls.model_fields.items() if n not in inherited}


def variables(name: str, field: FieldInfo, prefix: str) -> list[str]:
    """The environment variables that set a field: its aliases, else prefix + name."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c.upper() for c in alias.choices if isinstance(c, str)]
    if isinstance(alias, str):
        return [alias.upper()]
    return [f"{prefix}{field.alias or name}".upper()]


def type_name(annotation: Any) -> str:
    """`str | None`, `list[str]`, `Literal['a', 'b']`: module paths dropped."""
    if annotation is None or annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return annotation.__name__
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in typing.get_args(annotation)) + "]"
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return re.sub(r"\b(?:[a-z_][\w]*\.)+(\w+)", r"\1", str(annotation).replace("typing.", ""))


def default_of(field: FieldInfo) -> str:
    """The default as a reader would write it: `unset`, a value, or `required`."""
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, list | dict | tuple):
        value = _plain(value)
    text = str(value) if isinstance(value, str | Path) else repr(value)
    text = text.replace(str(Path.home()), "~")  # the builder's home is not the reader's
    return f"`{text}`" if text else '`""`'


def _plain(value: Any) -> Any:
    """A default made of models (API keys, routes) as the JSON a user would write."""
    if isinstance(value, BaseModel):
        return _plain(value.model_dump(exclude_defaults=True) or value.model_dump())
    if isinstance(value, SecretStr):
        return value.get_secret_value()  # a default secret is a development value, shown as is
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def cell(text: str) -> str:
    """Text fit for one table cell: one line, pipes escaped outside code spans (the tables
    extension leaves a pipe inside backticks alone, and would show the backslash there)."""
    parts = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def nested_model(field: FieldInfo) -> type[BaseModel] | None:
    """The config model a field nests (`train: TrainConfig`), if it is one."""
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not issubclass(annotation, BaseSettings):
            return annotation
    return None


def table(owner: str, fields: dict[str, FieldInfo], prefix: str) -> list[str]:
    """One row per field: variable, type, default, docstring."""
    rows = ["| variable | type | default | what |", "|---|---|---|---|"]
    for name, field in fields.items():
        if not field.description:
            log.warning("settings reference: %s.%s has no docstring", owner, name)
        names = " or ".join(f"`{v}`" for v in variables(name, field, prefix))
        kind = cell(f"`{type_name(field.annotation)}`")
        rows.append(
            f"| {names} | {kind} | {cell(default_of(field))} | {cell(field.description or '')} |"
        )
    return rows


def render_class(cls: type[BaseSettings]) -> list[str]:
    """A class's section: its docstring, what it inherits, its table, its nested models."""
    prefix = cls.model_config.get("env_prefix", "")
    delimiter = cls.model_config.get("env_nested_delimiter") or "__"
    doc = (cls.__doc__ or "").strip()
    lines = [f"### `{cls.__name__}`", "", f"`{cls.__module__}`: {' '.join(doc.split())}", ""]
    bases = [
        b.__name__ for b in cls.__bases__ if issubclass(b, BaseSettings) and b is not BaseSettings
    ]
    if bases:
        lines += ["Also reads " + ", ".join(f"[`{b}`](#{b.lower()})" for b in bases) + ".", ""]
    fields = own_fields(cls)
    flat = {n: f for n, f in fields.items() if nested_model(f) is None}
    if flat:
        lines += table(cls.__name__, flat, prefix) + [""]
    for name, field in fields.items():
        model = nested_model(field)
        if model is None:
            continue
        section = f"{prefix}{name}".upper()
        lines += [
            f"#### `{section}{delimiter}*`: `{model.__name__}`",
            "",
            f"`{model.__module__}`: {cell(field.description or model.__doc__ or '')} "
            f"A whole model may be given as JSON in `{section}`.",
            "",
        ]
        lines += table(model.__name__, model.model_fields, f"{section}{delimiter}") + [""]
    return lines


def render() -> str:
    """The whole reference: every settings class in the tree."""
    lines: list[str] = []
    for cls in settings_classes():
        lines += render_class(cls)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: fill the marker, where a page has it."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
