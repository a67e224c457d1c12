"""SGLang message rules: the text after ``[ts ranks]`` -> one typed event, or None.

One function, checked in the order lines are most frequent in a real log (batch stats first), each rule
behind a substring test so that an uninteresting line costs a handful of ``in`` checks. Version
differences (0.4.10 ``Decode batch.`` vs 0.5.x ``Decode batch,``; old vs new capture lines; ``bs=`` on the
begin line in 0.5.16 and on the end line in 0.5.23) are absorbed here so the events look the same for every
release.
"""

from __future__ import annotations

from typing import Any

from dsv4lab.logs import patterns as P
from dsv4lab.logs.causes import classify_error_text, oom_figures
from dsv4lab.logs.events import (
    Capacity,
    DecodeBatch,
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
    Phase,
    PhaseChange,
    PrefillBatch,
    RunEnd,
    WeightLoad,
)

__all__ = ["parse_progress_line", "parse_sglang_message"]

_SG = Engine.SGLANG

_UVICORN = (
    ("Uvicorn running on", "uvicorn running"),
    ("Application startup complete", "application startup complete"),
    ("Started server process", "uvicorn started"),
    ("Waiting for application startup", "waiting for application startup"),
)

#: Substrings that make a prefixed line worth the fatal-line rules (cheap prefilter).
_FATAL_HINTS = (
    "xception",
    "sigquit",
    "SIGQUIT",
    "kill_process_tree",
    "cheduler",
    "ailed",
    "rror",
    "out of memory",
    "Not enough memory",
    "watchdog",
    "crashed",
    "Exit code",
    "exit code",
)


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def _bs_list(text: str) -> tuple[int, ...] | None:
    m = P.BS_LIST.search(text)
    if not m:
        return None
    return tuple(int(x) for x in m.group(1).replace(",", " ").split() if x.isdigit())


def _f(m: object, group: int = 1) -> float | None:
    if m is None:
        return None
    return float(m.group(group))  # type: ignore[attr-defined]


def _capture(msg: str, line_no: int, text: str, ts: str | None, rank: int | None, dp: int | None) -> Event | None:
    where: dict[str, Any] = {"line_no": line_no, "text": text, "ts": ts, "rank": rank, "dp": dp, "engine": _SG}
    m = P.CAPTURE_NEW.search(msg)
    if m:
        role, graph, stage = m.group("role"), m.group("graph"), m.group("stage")
    else:
        m = P.CAPTURE_OLD.search(msg)
        if not m:
            dm = P.CAPTURE_DRAFT_ANY.search(msg)
            if dm:
                tail = msg[dm.end() :]
                return GraphCapture(
                    **where,
                    stage=dm.group("stage"),
                    role="draft",
                    graph="decode",
                    avail_gib=_f(P.AVAIL.search(tail)),
                    usage_gib=_f(P.USAGE.search(tail)),
                    elapsed_s=_f(P.ELAPSED.search(tail)),
                )
            bsm = P.CAPTURE_BS.search(msg)
            if bsm:
                sizes = tuple(int(x) for x in bsm.group(2).replace(",", " ").split() if x.isdigit())
                if bsm.group("what") == "num tokens":  # the piecewise (prefill) graph's token sizes
                    return GraphCapture(**where, stage="plan", graph="prefill")
                return GraphCapture(**where, stage="plan", bs=sizes)
            return None
        old_role = (m.group("role") or "").strip()
        role = "draft" if old_role.startswith("draft") else "target"
        graph = {"draft extend": "extend", "piecewise": "prefill"}.get(old_role, "decode")
        stage = m.group("stage")
    tail = msg[m.end() :]
    backend = P.BACKEND.search(tail)
    return GraphCapture(
        **where,
        stage=stage,
        role=role,
        graph=graph,
        avail_gib=_f(P.AVAIL.search(tail)),
        usage_gib=_f(P.USAGE.search(tail)),
        elapsed_s=_f(P.ELAPSED.search(tail)),
        bs=_bs_list(tail),
        backend=backend.group(1) if backend else None,
    )


def parse_progress_line(line: str, line_no: int) -> Event | None:
    """tqdm bars without a log prefix: graph capture (SGLang and vLLM) and weight shards."""
    if line.startswith("Capturing"):
        c = P.TQDM_COUNT.search(line)
        bs = P.TQDM_BS.search(line)
        avail = P.AVAIL.search(line)
        label = line.split(":", 1)[0] if ":" in line else line[:60]
        return GraphProgress(
            line_no=line_no,
            text=line,
            done=int(c.group(1)) if c else None,
            total=int(c.group(2)) if c else None,
            bs=int(bs.group(1)) if bs else None,
            avail_gib=float(avail.group(1)) if avail else None,
            label=label,
        )
    if line.startswith(("Loading safetensors checkpoint shards", "Loading pt checkpoint shards")):
        return PhaseChange(line_no=line_no, text=line, phase=Phase.WEIGHT_LOADING, what="loading checkpoint shards")
    return None


