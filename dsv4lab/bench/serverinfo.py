"""The benchmark's one-off requests to the server besides the measured ones: provenance (model name, engine
and version, GPUs), readiness, cache flush and profiling.

These are small requests, so they use aiohttp with explicit timeouts. A server that does not answer the
provenance GETs is still benchmarked — provenance then says "unknown" instead of failing the run; a flush
or a profile the user asked for and did not get is an error, since the run would not be what was asked.

Each engine names itself in its own way, so the engine is asked, not guessed from the port: SGLang (and the
twin, which adds a ``twin`` section) answers ``/server_info`` (``/get_server_info`` before 0.5.16) with a
``version``; vLLM has no such endpoint but answers ``GET /version`` with ``{"version": ...}`` and lists its
models as ``owned_by: "vllm"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

import aiohttp

from dsv4lab.errors import BenchError, DSV4LabError
from dsv4lab.hosts import Host

__all__ = [
    "discover_model",
    "engine_at",
    "engine_of",
    "fetch_json",
    "first_model_id",
    "flush_cache",
    "gpu_names",
    "identify_engine",
    "list_models",
    "server_info",
    "start_profile",
    "stop_profile",
    "stop_profile_later",
    "stop_profile_quietly",
    "wait_until_ready",
]

#: Info paths, newest first: 0.5.16+ serve /server_info, older releases /get_server_info.
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")


async def fetch_json(url: str, *, timeout_s: float, headers: Mapping[str, str] | None = None) -> Any | None:
    """GET ``url`` and parse JSON; None on any failure (refused, timeout, non-200, not JSON)."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers=dict(headers or {})) as resp,
        ):
            if resp.status != 200:
                return None
            return json.loads(await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError, ValueError):
        return None


