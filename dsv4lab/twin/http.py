"""The twin's HTTP server: SGLang's native and OpenAI endpoints, health, info, metrics and profiling.

Served by aiohttp in the main process, with uvicorn-style access-log lines. ``/health`` answers 503 until
warmup is done (like SGLang's Starting state) and then runs a 1-token generation when idle; info endpoints
exist under the emulated release's names (old ``/get_*`` names everywhere, new ones from 0.5.16, where
the old ones log a deprecation warning). ``/server_info`` says that this is a twin and on which clock.

Every streamed chunk and every response carries the modelled moment it stands for: ``twin_t`` (when its
tokens were produced) and ``twin_arrival`` (when the request arrived), in seconds from the start of the
request's session (``POST /twin/sessions``: a client announcing a run, see :mod:`.sessions`; the headers
``X-Twin-Session`` and ``X-Twin-Seq`` put a request in it), or of the twin's timeline without one. JSON
clients ignore keys they do not know; the lab's client reads its figures from them.
"""

from __future__ import annotations

import asyncio
import functools
import http
import json
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from dsv4lab.config.versions import SGLangRelease
from dsv4lab.twin.logfmt import LogWriter
from dsv4lab.twin.profiler import Profiler
from dsv4lab.twin.scheduler import Request, Scheduler, Token
from dsv4lab.twin.sessions import Session, SessionError

__all__ = ["ServerState", "build_app", "build_dummy_health_app", "count_tokens"]

_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORDS = (" the", " model", " answers", " with", " a", " steady", " stream", " of", " tokens", " from", " twin", ".")
HEALTH_TIMEOUT_S = 20.0
_FLUSH_NOTE = "(When there are running or waiting requests, the operation will not be performed.)\n"


def count_tokens(text: str) -> int:
    """The tokenizer stand-in: one token per word or punctuation mark (at least one)."""
    return max(1, len(_TOKEN.findall(text)))


_WORDS_JSON = tuple(json.dumps(w) for w in _WORDS)


def token_text(start: int, n: int) -> str:
    return "".join(_WORDS[(start + i) % len(_WORDS)] for i in range(n))


def token_json(start: int, n: int) -> str:
    """``json.dumps(token_text(start, n))`` without the encoder on the common one-token path."""
    if n == 1:
        return _WORDS_JSON[start % len(_WORDS)]
    return json.dumps(token_text(start, n))


@dataclass
class ServerState:
    """What the endpoints read: the resolved server args, the scheduler, readiness, twin facts."""

    release: SGLangRelease
    scheduler: Scheduler
    profiler: Profiler
    log: LogWriter
    model_path: str
    served_model_name: str
    context_len: int
    max_total_num_tokens: int
    server_args: Mapping[str, Any]
    memory_usage: Mapping[str, Any]
    twin: Mapping[str, Any]
    architecture: str
    enable_metrics: bool
    api_key: str | None
    ready: bool = False
    started_at: float = field(default_factory=time.time)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


def _error(message: str, status: int = 400) -> web.Response:
    phrase = http.HTTPStatus(status).phrase.replace(" ", "")
    return _json(
        {"object": "error", "message": message, "type": f"{phrase}Error", "param": None, "code": status}, status
    )


_Handler = Callable[[ServerState, web.Request], Awaitable[web.StreamResponse]]
_Release = tuple[int, int, int]

#: aiohttp's ``add_get`` answers HEAD too; SGLang's GET-or-POST actions (flush, profiling) answer GET and POST only.
_READ = ("HEAD", "GET")
_ACTION = ("GET", "POST")
_POST = ("POST",)
_NEW_NAMES: _Release = (0, 5, 16)  # /model_info and /server_info; the old /get_* names log a deprecation
_V0_5_23: _Release = (0, 5, 23)
#: Answered without the API key (what load balancers and Prometheus poll).
_OPEN_PATHS = ("/health", "/health_generate", "/ping", "/metrics")
#: The headers that put a request in an announced session, at its place in the session's schedule.
SESSION_HEADER = "X-Twin-Session"
SEQ_HEADER = "X-Twin-Seq"


@dataclass(frozen=True)
class _Route:
    """One row of the route table: the methods and path, its handler, and the releases that have it."""

    methods: tuple[str, ...]
    path: str
    handler: _Handler
    since: _Release | None = None
    before: _Release | None = None

    def served_by(self, release: SGLangRelease) -> bool:
        return (self.since is None or release.key >= self.since) and (self.before is None or release.key < self.before)


