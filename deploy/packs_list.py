"""`arloop packs list`: the packs this install can serve, where each comes from, and whether
it loads (its agents, whether it has an eval suite for the release gate).

Listed: every pack registered under the `arloop.packs` entry-point group (arloop's own
included), then each `module:attr` reference in ARLOOP_PACKS and the ones given on the
command line. A pack that does not load shows its error; the exit code is then 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agents.packs import PackNotFound, get_pack, registered
from agents.packs.loading import BUILT_IN


@dataclass(frozen=True)
class PackRow:
    """One line of the listing."""

    name: str
    source: str
    target: str
    agents: str
    eval_suite: str
    error: str | None = None


def rows(extra_refs: list[str]) -> list[PackRow]:
    """A row per registered pack and per extra `module:attr` reference, loaded to check it."""
    out = []
    for name, entries in sorted(registered().items()):
        for entry in entries:
            ref = name if len(entries) == 1 else entry.target
            out.append(_row(name, ref, entry.source, entry.target))
    for ref in dict.fromkeys(extra_refs):
        if ":" in ref:
            out.append(_row(ref, ref, "module:attr", ref))
    return out


def _row(name: str, ref: str, source: str, target: str) -> PackRow:
    try:
        pack = get_pack(ref)
        suite = "yes" if pack.has_eval_suite() else "no"
    except PackNotFound as exc:
        return PackRow(name, source, target, "-", "-", str(exc))
    except Exception as exc:  # noqa: BLE001 -- tasks("eval") failed: the listing shows it
        return PackRow(name, source, target, "-", "-", f"{type(exc).__name__}: {exc}")
    shown = pack.name if ":" in ref else name  # a reference shows the pack's own name
    return PackRow(shown, source, target, ", ".join(a.name for a in pack.agents), suite)


def main(extra_refs: list[str]) -> int:
    """Print the table; 0 when every pack loads, 1 otherwise."""
    listed = rows(extra_refs)
    table = Table(title="agent packs")
    for column in ("name", "agents", "eval suite", "source", "loads"):
        table.add_column(column, overflow="fold")
    for r in listed:
        cells = (r.name, r.agents, r.eval_suite, r.source, r.target)
        table.add_row(*(escape(c) for c in cells))
    console = Console()
    console.print(table)
    if any(r.source == BUILT_IN for r in listed):
        console.print(
            f"{BUILT_IN}: found without its installed entry point (an editable install made "
            "before they were declared); `pip install -e .` registers them",
            soft_wrap=True,
        )
    for r in listed:
        if r.error:
            console.print(f"[red]{escape(r.name)}[/red]: {escape(r.error)}", soft_wrap=True)
    return 1 if any(r.error for r in listed) else 0
