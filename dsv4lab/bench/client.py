"""The built-in client: one streamed request to an OpenAI or SGLang endpoint, turned into a RequestRecord.

Three APIs, one record: ``completions`` (``/v1/completions``), ``chat`` (``/v1/chat/completions``) and
``generate`` (SGLang's native ``/generate``, whose ``text`` and ``meta_info.completion_tokens`` are
cumulative). OpenAI requests ask for ``stream_options.include_usage`` so the output token count is the
server's; when a server sends no usage, the count falls back to the number of text-bearing chunks (exact
for servers that stream one token per chunk, an undercount for servers that group tokens — the record
says which was used) and the prompt count to the workload's target length.

Everything after the HTTP head runs inside the connection's read callback (see :mod:`.httpstream`), so a
chunk's timestamp is the moment its bytes reached Python.

**Where a request's clock starts** (``ClientOptions.ttft_clock``), which TTFT and E2E depend on:

* ``send`` (the default): when the request's bytes are written to a connection that is already open; the
  body was encoded beforehand. TTFT is then the server's time plus the network, nothing of the client's.
* ``connect``: measured the way SGLang's ``bench_serving`` measures, to compare with its published figures.
  Each request opens its own aiohttp session; the clock starts before aiohttp encodes the JSON body and
  opens the connection, and a chunk's time is taken when the request's task reads its line. TTFT then holds
  connection setup, encoding and the client's own scheduling delays — small at concurrency 1, tens of ms
  at 64 streams on a loaded core (``benchmarks/client_capacity.py`` measures it) — exactly as
  ``bench_serving``'s does. Over an SSH tunnel the connection setup is a round trip to the host.
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from dsv4lab.bench.httpstream import ConnectionPool, Endpoint, HTTPStreamError, build_post
from dsv4lab.bench.metrics import RequestRecord, Status
from dsv4lab.bench.sse import SSEParser
from dsv4lab.bench.workload import RequestSpec
from dsv4lab.errors import BenchError, unknown_name_message

__all__ = [
    "API",
    "ENDPOINTS",
    "ClientOptions",
    "ITLUnit",
    "SessionRequest",
    "StampedChunks",
    "TTFTClock",
    "prepare",
    "prepare_session",
    "request_body",
    "send_request",
]

#: The endpoint a benchmark speaks: OpenAI completions or chat, or SGLang's native ``/generate``.
API = Literal["completions", "chat", "generate"]
#: Where a request's clock starts: ``send`` (its bytes written on an open connection: the server's TTFT) or
#: ``connect`` (before encoding and connecting, as ``bench_serving`` counts it).
TTFTClock = Literal["send", "connect"]
#: One inter-token latency per chunk gap (``chunk``), or each gap split over the chunk's tokens (``token``).
ITLUnit = Literal["chunk", "token"]
#: Which streamed chunks get a timestamp (TTFT's first, ITL's gaps): ``text``, those that carry text (SGLang's
#: ``bench_serving``), or ``choice``, every chunk with a choice, text or not (``vllm bench serve``).
StampedChunks = Literal["text", "choice"]

#: The path each :data:`API` posts to.
ENDPOINTS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "generate": "/generate",
}

#: json's C scanner without the Python-level ``loads``/``decode`` wrappers (two regex passes per call): one
#: event per token makes this the client's hottest call. Raises StopIteration on a non-JSON start.
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]

#: How much of an error response body is kept for the message.
_ERROR_BODY_BYTES = 2000


@dataclass(frozen=True)
class ClientOptions:
    """How requests are sent, and which definitions the timings follow.

    Every timeout is explicit: a benchmark must never hang on a dead server. ``ttft_clock`` says where a
    request's clock starts (see the module docstring); ``itl_unit`` whether an inter-token gap is one per chunk
    (``chunk``, the default) or each chunk's gap split evenly over the tokens it carries (``token``, what
    ``bench_serving`` does on ``/generate``, where the server says how many tokens a chunk holds; on the
    OpenAI APIs a chunk's token count is unknown and both definitions give chunk gaps). ``stamp_chunks``
    which chunks count: ``text`` (the default, as SGLang's ``bench_serving``) only those with text, ``choice``
    every chunk with a choice, as ``vllm bench serve`` — a token that decodes to nothing yet (part of a UTF-8
    character, frequent with random byte-level tokens) still arrived, and a gap measured across it is two
    tokens long. ``stream=False``
    asks for one response body: TTFT then equals E2E, as in ``bench_serving --disable-stream``.
    ``headers`` and ``api_key`` are sent but never stored with results.
    """

    api: API = "completions"
    model: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    api_key: str | None = None
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    record_text: bool = False
    top_p: float | None = None
    stream: bool = True
    ttft_clock: TTFTClock = "send"
    itl_unit: ITLUnit = "chunk"
    stamp_chunks: StampedChunks = "text"

    def __post_init__(self) -> None:
        if self.api not in ENDPOINTS:
            raise BenchError(unknown_name_message("api", self.api, ENDPOINTS))
        if not (self.request_timeout_s > 0 and self.connect_timeout_s > 0):
            raise BenchError("request_timeout_s and connect_timeout_s must be > 0")
        if self.ttft_clock not in ("send", "connect"):
            raise BenchError(f"ttft_clock must be 'send' or 'connect', got {self.ttft_clock!r}")
        if self.itl_unit not in ("chunk", "token"):
            raise BenchError(f"itl_unit must be 'chunk' or 'token', got {self.itl_unit!r}")
        if self.stamp_chunks not in ("text", "choice"):
            raise BenchError(f"stamp_chunks must be 'text' or 'choice', got {self.stamp_chunks!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise BenchError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise BenchError(f"top_p must be in (0, 1], got {self.top_p}")
        for name, value in self.headers.items():
            if not name or any(c in name for c in ":\r\n ") or any(c in str(value) for c in "\r\n"):
                raise BenchError(f"header {name!r} is not a valid HTTP header name/value")
        object.__setattr__(self, "extra_body", dict(self.extra_body))
        object.__setattr__(self, "headers", dict(self.headers))

    def to_dict(self) -> dict[str, Any]:
        """Provenance: everything that shapes the numbers; header values and the API key are left out."""
        return {
            "api": self.api,
            "model": self.model,
            "ignore_eos": self.ignore_eos,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "extra_body": dict(self.extra_body),
            "header_names": sorted(self.headers),
            "api_key_set": self.api_key is not None,
            "request_timeout_s": self.request_timeout_s,
            "connect_timeout_s": self.connect_timeout_s,
            "ttft_clock": self.ttft_clock,
            "itl_unit": self.itl_unit,
            "stamp_chunks": self.stamp_chunks,
        }


def request_body(spec: RequestSpec, options: ClientOptions, model: str | None) -> dict[str, Any]:
    """The JSON body for ``spec`` on the chosen API (``extra_body`` is merged last, so it can override)."""
    if options.api == "generate":
        sampling: dict[str, Any] = {"max_new_tokens": spec.output_len, "temperature": options.temperature}
        if options.ignore_eos:
            sampling["ignore_eos"] = True
        if options.top_p is not None:
            sampling["top_p"] = options.top_p
        body: dict[str, Any] = {"sampling_params": sampling, "stream": options.stream}
        if spec.input_ids is not None:
            body["input_ids"] = list(spec.input_ids)
        else:
            body["text"] = spec.prompt
    else:
        body = {"max_tokens": spec.output_len, "temperature": options.temperature, "stream": options.stream}
        if options.stream:
            body["stream_options"] = {"include_usage": True}
        if options.top_p is not None:
            body["top_p"] = options.top_p
        if model is not None:
            body["model"] = model
        if options.ignore_eos:
            body["ignore_eos"] = True
        if options.api == "chat":
            if spec.input_ids is not None:
                raise BenchError("the chat API needs text prompts; build the workload without token_ids")
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = list(spec.input_ids) if spec.input_ids is not None else spec.prompt
    body.update(options.extra_body)
    return body


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    if err is None and isinstance(obj, dict) and isinstance(obj.get("message"), str):
        return str(obj["message"])  # SGLang's {"object": "error", "message": ...}
    return str(err if err is not None else obj)


def _error_code(obj: Any) -> int | None:
    """The HTTP status an error object names (vLLM streams a refused request as HTTP 200 and then an
    error event whose ``code`` is the status it would have answered with)."""
    err = obj.get("error") if isinstance(obj, dict) else None
    code = err.get("code") if isinstance(err, dict) else obj.get("code") if isinstance(obj, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code < 600:
        return code
    return None


def http_error(status: int, body: bytes) -> str:
    """``HTTP 404: The model `x` does not exist.``: the status and the message of an error body (OpenAI's
    ``{"error": {"message"}}``, FastAPI's ``{"detail"}``, SGLang's ``{"message"}``), else the body's text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        detail = obj.get("detail")
        if obj.get("error") is not None or isinstance(obj.get("message"), str):
            text = _error_text(obj)
        elif isinstance(detail, str):
            text = detail
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


class _Collector:
    """The sink of one streamed response: timestamps the chunks ``stamp_chunks`` names and reads usage."""

    __slots__ = (
        "api",
        "chunk_times",
        "chunk_tokens",
        "completion_tokens",
        "done",
        "ended",
        "err_body",
        "error",
        "error_code",
        "gen_text_len",
        "gen_tokens",
        "is_sse",
        "parser",
        "prompt_tokens",
        "stamp",
        "stamp_every_choice",
        "stamps",
        "status",
        "text_parts",
        "twin_arrival",
    )

    def __init__(self, api: str, record_text: bool, stamp_chunks: str = "text") -> None:
        self.api = api
        self.stamp_every_choice = stamp_chunks == "choice"
        self.parser = SSEParser()
        self.status = 0
        self.is_sse = True
        self.err_body = bytearray()
        self.chunk_times: list[float] = []
        self.chunk_tokens: list[int] | None = [] if api == "generate" else None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.done = False
        self.ended = False
        self.error = ""
        self.error_code: int | None = None
        self.text_parts: list[str] | None = [] if record_text else None
        self.gen_tokens = 0
        self.gen_text_len = 0
        #: The twin's modelled stamps: of each timestamped chunk, and of the request's arrival.
        self.stamps: list[float] = []
        self.stamp: float | None = None
        self.twin_arrival: float | None = None

    def _chunk(self, t: float) -> None:
        """A chunk that counts arrived at ``t`` (this machine's clock), stamped ``self.stamp`` by a twin."""
        self.chunk_times.append(t)
        if self.stamp is not None:
            self.stamps.append(self.stamp)

    def on_head(self, status: int, headers: Mapping[str, str], t: float) -> None:
        self.status = status
        self.is_sse = "text/event-stream" in headers.get("content-type", "")

    def on_body(self, data: bytes, t: float) -> None:
        if self.status >= 300 or not self.is_sse:
            if len(self.err_body) < (1 << 24):
                self.err_body += data
            return
        for event in self.parser.feed_data(data):
            self._event(event, t)

    def on_end(self, t: float) -> None:
        self.ended = True
        if self.status >= 300:
            return
        if not self.is_sse:  # a server that ignored "stream": one JSON body, one chunk at its end
            self._event(self.err_body.decode("utf-8", "replace"), t)
            self.done = self.done or not self.error
            return
        for ev in self.parser.close():
            self._event(ev.data, t)  # not the hot path

    def _event(self, data: str, t: float) -> None:
        if data == "[DONE]":
            self.done = True
            return
        try:
            obj, end = _scan(data, 0)
            if end != len(data) and data[end:].strip():
                raise ValueError("extra data")
        except (StopIteration, ValueError):
            self.error = f"unreadable event: {data[:200]!r}"
            return
        if not isinstance(obj, dict):
            return
        stamp = obj.get("twin_t")
        self.stamp = float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else None
        arrival = obj.get("twin_arrival")
        if isinstance(arrival, (int, float)) and not isinstance(arrival, bool):
            self.twin_arrival = float(arrival)
        if obj.get("error") is not None or obj.get("object") == "error":
            self.error_code = _error_code(obj)
            message = _error_text(obj)
            self.error = f"HTTP {self.error_code} (in the stream): {message}" if self.error_code else message
            return
        if self.api == "generate":
            self._generate(obj, t)
            return
        choices = obj.get("choices")
        if choices:
            c0 = choices[0]
            if self.api == "chat":
                delta = c0.get("delta") or c0.get("message") or {}
                text = delta.get("content") or delta.get("reasoning_content")
            else:
                text = c0.get("text")
            if text or self.stamp_every_choice:
                self._chunk(t)
            if text and self.text_parts is not None:
                self.text_parts.append(text)
        usage = obj.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)

    def _generate(self, obj: dict[str, Any], t: float) -> None:
        meta = obj.get("meta_info") or {}
        text = obj.get("text") or ""
        tokens = meta.get("completion_tokens")
        if isinstance(tokens, int):
            new = tokens - self.gen_tokens
            if new > 0:
                self._chunk(t)
                assert self.chunk_tokens is not None
                self.chunk_tokens.append(new)
                self.gen_tokens = tokens
            self.completion_tokens = tokens
        elif len(text) > self.gen_text_len:
            self._chunk(t)
        if self.text_parts is not None and len(text) > self.gen_text_len:
            self.text_parts.append(text[self.gen_text_len :])
        self.gen_text_len = max(self.gen_text_len, len(text))
        if isinstance(meta.get("prompt_tokens"), int):
            self.prompt_tokens = meta["prompt_tokens"]
        if meta.get("finish_reason") is not None and self.api == "generate":
            reason = meta["finish_reason"]
            if isinstance(reason, dict) and reason.get("type") == "abort":
                self.error = f"request aborted by the server: {reason.get('message', reason)}"


