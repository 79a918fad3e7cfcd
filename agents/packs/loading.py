"""Finding packs: `module:attr` strings and the `arloop.packs` entry-point group.

A pack reference is either a name registered under the `arloop.packs` entry-point group of an
installed distribution (arloop's own `tutoring` and `medical` are registered that way, in its
pyproject.toml) or a `module:attr` string naming a `Pack`, or a function returning one. A
function may take keyword options by name (today `tutoring_source` and `tutoring_eval_size`,
the learner's ARLOOP_TUTORING_*); it is given only those its signature names.

An editable checkout installed before the entry points were declared has no `arloop.packs`
metadata until it is reinstalled (`pip install -e .`); the built-in packs are then found
through `BUILTIN` (the same `module:attr` values as pyproject.toml, a test keeps them equal)
and `arloop packs list` says so.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from agents.packs.base import Pack
from agents.runtime import AgentSpec

GROUP = "arloop.packs"
BUILTIN = {"tutoring": "agents.packs.tutoring:pack", "medical": "agents.packs.medical:pack"}
"""The built-in packs' entry points, as declared in pyproject.toml (the fallback's table)."""
BUILT_IN = "arloop (built in)"
"""The source of a built-in pack found through `BUILTIN`, not its installed entry point."""


class PackNotFound(ValueError):
    """A pack reference names no usable pack; the message names the reference, what was
    wrong and how to fix it."""


@dataclass(frozen=True)
class PackEntry:
    """A registered pack: its name, the `module:attr` it loads, and who registered it."""

    name: str
    target: str
    """What it loads: `module:attr`."""
    source: str
    """Who registered it: `<distribution> <version>`, `arloop (built in)` (the fallback), or
    `module:attr` for a reference that is not registered."""


def how_to_name() -> str:
    """How to name a pack, with the installed ones: the tail of every PackNotFound."""
    names = ", ".join(sorted(registered())) or "none"
    return (
        f"installed packs are {names} (`arloop packs list`); a team's own pack is named "
        "'module:attr', a Pack or a function returning one (e.g. 'myteam.packs:support'), or "
        f"registered under the {GROUP!r} entry-point group of its package"
    )


def registered() -> dict[str, list[PackEntry]]:
    """Every registered pack by name (two distributions may claim one name: both listed)."""
    out: dict[str, list[PackEntry]] = {}
    seen = set()
    for ep in entry_points(group=GROUP):
        if (ep.name, ep.value) in seen:  # one distribution found twice on the path
            continue
        seen.add((ep.name, ep.value))
        dist = ep.dist
        who = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "unknown"
        out.setdefault(ep.name, []).append(PackEntry(ep.name, ep.value, who))
    for name, target in BUILTIN.items():  # arloop's own, where its metadata lacks them
        if not any(e.target == target for e in out.get(name, [])):
            out.setdefault(name, []).append(PackEntry(name, target, BUILT_IN))
    return out


def resolve(ref: str) -> PackEntry:
    """The registered pack `ref` names, or the `module:attr` it is; PackNotFound if neither."""
    if ":" in ref:
        return PackEntry(ref, ref, "module:attr")
    found = registered().get(ref)
    if not found:
        raise PackNotFound(f"unknown agent pack {ref!r}: {how_to_name()}")
    if len(found) > 1:
        claims = "; ".join(f"{e.target} from {e.source}" for e in found)
        raise PackNotFound(
            f"agent pack {ref!r} is registered twice ({claims}): uninstall one, or name the "
            "one you want as 'module:attr'"
        )
    return found[0]


def get_pack(
    ref: str, *, tutoring_source: str = "templates", tutoring_eval_size: int = 480
) -> Pack:
    """The pack `ref` names (a registered name or `module:attr`); PackNotFound saying why not.

    `tutoring_source` and `tutoring_eval_size` shape the built-in tutoring pack's problems
    (the learner's ARLOOP_TUTORING_SOURCE / ARLOOP_TUTORING_EVAL_SIZE).
    """
    entry = resolve(ref)
    options = {"tutoring_source": tutoring_source, "tutoring_eval_size": tutoring_eval_size}
    return load_target(ref, entry.target, options)


def load_packs(refs: list[str]) -> list[AgentSpec]:
    """The agents of the packs `refs` name (see `get_pack`); PackNotFound for a bad one, or
    for two packs that serve an agent of the same name."""
    return agents_of([get_pack(ref) for ref in refs], refs)


def agents_of(packs: list[Pack], refs: list[str]) -> list[AgentSpec]:
    """The agents of `packs` (loaded from `refs`, in order); PackNotFound for two packs that
    serve an agent of the same name."""
    served: dict[str, str] = {}
    agents = []
    for ref, pack in zip(refs, packs, strict=True):
        for agent in pack.agents:
            if agent.name in served:
                raise PackNotFound(
                    f"agent {agent.name!r} is served by both {served[agent.name]!r} and "
                    f"{ref!r}: rename one of them, or serve one pack"
                )
            served[agent.name] = ref
            agents.append(agent)
    return agents


def load_target(ref: str, target: str, options: Mapping[str, Any] | None = None) -> Pack:
    """Import `module:attr` and make the Pack (calling a function with the `options` it
    names); PackNotFound naming `ref`, the step that failed and the fix."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise PackNotFound(f"agent pack {ref!r}: {target!r} is not 'module:attr'; {how_to_name()}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PackNotFound(
            f"agent pack {ref!r}: cannot import {module_name} ({exc}): install the package "
            "that provides it, or put its folder on PYTHONPATH"
        ) from exc
    except Exception as exc:  # a pack module that fails while importing: its own bug
        raise PackNotFound(
            f"agent pack {ref!r}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from exc
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise PackNotFound(f"agent pack {ref!r}: {module_name} has no attribute {attr!r}")
        found = getattr(found, part)
    value = _call(found, ref, target, options or {}) if _is_factory(found) else found
    _check(value, ref, target)
    return value


def _is_factory(found: Any) -> bool:
    return callable(found) and not isinstance(found, Pack) and not isinstance(found, type)


def _call(factory: Callable[..., Any], ref: str, target: str, options: Mapping[str, Any]) -> Any:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it bare
        params = []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        kwargs = dict(options)
    else:
        names = {p.name for p in params}
        kwargs = {k: v for k, v in options.items() if k in names}
    try:
        return factory(**kwargs)
    except Exception as exc:
        raise PackNotFound(
            f"agent pack {ref!r}: calling {target}() raised {type(exc).__name__}: {exc}"
        ) from exc


def _check(value: Any, ref: str, target: str) -> None:
    """A Pack with at least one agent, every agent an AgentSpec; or a team's agent: no
    agents, a callable `run`."""
    if not isinstance(value, Pack):
        raise PackNotFound(
            f"agent pack {ref!r}: {target} is a {type(value).__name__}, not an "
            "agents.packs.Pack (nor a function returning one)"
        )
    _check_fields(value, ref, target)
    if value.run is not None:
        if value.agents or not callable(value.run):
            what = "agents beside its run" if value.agents else "a run that is not callable"
            raise PackNotFound(
                f"agent pack {ref!r}: {target} has {what}; a team's own agent is a Pack with "
                "no agents and run(task, base_url, model, headers) -> answer"
            )
        return
    bad = [a for a in value.agents if not isinstance(a, AgentSpec)]
    if not value.agents or bad:
        what = f"a {type(bad[0]).__name__} among its agents" if bad else "no agents"
        raise PackNotFound(
            f"agent pack {ref!r}: {target} has {what}; Pack.agents is a tuple of "
            "agents.runtime.AgentSpec (or, for a team's own agent, give it `run`)"
        )


CALLED = {
    "tasks": "tasks(split) -> list[Task]",
    "verify": "verify(task, answer) -> float",
    "score_reward": "score_reward(key, score) -> float | None",
}
"""Pack fields that must be functions, with how they are called."""
CALLED_OR_NONE = {
    "answer_of": "answer_of(reply) -> str | None",
    "reference_from": "reference_from(correction) -> str | None",
    "restate": "restate(reply, answer) -> str | None",
    "first_turn": "first_turn(task, step) -> float",
}
"""Pack fields that are a function or None."""


def _check_fields(value: Pack, ref: str, target: str) -> None:
    """The Pack's name is a non-empty str and its functions are functions: a wrong one is
    said at load, naming the field, not when the learner or the gate first calls it."""
    where = f"agent pack {ref!r}: {target}"
    if not isinstance(value.name, str) or not value.name.strip():
        raise PackNotFound(f"{where} has name {value.name!r}: give Pack.name a non-empty str")
    wrong = [(f, how) for f, how in CALLED.items() if not callable(getattr(value, f))] + [
        (f, how)
        for f, how in CALLED_OR_NONE.items()
        if getattr(value, f) is not None and not callable(getattr(value, f))
    ]
    if wrong:
        field, how = wrong[0]
        got = type(getattr(value, field)).__name__
        raise PackNotFound(f"{where} has a {got} as Pack.{field}: give it a function, {how}")
