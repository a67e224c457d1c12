"""Per-rank GPU memory during startup: the allocations SGLang makes, in its order, on one GPU.

:func:`dsv4lab.model.memory.preflight` gives the split (free before load per GPU, weights, the KV pool sized from
the *minimum* free memory, graph needs per runner). The twin adds what a real run has and a prediction
does not: each rank allocates its own way through that plan — weights in shards, the KV pool, then
communication buffers and CUDA-graph pools largest batch first, each graph's buffers in several tensors,
each allocation with a little deterministic fragmentation — and the first allocation that exceeds *that
rank's* free memory is the OOM, with PyTorch's numbers (tried, free, allocated, private pools). Because
ranks start from slightly different free memory (foreign use in the hardware profile), the GPU that fails
is stable: on the story's host, GPU 1.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from dsv4lab.config.hardware import HardwareProfile, ModelProfile
from dsv4lab.config.versions import SGLangRelease
from dsv4lab.model.memory import GraphNeed, Preflight

__all__ = ["Allocation", "GpuMemory", "GraphPlan", "OutOfMemory", "RankMemoryPlan", "plan_rank"]

#: Buffers a captured graph of the largest batch size allocates (activations, attention metadata, ...).
TENSORS_PER_LARGEST_GRAPH = 8
#: Upper bound of the extra bytes the caching allocator loses per allocation to block rounding.
MAX_FRAGMENTATION = 0.008


class OutOfMemory(Exception):
    """torch.OutOfMemoryError, with the numbers PyTorch prints."""

    def __init__(self, gpu: int, tried_gib: float, state: GpuMemory) -> None:
        super().__init__(f"GPU {gpu}: tried {tried_gib:.2f} GiB with {state.free_gib:.2f} GiB free")
        self.gpu = gpu
        self.tried_gib = tried_gib
        self.free_gib = state.free_gib
        self.total_gib = state.total_gib
        self.process_gib = state.process_gib
        self.allocated_gib = state.allocated_gib
        self.private_pool_gib = state.private_pool_gib
        self.reserved_unallocated_gib = state.reserved_unallocated_gib


@dataclass
class GpuMemory:
    """One GPU as one rank sees it: free memory and what this process holds (GiB)."""

    gpu: int
    total_gib: float
    free_gib: float
    foreign_gib: float
    rng: random.Random
    allocated_gib: float = 0.0
    private_pool_gib: float = 0.0
    reserved_unallocated_gib: float = 0.0
    context_gib: float = 0.0

    @property
    def process_gib(self) -> float:
        return self.total_gib - self.free_gib - self.foreign_gib

    @property
    def used_gib(self) -> float:
        return self.total_gib - self.free_gib

    def take_context(self, gib: float) -> None:
        """CUDA context and NCCL communicators: non-PyTorch memory, taken before the baseline."""
        self.context_gib += gib
        self.free_gib -= gib

    def alloc(self, gib: float, *, private_pool: bool = False) -> None:
        """Allocate like the caching allocator: the request plus rounding loss, or raise OutOfMemory."""
        if gib <= 0:
            return
        loss = gib * self.rng.uniform(0.0, MAX_FRAGMENTATION)
        if gib + loss > self.free_gib:
            raise OutOfMemory(self.gpu, gib, self)
        self.free_gib -= gib + loss
        self.allocated_gib += gib
        self.reserved_unallocated_gib += loss
        if private_pool:
            self.private_pool_gib += gib


@dataclass(frozen=True)
class Allocation:
    """One tensor (GiB) allocated while capturing the graph of batch size ``bs``."""

    bs: int
    gib: float


@dataclass(frozen=True)
class GraphPlan:
    """One CUDA-graph runner: what it captures, largest batch first, and the tensors each capture allocates."""

    role: str
    runner: str  # decode | verify | extend | draft_decode
    tokens_per_req: int
    bs: tuple[int, ...]  # ascending, as logged
    allocations: tuple[tuple[int, tuple[float, ...]], ...]  # (bs, tensors) in capture order

    @property
    def total_gib(self) -> float:
        return sum(sum(t) for _, t in self.allocations)


@dataclass(frozen=True)
class RankMemoryPlan:
    """Everything one rank will try to allocate, in SGLang's order for the release."""

    gpu: int
    total_gib: float
    foreign_gib: float
    context_gib: float
    free_before_load_gib: float
    weights_gib: float
    weight_shards: int
    draft_weights_gib: float
    draft_in_static: bool
    kv_pool_gib: float
    kv_tokens: int
    kv_bytes_per_token: float
    draft_kv_gib: float
    comm_gib: float
    graphs: tuple[GraphPlan, ...]
    #: Position of this GPU among the node's GPUs by free memory (0 = least free): the order in which
    #: ranks that fail in the same lock-stepped allocation report it.
    tightness: int

    def memory(self, seed: int) -> GpuMemory:
        """A fresh GPU state at startup (after CUDA context), with this rank's fragmentation RNG."""
        mem = GpuMemory(
            gpu=self.gpu,
            total_gib=self.total_gib,
            free_gib=self.free_before_load_gib + self.context_gib,
            foreign_gib=self.foreign_gib,
            rng=random.Random(f"{seed}:{self.gpu}"),
        )
        mem.take_context(self.context_gib)
        return mem