def parse_sglang_message(
    msg: str, line_no: int, text: str, ts: str | None, rank: int | None, dp: int | None
) -> Event | None:
    """The event for one SGLang log message (prefix already removed), or None if it carries nothing."""
    if msg.startswith("Decode batch"):
        return DecodeBatch.fast(line_no, text, ts, rank, dp, _SG)
    if msg.startswith("Prefill batch"):
        return PrefillBatch.fast(line_no, text, ts, rank, dp, _SG)
    where: dict[str, Any] = {"line_no": line_no, "text": text, "ts": ts, "rank": rank, "dp": dp, "engine": _SG}
    if msg.startswith("INFO:"):
        if "Uvicorn" not in msg and "pplication startup" not in msg and "server process" not in msg:
            return None
        for needle, what in _UVICORN:
            if needle in msg:
                return PhaseChange(**where, phase=Phase.WARMUP, what=what)
        return None
    if msg.startswith("Capture"):
        return _capture(msg, line_no, text, ts, rank, dp)
    if "Load weight" in msg:
        m = P.WEIGHT_END.search(msg)
        if m:
            mid = m.group("mid") or ""
            dtype = P.WEIGHT_DTYPE.search(mid)
            quant = P.WEIGHT_QUANT.search(mid)
            return WeightLoad(
                **where,
                stage="end",
                avail_gib=float(m.group("avail")),
                usage_gib=float(m.group("use")) if m.group("use") else None,
                model_class=m.group("cls"),
                dtype=dtype.group(1) if dtype else None,
                quant=quant.group(1).strip() if quant else None,
                elapsed_s=float(m.group("el")) if m.group("el") else None,
            )
        m = P.WEIGHT_BEGIN.search(msg)
        if m:
            return WeightLoad(
                **where,
                stage="begin",
                avail_gib=float(m.group(1)),
            )
        if "Load weight begin" in msg:  # cut before the figure
            return WeightLoad(**where, stage="begin")
        return None
    if "KV Cache" in msg or "KV cache allocated" in msg:
        m = P.KV_ALLOC.search(msg)
        if m:
            label = m.group("label")
            if msg.startswith("Post-capture"):
                label = "Post-capture"
            return KVCache(
                **where,
                tokens=int(m.group("tokens")),
                k_gib=float(m.group("k")) if m.group("k") else None,
                v_gib=float(m.group("v")) if m.group("v") else None,
                kv_gib=float(m.group("kv")) if m.group("kv") else None,
                dtype=m.group("dtype"),
                label=label,
                upper_bound=m.group("how") == "VA upper bound",
            )
    if msg.startswith("Memory pool end"):
        m = P.POOL_END.search(msg)
        return MemoryPoolEnd(**where, avail_gib=_f(m) if m else None)
    if msg.startswith("max_total_num_tokens="):
        kv = dict(P.KEY_NUM.findall(msg))
        avail = P.AVAIL.search(msg) or None

        def gi(key: str) -> int | None:
            v = kv.get(key)
            return _int(v) if v is not None else None

        gpu = kv.get("available_gpu_mem")
        return Capacity(
            **where,
            max_total_num_tokens=gi("max_total_num_tokens"),
            chunked_prefill_size=gi("chunked_prefill_size"),
            max_prefill_tokens=gi("max_prefill_tokens"),
            max_running_requests=gi("max_running_requests"),
            context_len=gi("context_len"),
            available_gib=float(gpu) if gpu is not None else (_f(avail) if avail else None),
        )
    if msg.startswith(("Init torch distributed", "Init parallel", "Memory baseline taken")):
        stage = "baseline" if msg.startswith("Memory") else ("begin" if " begin" in msg else "end")
        use = P.DIST_END_USAGE.search(msg)
        return DistInit(**where, stage=stage, usage_gib=_f(use))
    if "ready to roll" in msg:
        return PhaseChange(
            **where,
            phase=Phase.SERVING,
            what="ready",
            ready=True,
        )
    if "FP8 kernel" in msg or "MoE" in msg:
        m = P.FP8_TUNED.search(msg)
        if m:
            kernel = "fused_moe" if "MoE" in m.group("what") else "w8a8_block_fp8"
            return KernelConfig(
                **where,
                kernel=kernel,
                tuned=True,
                path=m.group("path"),
            )
        m = P.FP8_DEFAULT.search(msg)
        if m:
            kernel = "fused_moe" if "MoE" in m.group("what") else "w8a8_block_fp8"
            return KernelConfig(
                **where,
                kernel=kernel,
                tuned=False,
                path=m.group("path"),
            )
    if "profiled value" in msg:
        m = P.PROFILED_VALUE.search(msg)
        if m and int(m.group(2)) <= 0:
            return ErrorEvent(
                **where,
                kind=ErrorKind.KV_BUDGET,
                message=msg,
                traceback=(text,),
            )
        return LogWarning(**where, message=msg)
    if "kill_process_tree" in msg and "include_parent=False" in msg:
        return RunEnd(**where, reason=msg)
    if any(h in msg for h in _FATAL_HINTS):
        kind = classify_error_text(msg)
        graph_failed = "CUDA Graph failed" in msg or "cuda graph failed" in msg  # a graph wrapper's own line
        if (kind is not ErrorKind.OTHER or graph_failed) and not msg.startswith(
            ("Ignore import error", "Failed to import")
        ):
            return ErrorEvent(
                **where,
                kind=kind,
                message=msg,
                traceback=(text,),
                oom=oom_figures(msg) if kind is ErrorKind.OOM else None,
            )
    if (
        "arning" in msg
        or "WARNING" in msg
        or "deprecated" in msg
        or "Retract requests" in msg
        or "is unbalanced" in msg
        or "Not enough" in msg
    ):
        return LogWarning(**where, message=msg)
    return None
