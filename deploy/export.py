"""`arloop export`: the learner's logged runs and their feedback as a Hugging Face `datasets`
dataset in TRL's formats (`learner/trl_rows.py` builds the rows), written as parquet or JSON
lines. Nothing is written while a row holds text the PHI scrubber still finds: the agent API
scrubs before Redis (ARLOOP_SCRUB_PHI), and the export checks that it did.
Exit codes: 0 written, 1 refused (PHI found, nothing to export), 2 cannot run."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from deploy.learn.settings import LearnerSettings
from learner.store import Store
from learner.trl_rows import FORMATS, rated_runs, rows, texts

OK, REFUSED, CANNOT = 0, 1, 2
SUFFIXES = (".parquet", ".jsonl")
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class ExportError(ValueError):
    """The export cannot run as asked; the message names the fix."""


@dataclass(frozen=True)
class ExportOptions:
    fmt: str
    out: Path
    pack: str | None = None
    since: str | None = None
    scrub: bool = False
    limit: int = 1_000_000


def parse_since(text: str, now: float) -> float:
    """`7d`, `12h`, `30m` ago, an ISO date or time (`2026-12-01`, UTC unless it says), or
    seconds since the epoch; ExportError naming the forms otherwise."""
    span = _SPAN.match(text.strip())
    if span:
        return now - float(span[1]) * _SECONDS[span[2]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ExportError(
            f"--since {text!r}: give a span (7d, 12h, 30m), an ISO date or time "
            "(2026-12-01, 2026-12-01T08:00+01:00) or seconds since the epoch"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def build(opts: ExportOptions, settings: LearnerSettings, store: Store) -> list[dict[str, Any]]:
    """The rows of the export, from the store (ExportError when an option is wrong)."""
    if opts.fmt not in FORMATS:
        raise ExportError(f"--format {opts.fmt!r}: one of {', '.join(FORMATS)}")
    since = parse_since(opts.since, time.time()) if opts.since else 0.0
    runs = store.rewarded_runs(since=since, limit=opts.limit)
    if opts.pack is not None:
        agents = _agents_of(opts.pack, settings)
        runs = [(t, fb) for t, fb in runs if t.agent in agents]
    return rows(opts.fmt, rated_runs(runs, settings.round.max_user_reward_share))


def unscrubbed(table: list[dict[str, Any]], scrub) -> list[str]:
    """Trajectory ids of rows holding text that `scrub` changes (each distinct text once)."""
    seen: dict[str, bool] = {}
    found = []
    for row in table:
        dirty = False
        for text in texts(row):
            if text not in seen:
                seen[text] = scrub(text) != text
            dirty = dirty or seen[text]
        if dirty:
            found.append(row.get("trajectory_id") or row.get("chosen_id", "?"))
    return found


def scrubbed(table: list[dict[str, Any]], scrub) -> list[dict[str, Any]]:
    """The rows with every message text scrubbed (`--scrub`)."""

    def clean(value: Any) -> Any:
        if isinstance(value, list):
            return [m | {"content": scrub(m["content"])} for m in value]
        return value

    return [{k: clean(v) for k, v in row.items()} for row in table]


def write(table: list[dict[str, Any]], out: Path) -> None:
    """A `datasets.Dataset` of the rows, saved as parquet or JSON lines by `out`'s suffix."""
    from datasets import Dataset

    out.parent.mkdir(parents=True, exist_ok=True)
    dataset = Dataset.from_list(table)
    if out.suffix == ".parquet":
        dataset.to_parquet(str(out))
    else:
        dataset.to_json(str(out), lines=True, force_ascii=False)


def main(opts: ExportOptions, console: Console | None = None) -> int:
    """Entry point of `arloop export` (settings from ARLOOP_*, errors as messages)."""
    console = console or Console(soft_wrap=True)
    settings = LearnerSettings()
    path = settings.data_dir / "learner" / "store.db"
    try:
        if opts.out.suffix not in SUFFIXES:
            raise ExportError(f"--out {opts.out}: name a .parquet or a .jsonl file")
        if not path.exists():
            raise ExportError(
                f"no learner store at {path}: `arloop learn` writes it there as it reads the "
                "streams; set ARLOOP_DATA_DIR to the learner's data directory"
            )
        store = Store(path)
        try:
            table = build(opts, settings, store)
        finally:
            store.close()
    except ExportError as exc:
        console.print(f"[red]arloop export:[/] {escape(str(exc))}")
        return CANNOT
    if not table:
        console.print(
            f"arloop export: nothing to export as {opts.fmt} (runs need feedback that gives a "
            "reward; dpo needs a prompt with a run rewarded above 0 and one below)"
        )
        return REFUSED
    return _checked_write(opts, table, console)


def _checked_write(opts: ExportOptions, table: list[dict[str, Any]], console: Console) -> int:
    from agents.pii import shared_scrubber

    scrub = shared_scrubber().scrub
    if opts.scrub:
        table = scrubbed(table, scrub)
    else:
        dirty = unscrubbed(table, scrub)
        if dirty:
            shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
            console.print(
                f"[red]arloop export: refused:[/] {len(dirty)} of {len(table)} rows hold text "
                f"the PHI scrubber still finds (runs {shown}): they were logged with "
                "ARLOOP_SCRUB_PHI=false. Nothing was written; pass --scrub to scrub them now"
            )
            return REFUSED
    write(table, opts.out)
    columns = ", ".join(table[0])
    console.print(
        f"wrote {len(table)} {opts.fmt} rows to {opts.out} (columns: {columns}); load it with "
        f"datasets.load_dataset({opts.out.suffix.lstrip('.').replace('jsonl', 'json')!r}, "
        f"data_files={str(opts.out)!r})"
    )
    return OK


def _agents_of(ref: str, settings: LearnerSettings) -> set[str]:
    from agents.packs import PackNotFound, get_pack

    try:
        pack = get_pack(
            ref,
            tutoring_source=settings.tutoring_source,
            tutoring_eval_size=settings.tutoring_eval_size,
        )
    except PackNotFound as exc:
        raise ExportError(f"--pack: {exc}") from exc
    return {agent.name for agent in pack.agents}
