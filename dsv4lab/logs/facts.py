"""The memory figures a run's log gives, gathered for the fixes' arithmetic and the OOM guess.

A failing rank's own numbers are preferred; a rank without them borrows the tightest rank's (the engines
size every rank from the minimum), and the static fraction comes from the logged arguments when they are
there, else from the split itself.
"""

from __future__ import annotations

from dsv4lab.logs.events import Engine, OomFigures
from dsv4lab.logs.fixes import MemoryFacts
from dsv4lab.logs.patterns import CURRENT_FRACTION
from dsv4lab.logs.state import RankState, RunState

__all__ = ["memory_facts"]


def memory_facts(run: RunState, rank: int | None, engine: Engine | None, oom: OomFigures | None) -> MemoryFacts:
    """The memory figures of the failing rank (or the minimum over ranks), the fraction and the shape flags."""
    ranks = list(run.ranks.values())
    mine: RankState | None = run.ranks.get(rank) if rank is not None else None

    def pick(attr: str) -> float | None:
        if mine is not None and getattr(mine, attr) is not None:
            return float(getattr(mine, attr))
        vals = [getattr(st, attr) for st in ranks if getattr(st, attr) is not None]
        return float(min(vals)) if vals else None

    args = run.server_args
    fraction: float | None = None
    from_log = False
    max_bs = run.max_bs_seen
    tp = context = steps = drafts = topk = None
    kv_dtype = None
    if args is not None:
        key = "gpu_memory_utilization" if engine is Engine.VLLM else "mem_fraction_static"
        v = args.get(key)
        if isinstance(v, (int, float)):
            fraction, from_log = float(v), True
        for k in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
            b = args.get(k)
            if isinstance(b, int):
                max_bs = b
                break
        t = args.get("tp_size", args.get("tensor_parallel_size"))
        tp = t if isinstance(t, int) else None
        c = args.get("context_length", args.get("max_model_len"))
        context = c if isinstance(c, int) else None
        s = args.get("speculative_num_steps")
        steps = s if isinstance(s, int) else None
        d = args.get("speculative_num_draft_tokens")
        drafts = d if isinstance(d, int) else None
        k = args.get("speculative_eagle_topk")
        topk = k if isinstance(k, int) else None
        kd = args.get("kv_cache_dtype")
        kv_dtype = kd if isinstance(kd, str) else None
    if fraction is None and engine is Engine.VLLM and run.vllm_util is not None:
        fraction, from_log = run.vllm_util, True
    pre, post, pool_end = pick("pre"), pick("post"), pick("pool_end")
    if fraction is None:
        for err in run.errors:
            m = CURRENT_FRACTION.search(err.message)
            if m:
                fraction, from_log = float(m.group(1)), True
                break
    if fraction is None and engine is not Engine.VLLM and pre and pool_end is not None:
        fraction = round(1 - pool_end / pre, 3)
    if tp is None and run.max_rank is not None:
        tp = run.max_rank + 1
    graphs_vals = [st.graphs for st in ([mine] if mine else ranks) if st.graphs]
    if pre is None and post is not None:
        w = pick("weights")
        pre = post + w if w is not None else None
    total = oom.total_gib if oom and oom.total_gib is not None else run.vllm_total
    return MemoryFacts(
        pre=pre,
        post=post,
        weights=pick("weights"),
        kv=pick("kv") if engine is not Engine.VLLM else run.vllm_kv,
        slack_now=pool_end,
        capture_avail=pick("capture_avail"),
        graphs=max(graphs_vals) if graphs_vals else None,
        runtime_headroom=run.capacity.available_gib if run.capacity else None,
        fraction=fraction,
        fraction_from_log=from_log,
        max_bs=max_bs,
        tp=tp,
        context=context or (run.capacity.context_len if run.capacity else None),
        kv_dtype=kv_dtype,
        spec_steps=steps,
        spec_draft_tokens=drafts,
        spec_topk=topk,
        new_flags=run.new_style,
        total=total,
    )
