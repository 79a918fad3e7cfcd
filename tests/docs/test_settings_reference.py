"""The configuration page is generated from the settings classes (docs/hooks/): every field of
every process's settings, nested config models included, with its variable and docstring."""

from __future__ import annotations

import importlib.util
import logging

from pydantic import BaseModel

from deploy.learn.settings import LearnerSettings
from deploy.settings import AgentApiSettings
from tests.docs.markdown import DOCS


def hook():
    spec = importlib.util.spec_from_file_location(
        "settings_reference", DOCS / "hooks" / "settings_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_settings_class_is_found():
    names = {cls.__name__ for cls in hook().settings_classes()}
    assert {"CommonSettings", "AgentApiSettings", "LearnerSettings", "VllmSyncSettings"} <= names
    assert any("Policy" in n and "Server" in n for n in names), names


def test_every_field_is_rendered_with_its_variable_and_docstring():
    reference = hook()
    text = reference.render()
    for cls in reference.settings_classes():
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no docstring"
            nested = field.annotation
            if isinstance(nested, type) and issubclass(nested, BaseModel):
                for sub, sub_field in nested.model_fields.items():
                    assert f"`ARLOOP_{name}__{sub}`".upper() in text.upper(), (name, sub)
                    assert reference.cell(sub_field.description) in text
                continue
            for variable in reference.variables(name, field, "ARLOOP_"):
                assert f"`{variable}`" in text, variable
    assert "`ARLOOP_AGENTS_PORT` or `ARLOOP_PORT`" in text  # a process's own, then the shared
    assert "`ARLOOP_TRAIN__LEARNING_RATE` | `float` |" in text
    assert "~/.cache/arloop" in text  # the builder's home directory is not printed


def test_a_field_without_a_docstring_fails_the_strict_build(caplog):
    """The hook warns; `mkdocs build --strict` (make docs) turns a warning into a failure."""

    class Undocumented(AgentApiSettings):
        knob: int = 3

    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.settings_reference"):
        hook().render_class(Undocumented)
    assert "Undocumented.knob has no docstring" in caplog.text


def test_the_page_has_the_marker_the_hook_fills():
    assert "<!-- settings-reference -->" in (DOCS / "configuration.md").read_text()
    assert "`ARLOOP_GATE__MARGIN`" in hook().render()
    assert LearnerSettings.model_fields["gate"].description
