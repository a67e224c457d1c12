"""FP8 block-GEMM kernel configs: whether a tuned JSON exists for this GPU, and what SGLang says about it.

SGLang looks up ``N={n},K={k},device_name={gpu},dtype=fp8_w8a8,block_shape=[128, 128].json`` per GEMM
shape the first time the kernel runs; without it, it warns and uses a generic config that the story
measured as about 6% slower. The twin looks in ``DSV4LAB_TWIN_KERNEL_CONFIG_DIR`` (the launch script's
``kernel_config_dir``) and feeds the result to both the log and the timing model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4lab.config.hardware import HardwareProfile, ModelProfile

__all__ = [
    "KernelConfigs",
    "config_file_name",
    "expected_config_names",
    "find_kernel_configs",
    "write_tuned_configs",
]

#: Where the log says SGLang looked when no directory is configured (its own configs directory).
SGLANG_CONFIG_DIR = "/usr/local/lib/python3.12/dist-packages/sglang/srt/layers/quantization/configs"

#: (N, K) of the block-FP8 GEMMs each model runs per TP rank, by model profile name.
_SHAPES: dict[str, tuple[tuple[int, int], ...]] = {
    "deepseek-v4-flash": ((1024, 4096), (4096, 1024)),
    "tiny-moe": ((256, 1024), (1024, 256)),
}


def config_file_name(n: int, k: int, hardware: HardwareProfile) -> str:
    """The file name SGLang looks up for a tuned FP8 block-GEMM config of this shape on this GPU."""
    return f"N={n},K={k},device_name={hardware.gpu_name_as_file()},dtype=fp8_w8a8,block_shape=[128, 128].json"


def expected_config_names(hardware: HardwareProfile, model: ModelProfile) -> list[str]:
    """The tuned-JSON file names the model's GEMMs look up on this GPU (what an autotune run writes)."""
    return [config_file_name(n, k, hardware) for n, k in _SHAPES.get(model.name, ((1024, 4096),))]


@dataclass(frozen=True)
class KernelConfigs:
    """Per GEMM shape: the tuned file found, or the path SGLang would have looked at."""

    found: tuple[tuple[str, bool], ...]

    @property
    def tuned(self) -> bool:
        return all(ok for _, ok in self.found)

    def log_lines(self) -> list[str]:
        out = []
        for path, ok in self.found:
            if ok:
                out.append(f"Using configuration from {path} for W8A8 Block FP8 kernel.")
            else:
                out.append(
                    "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "
                    f"Config file not found at {path}, you can create them with "
                    "https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/quantization"
                )
        return out


def find_kernel_configs(directory: Path | None, hardware: HardwareProfile, model: ModelProfile) -> KernelConfigs:
    """Which tuned JSONs exist for the model's GEMM shapes on this GPU."""
    shapes = _SHAPES.get(model.name, ((1024, 4096),))
    found: list[tuple[str, bool]] = []
    for n, k in shapes:
        name = config_file_name(n, k, hardware)
        if directory is not None and (directory / name).is_file():
            found.append((str(directory / name), True))
        else:
            base = str(directory) if directory is not None else SGLANG_CONFIG_DIR
            found.append((f"{base}/{name}", False))
    return KernelConfigs(tuple(found))


def write_tuned_configs(directory: Path, hardware: HardwareProfile, model: ModelProfile) -> Path:
    """Stand in for an FP8 autotune run on the twin: write the tuned JSONs the model's GEMMs look up.

    The contents are a plausible tuned table; the twin only checks that the files exist (and then runs
    at tuned speed), exactly as SGLang's only question is whether the file for its shape is there.
    """
    directory.mkdir(parents=True, exist_ok=True)
    table = '{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "num_warps": 4}}\n'
    for name in expected_config_names(hardware, model):
        (directory / name).write_text(table, encoding="utf-8")
    return directory