def build_app(state: ServerState) -> web.Application:
    """The emulated release's endpoints, registered from :data:`_ROUTES`, behind the access log / API key."""
    app = web.Application(middlewares=[_access_log(state)], client_max_size=64 * 1024**2)
    for route in _ROUTES:
        if route.served_by(state.release):
            for method in route.methods:
                app.router.add_route(method, route.path, functools.partial(route.handler, state))
    return app


def _access_log(state: ServerState) -> Middleware:
    """uvicorn's access line for every request; without the API key only the open paths answer."""

    @web.middleware
    async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
        authorized = request.headers.get("Authorization", "") == f"Bearer {state.api_key}"
        if state.api_key and request.path not in _OPEN_PATHS and not authorized:
            resp: web.StreamResponse = _json({"error": "Unauthorized"}, 401)
            _access(state.log, request, resp.status)
            return resp
        try:
            resp = await handler(request)
        except web.HTTPException as exc:
            _access(state.log, request, exc.status)
            raise
        _access(state.log, request, resp.status)
        return resp

    return access_log


# -- health and readiness ----------------------------------------------------------------------------------------


async def _health(state: ServerState, request: web.Request) -> web.Response:
    if not state.ready:
        return web.Response(status=503)
    if state.scheduler.busy:
        return web.Response(status=200)
    req = state.scheduler.submit(Request(prompt_tokens=1, max_new_tokens=1, rid=f"HEALTH_CHECK_{uuid.uuid4().hex}"))
    try:
        await asyncio.wait_for(_drain(req), timeout=HEALTH_TIMEOUT_S)
    except asyncio.TimeoutError:
        return web.Response(status=503)
    return web.Response(status=200)


async def _ready(state: ServerState, request: web.Request) -> web.Response:
    return web.Response(status=200 if state.ready else 503)


async def _ping(state: ServerState, request: web.Request) -> web.Response:
    return web.Response(text="pong")


# -- info --------------------------------------------------------------------------------------------------------


def _model_info_data(state: ServerState) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model_path": state.model_path,
        "tokenizer_path": state.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
    }
    if state.release.key >= _V0_5_23:
        data.update(
            served_model_name=state.served_model_name,
            load_format="auto",
            reasoning_parser=None,
            tool_call_parser=None,
            disaggregation_mode="null",
            has_image_understanding=False,
            has_audio_understanding=False,
            model_type="deepseek_v4",
            architectures=[state.architecture],
        )
    return data


def _server_info_data(state: ServerState) -> dict[str, Any]:
    s = state.scheduler
    internal: dict[str, Any] = {
        "last_gen_throughput": s.stats.last_gen_throughput,
        "memory_usage": dict(state.memory_usage),
    }
    if s.spec:
        internal["avg_spec_accept_length"] = s.stats.avg_spec_accept_length
    if state.release.key >= _V0_5_23:
        internal["effective_max_running_requests_per_dp"] = s.limits.max_running_requests
    data: dict[str, Any] = dict(state.server_args)
    data.update(
        max_total_num_tokens=state.max_total_num_tokens,
        max_req_input_len=state.context_len - 1,
        internal_states=[internal],
        version=state.release.version,
        twin={
            **state.twin,
            "now_s": s.base + s.now,
            "behind_s_max": round(s.stats.behind_s_max, 3),
            "sessions_dropped": s.stats.sessions_dropped,
        },
    )
    if state.release.key >= _V0_5_23:
        data.update(startup_time=state.started_at, frontend="http")
    return data


async def _model_info(state: ServerState, request: web.Request) -> web.Response:
    return _json(_model_info_data(state))


async def _server_info(state: ServerState, request: web.Request) -> web.Response:
    return _json(_server_info_data(state))


def _deprecated(data: Callable[[ServerState], dict[str, Any]], old: str, new: str) -> _Handler:
    """The old name of an info endpoint: the same answer, and SGLang's deprecation warning in the log."""

    async def handler(state: ServerState, request: web.Request) -> web.Response:
        state.log.log(f"The endpoint {old} is deprecated and will be removed in a future version. Use {new} instead.")
        return _json(data(state))

    return handler


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.served_model_name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "sglang",
        "root": state.served_model_name,
        "max_model_len": state.context_len,
    }


