"""Fast twin tests without processes: argparse per release, the timing model's calibration, the memory
simulation's failure point, log shapes, settings and the GPU view's formatting."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from dsv4lab.config.hardware import hardware_profile, model_profile
from dsv4lab.config.launch_script import render_argv
from dsv4lab.config.presets import config_a, config_b, config_b_fixed
from dsv4lab.config.versions import resolve_release
from dsv4lab.model.memory import preflight
from dsv4lab.twin import logfmt
from dsv4lab.twin.args import parse_args
from dsv4lab.twin.clock import TwinClock
from dsv4lab.twin.faults import parse_fault
from dsv4lab.twin.memsim import OutOfMemory, plan_rank
from dsv4lab.twin.scheduler import Request, Scheduler, SchedulerLimits
from dsv4lab.twin.settings import TwinSettings
from dsv4lab.twin.smi import GpuRow, query
from dsv4lab.twin.timing import TimingModel
from tests.test_twin_support import KINDS

HW = hardware_profile("rtx-pro-6000-x8")
DSV4 = model_profile("deepseek-v4-flash")


def test_ambiguous_flag_exits_2_on_0_5_23(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "m", "--cuda-graph-max-bs", "16"], resolve_release("0.5.23"))
    assert exc.value.code == 2
    assert "ambiguous option: --cuda-graph-max-bs could match" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["0.4.10", "0.5.4", "0.5.16"])
def test_old_spelling_accepted_before_0_5_23(version: str) -> None:
    a = parse_args(["--model-path", "m", "--cuda-graph-max-bs", "16", "--tp", "8"], resolve_release(version))
    assert a.config.cuda_graph_max_bs == 16 and a.config.tp == 8


def test_new_spelling_only_from_0_5_16() -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "m", "--cuda-graph-max-bs-decode", "16"], resolve_release("0.5.4"))
    assert exc.value.code == 2


def test_unknown_flag_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "m", "--warp-drive"], resolve_release("0.5.23"))
    assert exc.value.code == 2


@pytest.mark.parametrize("version", ["0.4.10", "0.5.4", "0.5.16", "0.5.23"])
@pytest.mark.parametrize("preset", [config_a, config_b, config_b_fixed])
def test_rendered_argv_round_trips(version: str, preset: object) -> None:
    assert callable(preset)
    cfg = preset().replace(
        extra_args=(
            "--attention-backend",
            "flashmla",
            "--decode-log-interval",
            "10",
            "--api-key",
            "k",
            "--swa-full-tokens-ratio",
            "0.1",
            "--page-size",
            "128",
            "--skip-server-warmup",
        )
    )
    a = parse_args(render_argv(cfg, version), resolve_release(version))
    assert a.config.mem_fraction_static == cfg.mem_fraction_static
    assert a.config.cuda_graph_max_bs == cfg.cuda_graph_max_bs
    assert a.config.speculative == cfg.speculative
    assert a.decode_log_interval == 10 and a.api_key == "k" and a.skip_server_warmup


def _rate(cfg: object, c: int, ctx: int = 8100) -> float:
    p = preflight(cfg, HW, DSV4, sglang_version="0.5.23")  # type: ignore[arg-type]
    t = TimingModel(HW, DSV4, 8, p.settings.speculative, tuned_fp8=True)
    accept = DSV4.mtp_accept_mean if p.settings.speculative else 1.0
    return c * accept / t.decode_step(c, c * ctx).total_s


def test_story_calibration() -> None:
    a1, a16 = _rate(config_a(), 1), _rate(config_a(), 16)
    b1, b16 = _rate(config_b_fixed(), 1), _rate(config_b_fixed(), 16)
    assert a16 == pytest.approx(23, rel=0.10)
    assert 1.37 <= b1 / a1 <= 1.57
    assert b16 / a16 == pytest.approx(1.0, abs=0.10)


def test_an_idle_twin_starts_on_a_request_when_it_arrived_not_when_its_loop_got_to_it() -> None:
    """The twin's HTTP handlers share the scheduler's event loop, so an idle scheduler wakes only after the
    handlers queued before it (16 prompts of 8,000 tokens parsed at once: 15-75 ms, more on a busy host). A real
    server's scheduler is a process of its own: that wait must not reach the modelled GPU clock, where at time
    scale 0.02 it read as seconds and tipped a +6 % lever's A/B to +19 %."""
    timing = TimingModel(HW, DSV4, 8, None, tuned_fp8=True)
    limits = SchedulerLimits(
        max_running_requests=16,
        max_total_tokens=1_000_000,
        chunked_prefill_size=8192,
        max_graph_bs=16,
        decode_log_interval=40,
        accept_alpha=0.0,
        num_draft_steps=0,
    )
    scale = 0.3
    prefill_s = timing.prefill_s(8000)  # modelled seconds: the twin's stamps are on its own clock

    async def first_tokens(held_s: float, pace: float | None = scale) -> tuple[float, float, float]:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            release = resolve_release("0.5.23")
            log = logfmt.LogWriter(release, fd=devnull)
            sched = Scheduler(timing, limits, release, log, TwinClock(pace), seed=7)
            sched.start()
            await asyncio.sleep(0.05)  # the loop is idle, waiting for a request
            first = sched.submit(Request(prompt_tokens=8000, max_new_tokens=2))
            time.sleep(held_s)  # the event loop is held (other requests' handlers) before the scheduler runs
            second = sched.submit(Request(prompt_tokens=8000, max_new_tokens=2))
            for req in (first, second):
                while req.finished_at is None:
                    await req.events.get_all()
            assert first.first_token_at is not None and second.first_token_at is not None
            return (
                first.first_token_at - first.created,
                second.first_token_at - first.first_token_at,
                sched.stats.behind_s_max,
            )
        finally:
            os.close(devnull)

    quiet, quiet_gap, _ = asyncio.run(first_tokens(0.0))
    held, held_gap, behind = asyncio.run(first_tokens(0.9 * prefill_s * scale))
    assert quiet == pytest.approx(prefill_s, rel=0.5)
    # Started when it arrived, the first prefill ends when it would have ended in the quiet run; started when
    # the loop got to it, it would end 0.9 of a prefill later.
    assert held < quiet + 0.45 * prefill_s, (held, quiet, prefill_s)
    # The second request arrived during the first one's prefill: it is prefilled after it, not beside it.
    assert held_gap > 0.5 * prefill_s and quiet_gap > 0.5 * prefill_s, (held_gap, quiet_gap)
    assert behind >= 0.8 * prefill_s * scale  # the held loop is on record (/server_info's behind_s_max, wall s)


