"""Fuzzing the parsers that read what other programs wrote: server logs and SSE streams.

A log can be anything a crashing process left behind (half a line, a tqdm bar, a core dump passed by
mistake), and an SSE stream is whatever bytes the network delivers, cut anywhere. The properties: no
exception other than the documented :class:`~dsv4lab.errors.LogError` (for a log that is not text), a
bounded time per input, and for SSE the same events however the bytes are cut.

The runs are short in ``make test`` (a few seconds each). For a longer run:
``DSV4LAB_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/test_fuzz.py`` (hypothesis keeps failing inputs in
``.hypothesis/`` and replays them first on the next run).
"""

from __future__ import annotations

import os
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4lab.bench.sse import SSEEvent, SSEParser
from dsv4lab.errors import LogError
from dsv4lab.logs import Diagnosis, LogParser, classify_line, diagnose, parse_log
from dsv4lab.model.diagnosis import diagnose_with_model
from dsv4lab.secrets import redact_text

EXAMPLES = int(os.environ.get("DSV4LAB_FUZZ_EXAMPLES", "120"))
#: Per input, far above what any of these takes (a few ms): a regex gone quadratic shows up as a failure.
BOUND_S = 2.0

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # timed explicitly below, so a loaded CI machine does not flake on hypothesis' 200 ms
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)

# Pieces of real SGLang / vLLM lines, so random input reaches the parser's deeper branches, not only "unknown".
_PIECES = [
    "[2026-05-16 12:01:32] ",
    "[2026-05-16 12:01:32 TP0] ",
    "[2026-05-16 12:01:32 DP1 TP7 EP3] ",
    "(APIServer pid=1) INFO 12-31 14:55:25 [launcher.py:1] ",
    "INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
    "Load weight begin. avail mem=94.24 GB",
    "Load weight end. type=DeepseekV4ForCausalLM, dtype=torch.bfloat16, avail mem=75.54 GB, mem usage=18.70 GB.",
    "KV Cache is allocated. #tokens: 6237623, KV size: 47.27 GB",
    "Memory pool end. avail mem=28.27 GB",
    "Capture cuda graph begin. This can take up to several minutes. avail mem=28.27 GB",
    "Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]",
    "Capturing batches (bs=256 avail_mem=9.41 GB):  37%|███▋      | 13/35 [00:04<00:07,  2.95it/s]",
    "Capture cuda graph end. Time elapsed: 12.34 s. mem usage=19.42 GB. avail mem=8.85 GB.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 1 has a total capacity of 95.59 GiB"
    " of which 148.00 MiB is free.",
    "Traceback (most recent call last):",
    '  File "/sgl/python/sglang/srt/model_executor/cuda_graph_runner.py", line 312, in capture',
    "RuntimeError: Capture cuda graph failed: ",
    "Exception: Capture cuda graph failed",
    "Received sigquit from a child process. It usually means the child failed.",
    "Killed",
    "Decode batch. #running-req: 16, #token: 8000, token usage: 0.01, accept len: 1.71, gen throughput (token/s): 23.1",
    "Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.00",
    "The server is fired up and ready to roll!",
    "server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V4-Flash', tp_size=8, mem_fraction_static=0.7, ",
    "api_key='hf_abcdefghijklmn')",
    "Using config file N=7168,K=2048,device_name=NVIDIA_RTX_PRO_6000,dtype=fp8_w8a8,block_shape=[128, 128].json",
    "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use",
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error",
    "Not enough memory. Please try to increase --mem-fraction-static.",
    "gpu_id=1",
    "=" * 60,
    "\r",
    "\t",
    "\x1b[31m",
    "\x1b[0m",
    " ",
    ": ",
    "GiB",
    "%|",
    "é世🙂",
    "\ufeff",
    "\u2028",
]

_text = st.text(st.characters(codec="utf-8"), max_size=80)
_line = st.lists(st.one_of(st.sampled_from(_PIECES), _text), max_size=8).map("".join)
_lines = st.lists(_line, max_size=60)
_bytes_lines = st.lists(st.binary(max_size=120), max_size=40)


def _timed(fn: object, *args: object) -> object:
    start = time.monotonic()
    result = fn(*args)  # type: ignore[operator]
    assert time.monotonic() - start < BOUND_S, f"{getattr(fn, '__name__', fn)} took too long"
    return result