def _record(
    c: _Collector,
    spec: RequestSpec,
    scheduled_s: float,
    start: float,
    origin: float,
    failure: str,
) -> RequestRecord:
    times = tuple(x - start for x in c.chunk_times)
    start_s, end_s = start - origin, time.perf_counter() - start
    if c.twin_arrival is not None and c.stamps and len(c.stamps) == len(c.chunk_times):
        # A twin said when each chunk was produced and when the request arrived, on its modelled clock: the
        # figures are those, never this machine's reading of them (which holds the host's own stalls).
        times = tuple(x - c.twin_arrival for x in c.stamps)
        start_s, end_s = c.twin_arrival, times[-1]
    status: Status = "ok"
    error = ""
    if failure:
        status, error = ("incomplete" if times else "failed"), failure
    elif c.status >= 300:
        status = "failed"
        error = http_error(c.status, bytes(c.err_body[:_ERROR_BODY_BYTES]))
    elif c.error:
        status, error = "failed", c.error
    elif not c.done:
        status, error = ("incomplete" if times else "failed"), "the stream ended without [DONE]"
    elif not times:
        status, error = "failed", "the server returned no generated text"
    out_from_server = c.completion_tokens is not None
    prompt_from_server = c.prompt_tokens is not None
    return RequestRecord(
        index=spec.index,
        status=status,
        scheduled_s=scheduled_s,
        start_s=start_s,
        ttft_s=times[0] if times else None,
        e2e_s=times[-1] if times else None,
        end_s=end_s,
        chunk_times_s=times,
        chunk_tokens=tuple(c.chunk_tokens) if c.chunk_tokens is not None and c.chunk_tokens else None,
        prompt_tokens=int(c.prompt_tokens) if c.prompt_tokens is not None else spec.prompt_len,
        output_tokens=int(c.completion_tokens) if c.completion_tokens is not None else len(times),
        prompt_tokens_from_server=prompt_from_server,
        output_tokens_from_server=out_from_server,
        error=error,
        http_status=(c.error_code if c.error and c.error_code else c.status) or None,
        text="".join(c.text_parts) if c.text_parts is not None else None,
    )


