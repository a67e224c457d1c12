"""The numbers of batch-stats lines, parsed when someone reads them.

SGLang's ``Decode batch`` / ``Prefill batch`` lines are ``key: value`` lists whose fields come and go
between releases (0.4.10 ends with ``, ``, 0.5.23 drops it and adds ``accept rate``, ``cap len``, PD and
hybrid-pool fields), so they are read as key/value pairs rather than with one rigid regex; a field that is
missing or cut off is ``None``. vLLM's periodic ``Avg generation throughput`` line maps to decode stats.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from dsv4lab.logs import patterns as P

__all__ = ["DecodeStats", "Engine", "PrefillStats", "decode_stats", "parse_batch_fields", "prefill_stats"]


class Engine(str, Enum):
    """The serving engine that wrote a log."""

    SGLANG = "sglang"
    VLLM = "vllm"


@dataclass(frozen=True)
class DecodeStats:
    """The numbers of one decode-stats line (``None`` where the line lacks or cuts a field)."""

    running: int | None = None
    tokens: int | None = None
    token_usage: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    cuda_graph: bool | None = None
    gen_throughput: float | None = None
    queue: int | None = None


@dataclass(frozen=True)
class PrefillStats:
    """The numbers of one prefill-stats line."""

    new_seq: int | None = None
    new_tokens: int | None = None
    cached_tokens: int | None = None
    token_usage: float | None = None
    running: int | None = None
    queue: int | None = None
    input_throughput: float | None = None
    cuda_graph: bool | None = None


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    text = text.strip().rstrip(",%")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    v = _num(text)
    return int(v) if v is not None else None


def parse_batch_fields(msg: str, start: str) -> dict[str, str]:
    """``key: value`` pairs of a batch-stats line from ``start`` on (robust to added/removed fields)."""
    i = msg.find(start)
    if i < 0:
        return {}
    out: dict[str, str] = {}
    for part in msg[i:].split(", "):
        key, sep, value = part.partition(": ")
        if sep:
            out[key] = value
    return out


def _graph_flag(fields: dict[str, str]) -> bool | None:
    for key in ("cuda graph", "cpu graph", "npu graph", "musa graph"):
        v = fields.get(key)
        if v is not None:
            v = v.strip()
            return True if v.startswith("True") else False if v.startswith("False") else None
    return None


def decode_stats(text: str, engine: Engine | None = Engine.SGLANG) -> DecodeStats:
    """Decode stats of one line (SGLang ``Decode batch`` or vLLM ``Avg generation throughput``)."""
    if engine is Engine.VLLM or "Avg generation throughput" in text:
        m = P.VLLM_STATS.search(text)
        if not m:
            return DecodeStats()
        usage = m.group(4)
        return DecodeStats(
            gen_throughput=float(m.group(1)),
            running=int(m.group(2)),
            queue=int(m.group(3)),
            token_usage=float(usage) / 100 if usage else None,
        )
    f = parse_batch_fields(text, "#running-req")
    return DecodeStats(
        running=_int(f.get("#running-req")),
        tokens=_int(f.get("#token", f.get("#full token"))),
        token_usage=_num(f.get("token usage", f.get("full token usage"))),
        accept_len=_num(f.get("accept len")),
        accept_rate=_num(f.get("accept rate")),
        cuda_graph=_graph_flag(f),
        gen_throughput=_num(f.get("gen throughput (token/s)")),
        queue=_int(f.get("#queue-req")),
    )


def prefill_stats(text: str) -> PrefillStats:
    """Prefill stats of one SGLang ``Prefill batch`` line."""
    f = parse_batch_fields(text, "#new-seq")
    return PrefillStats(
        new_seq=_int(f.get("#new-seq")),
        new_tokens=_int(f.get("#new-token")),
        cached_tokens=_int(f.get("#cached-token")),
        token_usage=_num(f.get("token usage", f.get("full token usage"))),
        running=_int(f.get("#running-req")),
        queue=_int(f.get("#queue-req")),
        input_throughput=_num(f.get("input throughput (token/s)")),
        cuda_graph=_graph_flag(f),
    )