def test_in_virtual_time_a_held_event_loop_changes_nothing() -> None:
    """In virtual time the twin never looks at the wall clock while it works: the same two requests give the
    same modelled timeline, to the bit, whether or not the host held the event loop between them."""
    timing = TimingModel(HW, DSV4, 8, None, tuned_fp8=True)
    limits = SchedulerLimits(16, 1_000_000, 8192, 16, 40, 0.0, 0)

    async def timeline(held_s: float) -> list[tuple[float, ...]]:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            release = resolve_release("0.5.23")
            sched = Scheduler(timing, limits, release, logfmt.LogWriter(release, fd=devnull), TwinClock(None), 7)
            sched.start()
            session = sched.open_session([0.0, 0.0, 0.5], None, "held")
            reqs = [Request(prompt_tokens=8000, max_new_tokens=4) for _ in range(3)]
            for i, req in enumerate(reqs):
                sched.submit_to(session, i, req)
                time.sleep(held_s)  # the host stalls between the requests' arrivals over HTTP
            stamps: list[tuple[float, ...]] = []
            for req in reqs:
                got: list[float] = [req.created]
                while req.finished_at is None:
                    got += [t for _, _, t in await req.events.get_all()]
                stamps.append(tuple(got))
            return stamps
        finally:
            os.close(devnull)

    quiet = asyncio.run(timeline(0.0))
    assert quiet == asyncio.run(timeline(0.3))
    assert quiet[2][0] == 0.5 and len(quiet[0]) == 5  # arrived when scheduled; one stamp per token


def test_attention_share_and_untuned_penalty() -> None:
    t = TimingModel(HW, DSV4, 8, None, tuned_fp8=True)
    share = t.decode_step(16, 16 * 8100).shares()["attention"]
    assert share == pytest.approx(0.63, abs=0.04)
    slow = TimingModel(HW, DSV4, 8, None, tuned_fp8=False)
    ratio = slow.decode_step(16, 16 * 8100).total_s / t.decode_step(16, 16 * 8100).total_s
    assert ratio == pytest.approx(1.06, abs=0.005)


def test_throughput_rises_and_saturates_in_the_model() -> None:
    rates = [_rate(config_a(), c) for c in (1, 4, 16, 64, 256)]
    assert rates == sorted(rates)
    assert rates[-1] / rates[-2] < 1.5 < rates[1] / rates[0]