def graph_plan(need: GraphNeed, capture_bs: Sequence[int], fixed_gib: float) -> GraphPlan:
    """Split ``a + b x max_bs x tokens`` over the captures: the largest graph sizes the shared pool.

    Capturing largest first, the first graph allocates the batch-proportional buffers (``need.gib -
    fixed_gib``, in several tensors); every later, smaller graph reuses them and adds only its share of
    the fixed part ``a``.
    """
    bs = tuple(sorted(b for b in capture_bs if b <= need.max_bs)) or (need.max_bs,)
    order = tuple(reversed(bs))
    fixed = min(need.gib, fixed_gib)
    tensor = (need.gib - fixed) / TENSORS_PER_LARGEST_GRAPH
    per_graph = fixed / len(order)
    allocations = [(order[0], (per_graph, *([tensor] * TENSORS_PER_LARGEST_GRAPH)))]
    allocations += [(b, (per_graph,)) for b in order[1:]]
    runner = "extend" if need.runner == "draft_extend" else need.runner
    return GraphPlan(need.role, runner, need.tokens_per_request, bs, tuple(allocations))


def plan_rank(
    p: Preflight,
    gpu_index: int,
    hardware: HardwareProfile,
    model: ModelProfile,
    release: SGLangRelease,
) -> RankMemoryPlan:
    """The allocation plan of the rank driving local GPU ``gpu_index``."""
    g = p.per_gpu[gpu_index]
    gr = model.graphs
    fixed = {
        "decode": gr.target_a_gib,
        "verify": gr.target_a_gib,
        "draft_extend": gr.draft_extend_a_gib,
        "draft_decode": gr.draft_decode_a_gib,
    }
    spec = p.settings.speculative is not None
    capture = p.settings.capture_bs
    graphs = tuple(graph_plan(n, capture, fixed.get(n.runner, 0.0)) for n in p.graphs)
    bpt = model.kv_bytes_per_token_spec if spec and release.draft_in_static else model.kv_bytes_per_token
    frees = [x.free_before_load_gib for x in p.per_gpu]
    order = sorted(range(len(frees)), key=lambda i: (frees[i], i))
    weights_shards = max(1, round(g.weights_gib / 0.9))
    return RankMemoryPlan(
        gpu=gpu_index,
        total_gib=hardware.gpu.total_gib,
        foreign_gib=hardware.other_used_gib[gpu_index],
        context_gib=hardware.context_overhead_gib,
        free_before_load_gib=g.free_before_load_gib,
        weights_gib=g.weights_gib,
        weight_shards=weights_shards,
        draft_weights_gib=g.draft_weights_gib if spec else 0.0,
        draft_in_static=release.draft_in_static,
        kv_pool_gib=g.kv_pool_gib,
        kv_tokens=p.kv_tokens,
        kv_bytes_per_token=bpt,
        draft_kv_gib=g.draft_kv_gib,
        comm_gib=g.comm_gib,
        graphs=graphs,
        tightness=order.index(gpu_index),
    )
