"""The failing GPU from every form a log gives it (dsv4lab/logs/devices.py), in the engines' own line formats.

A device ordinal in the message (PyTorch's ``GPU N`` old and new, torch_npu's ``NPU N``, vLLM's
``device cuda:N``), else the failing rank's device (SGLang's ``compute_local_gpu_id``, vLLM's
``cuda:local_rank``), mapped to the physical card through a CUDA_VISIBLE_DEVICES the log shows; nothing for
a Ray actor, whose ordinals are its own.
"""

from __future__ import annotations

import pytest

from dsv4lab.logs import DeviceMap, Engine, Outcome, Phase, diagnose, parse_log
from dsv4lab.logs.devices import named_index, parse_visible, rank_index

OOM_NEW = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {n} has a total capacity of 79.19 GiB of which 1.00 GiB is free."  # noqa: E501
OOM_OLD = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU {n}; 44.56 GiB total capacity; 27.91 GiB already allocated; 565.31 MiB free; 27.93 GiB reserved in total by PyTorch)"  # noqa: E501
FREE = "(EngineCore pid=79) ERROR 01-28 15:59:42 [core.py:935] ValueError: Free memory on device cuda:{n} (1.53/22.05 GiB) on startup is less than desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."  # noqa: E501


@pytest.mark.parametrize(
    ("text", "index"),
    [
        ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.19 GiB", 3),
        ("CUDA out of memory. Tried to allocate 1.63 GiB (GPU 2; 44.56 GiB total capacity;", 2),
        ("NPU out of memory. Tried to allocate 1.00 GiB (NPU 5; 60.96 GiB total capacity;", 5),
        ("Free memory on device cuda:1 (1.53/22.05 GiB) on startup", 1),
        ("RuntimeError: CUDA error: out of memory on device 6", 6),
        ("RuntimeError: CUDA error: out of memory", None),
        ("Available memory on node 0 (10.27/13.59 GiB) on kv cache allocation", None),  # a NUMA node, no GPU
    ],
)
def test_device_index_in_a_message(text: str, index: int | None) -> None:
    assert named_index(text) == index


def test_old_torch_oom_form_gives_its_figures() -> None:
    d = diagnose([OOM_OLD.format(n=0)])
    assert (d.outcome, d.gpu, d.tried_to_allocate_gib, d.total_gib) == (Outcome.OOM, 0, 1.63, 44.56)


def test_cuda_n_of_the_free_memory_check() -> None:
    d = diagnose([FREE.format(n=2)])
    assert (d.outcome, d.phase, d.gpu) == (Outcome.OOM, Phase.STARTUP_OTHER, 2)


@pytest.mark.parametrize(
    ("line", "visible"),
    [
        ("CUDA_VISIBLE_DEVICES=4,5 python -m sglang.launch_server --model-path m --tp 2", (4, 5)),
        ("export CUDA_VISIBLE_DEVICES=1", (1,)),
        ('os.environ["CUDA_VISIBLE_DEVICES"] = "3"', (3,)),
        ("docker run -e HIP_VISIBLE_DEVICES=2,3 image", (2, 3)),
        ("CUDA_VISIBLE_DEVICES=GPU-8f3c5e1a vllm serve m", None),
    ],
)
def test_visible_devices_forms(line: str, visible: tuple[int, ...] | None) -> None:
    assert parse_visible(line) == visible


def test_visible_devices_remap_the_ordinal_to_the_card() -> None:
    lines = ['os.environ["CUDA_VISIBLE_DEVICES"] = "1"', "llm = LLM(model='facebook/opt-125m')", OOM_OLD.format(n=0)]
    assert any(isinstance(e, DeviceMap) and e.visible == (1,) for e in parse_log(lines))
    d = diagnose(lines)
    assert d.gpu == 1 and "GPU 1 (the process's GPU 0" in d.cause
    assert diagnose(["CUDA_VISIBLE_DEVICES=4,5,6,7 vllm serve m -tp 4", FREE.format(n=2)]).gpu == 6


def _sglang(args: str, tag: str, exc: str) -> list[str]:
    return [
        f"[2026-05-16 23:40:00] server_args=ServerArgs(model_path='m', {args})",
        f"[2026-05-16 23:41:00 {tag}] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 1, in event_loop_overlap',
        "    result = self.run_batch(batch)",
        exc,
    ]


def test_sglang_rank_prefix_through_the_ranks_device() -> None:
    exc = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert diagnose(_sglang("tp_size=4", "TP3", exc)).gpu == 3
    # gpu_id = base_gpu_id + (tp_rank % tp_size_per_node) * gpu_id_step
    assert diagnose(_sglang("tp_size=4, base_gpu_id=2, gpu_id_step=2", "TP1", exc)).gpu == 4
    assert diagnose(_sglang("tp_size=4, nnodes=2", "TP3", exc)).gpu == 1
    # DP attention shares one TP group (the TP tag is global); plain DP offsets each replica: not said.
    assert diagnose(_sglang("tp_size=4, dp_size=2, enable_dp_attention=True", "DP1 TP3", exc)).gpu == 3
    assert diagnose(_sglang("tp_size=2, dp_size=2", "DP1 TP1", exc)).gpu is None
    # A message that names its device wins over the prefix.
    assert diagnose(_sglang("tp_size=4", "TP3", OOM_NEW.format(n=1))).gpu == 1
    # Not a device failure: no GPU is named for an NCCL error.
    nccl = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled system error"
    assert diagnose(_sglang("tp_size=4", "TP3", nccl)).gpu is None


def test_vllm_worker_rank_is_its_cuda_device() -> None:
    lines = [
        "(Worker_TP2 pid=11) ERROR 05-16 23:42:10 [multiproc_executor.py:671] Traceback (most recent call last):",
        '(Worker_TP2 pid=11) ERROR 05-16 23:42:10 [multiproc_executor.py:671]   File "/v/vllm/v1/worker/'
        'gpu_model_runner.py", line 1, in execute_model',
        "(Worker_TP2 pid=11) ERROR 05-16 23:42:10 [multiproc_executor.py:671]     out = self.model(x)",
        "(Worker_TP2 pid=11) ERROR 05-16 23:42:10 [multiproc_executor.py:671] RuntimeError: CUDA error: out of memory",
    ]
    assert diagnose(lines).gpu == 2
    assert rank_index(Engine.VLLM, 2, None, None) == 2
    assert rank_index(Engine.VLLM, 2, 1, None) is None  # a DP replica's ranks sit after the others' GPUs


def test_ray_actor_ordinals_name_no_card() -> None:
    line = (
        "(APIServer pid=132135) (DPEngineCoreActor pid=143281) ERROR 12-23 23:04:22 [core.py:1525] "
        + OOM_NEW.format(n=0)
    )
    d = diagnose([line])
    assert d.outcome is Outcome.OOM and d.gpu is None


def test_cpu_backend_kv_space_refusal_is_a_kv_budget() -> None:
    line = (
        "(Worker pid=11928) ERROR 12-01 16:18:31 [multiproc_executor.py:1063] ValueError: Available memory on node 0 "
        "(10.27/13.59 GiB) on kv cache allocation is less than requested memory for kv (200.0 GiB). Decrease "
        "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes."
    )
    d = diagnose([line])
    assert (d.outcome, d.phase, d.free_gib, d.total_gib, d.gpu) == (
        Outcome.OOM,
        Phase.KV_CACHE_ALLOC,
        10.27,
        13.59,
        None,
    )
    assert "200.00 GiB" in d.cause and d.fixes[0].change.startswith("VLLM_CPU_KVCACHE_SPACE=8")
