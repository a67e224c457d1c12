"""Read the launch arguments an engine logs about itself.

SGLang logs its *resolved* arguments at startup (heuristic defaults such as ``mem_fraction_static``
already filled in), which is exactly what the memory model needs to rebuild a config from a log:
``server_args=ServerArgs(model_path='...', tp_size=8, ...)`` up to 0.5.16 (a dataclass repr) and
``server_args={'model_path': '...', ...}`` in 0.5.23 (a dict). vLLM logs ``non-default args: {...}``.

Both are Python literal syntax, so :func:`ast.literal_eval` reads them without executing anything; values
that are not literals (an enum repr, a nested object) are skipped, and a line cut mid-way falls back to
picking the known keys one by one, so a truncated line still gives what it holds.
"""

from __future__ import annotations

import ast
import re
from typing import Any

__all__ = ["KEY_FIELDS", "parse_server_args"]

#: The keys the memory model rebuilds a config from (both spellings of the graph max bs).
KEY_FIELDS = (
    "model_path",
    "model",
    "tp_size",
    "tensor_parallel_size",
    "dp_size",
    "mem_fraction_static",
    "gpu_memory_utilization",
    "cuda_graph_max_bs",
    "cuda_graph_max_bs_decode",
    "cuda_graph_bs",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "max_running_requests",
    "max_num_seqs",
    "chunked_prefill_size",
    "context_length",
    "max_model_len",
    "kv_cache_dtype",
    "disable_cuda_graph",
    "enforce_eager",
    "quantization",
)

_LITERAL = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\[[^\]]*\]|-?[\d.eE+-]+|None|True|False"
_PAIR = re.compile(r"(?:^|[,({]\s*)['\"]?(?P<key>\w+)['\"]?\s*[=:]\s*(?P<value>" + _LITERAL + r")(?=\s*[,)}]|\s*$)")
_MAX_CHARS = 200_000


def _literal(text: str) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def _from_call(body: str) -> dict[str, Any] | None:
    """``ServerArgs(a=1, b='x')`` -> dict, skipping values that are not literals."""
    try:
        tree = ast.parse(body.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    call = tree.body
    if not isinstance(call, ast.Call):
        return None
    out: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            continue
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return out


def _from_dict(body: str) -> dict[str, Any] | None:
    try:
        tree = ast.parse(body.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    node = tree.body
    if not isinstance(node, ast.Dict):
        return None
    out: dict[str, Any] = {}
    for k, v in zip(node.keys, node.values, strict=False):
        if not isinstance(k, ast.Constant) or not isinstance(k.value, str):
            continue
        try:
            out[k.value] = ast.literal_eval(v)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return out


def _scan(body: str) -> dict[str, Any]:
    """Key by key, for a line that is cut off or not valid Python as a whole."""
    out: dict[str, Any] = {}
    for m in _PAIR.finditer(body):
        key = m.group("key")
        if key in out:
            continue
        ok, value = _literal(m.group("value"))
        if ok:
            out[key] = value
    return out


def parse_server_args(text: str) -> dict[str, Any]:
    """The arguments in a ``server_args=`` / ``non-default args:`` value (the text after ``=`` / ``:``).

    Accepts ``ServerArgs(...)``, ``{...}``, with or without the ``server_args=`` lead-in. Never raises:
    unreadable text gives ``{}``.
    """
    body = text.strip()[:_MAX_CHARS]
    for lead in ("server_args=", "non-default args:"):
        if body.startswith(lead):
            body = body[len(lead) :].strip()
    parsed: dict[str, Any] | None = None
    if body.startswith("{"):
        parsed = _from_dict(body)
    elif "(" in body[:40]:
        parsed = _from_call(body)
    if parsed is None:
        parsed = _scan(body)
    return parsed