@FUZZ
@given(_lines)
def test_text_logs_never_raise(lines: list[str]) -> None:
    refusal = "binary"
    try:
        _timed(lambda ls: list(parse_log(ls)), lines)
    except LogError as exc:  # documented: NUL bytes in the first lines mean "not a text log"
        refusal = str(exc)
    assert "binary" in refusal
    d = _timed(diagnose, lines)
    assert isinstance(d, Diagnosis) and 0.0 <= d.confidence <= 1.0
    for line in lines:
        classify_line(line)


@FUZZ
@given(_lines)
def test_the_streaming_parser_takes_any_line(lines: list[str]) -> None:
    """What the watcher does: one line at a time, as they arrive, lines split at \\r as tqdm writes them."""
    parser = LogParser()
    start = time.monotonic()
    for raw in lines:
        parser.feed(raw)
    assert time.monotonic() - start < BOUND_S


@FUZZ
@given(_bytes_lines)
def test_byte_logs_parse_or_say_they_are_binary(lines: list[bytes]) -> None:
    refusal = "binary"
    try:
        _timed(lambda ls: list(parse_log(ls)), lines)
    except LogError as exc:
        refusal = str(exc)
    assert "binary" in refusal  # the one documented refusal
    d = _timed(diagnose, lines)  # diagnose turns an unreadable log into an UNKNOWN verdict, never an exception
    assert isinstance(d, Diagnosis)


@settings(max_examples=max(10, EXAMPLES // 6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_lines)
def test_diagnosis_with_the_memory_model_never_raises(lines: list[str]) -> None:
    d = _timed(diagnose_with_model, lines)
    assert isinstance(d, Diagnosis)


@FUZZ
@given(_text)
def test_redaction_takes_any_text(text: str) -> None:
    """Every log line a report or a copy shows goes through redaction: it must take anything, quickly."""
    out = _timed(redact_text, text, ("hf_secretvalue123",))
    assert isinstance(out, str) and "hf_secretvalue123" not in out


# -- SSE ---------------------------------------------------------------------------------------------------------

_SSE_PIECES = [
    b"data: ",
    b"data:",
    b"event: update",
    b"id: 7",
    b": keep-alive",
    b"retry: 10",
    b'{"text": "h\xc3\xa9llo"}',
    b"[DONE]",
    b"\n",
    b"\r\n",
    b"\r",
    b"\n\n",
    b"\xe4\xb8\x96",
    b"\xff\xfe",
    b"\x00",
    b" ",
]
_sse_stream = st.lists(st.one_of(st.sampled_from(_SSE_PIECES), st.binary(max_size=30)), max_size=60).map(b"".join)


def _events(data: bytes, cuts: list[int]) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    last = 0
    for c in [*sorted(cuts), len(data)]:
        out += p.feed(data[last:c])
        last = c
    return out + p.close()


@FUZZ
@given(_sse_stream, st.lists(st.integers(0, 2000), max_size=20))
def test_sse_events_do_not_depend_on_where_the_network_cut(data: bytes, cuts: list[int]) -> None:
    cuts = [c % (len(data) + 1) for c in cuts]
    whole = _timed(_events, data, [])
    assert _timed(_events, data, cuts) == whole
    assert _events(data, list(range(len(data)))) == whole  # one byte at a time
    data_only = SSEParser()
    got: list[str] = []
    last = 0
    for c in [*sorted(cuts), len(data)]:
        got += data_only.feed_data(data[last:c])
        last = c
    assert got == [e.data for e in whole][: len(got)]


@settings(max_examples=max(5, EXAMPLES // 20), deadline=None)
@given(st.integers(1, 4))
def test_a_large_event_is_parsed_in_linear_time(megabytes: int) -> None:
    """Megabytes of one event, fed in 1 KiB reads: the parser must not rescan what it already holds."""
    payload = b"data: " + b"x" * (megabytes << 20) + b"\n\n"
    p = SSEParser()
    start = time.monotonic()
    events: list[SSEEvent] = []
    for i in range(0, len(payload), 1024):
        events += p.feed(payload[i : i + 1024])
    assert time.monotonic() - start < BOUND_S * megabytes
    assert len(events) == 1 and len(events[0].data) == megabytes << 20
