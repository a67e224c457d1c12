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
  begin; that reading is marked as a guess;
- a capture is the draft model's when the stack runs through the draft's code: SGLang's speculative
  workers build the draft with capture switched off and capture it later in their own ``init_cuda_graphs``
  (``EAGLEDraftCudaGraphRunner``, the draft-extend runners, all in ``sglang/srt/speculative/``), and vLLM
  captures its drafter inside the target's capture pass (``_dummy_run`` -> ``drafter.dummy_run`` in
  ``vllm/v1/spec_decode/``);
- when nothing names a step, two readings remain that depend on the rest of the log or the block
  (``ambiguous_dummy_run``, ``entry_step``): see their docstrings.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4lab.logs.events import Phase

__all__ = [
    "StepEvidence",
    "allocates",
    "ambiguous_dummy_run",
    "entry_step",
    "frame_phase",
    "frame_step",
    "import_time",
    "sglang_compile_guess",
]


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
        # SGLang's draft runners (0.4.x-0.5.23): EAGLE draft decode / draft extend, the multi-layer EAGLE
        # draft-extend runner, the frozen-KV MTP runner and the UNO tree-draft runner.
        files=(
            "eagle_draft_cuda_graph",
            "eagle_draft_extend_cuda_graph",
            "draft_cuda_graph",
            "draft_extend_cuda_graph",
            "frozen_kv_mtp_cuda_graph",
            "uno_cuda_graph",
            "draft_forward_cg",
        ),
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
                # vLLM's worker calls its model runner's sampler / pooler dummy run only from
                # compile_or_warm_up_model, after the KV cache and the graphs exist (the profiling pass
                # calls the same methods from inside the runner, as self._dummy_sampler_run).
                "model_runner._dummy_sampler_run",
                "model_runner._dummy_pooler_run",
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
                "load_weights_and_postprocess",
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
        # Before any step: the command line (argparse, SGLang's ServerArgs checks, vLLM's EngineArgs and
        # serve-argument checks), the environment (SGLang's _set_envs_and_config and package-version
        # asserts), the API server's socket, distributed init and the device.
        files=("argparse.py", "server_args.py", "arg_utils.py", "cli_args.py", "rendezvous.py"),
        funcs=frozenset(
            {
                "parse_args",
                "prepare_server_args",
                "check_server_args",
                "_set_envs_and_config",
                "assert_pkg_version",
                "create_engine_config",
                "validate_parsed_serve_args",
                "setup_server",
                "create_server_socket",
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
                "execute_dummy_batch",  # vLLM: an idle data-parallel rank steps with the busy ones
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
    """The step a traceback names, whether the reading is a guess (a cut call name, not a frame), and how it
    was found (``source``, said in the diagnosis' notes) with how sure that way is (``strength``)."""

    phase: Phase
    guessed: bool
    source: str = "the traceback frames"
    strength: float = 0.9


#: Process entry functions: the outermost engine frame of a scheduler, engine-core, worker or server process.
#: A complete traceback whose innermost frame is one of these raised in the process's own setup (logging,
#: faulthandler, affinity, the environment) before any step began.
_ENTRY_FUNCS = frozenset(
    {
        "run_scheduler_process",
        "run_detokenizer_process",
        "run_data_parallel_controller_process",
        "launch_server",
        "_launch_subprocesses",
        "run_engine_core",
        "worker_main",
        "run_server",
        "run_server_worker",
        "main",
    }
)
#: vLLM's dummy forward passes: run by the profiling pass (KV sizing) and again by the warm-up after the KV
#: cache exists, so the frame alone names neither.
_DUMMY_RUNS = frozenset({"_dummy_run", "_dummy_sampler_run", "_dummy_pooler_run"})
#: Files of vLLM's spec_decode/ that are shared helpers, not a drafter's own code.
_SPEC_HELPERS = ("spec_decode/utils.py", "spec_decode/metadata.py", "spec_decode/metrics.py")


def _draft_frame(file: str, func: str) -> bool:
    """A frame of the draft model's own code: SGLang's speculative workers and draft runners, vLLM's drafters,
    the draft-worker construction, or a call to a draft class / method (``EAGLEDraftCudaGraphRunner``,
    ``draft_forward``)."""
    if file.startswith("speculative/"):
        name = file[len("speculative/") :]
        return any(p in name for p in ("worker", "draft", "graph", "_cg"))
    if file.startswith("spec_decode/"):
        return file not in _SPEC_HELPERS
    return "draft" in func.lower()


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
            if rule.phase is Phase.CUDA_GRAPH_CAPTURE and any(_draft_frame(file, func) for file, func in split):
                return StepEvidence(
                    Phase.DRAFT_CUDA_GRAPH_CAPTURE, False, "the traceback frames (a capture inside the draft's code)"
                )
            return StepEvidence(rule.phase, False)
    for f in reversed(frames):
        if f.startswith("cut:"):
            phase_cut = _cut_call(f[4:])
            if phase_cut is not None:
                return StepEvidence(phase_cut, True, "a call name cut off mid-word (a guess)", 0.45)
    return None


#: torch.compile's own frames. SGLang compiles only for CUDA graphs (--enable-torch-compile, the piecewise
#: graph), so in an SGLang traceback they point at capture; a guess, since the step's own frame is missing.
_COMPILE_FILES = ("eval_frame.py", "graph_module.py", "compile_fx.py", "convert_frame.py")


def sglang_compile_guess(frames: tuple[str, ...]) -> bool:
    """True when an SGLang traceback shows only torch.compile machinery (see ``_COMPILE_FILES``)."""
    return any(f.split(":", 1)[0] in _COMPILE_FILES for f in frames)


def ambiguous_dummy_run(frames: tuple[str, ...]) -> bool:
    """True when vLLM's dummy-run frames are all that names a step (see ``_DUMMY_RUNS``): the log's own state
    decides — after the KV cache exists it is the warm-up, before it the profiling pass."""
    return frame_step(frames) is None and any(f.rpartition(":")[2] in _DUMMY_RUNS for f in frames)


def entry_step(frames: tuple[str, ...]) -> StepEvidence | None:
    """Startup for a complete traceback whose innermost frame is a process entry function (``_ENTRY_FUNCS``):
    the exception was raised there, in the process's own setup, before any step. Only for blocks that kept
    their exception line — a cut block's innermost frame is just where the cut fell."""
    real = [f for f in frames if not f.startswith(("call:", "cut:"))]
    if real and real[-1].rpartition(":")[2] in _ENTRY_FUNCS and frame_step(frames) is None:
        return StepEvidence(Phase.STARTUP_OTHER, False, "the traceback (raised in the process's own setup)", 0.8)
    return None


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