async def _models(state: ServerState, request: web.Request) -> web.Response:
    return _json({"object": "list", "data": [_model_card(state)]})


async def _one_model(state: ServerState, request: web.Request) -> web.Response:
    if request.match_info["model"] != state.served_model_name:
        return _error(f"The model `{request.match_info['model']}` does not exist.", 404)
    return _json(_model_card(state))


async def _metrics(state: ServerState, request: web.Request) -> web.Response:
    if not state.enable_metrics:
        return web.Response(status=404, text="Not Found")
    return web.Response(text=_metrics_text(state), content_type="text/plain", charset="utf-8")


# -- actions -----------------------------------------------------------------------------------------------------


async def _flush_cache(state: ServerState, request: web.Request) -> web.Response:
    # 0.5.23 takes ?timeout=S: wait up to S seconds for running and waiting requests to end (what
    # bench_serving --flush-cache asks for, 60 s); older releases, and timeout 0, refuse at once when busy.
    wait_s = _query_float(request, "timeout") if state.release.key >= _V0_5_23 else 0.0
    if wait_s is None:
        return _error("timeout must be a number >= 0", 422)
    deadline = time.monotonic() + wait_s
    while state.scheduler.busy and time.monotonic() < deadline:
        await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    if state.scheduler.busy:
        text = "Timed out waiting for idle state." if wait_s > 0 else "Cache not flushed. "
        return web.Response(
            status=400,
            text=text + ("\n" if wait_s > 0 else "Please check backend logs for more details. " + _FLUSH_NOTE),
        )
    return web.Response(text="Cache flushed.\nPlease check backend logs for more details. " + _FLUSH_NOTE)


async def _start_profile(state: ServerState, request: web.Request) -> web.Response:
    body = await _body(request)
    steps = body.get("num_steps")
    state.profiler.start(body.get("output_dir"), int(steps) if steps is not None else None)
    return web.Response(text="Start profiling.\n")


async def _stop_profile(state: ServerState, request: web.Request) -> web.Response:
    if not state.profiler.active:
        return web.Response(status=400, text="Profiling is not in progress. Call /start_profile first.\n")
    path = state.profiler.stop()
    state.log.log(f"Profiling done. Traces are saved to: {path.parent}")
    return web.Response(text=f"Stop profiling. This will take some time.\nTrace: {path}\n")


# -- generation --------------------------------------------------------------------------------------------------


def _native_prompt_tokens(body: Mapping[str, Any]) -> int:
    """/generate's prompt length: ``input_ids`` (one list or a batch's first) or the first ``text``."""
    if "input_ids" in body and body["input_ids"] is not None:
        ids = body["input_ids"]
        return len(ids[0]) if ids and isinstance(ids[0], list) else len(ids)
    text = body.get("text") or ""
    return count_tokens(text[0] if isinstance(text, list) and text else str(text))


def _native_meta(state: ServerState, req: Request, done: bool) -> dict[str, Any]:
    m: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": {"type": "length", "length": req.generated} if done else None,
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": req.generated,
        "cached_tokens": 0,
        "e2e_latency": (req.finished_at if req.finished_at is not None else state.scheduler.now) - req.created,
    }
    if state.scheduler.spec:
        m["spec_accept_length"] = req.spec_accept_length
        m["spec_verify_ct"] = req.verify_steps
    return m


async def _generate(state: ServerState, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    sp = body.get("sampling_params") or {}
    prompt = _native_prompt_tokens(body)
    max_new = int(sp.get("max_new_tokens", 128))
    bad = _check_len(state, prompt, max_new)
    if bad is not None:
        return _refused(state, request, bad)
    req = _submit(state, request, prompt, max_new)
    if isinstance(req, web.Response):
        return req
    if not body.get("stream"):
        t = await _drain(req)
        out = {"text": token_text(0, req.generated), "meta_info": _native_meta(state, req, True), "index": 0}
        return _json({**out, **_stamps(state, req, t)})
    resp = await _sse(request)
    try:
        generated = 0
        parts = []
        async for items in _events(req):
            for n, done, t in items:
                generated += n
                meta = _native_meta(state, req, done)
                meta["completion_tokens"] = generated
                chunk = {"text": token_text(0, generated), "meta_info": meta, "index": 0, **_stamps(state, req, t)}
                parts.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"".join(parts))
            parts.clear()
        await resp.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        state.scheduler.abort(req)
        raise
    return resp