def _headers(options: ClientOptions, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    headers = dict(options.headers)
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    headers.update(extra or {})
    return headers


def prepare(
    endpoint: Endpoint,
    spec: RequestSpec,
    options: ClientOptions,
    model: str | None,
    extra_headers: Mapping[str, str] | None = None,
) -> bytes:
    """The request bytes, built before the clock starts (``ttft_clock="send"``: JSON encoding is not the
    server's time). ``extra_headers``: the twin session's, which place the request in its run."""
    body = json.dumps(request_body(spec, options, model), separators=(",", ":")).encode()
    return build_post(endpoint, ENDPOINTS[options.api], body, _headers(options, extra_headers))


@dataclass(frozen=True)
class SessionRequest:
    """A request to send as ``bench_serving`` does (``ttft_clock="connect"``): the body as a dict, encoded
    by aiohttp once the clock runs, on a session of its own."""

    url: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]


def prepare_session(
    endpoint: Endpoint,
    spec: RequestSpec,
    options: ClientOptions,
    model: str | None,
    extra_headers: Mapping[str, str] | None = None,
) -> SessionRequest:
    """The :class:`SessionRequest` for ``spec`` (``bench_serving`` builds its payload dict before its clock too)."""
    body = request_body(spec, options, model)
    return SessionRequest(endpoint.url + ENDPOINTS[options.api], body, _headers(options, extra_headers))


