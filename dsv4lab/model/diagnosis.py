"""A log's diagnosis, checked against the memory model.

:func:`dsv4lab.logs.diagnose` reads what the log says: the failing GPU, the allocation that failed, the
split the server logged. A single failed allocation is not the shortfall, though: capture stops at the
first graph that does not fit. When the log names a model and a card dsv4lab has profiles for, this module
rebuilds the config from the logged ``server_args``, runs :func:`~dsv4lab.model.memory.preflight` on it, states
how far short the whole capture would have been, and checks each proposed fix against the same model, so
the next launch is predicted to fit before anyone waits for it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from dsv4lab.config.hardware import HardwareProfile, ModelProfile, hardware_profile, model_profile
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.errors import ConfigError
from dsv4lab.logs import Diagnosis, Fix, Outcome, Phase, ServerArgs, diagnose, parse_log
from dsv4lab.logs.source import LogSource
from dsv4lab.model.calibration import calibrate, config_from_server_args, hardware_for_total
from dsv4lab.model.memory import Preflight, preflight, suggest

__all__ = ["diagnose_with_model"]

#: Server args come first in a log; stop looking after this many events.
_ARGS_WITHIN_EVENTS = 20_000

_FLAG_VALUE = re.compile(r"^(--[a-z0-9-]+)[ =](\S+)$")
_FIELD_FOR_FLAG = {
    "--mem-fraction-static": "mem_fraction_static",
    "--cuda-graph-max-bs": "cuda_graph_max_bs",
    "--cuda-graph-max-bs-decode": "cuda_graph_max_bs",
}


def _server_args(log: LogSource) -> dict[str, Any] | None:
    for i, event in enumerate(parse_log(log)):
        if isinstance(event, ServerArgs):
            return event.args
        if i > _ARGS_WITHIN_EVENTS:
            break
    return None


def _lever(fix: Fix) -> tuple[str, float | int] | None:
    """(config field, value) of a fix that sets one modelled flag, e.g. ``--mem-fraction-static 0.60``."""
    match = _FLAG_VALUE.match(fix.change.strip())
    name = _FIELD_FOR_FLAG.get(match.group(1)) if match else None
    if match is None or name is None:
        return None
    try:
        value: float | int = float(match.group(2)) if name == "mem_fraction_static" else int(match.group(2))
    except ValueError:
        return None
    return name, value


def _verdict(p: Preflight) -> str:
    if p.fits:
        return f"the model predicts it fits with {p.min_headroom_gib:.1f} GiB left on the tightest GPU"
    return f"the model predicts it is still short by {p.short_by_gib:.1f} GiB in {p.fail_phase}"


def diagnose_with_model(
    log: LogSource,
    *,
    hardware: HardwareProfile | str | None = None,
    model: ModelProfile | str | None = None,
    calibration_logs: tuple[LogSource, ...] = (),
    sglang_version: str | None = None,
) -> Diagnosis:
    """:func:`dsv4lab.logs.diagnose`, plus the memory model's arithmetic for OOMs it can model."""
    d = diagnose(log)
    if d.outcome is not Outcome.OOM or d.phase not in (
        Phase.CUDA_GRAPH_CAPTURE,
        Phase.DRAFT_CUDA_GRAPH_CAPTURE,
        Phase.KV_CACHE_ALLOC,
    ):
        return d
    if isinstance(log, (str, bytes, list, tuple)) or hasattr(log, "__fspath__"):  # re-readable sources
        args = _server_args(log)
    else:
        return d  # a one-shot stream: the lines are gone, nothing more to read
    if not args:
        return d
    try:
        config = config_from_server_args(args)
        m = model_profile(model) if isinstance(model, str) else model or model_profile(config.model_path)
        if calibration_logs:
            m = calibrate(*calibration_logs, model=m).model
        hw = hardware_profile(hardware) if isinstance(hardware, str) else hardware
        hw = hw or hardware_for_total(d.total_gib, config.tp)
        if hw is None:
            return d
        version = sglang_version or ("0.5.23" if d.figures.get("new_flags") else "0.5.4")
        base = preflight(config, hw, m, sglang_version=version)
    except ConfigError as exc:
        return dataclasses.replace(d, notes=(*d.notes, f"memory model not applied: {exc}"))
    return _with_model(d, config, base, hw, m, version)


def _with_model(
    d: Diagnosis, config: ServerConfig, base: Preflight, hw: HardwareProfile, m: ModelProfile, version: str
) -> Diagnosis:
    worst = min(base.per_gpu, key=lambda g: g.slack_gib)
    graphs = " + ".join(f"{g.role} {g.runner} {g.gib:.1f}" for g in base.graphs)
    note = (
        f"Memory model ({hw.name}, {m.name}): at mem_fraction_static {base.settings.mem_fraction_static:.2f} the "
        f"slack outside the static share is {worst.slack_gib:.1f} GiB on GPU {worst.gpu}; graphs ({graphs}) and "
        f"buffers ({worst.comm_gib:.1f}) need {worst.comm_gib + worst.graphs_gib:.1f} GiB"
        + (f": short by {base.short_by_gib:.1f} GiB in {base.fail_phase}." if not base.fits else "; it should fit.")
    )
    # Each fix with its rank: 0 predicted to fit, 1 not modelled (kept as the log reading gave it), 2 still
    # short. A card lists what fits first: a first row that says "still short" sends a reader the wrong way.
    ranked: list[tuple[int, Fix]] = []
    levers: dict[str, tuple[Fix, float | int]] = {}  # the first fix per config field, for the combination
    for fix in d.fixes:
        lever = _lever(fix)
        if lever is None:
            ranked.append((1, fix))
            continue
        name, value = lever
        try:
            p = preflight(config.replace(**{name: value}), hw, m, sglang_version=version)
        except ConfigError:  # a value the config rejects: keep the fix as the log reading gave it
            ranked.append((1, fix))
            continue
        ranked.append((0 if p.fits else 2, Fix(fix.change, f"{fix.why} Checked: {_verdict(p)}.")))
        levers.setdefault(name, (fix, value))
    # Both levers together (the story's fix), and the model's own suggestions, each checked.
    flags = [f.change for _, f in ranked]
    if len(levers) == 2:
        p = preflight(config.replace(**{k: v for k, (_, v) in levers.items()}), hw, m, sglang_version=version)
        both = Fix(
            " ".join(f.change for f, _ in levers.values()),
            f"Both changes together: {_verdict(p)}; the KV pool keeps {p.kv_tokens:,} tokens.",
        )
        ranked.append((0 if p.fits else 2, both))
    for s in suggest(config, hw, m, sglang_version=version):
        change = s.as_flags(version)
        if change not in flags:
            ranked.append((0, Fix(change, f"Memory model: {s.why}.")))
    fixes = tuple(f for _, f in sorted(ranked, key=lambda rf: rf[0]))  # stable: the log's order within a rank
    figures = {
        **d.figures,
        "model_short_by_gib": base.short_by_gib,
        "model_slack_gib": worst.slack_gib,
        "model_need_gib": worst.comm_gib + worst.graphs_gib,
    }
    return dataclasses.replace(d, fixes=fixes, notes=(*d.notes, note), figures=figures)
