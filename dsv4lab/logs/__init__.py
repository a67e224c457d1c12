"""Reading SGLang and vLLM server logs: typed events, a fast per-line classifier and a diagnosis.

- :func:`parse_log` / :class:`LogParser`: streaming parse into frozen events (memory snapshots, phases,
  batch stats, kernel configs, warnings, errors with their tracebacks, server args).
- :func:`classify_line`: a stateless per-line verdict (:class:`LineKind`) for the live watcher.
- :func:`diagnose`: outcome, phase, root cause, evidence and ranked fixes for a whole log.
- :func:`events_frame`, :func:`decode_frame`, :func:`memory_frame`: the same as pandas DataFrames.
"""

from __future__ import annotations

from dsv4lab.logs.classify import LineKind, classify_line
from dsv4lab.logs.detect import detect_engine, engine_votes
from dsv4lab.logs.errors import LogError
from dsv4lab.logs.events import (
    Capacity,
    DecodeBatch,
    DeviceMap,
    DistInit,
    Engine,
    ErrorEvent,
    ErrorKind,
    Event,
    GraphCapture,
    GraphProgress,
    KernelConfig,
    KVCache,
    LogWarning,
    MemoryPoolEnd,
    OomFigures,
    Phase,
    PhaseChange,
    PrefillBatch,
    RunEnd,
    RunStart,
    ServerArgs,
    VllmMemoryProfile,
    WeightLoad,
)
from dsv4lab.logs.fixes import Fix, MemoryFacts
from dsv4lab.logs.frames import decode_frame, events_frame, memory_frame, prefill_frame
from dsv4lab.logs.parse import LogParser, parse_line, parse_log
from dsv4lab.logs.runs import Diagnosis, Outcome, diagnose, diagnose_events
from dsv4lab.logs.serverargs import parse_server_args
from dsv4lab.logs.source import iter_lines

__all__ = [
    "Capacity",
    "DecodeBatch",
    "DeviceMap",
    "Diagnosis",
    "DistInit",
    "Engine",
    "ErrorEvent",
    "ErrorKind",
    "Event",
    "Fix",
    "GraphCapture",
    "GraphProgress",
    "KVCache",
    "KernelConfig",
    "LineKind",
    "LogError",
    "LogParser",
    "LogWarning",
    "MemoryFacts",
    "MemoryPoolEnd",
    "OomFigures",
    "Outcome",
    "Phase",
    "PhaseChange",
    "PrefillBatch",
    "RunEnd",
    "RunStart",
    "ServerArgs",
    "VllmMemoryProfile",
    "WeightLoad",
    "classify_line",
    "decode_frame",
    "detect_engine",
    "diagnose",
    "diagnose_events",
    "engine_votes",
    "events_frame",
    "iter_lines",
    "memory_frame",
    "parse_line",
    "parse_log",
    "parse_server_args",
    "prefill_frame",
]