#: aiohttp's read buffer for session requests: bench_serving raises it from 64 KiB to 10 MiB, because a
#: full buffer stalls long streams (vLLM #39963); the same here, so both clients read alike.
_READ_BUFSIZE = 10 * 1024**2


def _session(options: ClientOptions) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=options.request_timeout_s, connect=options.connect_timeout_s)
    return aiohttp.ClientSession(timeout=timeout, read_bufsize=_READ_BUFSIZE)


async def _send_session(session: aiohttp.ClientSession, req: SessionRequest, collector: _Collector) -> None:
    """One request on its own aiohttp session, line by line; times are taken when the task reads a line."""
    async with session.post(req.url, json=dict(req.body), headers=dict(req.headers)) as resp:
        collector.on_head(resp.status, {k.lower(): v for k, v in resp.headers.items()}, time.perf_counter())
        async for line in resp.content:
            collector.on_body(line, time.perf_counter())
        collector.on_end(time.perf_counter())


async def send_request(
    pool: ConnectionPool,
    spec: RequestSpec,
    request: bytes | SessionRequest,
    options: ClientOptions,
    *,
    scheduled_s: float,
    origin: float,
    on_connection_error: Callable[[BaseException], None] | None = None,
) -> RequestRecord:
    """Send one request and return what was seen; never raises for a server-side failure.

    ``request`` is the prepared bytes (sent on ``pool``, clock from the send) or a :class:`SessionRequest`
    (sent on a session of its own, created just before the clock starts — bench_serving's order — so the
    clock holds encoding and connecting).
    """
    collector = _Collector(options.api, options.record_text, options.stamp_chunks)
    session = _session(options) if isinstance(request, SessionRequest) else None
    start = time.perf_counter()
    failure = ""
    try:
        if isinstance(request, SessionRequest):
            assert session is not None
            await _send_session(session, request, collector)
        else:
            await pool.request(request, collector, timeout_s=options.request_timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        failure = f"no complete response within {options.request_timeout_s:g} s"
    except HTTPStreamError as exc:
        failure = f"bad HTTP response: {exc}"
    except (ConnectionError, OSError, aiohttp.ClientError) as exc:
        failure = f"connection error: {exc or type(exc).__name__}"
        if on_connection_error is not None:
            on_connection_error(exc)
    finally:
        if session is not None:
            await session.close()
    return _record(collector, spec, scheduled_s, start, origin, failure)