async def _completions(state: ServerState, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    return await _openai(state, request, body, chat=False)


async def _chat(state: ServerState, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    return await _openai(state, request, body, chat=True)


async def _open_session(state: ServerState, request: web.Request) -> web.Response:
    body = await _body(request)
    try:
        session = state.scheduler.open_session(body.get("schedule") or [], body.get("cap"), body.get("key"))
    except SessionError as exc:
        return _error(str(exc))
    return _json({"id": session.sid, "clock": state.twin["clock"], "requests": len(session.schedule)})


async def _close_session(state: ServerState, request: web.Request) -> web.Response:
    if not state.scheduler.close_session(request.match_info["sid"]):
        return _error(f"no open session {request.match_info['sid']!r}", 404)
    return web.Response(status=204)


#: Every endpoint of every emulated release, in registration order; :func:`build_app` keeps the release's rows.
_ROUTES: tuple[_Route, ...] = (
    _Route(_READ, "/health", _health),
    _Route(_READ, "/health_generate", _health),
    _Route(_READ, "/ready", _ready, since=_V0_5_23),
    _Route(_READ, "/ping", _ping, since=_V0_5_23),
    _Route(_READ, "/model_info", _model_info, since=_NEW_NAMES),
    _Route(_READ, "/server_info", _server_info, since=_NEW_NAMES),
    _Route(_READ, "/get_model_info", _deprecated(_model_info_data, "/get_model_info", "/model_info"), since=_NEW_NAMES),
    _Route(
        _READ, "/get_server_info", _deprecated(_server_info_data, "/get_server_info", "/server_info"), since=_NEW_NAMES
    ),
    _Route(_READ, "/get_model_info", _model_info, before=_NEW_NAMES),
    _Route(_READ, "/get_server_info", _server_info, before=_NEW_NAMES),
    _Route(_READ, "/v1/models", _models),
    _Route(_READ, "/v1/models/{model:.+}", _one_model),
    _Route(_ACTION, "/flush_cache", _flush_cache),
    _Route(_READ, "/metrics", _metrics),
    _Route(_ACTION, "/start_profile", _start_profile),
    _Route(_ACTION, "/stop_profile", _stop_profile),
    _Route(_POST, "/generate", _generate),
    _Route(_POST, "/v1/completions", _completions),
    _Route(_POST, "/v1/chat/completions", _chat),
    _Route(_POST, "/twin/sessions", _open_session),
    _Route(("DELETE",), "/twin/sessions/{sid}", _close_session),
)


def _query_float(request: web.Request, name: str) -> float | None:
    """A non-negative number from the query string (0 when absent), None when it is not one."""
    raw = request.query.get(name, "0")
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _access(log: LogWriter, request: web.Request, status: int) -> None:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "127.0.0.1:0"
    phrase = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ else ""
    qs = f"?{request.query_string}" if request.query_string else ""
    log.uvicorn(
        f'{client} - "{request.method} {request.path}{qs} HTTP/{request.version.major}.{request.version.minor}" '
        f"{status} {phrase}"
    )


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(text="invalid JSON body") from None
    return data if isinstance(data, dict) else {}


async def _drain(req: Request) -> float:
    """Wait for the request's end; the modelled moment of its last token."""
    t = 0.0
    async for items in _events(req):
        t = items[-1][2]
    return t


async def _events(req: Request) -> AsyncIterator[list[Token]]:
    """The request's notifications, a batch per wake-up (each step's tokens stay a chunk of their own, with
    their own stamp: merging them would make the chunks depend on how fast the host ran the handlers)."""
    while True:
        items = await req.events.get_all()
        yield items
        if items[-1][1]:
            return


def _stamps(state: ServerState, req: Request, t: float) -> dict[str, float]:
    """The modelled moments a chunk carries: from its session's start, or on the twin's timeline."""
    origin = req.session.t0 if req.session is not None else -state.scheduler.base
    return {"twin_t": t - origin, "twin_arrival": req.created - origin}


def _submit(state: ServerState, request: web.Request, prompt: int, max_new: int) -> Request | web.Response:
    """Schedule a request, in its session when its headers name one."""
    s = state.scheduler
    found = _session_of(state, request)
    if isinstance(found, web.Response):
        return found
    req = Request(prompt_tokens=max(1, prompt), max_new_tokens=max(1, max_new))
    if found is None:
        return s.submit(req)
    session, seq = found
    s.submit_to(session, seq, req)
    return req


def _session_of(state: ServerState, request: web.Request) -> tuple[Session, int] | web.Response | None:
    sid = request.headers.get(SESSION_HEADER)
    if sid is None:
        return None
    session = state.scheduler.sessions.get(sid)
    raw = request.headers.get(SEQ_HEADER, "")
    if session is None:
        return _error(f"{SESSION_HEADER} {sid!r} names no open session (it ended, or was never opened)", 404)
    if not raw.isdigit() or int(raw) >= len(session.schedule) or int(raw) in session.received:
        return _error(
            f"{SEQ_HEADER} must be a request's place in the session's schedule, each sent once: 0 to "
            f"{len(session.schedule) - 1}, got {raw!r}"
        )
    return session, int(raw)


def _refused(state: ServerState, request: web.Request, response: web.Response) -> web.Response:
    """A session request answered with an error before it was scheduled: its slot frees at its arrival."""
    found = _session_of(state, request)
    if isinstance(found, tuple):
        state.scheduler.submit_to(found[0], found[1], None)
    return response


async def _sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


def _check_len(state: ServerState, prompt: int, max_new: int) -> web.Response | None:
    if prompt + max_new > state.context_len:
        return _error(
            f"Requested token count exceeds the model's maximum context length of {state.context_len} tokens. "
            f"You requested a total of {prompt + max_new} tokens: {prompt} tokens from the input messages and "
            f"{max_new} tokens for the completion. Please reduce the number of tokens in the input messages or "
            "the completion to fit within the limit."
        )
    return None


def _openai_lengths(body: Mapping[str, Any], *, chat: bool) -> tuple[int, int] | web.Response:
    """(prompt tokens, max new tokens) of an OpenAI request, or the 400 a malformed chat gets."""
    if chat:
        messages = body.get("messages") or []
        if not isinstance(messages, list) or not messages:
            return _error("messages must be a non-empty list")
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        prompt = count_tokens(text) + 4 * len(messages)  # chat template tokens per message
        return prompt, int(body.get("max_completion_tokens") or body.get("max_tokens") or 128)
    p = body.get("prompt", "")
    if isinstance(p, list) and p and isinstance(p[0], int):
        prompt = len(p)
    elif isinstance(p, list) and p and isinstance(p[0], list):
        prompt = len(p[0])
    elif isinstance(p, list):
        prompt = count_tokens(str(p[0]) if p else "")
    else:
        prompt = count_tokens(str(p))
    return prompt, int(body.get("max_tokens") or 16)


@dataclass(frozen=True)
class _Completion:
    """One OpenAI completion or chat completion in flight: its id, creation time and model, answered whole or
    streamed."""

    req: Request
    chat: bool
    model: str
    state: ServerState
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def rid(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.req.rid

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def usage(self) -> dict[str, Any]:
        req = self.req
        return {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": req.generated,
            "total_tokens": req.prompt_tokens + req.generated,
            "prompt_tokens_details": None,
        }

    def reply(self, t: float) -> web.Response:
        text = token_text(0, self.req.generated)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "matched_stop": None, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        else:
            choice["text"] = text
        return _json(
            {
                "id": self.rid,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": self.usage(),
                **_stamps(self.state, self.req, t),
            }
        )

    async def stream(self, resp: web.StreamResponse, *, include_usage: bool) -> None:
        """The chunks, written by hand around each token's JSON (the hot path of a benchmark)."""
        chat, rid, obj = self.chat, self.rid, self.chunk_object
        head = (
            f'{{"id":"{rid}","object":"{obj}","created":{self.created},"model":{json.dumps(self.model)},'
            '"choices":[{"index":0,'
        )
        if chat:
            await resp.write(
                (
                    "data: "
                    + head
                    + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
                ).encode()
            )
        prefix = "data: " + head + ('"delta":{"content":' if chat else '"text":')
        close = '},"logprobs":null,"finish_reason":' if chat else ',"logprobs":null,"finish_reason":'
        pos = 0
        req, state = self.req, self.state
        parts: list[str] = []
        async for items in _events(req):
            for n, done, t in items:
                piece = token_json(pos, n)
                pos += n
                stamps = _stamps(state, req, t)
                finish = '"length"}]' if done else "null}]"
                end = f',"twin_t":{stamps["twin_t"]!r},"twin_arrival":{stamps["twin_arrival"]!r}}}\n\n'
                parts.append(prefix + piece + close + finish + end)
            await resp.write("".join(parts).encode())
            parts.clear()
        if include_usage:
            tail = {
                "id": rid,
                "object": obj,
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.usage(),
            }
            await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")


async def _openai(state: ServerState, request: web.Request, body: dict[str, Any], *, chat: bool) -> web.StreamResponse:
    lengths = _openai_lengths(body, chat=chat)
    if isinstance(lengths, web.Response):
        return lengths
    prompt, max_new = lengths
    bad = _check_len(state, prompt, max_new)
    if bad is not None:
        return _refused(state, request, bad)
    req = _submit(state, request, prompt, max_new)
    if isinstance(req, web.Response):
        return req
    completion = _Completion(req, chat, state.served_model_name, state)
    if not body.get("stream"):
        t = await _drain(req)
        return completion.reply(t)
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    resp = await _sse(request)
    try:
        await completion.stream(resp, include_usage=include_usage)
    except (ConnectionResetError, asyncio.CancelledError):
        state.scheduler.abort(req)
        raise
    return resp


def _metrics_text(state: ServerState) -> str:
    s = state.scheduler
    labels = f'model_name="{state.served_model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    gauges = {
        "num_running_reqs": ("The number of running requests.", len(s.running)),
        "num_queue_reqs": ("The number of requests in the waiting queue.", len(s.waiting)),
        "num_used_tokens": ("The number of used tokens.", s.used_tokens),
        "token_usage": ("The token usage.", s.token_usage),
        "gen_throughput": ("The generation throughput (token/s).", s.stats.last_gen_throughput),
        "cache_hit_rate": ("The prefix cache hit rate.", 0.0),
        "spec_accept_length": (
            "The average acceptance length of speculative decoding.",
            s.stats.avg_spec_accept_length,
        ),
        "is_cuda_graph": ("Whether the batch is using CUDA graph.", 1.0 if s.stats.last_cuda_graph else 0.0),
        "utilization": ("The utilization.", 1.0 if s.busy else 0.0),
    }
    twin_now = s.base + s.now
    counters = {
        "prompt_tokens_total": ("Number of prefill tokens processed.", s.stats.prompt_tokens_total),
        "generation_tokens_total": ("Number of generation tokens processed.", s.stats.generation_tokens_total),
        "cached_tokens_total": ("Number of cached prompt tokens.", 0),
        "num_requests_total": ("Number of requests processed.", s.stats.num_requests_total),
    }
    out: list[str] = []
    for name, (help_text, value) in gauges.items():
        out += [
            f"# HELP sglang:{name} {help_text}",
            f"# TYPE sglang:{name} gauge",
            f"sglang:{name}{{{labels}}} {float(value)}",
        ]
    for name, (help_text, value) in counters.items():
        out += [
            f"# HELP sglang:{name} {help_text}",
            f"# TYPE sglang:{name} counter",
            f"sglang:{name}{{{labels}}} {float(value)}",
        ]
    for name, help_text, total in (
        ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.stats.ttft_sum),
        ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", s.stats.e2e_sum),
    ):
        count = s.stats.finished_total
        out += [
            f"# HELP sglang:{name} {help_text}",
            f"# TYPE sglang:{name} histogram",
            f'sglang:{name}_bucket{{{labels},le="+Inf"}} {float(count)}',
            f"sglang:{name}_sum{{{labels}}} {float(total)}",
            f"sglang:{name}_count{{{labels}}} {float(count)}",
        ]
    out += [
        "# HELP dsv4lab_twin_time_seconds The twin's modelled time when this reading was taken.",
        "# TYPE dsv4lab_twin_time_seconds gauge",
        f"dsv4lab_twin_time_seconds {twin_now!r}",
    ]
    return "\n".join(out) + "\n"


def build_dummy_health_app(log: LogWriter) -> web.Application:
    """What nodes with rank >= 1 serve once their schedulers are ready (SGLang's dummy health server)."""

    async def ok(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    for path in ("/health", "/health_generate", "/ping"):
        app.router.add_get(path, ok)
    return app
