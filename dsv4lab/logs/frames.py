"""Events as pandas DataFrames, for notebooks and plots.

One row per event with its common columns (line, timestamp, rank, engine) and its own fields; the
specialised frames pick the events a plot needs (decode throughput over time, memory per rank per step).
Each accepts parsed events or a log (path / lines) and parses it on the way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # pandas costs 2.5 s to import: every CLI verb imports this package, few draw a frame
    import pandas as pd

from dsv4lab.logs.events import (
    Capacity,
    DecodeBatch,
    DistInit,
    Event,
    GraphCapture,
    KVCache,
    MemoryPoolEnd,
    PrefillBatch,
    VllmMemoryProfile,
    WeightLoad,
)
from dsv4lab.logs.parse import parse_log
from dsv4lab.logs.source import LogSource

__all__ = ["decode_frame", "events_frame", "memory_frame", "prefill_frame"]

_MEMORY_TYPES = (WeightLoad, KVCache, MemoryPoolEnd, GraphCapture, Capacity, DistInit, VllmMemoryProfile)


def _events(source: Iterable[Event] | LogSource) -> Iterator[Event]:
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__") or hasattr(source, "read"):
        yield from parse_log(cast(LogSource, source))
        return
    it: Iterator[Any] = iter(cast(Iterable[Any], source))
    first = next(it, None)
    if first is None:
        return
    if isinstance(first, Event):
        yield first
        for ev in it:
            if isinstance(ev, Event):
                yield ev
        return

    def lines() -> Iterator[Any]:
        yield first
        yield from it

    yield from parse_log(lines())


def _row(ev: Event) -> dict[str, Any]:
    row: dict[str, Any] = {"type": type(ev).__name__}
    for f in dataclasses.fields(ev):
        value = getattr(ev, f.name)
        if isinstance(value, Enum):
            value = value.value
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for k, v in dataclasses.asdict(value).items():
                row[f"{f.name}_{k}"] = v
            continue
        elif isinstance(value, tuple) and f.name in ("traceback", "frames", "items"):
            value = len(value) if f.name != "items" else dict(value)
        row[f.name] = value
    if isinstance(ev, DecodeBatch | PrefillBatch):
        row.update(dataclasses.asdict(ev.stats))
    return row


def _frame(rows: list[dict[str, Any]], first: tuple[str, ...]) -> pd.DataFrame:
    import pandas as pd

    df: pd.DataFrame = pd.DataFrame.from_records(rows)
    if df.empty:
        empty: pd.DataFrame = pd.DataFrame(columns=list(first))
        return empty
    cols = [c for c in first if c in df.columns] + [c for c in df.columns if c not in first]
    out: pd.DataFrame = df.loc[:, cols]
    return out


def events_frame(events: Iterable[Event] | LogSource) -> pd.DataFrame:
    """One row per event: ``type``, ``line_no``, ``ts``, ``rank``, ``dp``, ``engine``, then its fields."""
    rows = [_row(ev) for ev in _events(events)]
    return _frame(rows, ("type", "line_no", "ts", "rank", "dp", "engine"))


def decode_frame(events: Iterable[Event] | LogSource) -> pd.DataFrame:
    """Decode-batch stats: running requests, tokens, token usage, accept len/rate, gen throughput, queue."""
    rows = [_row(ev) for ev in _events(events) if isinstance(ev, DecodeBatch)]
    df = _frame(
        rows,
        (
            "line_no",
            "ts",
            "rank",
            "dp",
            "running",
            "tokens",
            "token_usage",
            "accept_len",
            "accept_rate",
            "cuda_graph",
            "gen_throughput",
            "queue",
        ),
    )
    return _drop(df)


def _drop(df: pd.DataFrame) -> pd.DataFrame:
    out: pd.DataFrame = df.drop(columns=["type", "text", "engine"], errors="ignore")
    return out


def prefill_frame(events: Iterable[Event] | LogSource) -> pd.DataFrame:
    """Prefill-batch stats: new sequences/tokens, cached tokens, token usage, running, queue, throughput."""
    rows = [_row(ev) for ev in _events(events) if isinstance(ev, PrefillBatch)]
    return _drop(_frame(rows, ("line_no", "ts", "rank", "dp")))


def memory_frame(events: Iterable[Event] | LogSource) -> pd.DataFrame:
    """Memory snapshots per rank and step: ``step`` (load_begin, load_end, kv, pool_end, capture_begin/end,
    summary, ...), ``role``/``graph`` for captures, ``avail_gib``, ``usage_gib``, ``size_gib``, ``tokens``."""
    rows: list[dict[str, Any]] = []
    for ev in _events(events):
        if not isinstance(ev, _MEMORY_TYPES):
            continue
        row: dict[str, Any] = {
            "line_no": ev.line_no,
            "ts": ev.ts,
            "rank": ev.rank,
            "dp": ev.dp,
            "engine": ev.engine.value if ev.engine else None,
            "step": None,
            "role": None,
            "graph": None,
            "avail_gib": None,
            "usage_gib": None,
            "size_gib": None,
            "tokens": None,
        }
        if isinstance(ev, WeightLoad):
            row.update(step=f"load_{ev.stage}", avail_gib=ev.avail_gib, usage_gib=ev.usage_gib)
        elif isinstance(ev, KVCache):
            row.update(step="kv", size_gib=ev.size_gib, tokens=ev.tokens)
        elif isinstance(ev, MemoryPoolEnd):
            row.update(step="pool_end", avail_gib=ev.avail_gib)
        elif isinstance(ev, GraphCapture):
            row.update(
                step=f"capture_{ev.stage}", role=ev.role, graph=ev.graph, avail_gib=ev.avail_gib, usage_gib=ev.usage_gib
            )
        elif isinstance(ev, Capacity):
            row.update(step="summary", avail_gib=ev.available_gib, tokens=ev.max_total_num_tokens)
        elif isinstance(ev, DistInit):
            row.update(step=f"dist_{ev.stage}", usage_gib=ev.usage_gib)
        elif isinstance(ev, VllmMemoryProfile):
            row.update(step="vllm_profile", size_gib=ev.kv_gib, usage_gib=ev.weights_gib)
        rows.append(row)
    return _frame(rows, ("line_no",))
