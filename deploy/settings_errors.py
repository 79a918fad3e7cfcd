"""A settings error as people read it: one line per bad variable, naming the variable, the
value it had and an example that works (`ARLOOP_PACKS: 'tutoring' is not a JSON list;
example: ARLOOP_PACKS='["tutoring"]'`), never pydantic's traceback or its field names."""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import SettingsError

from deploy.settings import PREFIX

_SOURCE_FIELD = re.compile(r'error parsing value for field "(?P<field>[^"]+)"')
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def explain(exc: ValidationError | SettingsError, cls: type[BaseModel]) -> list[str]:
    """One line per problem in `exc`, raised while `cls` read the environment."""
    if isinstance(exc, SettingsError):
        return [_undecodable(exc, cls)]
    errors = exc.errors(include_url=False)
    return [line for err in errors for line in _line(err, cls).splitlines()]  # several at once


def _undecodable(exc: SettingsError, cls: type[BaseModel]) -> str:
    """A list or model variable whose value is not JSON (pydantic-settings decodes it first)."""
    found = _SOURCE_FIELD.search(str(exc))
    cause = exc.__cause__
    if found is None or not isinstance(cause, json.JSONDecodeError):
        return str(exc)
    name = found["field"]
    var = f"{PREFIX}{name}".upper()
    field = cls.model_fields.get(name)
    raw = cause.doc
    if field is not None and _is_list(field.annotation):
        return f"{var}: {raw!r} is not a JSON list; example: {var}={_quote(json.dumps([raw]))}"
    return f"{var}: {raw!r} is not valid JSON ({cause.msg}); example: {_example(var, field)}"


def _line(err: dict[str, Any], cls: type[BaseModel]) -> str:
    loc = [part for part in err["loc"] if isinstance(part, str)]
    message = err["msg"].removeprefix("Value error, ")
    if not loc:  # a check across fields: its message names the variables itself
        return message
    var, field = _variable(loc, cls)
    example = _example(var, field)
    var = _set_name(var, field)
    value = err.get("input")
    shown = value if isinstance(value, str) else json.dumps(value, default=str)
    if err["type"] == "renamed_setting":
        return message  # names the old variable and the new one
    if err["type"] == "list_type" and isinstance(value, str):  # an optional list, left a string
        return f"{var}: {value!r} is not a JSON list; example: {var}={_quote(json.dumps([value]))}"
    if err["type"] in _RANGE_ERRORS and field is not None:
        message = f"out of range (must be {_range(field)})"
    elif err["type"] == "literal_error":
        message = f"not one of {err['ctx']['expected']}"
    else:
        message = _negated(message)
    return f"{var}: {shown!r} is {message}; example: {example}"


def _variable(loc: list[str], cls: type[BaseModel]) -> tuple[str, FieldInfo | None]:
    """The variable a location names (`('train', 'learning_rate')` ->
    ARLOOP_TRAIN__LEARNING_RATE) and its field, where `cls` declares it."""
    if loc[0].upper().startswith(PREFIX):  # read through an alias: the name is the variable
        alias = loc[0].upper()
        fields = cls.model_fields.items()
        owner = next((f for _, f in fields if alias in _aliases(f)), None)
        return alias, owner
    field: FieldInfo | None = None
    model: Any = cls
    for part in loc:
        field = model.model_fields.get(part) if _is_model(model) else None
        model = field.annotation if field is not None else None
    return PREFIX + "__".join(loc).upper(), field


def _set_name(var: str, field: FieldInfo | None) -> str:
    """Of a field's variables (ARLOOP_POLICY_PORT, then ARLOOP_PORT), the one the user set."""
    names = _aliases(field) if field is not None else []
    env = {k.upper() for k in os.environ}
    return next((n for n in names if n in env), var)


def _aliases(field: FieldInfo) -> list[str]:
    choices = getattr(field.validation_alias, "choices", [])
    return [c.upper() for c in choices if isinstance(c, str)]


def _range(field: FieldInfo) -> str:
    bounds = [
        f"{sign} {getattr(m, key)}"
        for m in field.metadata
        for key, sign in _BOUNDS
        if getattr(m, key, None) is not None
    ]
    return " and ".join(bounds) or "in range"


def _example(var: str, field: FieldInfo | None) -> str:
    """`VAR=value` with a value that validates: the field's default, or one of its kind."""
    if field is None:
        return f"{var}=<value>"
    default = field.get_default(call_default_factory=True, validated_data={})
    args = get_args(field.annotation)
    if get_origin(field.annotation) is not None and all(isinstance(a, str) for a in args):
        return f"{var}={args[-1]}"  # a Literal: one of its values
    if isinstance(default, BaseModel):
        first = next(iter(type(default).model_fields), "")
        return f"{var}__{first.upper()}={_scalar(getattr(default, first, ''))}"
    if default is None or default == []:
        if not _is_list(field.annotation):
            return var + "="
        item = [a for arg in args for a in get_args(arg) if isinstance(a, str)][:1] or ["..."]
        return f"{var}={_quote(json.dumps(item))}"  # list[Literal[...]]: one of its values
    return f"{var}={_scalar(default)}"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list) and not all(isinstance(v, (str, int, float)) for v in value):
        return _quote(json.dumps(["..."]))  # e.g. API keys: show the shape, not the secret
    if isinstance(value, (list, dict)):
        return _quote(json.dumps(value, default=str))
    return _quote(str(getattr(value, "get_secret_value", lambda: value)()))


def _quote(text: str) -> str:
    return shlex.quote(text)


def _negated(message: str) -> str:
    """pydantic's "Input should be a valid integer, unable to ..." as "not a valid integer (...)"."""
    for lead in ("Input should be ", "Value should be "):
        if message.startswith(lead):
            what, _, why = message.removeprefix(lead).partition(", ")
            return f"not {what}" + (f" ({why})" if why else "")
    return f"invalid: {message[:1].lower()}{message[1:]}"


def _is_list(annotation: Any) -> bool:
    if get_origin(annotation) is list:
        return True
    return any(_is_list(a) for a in get_args(annotation))


def _is_model(model: Any) -> bool:
    return isinstance(model, type) and issubclass(model, BaseModel)
