"""The engines a lab launches: the SGLang twin, SGLang, vLLM (see :class:`~dsv4lab.engines.base.Engine`)."""

from __future__ import annotations

from dsv4lab.engines.base import Engine, HostFacts, SessionSettings, SmiSpec
from dsv4lab.engines.sglang import SGLangEngine
from dsv4lab.engines.twin import TwinEngine, twin_interval_ms
from dsv4lab.engines.vllm import VllmEngine
from dsv4lab.errors import UnknownNameError

__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "Engine",
    "HostFacts",
    "SGLangEngine",
    "SessionSettings",
    "SmiSpec",
    "TwinEngine",
    "VllmEngine",
    "get_engine",
    "twin_interval_ms",
]

#: Every engine by the name ``target=`` and ``--engine`` take.
ENGINES: dict[str, Engine] = {e.name: e for e in (TwinEngine(), SGLangEngine(), VllmEngine())}
#: Their names, in the order ``--engine`` lists them.
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)


def get_engine(name: str | Engine) -> Engine:
    """The engine called ``name`` (an engine passes through); an unknown name lists the known ones."""
    if isinstance(name, Engine):
        return name
    engine = ENGINES.get(name) if isinstance(name, str) else None
    if engine is None:
        raise UnknownNameError("target engine", name, ENGINE_NAMES, field="target")
    return engine
