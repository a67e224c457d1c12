"""``/start_profile`` and ``/stop_profile``: a torch-profiler-style Chrome trace drawn from the timing model.

While profiling, every scheduler iteration is recorded with its :class:`timing.StepCost`; on stop the
twin writes ``{profile_id}-TP-0.trace.json`` (Chrome trace JSON with ``traceEvents``) whose GPU kernels
split each step the way the model does — so the kernel breakdown a notebook computes from the trace
(e.g. the sparse-MLA decode kernel's share of GPU time) is the model's, and changes with load exactly as
the modelled throughput does.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4lab.config.hardware import HardwareProfile
from dsv4lab.twin.timing import StepCost

__all__ = ["Profiler", "kernel_names"]


def kernel_names(hardware: HardwareProfile) -> dict[str, str]:
    """Kernel names per cost term, as they appear in a profile on this GPU generation."""
    if hardware.gpu.sm == "sm_120":
        attention = "_fwd_sparse_mla_decode_kernel_sm120_triton"
    elif hardware.gpu.sm in ("sm_90", "sm_100"):
        attention = "flash_fwd_splitkv_mla_sparse_kernel"
    else:
        attention = "sparse_mla_decode_kernel"
    algo = os.environ.get("NCCL_ALGO", "Ring").upper()
    proto = os.environ.get("NCCL_PROTO", "LL").upper()
    return {
        "attention": attention,
        "moe": "fused_moe_kernel",
        "dense": "_w8a8_block_fp8_matmul",
        "allreduce": f"ncclDevKernel_AllReduce_Sum_bf16_{algo}_{proto}",
        "draft": "eagle_mtp_draft_extend_kernel",
        "other": "elementwise_kernel",
        "prefill": "flash_mla_sparse_prefill_kernel",
    }


@dataclass
class Profiler:
    """A profile in progress: the steps recorded between ``/start_profile`` and ``/stop_profile``."""

    hardware: HardwareProfile
    active: bool = False
    steps: list[tuple[float, StepCost | None, float]] = field(default_factory=list)
    output_dir: Path | None = None
    num_steps: int | None = None
    started_at: float = 0.0

    def start(self, output_dir: str | None, num_steps: int | None) -> None:
        self.active = True
        self.steps = []
        base = output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or tempfile.gettempdir()
        self.output_dir = Path(base).expanduser()
        self.num_steps = num_steps
        self.started_at = time.time()

    def record(self, start: float, cost: StepCost | None, duration: float) -> bool:
        """Record one iteration (its start and duration in modelled seconds, on the twin's clock); True when
        ``num_steps`` were reached (the caller then stops)."""
        if not self.active:
            return False
        self.steps.append((start, cost, duration))
        return self.num_steps is not None and len(self.steps) >= self.num_steps

    def stop(self) -> Path:
        self.active = False
        out = self.output_dir or Path(tempfile.gettempdir())
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{self.started_at:.6f}-TP-0.trace.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.trace()), encoding="utf-8")
        os.replace(tmp, path)
        return path

    def trace(self) -> dict[str, Any]:
        names = kernel_names(self.hardware)
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python (scheduler TP0)"}},
        ]
        for ts, cost, duration in self.steps:
            t_us = ts * 1e6
            total_us = duration * 1e6
            events.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "forward_decode" if cost else "forward_extend",
                    "pid": 1,
                    "tid": 1,
                    "ts": t_us,
                    "dur": total_us,
                    "args": {},
                }
            )
            if cost is None:
                parts = [("prefill", 0.55), ("moe", 0.3), ("dense", 0.1), ("allreduce", 0.05)]
            else:
                parts = list(cost.shares().items())
            cursor = t_us
            for kind, share in parts:
                dur = share * total_us
                if dur <= 0:
                    continue
                events.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": names[kind],
                        "pid": 0,
                        "tid": 7,
                        "ts": cursor,
                        "dur": dur,
                        "args": {"device": 0, "stream": 7, "correlation": len(events)},
                    }
                )
                cursor += dur
        return {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": self.hardware.gpu.name, "computeCapability": self.hardware.gpu.sm}],
            "displayTimeUnit": "ms",
            "traceEvents": events,
        }