def _simulate(cfg: object, gpu: int) -> OutOfMemory | None:
    release = resolve_release("0.5.23")
    p = preflight(cfg, HW, DSV4, sglang_version=release)  # type: ignore[arg-type]
    plan = plan_rank(p, gpu, HW, DSV4, release)
    mem = plan.memory(seed=0)
    try:
        mem.alloc(plan.weights_gib)
        mem.alloc(plan.draft_weights_gib)
        mem.alloc(plan.kv_pool_gib)
        mem.alloc(plan.comm_gib)
        for g in plan.graphs:
            for _, tensors in g.allocations:
                for t in tensors:
                    mem.alloc(t, private_pool=True)
    except OutOfMemory as oom:
        return oom
    return None


def test_memory_simulation_fails_b_and_fits_a_and_b_fixed() -> None:
    assert all(_simulate(config_a(), g) is None for g in range(8))
    assert all(_simulate(config_b_fixed(), g) is None for g in range(8))
    oom = _simulate(config_b(), 1)
    assert oom is not None and oom.gpu == 1 and oom.free_gib < oom.tried_gib
    release = resolve_release("0.5.23")
    p = preflight(config_b(), HW, DSV4, sglang_version=release)
    assert plan_rank(p, 1, HW, DSV4, release).tightness == 0  # GPU 1 reports first


def test_log_shapes_parse() -> None:
    for v in ("0.4.10", "0.5.4", "0.5.16", "0.5.23"):
        r = resolve_release(v)
        assert KINDS["Load weight end"].search(logfmt.load_weight_end(r, 1.0, "X", "fp8", 1.0, 2.0))
        assert KINDS["KV Cache is allocated"].search(logfmt.kv_allocated(r, "torch.bfloat16", 10, 1.0))
        end = logfmt.capture_end(r, "target", "decode", [1, 2], 1.0, 1.0, 1.0)
        assert KINDS["CUDA graph end" if r.log_style == "new" else "cuda graph end"].search(end)
        draft = logfmt.capture_end(r, "draft", "extend", [1, 2], 1.0, 1.0, 1.0)
        assert KINDS["CUDA graph end" if r.log_style == "new" else "cuda graph end"].search(draft)
        assert KINDS["Decode batch"].search(logfmt.decode_batch(r, 1, 2, 0.1, 1.7, 0.7, True, 5.0, 0))
    oom = logfmt.oom_message(1, 4.8e9, 1.02e11, 1.6e8, 1e11, 9e10, 2.9e10, 2e8)
    assert KINDS["CUDA out of memory. Tried"].search(oom)
    assert logfmt.format_size(512) == "512 bytes" and logfmt.format_size(3 * 1024**3) == "3.00 GiB"


def test_rank_prefix() -> None:
    r = resolve_release("0.5.23")
    assert logfmt.rank_prefix(r, logfmt.Rank(gpu=0, tp_rank=0, tp_size=1)) == ""
    assert logfmt.rank_prefix(r, logfmt.Rank(gpu=3, tp_rank=3, tp_size=8)) == " TP3"
    assert logfmt.rank_prefix(r, logfmt.Rank(gpu=3, tp_rank=1, tp_size=2, dp_rank=1, dp_size=2)) == " DP1 TP1"


def test_settings_and_faults() -> None:
    s = TwinSettings.from_env({"DSV4LAB_TWIN_PACE": "0.1", "DSV4LAB_TWIN_FAULT": "crash_serving:3"})
    assert s.hardware.name == "rtx-pro-6000-x8" and s.pace == 0.1 and s.release.version == "0.5.23"
    assert s.fault is not None and s.fault.value == 3.0 and s.fault_named("crash_serving") is s.fault
    assert parse_fault("slow-start") is not None and parse_fault("") is None
    from dsv4lab.errors import ConfigError

    with pytest.raises(ConfigError):
        TwinSettings.from_env({"DSV4LAB_TWIN_PACE": "0"})


def test_smi_formats() -> None:
    rows = [GpuRow(0, "G", 100, 1000, 7)]
    assert query(rows, ["index", "memory.used"], ["csv", "noheader", "nounits"]) == "0, 100\n"
    assert query(rows, ["memory.used", "utilization.gpu"], ["csv"]) == (
        "memory.used [MiB], utilization.gpu [%]\n100 MiB, 7 %\n"
    )
