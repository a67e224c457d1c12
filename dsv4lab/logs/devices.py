"""Which physical GPU a failure was on, from every form a log gives it.

"Which GPU" is often the whole answer on a shared host (another process holds memory on one card), and logs
name it in several ways, each an index the engine or PyTorch counts in its own space:

- in the message: PyTorch's allocator (``GPU 3 has a total capacity``, before 2.0 ``(GPU 3; ...)``, torch_npu
  ``(NPU 3; ...)``), vLLM's free-memory checks (``Free memory on device cuda:0``: the worker's
  ``torch.device(f"cuda:{visible index}")``) or any ``device N``. These are ordinals among the devices the
  process sees.
- in the rank prefix, through the rank's device: SGLang starts scheduler ``tp_rank`` on ``gpu_id =
  base_gpu_id + (tp_rank % tp_size_per_node) * gpu_id_step`` (``compute_local_gpu_id``), and a vLLM worker
  of local rank ``r`` (``Worker_TPr``, ``rank=r``, ``[rankr]:``) runs on ``cuda:r`` (``init_device``). Only
  where the log's arguments leave no doubt (no pipeline stages, data parallel only as DP attention for
  SGLang or rank 0 for vLLM).
- the ``CUDA_VISIBLE_DEVICES`` the log shows (a pasted command, an ``export``, ``os.environ[...]``) maps such an
  ordinal to the physical card: ordinal ``i`` is ``visible[i]``.

A Ray actor (vLLM's Ray executor and Ray DP) runs under the ``CUDA_VISIBLE_DEVICES`` Ray set for it alone, so
its ordinals name no card the log can tell: no GPU is named then.
"""

from __future__ import annotations

import re

from dsv4lab.logs.events import Engine, ErrorEvent, ServerArgs

__all__ = ["VISIBLE_DEVICES", "failing_gpu", "named_index", "parse_visible", "rank_index"]

#: A device index in a failure message (the forms above), tried in this order.
_INDEX = (
    re.compile(r"\b(?:GPU|NPU|XPU) (\d+)(?: has a total capac|;)"),
    re.compile(r"\bdevice (?:cuda|hip|xpu|npu):(\d+)\b"),
    re.compile(r"\b(?:cuda|hip):(\d+)\b"),
    re.compile(r"\b(?:GPU|device) (\d+)\b"),
)
#: ``CUDA_VISIBLE_DEVICES=0,1``, ``export HIP_VISIBLE_DEVICES=2``, ``os.environ["CUDA_VISIBLE_DEVICES"] = "1"``,
#: ``-e CUDA_VISIBLE_DEVICES=2,3``, ``CUDA_VISIBLE_DEVICES: 4`` (numeric lists only; UUIDs name no ordinal).
VISIBLE_DEVICES = re.compile(
    r"\b(?:CUDA|HIP|ROCR)_VISIBLE_DEVICES['\"]?\]?\s*[=:]\s*['\"]?(\d+(?:\s*,\s*\d+)*)(?![\w-])"
)
#: Process tags of Ray actors (their own CUDA_VISIBLE_DEVICES), among a line's leading ``(...)`` tags.
_RAY_TAGS = ("Ray", "Actor")
_TAGS = re.compile(r"^(?:\([^()]{1,80}\) )+")


def parse_visible(line: str) -> tuple[int, ...] | None:
    """The device list a line assigns to ``CUDA_VISIBLE_DEVICES`` (or HIP/ROCR), or None."""
    m = VISIBLE_DEVICES.search(line)
    if m is None:
        return None
    return tuple(int(x) for x in m.group(1).replace(" ", "").split(","))


def named_index(text: str) -> int | None:
    """The device ordinal a failure message names (see the module docstring), or None."""
    for rx in _INDEX:
        m = rx.search(text)
        if m:
            return int(m.group(1))
    return None


def _int(args: ServerArgs | None, *keys: str) -> int | None:
    if args is None:
        return None
    for k in keys:
        v = args.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            return v
    return None


def rank_index(engine: Engine | None, rank: int | None, dp: int | None, args: ServerArgs | None) -> int | None:
    """The device ordinal of the rank that wrote a line, where the engine's device assignment fixes it."""
    pp = _int(args, "pp_size", "pipeline_parallel_size")
    if pp is not None and pp > 1:
        return None
    if engine is Engine.VLLM:
        if rank is None or (dp is not None and dp > 0):
            return None
        nodes = _int(args, "nnodes")
        tp = _int(args, "tensor_parallel_size", "tp_size")
        if nodes and nodes > 1:
            if not tp or tp % nodes:
                return None
            return rank % (tp // nodes)
        return rank
    base = _int(args, "base_gpu_id") or 0
    step = _int(args, "gpu_id_step") or 1
    tp = _int(args, "tp_size", "tensor_parallel_size")
    if rank is None:
        dp_size = _int(args, "dp_size")
        return base if tp == 1 and (dp_size is None or dp_size == 1) and dp is None else None
    if dp is not None and dp > 0 and not (args is not None and args.get("enable_dp_attention") is True):
        return None  # plain data parallelism offsets each replica's base; the arguments would have to say how
    nodes = _int(args, "nnodes") or 1
    per_node = tp // nodes if tp and tp % nodes == 0 else None
    local = rank % per_node if per_node else rank
    return base + local * step


def _ray_actor(err: ErrorEvent) -> bool:
    m = _TAGS.match(err.text)
    tags = m.group(0) if m else ""
    return any(t in tags for t in _RAY_TAGS) or "ray::" in err.message


def failing_gpu(
    engine: Engine | None,
    errors: list[ErrorEvent],
    args: ServerArgs | None,
    visible: tuple[int, ...] | None,
) -> int | None:
    """The physical GPU of the failure: the first of ``errors`` (the root first) that names a device in its
    message, else the root's rank through the rank's device; through ``visible`` when the log shows it."""
    if not errors:
        return None
    root = errors[0]
    if _ray_actor(root):
        return None
    index: int | None = None
    for err in errors:
        if err.oom is not None and err.oom.gpu is not None:
            index = err.oom.gpu
        else:
            index = named_index(err.message)
        if index is not None:
            if _ray_actor(err):
                return None
            break
    if index is None:
        index = rank_index(engine, root.rank, root.dp, args)
    if index is None:
        return None
    if visible and index < len(visible):
        return visible[index]
    return index