async def server_info(
    base_url: str, *, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The server's ``/server_info`` (or older ``/get_server_info``) JSON, or ``{}``."""
    for path in SERVER_INFO_PATHS:
        data = await fetch_json(base_url + path, timeout_s=timeout_s, headers=headers)
        if isinstance(data, dict):
            return data
    return {}


async def list_models(
    base_url: str, *, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The model cards of ``/v1/models`` (``id``, and where the engine says so ``owned_by``, ``root``,
    ``max_model_len``), or ``[]``."""
    data = await fetch_json(base_url + "/v1/models", timeout_s=timeout_s, headers=headers)
    models = data.get("data") if isinstance(data, dict) else None
    return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []


def first_model_id(models: list[dict[str, Any]]) -> str | None:
    """The first model's id (what SGLang's and vLLM's own clients use when no model is given)."""
    model_id = models[0].get("id") if models else None
    return str(model_id) if model_id is not None else None


async def discover_model(
    base_url: str, *, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None
) -> str | None:
    """The first model id of ``/v1/models``."""
    return first_model_id(await list_models(base_url, timeout_s=timeout_s, headers=headers))


def engine_of(info: dict[str, Any]) -> tuple[str, str | None]:
    """(engine, version) from a server_info JSON: the twin says so itself; SGLang reports ``version``."""
    engine = info.get("engine")
    version = info.get("version")
    if isinstance(engine, str) and engine:
        name = engine
    elif info.get("twin"):
        name = "dsv4lab-twin"
    elif version is not None:
        name = "sglang"
    else:
        name = "unknown"
    return name, (str(version) if version is not None else None)


#: ``owned_by`` values of ``/v1/models`` that name an engine (others, e.g. a proxy's organisation, do not).
_OWNERS = {"vllm": "vllm", "sglang": "sglang"}


async def identify_engine(
    base_url: str,
    info: Mapping[str, Any],
    models: list[dict[str, Any]],
    *,
    timeout_s: float = 10.0,
    headers: Mapping[str, str] | None = None,
) -> tuple[str, str | None, str]:
    """(engine, version, how it was learnt) from the server's own endpoints: ``/server_info`` when it
    answered (SGLang, the twin), else ``GET /version`` and the models' ``owned_by`` (vLLM)."""
    if info:
        name, version = engine_of(dict(info))
        return name, version, "GET /server_info"
    owner = models[0].get("owned_by") if models else None
    name = _OWNERS.get(str(owner).lower(), "unknown") if owner is not None else "unknown"
    data = await fetch_json(base_url + "/version", timeout_s=timeout_s, headers=headers)
    version = data.get("version") if isinstance(data, dict) else None
    if version is None:
        return name, None, f"GET /v1/models (owned_by {owner})" if name != "unknown" else "not reported"
    how = "GET /version" + (f" and /v1/models (owned_by {owner})" if name != "unknown" else "")
    return name, str(version), how


async def engine_at(
    base_url: str, *, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None
) -> tuple[str, str | None, str]:
    """:func:`identify_engine` for a server nothing is known of yet."""
    info = await server_info(base_url, timeout_s=timeout_s, headers=headers)
    models = await list_models(base_url, timeout_s=timeout_s, headers=headers)
    return await identify_engine(base_url, info, models, timeout_s=timeout_s, headers=headers)


def gpu_names(host: Host, *, timeout_s: float = 20.0) -> tuple[str, ...]:
    """GPU names on ``host`` from ``nvidia-smi`` (the twin ships a stand-in), or () when it cannot tell."""
    try:
        # Through bash so that a host without nvidia-smi answers with status 127 instead of raising.
        query = "nvidia-smi --query-gpu=name --format=csv,noheader"
        result = host.run(["bash", "-c", query], timeout_s=timeout_s)
    except (DSV4LabError, OSError):
        return ()
    if not result.ok:
        return ()
    return tuple(line.strip() for line in result.stdout.splitlines() if line.strip())


async def _post(
    url: str, *, body: Mapping[str, Any] | None, timeout_s: float, headers: Mapping[str, str] | None
) -> tuple[int, str]:
    """POST (a JSON body, or none) and return (status, text); a transport failure is a BenchError."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, json=dict(body) if body is not None else None, headers=dict(headers or {})) as resp,
        ):
            return resp.status, (await resp.text()).strip()
    except (asyncio.TimeoutError, TimeoutError):
        raise BenchError(f"POST {url} got no answer within {timeout_s:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise BenchError(f"POST {url} failed: {exc}") from None


async def flush_cache(
    base_url: str, *, wait_s: float = 60.0, timeout_s: float = 90.0, headers: Mapping[str, str] | None = None
) -> None:
    """Empty the server's prefix cache (SGLang ``POST /flush_cache``), so a run does not reuse the prefixes
    of the one before. SGLang 0.5.23 waits up to ``timeout`` seconds (``wait_s``) for running requests to
    end; older releases refuse at once when busy. A refusal raises :class:`BenchError`."""
    status, text = await _post(
        f"{base_url}/flush_cache?timeout={wait_s:g}", body=None, timeout_s=timeout_s, headers=headers
    )
    if status != 200:
        raise BenchError(f"the server did not flush its cache (flush_cache: HTTP {status}: {text[:300]})")


async def start_profile(
    base_url: str, *, output_dir: str | None = None, timeout_s: float = 60.0, headers: Mapping[str, str] | None = None
) -> None:
    """Start the server's torch profiler (``POST /start_profile``); traces go to ``output_dir`` on the server
    host (default: the server's ``SGLANG_TORCH_PROFILER_DIR``)."""
    body: dict[str, Any] = {"activities": ["CPU", "GPU"]}
    if output_dir is not None:
        body["output_dir"] = output_dir
    status, text = await _post(f"{base_url}/start_profile", body=body, timeout_s=timeout_s, headers=headers)
    if status != 200:
        raise BenchError(f"the server did not start profiling (start_profile: HTTP {status}: {text[:300]})")


async def stop_profile(base_url: str, *, timeout_s: float = 300.0, headers: Mapping[str, str] | None = None) -> str:
    """Stop the profiler (``POST /stop_profile``) and return the server's answer (it names the trace)."""
    status, text = await _post(f"{base_url}/stop_profile", body={}, timeout_s=timeout_s, headers=headers)
    if status != 200:
        raise BenchError(f"the server did not stop profiling (stop_profile: HTTP {status}: {text[:300]})")
    return text


async def wait_until_ready(base_url: str, timeout_s: float, *, headers: Mapping[str, str] | None = None) -> None:
    """Poll ``GET /v1/models`` once a second until it answers 200 (``bench_serving --ready-check-timeout-sec``);
    raise :class:`BenchError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if await fetch_json(base_url + "/v1/models", timeout_s=max(0.1, min(5.0, left)), headers=headers) is not None:
            return
        if time.monotonic() >= deadline:
            raise BenchError(f"the server at {base_url} was not ready (GET /v1/models) within {timeout_s:g} s")
        await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def stop_profile_later(base: str, headers: Mapping[str, str]) -> None:
    """POST /stop_profile from a thread that outlives the call (a profiler left running fills the disk)."""

    def stop() -> None:
        url = f"{base}/stop_profile"  # base is the run's http(s) endpoint
        request = urllib.request.Request(url, data=b"{}", headers=dict(headers), method="POST")  # noqa: S310
        request.add_header("Content-Type", "application/json")
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=300.0):  # noqa: S310
            pass

    threading.Thread(target=stop, name="dsv4lab-stop-profile", daemon=False).start()


async def stop_profile_quietly(base: str, headers: Mapping[str, str], *, quiet: bool) -> str | None:
    """Stop the profiler; after an aborted run the server may be gone, so a failure is only noted."""
    try:
        return await stop_profile(base, headers=headers)
    except BenchError as exc:
        if not quiet:
            raise
        return f"not stopped: {exc}"
