"""A real streaming server for the benchmark tests: aiohttp on 127.0.0.1 with controlled timings.

It speaks the three APIs the client supports (OpenAI completions and chat with ``include_usage``, SGLang's
native ``/generate`` with cumulative text), records when it sent each chunk, and can be killed mid-run
(stop listening and cut every open connection) — the in-process stand-in for a dying server. With
``vllm=True`` it answers as vLLM does where the client must tell engines apart: no ``/server_info``, a
``GET /version``, models ``owned_by: "vllm"``, ``/tokenize`` and ``/detokenize`` over :class:`ToyTokenizer`
(whose counts are then the usage it reports), and prompt ids past the vocabulary refused in the stream. The tests in
this file check the stand-in itself; the other ``test_bench_*`` files import :class:`FakeServer`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["FakeServer", "ServerBehaviour", "ToyTokenizer", "fake_server"]


class ToyTokenizer:
    """A tokenizer whose decoding and re-encoding is not an identity, like byte-level BPE's: ids 0-4 are
    specials (0 the BOS it adds), 5-399 one word each, 400-449 a two-letter word that encodes as two
    one-letter tokens (450-499). Ids from ``vocab`` on decode to nothing."""

    vocab = 500
    bos = 0

    def piece(self, i: int) -> str:
        if i < 5:
            return f"<s{i}>"
        if i < 400:
            return f"w{i}"
        if i < 450:
            return "q" + chr(97 + (i - 400) % 26)
        return chr(97 + (i - 450) % 26)

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.piece(i) for i in ids if 0 <= i < self.vocab)

    def encode(self, text: str, *, special: bool) -> list[int]:
        out = [self.bos] if special else []
        for word in text.split():
            if word.startswith("w") and word[1:].isdigit() and 5 <= int(word[1:]) < 400:
                out.append(int(word[1:]))
            else:
                out.extend(450 + (ord(c) - 97) % 50 for c in word)
        return out


@dataclass
class ServerBehaviour:
    ttft_s: float = 0.01
    itl_s: float = 0.002
    tokens_per_chunk: int = 1
    usage: bool = True
    keepalive_comments: bool = False
    error_after_chunks: int | None = None  # send an error event after this many chunks
    http_status: int = 200
    cut_after_chunks: int | None = None  # close the connection without [DONE] after this many chunks
    server_info: dict[str, Any] = field(default_factory=lambda: {"version": "0.5.23", "engine": "fake"})
    vllm: bool = False  # answer as vLLM (see the module docstring)
    # OpenAI APIs: every k-th chunk, the first included, has the text "" (a token that decodes to nothing yet)
    empty_text_every: int | None = None


class FakeServer:
    def __init__(self, behaviour: ServerBehaviour | None = None) -> None:
        self.behaviour = behaviour or ServerBehaviour()
        self.port = 0
        self.sends: list[list[float]] = []  # per request, perf_counter of each chunk write
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # per request, its HTTP headers (names lower-cased)
        self.paths: list[str] = []  # per request, the path it was sent to
        self.in_flight = 0
        self.max_in_flight = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._transports: set[asyncio.Transport] = set()
        self.tokenizer = ToyTokenizer()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeServer:
        app = web.Application()
        app.router.add_post("/v1/completions", self._stream)
        app.router.add_post("/v1/chat/completions", self._stream)
        app.router.add_post("/generate", self._stream)
        if self.behaviour.vllm:
            app.router.add_get("/version", self._version)
            app.router.add_post("/tokenize", self._tokenize)
            app.router.add_post("/detokenize", self._detokenize)
        else:
            app.router.add_get("/server_info", self._info)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await self._site.start()
        server = self._site._server
        assert server is not None
        sockets = getattr(server, "sockets", None)
        assert sockets
        self.port = sockets[0].getsockname()[1]
        return self

    async def kill(self) -> None:
        """Die like a crashed process: refuse new connections, cut every open one."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        for t in list(self._transports):
            t.abort()

    async def stop(self) -> None:
        await self.kill()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(self.behaviour.server_info)

    async def _models(self, request: web.Request) -> web.Response:
        card: dict[str, Any] = {"id": "fake-model", "object": "model"}
        if self.behaviour.vllm:
            card.update(owned_by="vllm", root="fake-model", max_model_len=4096)
        return web.json_response({"object": "list", "data": [card]})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.paths.append(request.path)
        if "messages" in body:
            text = "user: " + " ".join(m["content"] for m in body["messages"]) + " assistant:"
            tokens = self.tokenizer.encode(text, special=True)
        else:
            tokens = self.tokenizer.encode(body["prompt"], special=body.get("add_special_tokens", True))
        return web.json_response({"count": len(tokens), "max_model_len": 4096, "tokens": tokens})

    async def _detokenize(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        return web.json_response({"prompt": self.tokenizer.decode((await request.json())["tokens"])})

    def _prompt_tokens(self, prompt: Any) -> int:
        if isinstance(prompt, list):
            return len(prompt)
        if self.behaviour.vllm:
            return len(self.tokenizer.encode(prompt, special=True))
        return len(prompt.split())

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        b = self.behaviour
        if request.transport is not None:
            self._transports.add(request.transport)
        body = await request.json()
        self.bodies.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        self.paths.append(request.path)
        if b.http_status != 200:
            return web.json_response({"error": {"message": "overloaded"}}, status=b.http_status)
        api = request.path
        if api == "/generate":
            n = int(body["sampling_params"]["max_new_tokens"])
            prompt_tokens = len(body.get("input_ids") or body.get("text", "").split())
        else:
            n = int(body["max_tokens"])
            prompt = body.get("prompt") or body.get("messages", [{}])[0].get("content", "")
            prompt_tokens = self._prompt_tokens(prompt)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        prompt = body.get("prompt")
        if b.vllm and isinstance(prompt, list) and any(i >= self.tokenizer.vocab for i in prompt):
            bad = max(prompt)  # vLLM refuses after the stream has begun: HTTP 200, then an error event
            error = {"error": {"message": f"Token id {bad} is out of vocabulary", "code": 400}}
            await resp.write(b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n")
            return resp
        sends: list[float] = []
        self.sends.append(sends)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(b.ttft_s)
            sent = 0
            chunk_no = 0
            while sent < n:
                k = min(b.tokens_per_chunk, n - sent)
                sent += k
                text = " ".join(f"t{sent - k + j}" for j in range(k)) + " "
                if b.empty_text_every and chunk_no % b.empty_text_every == 0:
                    text = ""
                if api == "/generate":
                    obj: dict[str, Any] = {
                        "text": " ".join(f"t{j}" for j in range(sent)) + " ",
                        "meta_info": {"prompt_tokens": prompt_tokens, "completion_tokens": sent, "finish_reason": None},
                    }
                    if not b.usage:
                        obj["meta_info"] = {}
                elif api == "/v1/chat/completions":
                    obj = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
                else:
                    obj = {"object": "text_completion", "choices": [{"index": 0, "text": text}], "usage": None}
                if b.keepalive_comments:
                    await resp.write(b": ping\n\n")
                await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                sends.append(time.perf_counter())
                chunk_no += 1
                if b.error_after_chunks is not None and chunk_no >= b.error_after_chunks:
                    await resp.write(b'data: {"error": {"message": "boom mid-stream", "code": 500}}\n\n')
                    await resp.write(b"data: [DONE]\n\n")
                    return resp
                if b.cut_after_chunks is not None and chunk_no >= b.cut_after_chunks:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if sent < n:
                    await asyncio.sleep(b.itl_s)
            if api != "/generate" and b.usage:
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
                await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        finally:
            self.in_flight -= 1
        return resp


async def fake_server(behaviour: ServerBehaviour | None = None) -> FakeServer:
    return await FakeServer(behaviour).start()


def test_fake_server_streams_sse_with_usage() -> None:
    async def go() -> list[bytes]:
        s = await fake_server(ServerBehaviour(ttft_s=0.0, itl_s=0.0))
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(s.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 3}) as resp,
            ):
                return [line async for line in resp.content]
        finally:
            await s.stop()

    lines = [x for x in asyncio.run(go()) if x.strip()]
    assert lines[-1] == b"data: [DONE]\n"
    usage = json.loads(lines[-2][6:])["usage"]
    assert usage == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert len(lines) == 5


async def _serve_forever(ttft_s: float, itl_s: float) -> None:
    s = await fake_server(ServerBehaviour(ttft_s=ttft_s, itl_s=itl_s))
    print(s.port, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":  # a server process for the kill -9 test: prints its port, serves until killed
    import sys

    asyncio.run(_serve_forever(float(sys.argv[1]), float(sys.argv[2])))
