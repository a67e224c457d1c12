"""What the benchmark asks the server (and its host) for provenance: model name, engine and version, GPUs.

These are small one-off GETs, so they use aiohttp with explicit timeouts; a server that does not answer
them is still benchmarked — provenance then says "unknown" instead of failing the run.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from dsv4lab.errors import DSV4LabError
from dsv4lab.hosts import Host

__all__ = ["discover_model", "engine_of", "fetch_json", "gpu_names", "server_info"]

#: Info paths, newest first: 0.5.16+ serve /server_info, older releases /get_server_info.
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")


async def fetch_json(url: str, *, timeout_s: float) -> Any | None:
    """GET ``url`` and parse JSON; None on any failure (refused, timeout, non-200, not JSON)."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
            if resp.status != 200:
                return None
            return json.loads(await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError, ValueError):
        return None


async def server_info(base_url: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's ``/server_info`` (or older ``/get_server_info``) JSON, or ``{}``."""
    for path in SERVER_INFO_PATHS:
        data = await fetch_json(base_url + path, timeout_s=timeout_s)
        if isinstance(data, dict):
            return data
    return {}


async def discover_model(base_url: str, *, timeout_s: float = 10.0) -> str | None:
    """The first model id of ``/v1/models`` (what SGLang's own client uses when no model is given)."""
    data = await fetch_json(base_url + "/v1/models", timeout_s=timeout_s)
    if isinstance(data, dict):
        models = data.get("data")
        if isinstance(models, list) and models and isinstance(models[0], dict):
            model_id = models[0].get("id")
            return str(model_id) if model_id is not None else None
    return None


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
