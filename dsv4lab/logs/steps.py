"""Which startup step a traceback was in, read from its frames (``file:function``, innermost last).

Pasted logs often lose the exception line (a thread excerpt, a cut terminal), and then the frames are the
only record of where the server was. Both engines name their steps in function names — SGLang's
``init_memory_pool`` / ``init_cuda_graphs`` / ``event_loop_*``, vLLM's ``load_model`` /
``determine_available_memory`` / ``capture_model`` / ``execute_model`` — so a step is told by the frames
it contains, whatever order the runners nest in:

- the most specific step wins (draft capture > capture > warmup > KV sizing > weights > setup), because
  a capture runs forward passes that look like serving;
- a frame that runs in two steps names neither: vLLM's ``_dummy_sampler_run`` is called from the
  profiling pass and from the post-capture warmup, so only its caller decides;
- wrappers that cover several steps (vLLM's ``EngineCore._initialize_kv_caches``, SGLang's
  ``ModelRunner.initialize``) name no step by themselves;
- a code line cut mid-name (``self.init_cu``) still narrows the call to the known step functions it can
  begin; that reading is marked as a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4lab.logs.events import Phase

__all__ = ["StepEvidence", "allocates", "frame_phase", "frame_step", "import_time", "sglang_compile_guess"]


@dataclass(frozen=True)
class _Rule:
    """Frames of one step: file-name parts, exact function names, and function-name parts."""

    phase: Phase
    files: tuple[str, ...] = ()
    funcs: frozenset[str] = frozenset()
    func_parts: tuple[str, ...] = ()

    def matches(self, file: str, func: str) -> bool:
        return func in self.funcs or any(p in file for p in self.files) or any(p in func for p in self.func_parts)


# By precedence: the first rule with a matching frame wins. A frame's code line counts as a frame of the
# function it calls ("call:name"), so a traceback cut right after that line still names the step.
_RULES: tuple[_Rule, ...] = (
    _Rule(
        Phase.DRAFT_CUDA_GRAPH_CAPTURE,
        files=("eagle_draft_cuda_graph", "eagle_draft_extend_cuda_graph", "draft_cuda_graph"),
    ),
    _Rule(
        Phase.CUDA_GRAPH_CAPTURE,
        files=(
            "cuda_graph_runner",
            "cuda_graph_backend",
            "cuda_graph_setup",
            "piecewise_cuda_graph",
            "cudagraph_utils",
            "compilation/cuda_graph",  # vLLM's CUDAGraphWrapper
        ),
        funcs=frozenset(
            {
                "init_cuda_graphs",
                "init_device_graphs",
                "capture_model",
                "capture_one_batch_size",
                "capture_one",
                "capture",
                "_capture_cudagraphs",
                "capture_cudagraph",
                "graph_capture",
                "capture_begin",  # torch.cuda.graph
                "capture_end",
                "register_graph_buffers",  # custom all-reduce registers the captured graphs' buffers
            }
        ),
    ),
    _Rule(
        Phase.WARMUP,
        funcs=frozenset(
            {
                "_execute_server_warmup",
                "_wait_and_warmup",
                "warmup_model",
                "_warm_up_model",
                "_warmup",
                "compile_or_warm_up_model",
                "kernel_warmup",
            }
        ),
    ),
    _Rule(
        Phase.KV_CACHE_ALLOC,
        # vLLM compiles the model in the profiling pass (backends / compiler_interface); its other compilation
        # files wrap model construction (decorators) or graphs (cuda_graph), so they name other steps.
        files=(
            "kv_cache_configurator",
            "pool_configurator",
            "kv_cache_utils",
            "compilation/backends",
            "compilation/compiler_interface",
        ),
        funcs=frozenset(
            {
                "init_memory_pool",
                "profile_max_num_token",
                "initialize_kv_cache",
                "initialize_from_config",
                "determine_available_memory",
                "determine_num_available_blocks",
                "profile_run",
                "get_kv_cache_config",
                "get_kv_cache_configs",
                "check_enough_kv_cache_memory",
                "_check_enough_kv_cache_memory",
                "raise_if_cache_size_invalid",
                "initialize_cache",
                "init_cache_engine",
                "_init_cache",
                "profile_cudagraph_memory",
            }
        ),
    ),
    _Rule(
        Phase.WEIGHT_LOADING,
        files=("weight_utils", "model_loader", "safetensors"),
        funcs=frozenset(
            {
                "load_model",
                "load_weights",
                "download_weights",
                "process_weights_after_loading",
                "_initialize_model",
                "initialize_model",
                "build_model",
                "get_model",
                "create_weights",  # a layer allocating its parameters: the model is being built
                "make_layers",
            }
        ),
        func_parts=("repack",),
    ),
    _Rule(
        Phase.STARTUP_OTHER,
        funcs=frozenset(
            {
                "init_torch_distributed",
                "initialize_model_parallel",
                "init_distributed_environment",
                "init_process_group",
                "init_model_parallel_group",
                "ncclCommInitRank",
                "init_parallel",
                "init_worker_distributed_environment",
                "init_device",
                "request_memory",
                "get_open_port",
            }
        ),
    ),
    _Rule(
        Phase.SERVING,
        funcs=frozenset(
            {
                "run_batch",
                "process_batch_result",
                "forward_thread_func",
                "execute_model",
                "run_busy_loop",
                "_process_engine_step",
                "step_with_batch_queue",
                "engine_step",
                "run_engine_loop",
                "step_async",
                "output_handler",
                "exposed_step",
                "forward_step",
                "forward_fill_batch",
                "forward_decode_batch",
                "loop_for_forward",
                "generate_request",
            }
        ),
        func_parts=("event_loop_",),
    ),
)

#: Step functions a cut code line may be the start of (``self.init_cu`` -> ``init_cuda_graphs``).
_STEP_CALLS: tuple[tuple[str, Phase], ...] = (
    ("init_cuda_graphs", Phase.CUDA_GRAPH_CAPTURE),
    ("init_device_graphs", Phase.CUDA_GRAPH_CAPTURE),
    ("capture_model", Phase.CUDA_GRAPH_CAPTURE),
    ("init_memory_pool", Phase.KV_CACHE_ALLOC),
    ("profile_max_num_token", Phase.KV_CACHE_ALLOC),
    ("determine_available_memory", Phase.KV_CACHE_ALLOC),
    ("determine_num_available_blocks", Phase.KV_CACHE_ALLOC),
    ("profile_run", Phase.KV_CACHE_ALLOC),
    ("load_model", Phase.WEIGHT_LOADING),
    ("init_torch_distributed", Phase.STARTUP_OTHER),
    ("compile_or_warm_up_model", Phase.WARMUP),
)
_MIN_CUT = 5

#: Code that allocates GPU memory: a traceback cut right inside one is an allocation that failed.
_ALLOCATORS = ("torch.empty", "torch.zeros", "torch.ones", "torch.full", ".cuda(", "create_weights", "empty_like")


@dataclass(frozen=True)
class StepEvidence:
    """The step a traceback names, and whether the reading is a guess (a cut call name, not a frame)."""

    phase: Phase
    guessed: bool


def _cut_call(name: str) -> Phase | None:
    if len(name) < _MIN_CUT:
        return None
    hits = {phase for call, phase in _STEP_CALLS if call.startswith(name)}
    return hits.pop() if len(hits) == 1 else None


def frame_step(frames: tuple[str, ...]) -> StepEvidence | None:
    """The step named by the frames; a ``cut:`` frame (a call cut mid-name) only when nothing else names one."""
    split = [f.rpartition(":")[::2] for f in frames if not f.startswith("cut:")]
    for rule in _RULES:
        if any(rule.matches(file, func) for file, func in split):
            return StepEvidence(rule.phase, False)
    for f in reversed(frames):
        if f.startswith("cut:"):
            phase_cut = _cut_call(f[4:])
            if phase_cut is not None:
                return StepEvidence(phase_cut, True)
    return None


#: torch.compile's own frames. SGLang compiles only for CUDA graphs (--enable-torch-compile, the piecewise
#: graph), so in an SGLang traceback they point at capture; a guess, since the step's own frame is missing.
_COMPILE_FILES = ("eval_frame.py", "graph_module.py", "compile_fx.py", "convert_frame.py")


def sglang_compile_guess(frames: tuple[str, ...]) -> bool:
    """True when an SGLang traceback shows only torch.compile machinery (see ``_COMPILE_FILES``)."""
    return any(f.split(":", 1)[0] in _COMPILE_FILES for f in frames)


def frame_phase(frames: tuple[str, ...]) -> Phase | None:
    """The step a traceback was in (see the module docstring); None when no frame names one."""
    ev = frame_step(frames)
    return ev.phase if ev is not None else None


def import_time(frames: tuple[str, ...]) -> bool:
    """True for a traceback of module imports only (``runpy`` / ``<module>`` frames): it died importing."""
    real = [f for f in frames if not f.startswith(("call:", "cut:"))]
    return bool(real) and all(f.endswith(":<module>") or f.startswith("runpy.py:") for f in real)


def allocates(lines: tuple[str, ...]) -> bool:
    """True when the innermost code of a (cut) traceback allocates GPU memory (its last few code lines)."""
    return any(a in line for line in lines[-8:] if "File " not in line for a in _ALLOCATORS)
