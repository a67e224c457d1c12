"""Continuous batching, like SGLang's scheduler loop, on an asyncio event loop in the main process.

Each iteration is either a prefill batch (waiting requests admitted up to the chunked-prefill budget, the
running-request cap and the KV pool; the first output token comes out of prefill) or one decode step over
every running request. A decode step advances each request by one token, or under speculative decoding by
an accepted length drawn from a seeded acceptance model (i.i.d. per draft position, mean ``1 + alpha``
for one draft token), and lasts what :class:`timing.TimingModel` says (times the time scale). The loop
logs SGLang's ``Prefill batch`` and ``Decode batch`` lines and keeps the numbers ``/server_info`` and
``/metrics`` report.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dsv4lab.config.versions import SGLangRelease
from dsv4lab.twin import logfmt
from dsv4lab.twin.logfmt import LogWriter
from dsv4lab.twin.timing import SpeedDrift, StepCost, TimingModel

__all__ = ["Request", "Scheduler", "SchedulerLimits", "Stats"]

_ids = itertools.count(1)

#: How far (s of wall time) the loop may fall behind its modelled clock and still catch up. While it is busy
#: every step starts when the last one was due to end, not when the loop got to run: on a loaded host the
#: process is not scheduled for 0.1-0.7 s at a time (measured here beside a real vLLM server on 2 cores),
#: and at time scale 0.02 each such stall that is not caught up costs 5-35 s of modelled GPU time, which is
#: how a lever A/B measured +63% for a +6% lever. Behind by more than this (a suspended laptop, a time scale
#: so small that the loop is processing-bound) it restarts from now rather than bursting.
MAX_CATCH_UP_S = 5.0


class TokenChannel:
    """Scheduler -> HTTP handler notifications, lighter than an asyncio.Queue on the per-token path.

    The scheduler appends ``(new tokens, finished)``; a handler that lags behind picks up several at once
    and writes them as one chunk, as SGLang's detokenizer batches output under load.
    """

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: list[tuple[int, bool]] = []
        self.waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: tuple[int, bool]) -> None:
        self.items.append(item)
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def get_all(self) -> list[tuple[int, bool]]:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        items, self.items = self.items, []
        return items


@dataclass
class Request:
    """One generation request as the scheduler tracks it."""

    prompt_tokens: int
    max_new_tokens: int
    rid: str = field(default_factory=lambda: f"{next(_ids):032x}")
    created: float = field(default_factory=time.monotonic)
    prefilled: int = 0
    generated: int = 0
    verify_steps: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    #: (new tokens, finished) notifications for the HTTP handler.
    events: TokenChannel = field(default_factory=TokenChannel)

    @property
    def context(self) -> int:
        return self.prefilled + self.generated

    @property
    def spec_accept_length(self) -> float:
        return (self.generated - 1) / self.verify_steps if self.verify_steps else 1.0


@dataclass(frozen=True)
class SchedulerLimits:
    """The limits SGLang's scheduler works within, resolved from the config: they shape batching and so the
    twin's throughput."""

    max_running_requests: int
    max_total_tokens: int
    chunked_prefill_size: int
    max_graph_bs: int  # 0 = graphs disabled
    decode_log_interval: int
    accept_alpha: float
    num_draft_steps: int


@dataclass
class Stats:
    """Counters for /server_info and /metrics."""

    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_requests_total: int = 0
    finished_total: int = 0
    last_gen_throughput: float = 0.0
    spec_accepted_total: int = 0
    spec_verify_total: int = 0
    ttft_sum: float = 0.0
    e2e_sum: float = 0.0
    busy_s: float = 0.0
    decode_steps: int = 0
    last_cuda_graph: bool = True
    #: The furthest (s of wall time) the loop has been behind its modelled clock: how much the host stalled it.
    behind_s_max: float = 0.0

    @property
    def avg_spec_accept_length(self) -> float:
        return self.spec_accepted_total / self.spec_verify_total if self.spec_verify_total else 0.0


class Scheduler:
    """The batching loop. ``submit`` a request, then read its ``events`` queue."""

    def __init__(
        self,
        timing: TimingModel,
        limits: SchedulerLimits,
        release: SGLangRelease,
        log: LogWriter,
        time_scale: float,
        seed: int,
        on_step: Callable[[float, StepCost | None, float], None] | None = None,
    ) -> None:
        self.timing = timing
        self.limits = limits
        self.release = release
        self.log = log
        self.scale = time_scale
        self.rng = random.Random(seed)
        tc = timing.hardware.timing
        self.drift = SpeedDrift(tc.speed_drift_cv, tc.speed_drift_tau_s, seed + 1)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = Stats()
        self.on_step = on_step
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._since_log_tokens = 0
        self._since_log_t = time.monotonic()
        self._since_log_accepted = 0
        self._since_log_verify = 0
        self.spec = timing.speculative is not None
        self._last_end: float | None = None

    # -- public ------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def submit(self, req: Request) -> Request:
        self.waiting.append(req)
        self.stats.num_requests_total += 1
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        req.aborted = True

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def used_tokens(self) -> int:
        return sum(r.context for r in self.running) + sum(r.prefilled for r in self.waiting)

    @property
    def token_usage(self) -> float:
        return self.used_tokens / max(self.limits.max_total_tokens, 1)

    # -- loop -----------------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_aborted()
            if not self.waiting and not self.running:
                self._wake.clear()
                self._last_end = None
                await self._wake.wait()
                continue
            now = loop.time()
            # When the modelled clock says this step starts. Busy back to back: when the last one was due to end,
            # so neither the event loop's wake-up lateness nor a stall of the whole process accumulates. Idle until
            # a request came: when the first waiting one arrived (waiting is in arrival order), with only what had
            # arrived by then. This loop wakes only after the event loop has run the handlers queued before it: a
            # benchmark's 16 prompts of 8,000 tokens arriving at once took 25-110 ms to parse, and the wake came
            # up to 75 ms after the first arrival (beside a browser test on 2 cores; hundreds of ms on a busier
            # host), at time scale 0.02 1-4 s of GPU time a real server, whose scheduler is a process of its own,
            # would not lose.
            last_end = self._last_end
            due = self.waiting[0].created if last_end is None else last_end
            behind = now - due
            self.stats.behind_s_max = max(self.stats.behind_s_max, behind)
            start, arrived_by = now, math.inf
            if behind < MAX_CATCH_UP_S:
                start = due
                if last_end is None:
                    arrived_by = due
            batch = self._admit(arrived_by)
            if batch:
                # A GPU cannot begin a prefill before its request arrived: catching up stops at the newest.
                start = max(start, max(req.created for req, _ in batch))
                modelled = self.timing.prefill_s(sum(n for _, n in batch))
                duration = modelled * self.drift.factor(modelled) * self.scale
                self._last_end = start + duration
                await asyncio.sleep(max(0.0, start + duration - loop.time()))
                self._finish_prefill(batch, duration)
                self.stats.busy_s += duration
                if self.on_step:
                    self.on_step(start, None, duration)
                continue
            cost = self._decode_cost()
            duration = cost.total_s * self.drift.factor(cost.total_s) * self.scale
            self._last_end = start + duration
            await asyncio.sleep(max(0.0, start + duration - loop.time()))
            self._advance(duration)
            self.stats.busy_s += duration
            if self.on_step:
                self.on_step(start, cost, duration)

    def _drop_aborted(self) -> None:
        if any(r.aborted for r in self.running):
            self.running = [r for r in self.running if not r.aborted]
        if any(r.aborted for r in self.waiting):
            self.waiting = deque(r for r in self.waiting if not r.aborted)

    def _admit(self, arrived_by: float = math.inf) -> list[tuple[Request, int]]:
        """Requests (and how many of their prompt tokens) in the next prefill batch: those that had arrived by
        ``arrived_by``, the step's start on the modelled clock."""
        budget = self.limits.chunked_prefill_size
        free_tokens = self.limits.max_total_tokens - self.used_tokens
        batch: list[tuple[Request, int]] = []
        slots = self.limits.max_running_requests - len(self.running)
        for req in self.waiting:
            if budget <= 0 or len(batch) >= slots or req.created > arrived_by:
                break
            need = req.prompt_tokens - req.prefilled
            if req.prefilled == 0 and req.prompt_tokens + req.max_new_tokens > free_tokens:
                break  # no room in the KV pool yet: wait for requests to finish
            take = min(need, budget)
            batch.append((req, take))
            budget -= take
            free_tokens -= take
        return batch

    def _finish_prefill(self, batch: list[tuple[Request, int]], duration: float) -> None:
        now = time.monotonic()
        new_seq = 0
        new_tokens = 0
        for req, take in batch:
            req.prefilled += take
            new_tokens += take
            if req.prefilled == take:
                new_seq += 1
            if req.prefilled < req.prompt_tokens:
                continue  # chunked: the rest next time
            self.waiting.remove(req)
            self.stats.prompt_tokens_total += req.prompt_tokens
            if req.aborted:
                continue
            req.generated = 1
            req.first_token_at = now
            self.stats.generation_tokens_total += 1
            self.stats.ttft_sum += now - req.created
            if req.max_new_tokens <= 1:
                self._finish(req, now)
                req.events.put_nowait((1, True))
            else:
                self.running.append(req)
                req.events.put_nowait((1, False))
        pending = sum(r.prompt_tokens - r.prefilled for r in self.waiting)
        self.log.log(
            logfmt.prefill_batch(
                self.release,
                new_seq,
                new_tokens,
                0,
                self.token_usage,
                len(self.running),
                len(self.waiting),
                pending,
                new_tokens / duration if duration > 0 else 0.0,
            )
        )

    def _decode_cost(self) -> StepCost:
        b = len(self.running)
        graph = 0 < b <= self.limits.max_graph_bs
        self.stats.last_cuda_graph = graph
        return self.timing.decode_step(b, sum(r.context for r in self.running), cuda_graph=graph)

    def _accepted(self) -> int:
        n = 1
        for _ in range(self.limits.num_draft_steps):
            if self.rng.random() < self.limits.accept_alpha:
                n += 1
            else:
                break
        return n

    def _advance(self, duration: float) -> None:
        now = time.monotonic()
        produced = 0
        still: list[Request] = []
        for req in self.running:
            n = self._accepted() if self.spec else 1
            n = min(n, req.max_new_tokens - req.generated)
            req.generated += n
            produced += n
            if self.spec:
                req.verify_steps += 1
                self._since_log_accepted += n
                self._since_log_verify += 1
            done = req.generated >= req.max_new_tokens
            if done:
                self._finish(req, now)
            else:
                still.append(req)
            req.events.put_nowait((n, done))
        self.running = still
        self.stats.generation_tokens_total += produced
        self.stats.decode_steps += 1
        self._since_log_tokens += produced
        if self.stats.decode_steps % self.limits.decode_log_interval == 0:
            self._log_decode(now)

    def _finish(self, req: Request, now: float) -> None:
        req.finished_at = now
        self.stats.finished_total += 1
        self.stats.e2e_sum += now - req.created
        if self.spec:
            self.stats.spec_accepted_total += req.generated - 1
            self.stats.spec_verify_total += req.verify_steps

    def _log_decode(self, now: float) -> None:
        elapsed = now - self._since_log_t
        gen = self._since_log_tokens / elapsed if elapsed > 0 else 0.0
        self.stats.last_gen_throughput = gen
        accept_len = accept_rate = None
        if self.spec and self._since_log_verify:
            accept_len = self._since_log_accepted / self._since_log_verify
            accept_rate = (accept_len - 1) / max(self.limits.num_draft_steps, 1)
        self.log.log(
            logfmt.decode_batch(
                self.release,
                len(self.running),
                self.used_tokens,
                self.token_usage,
                accept_len,
                accept_rate,
                self.stats.last_cuda_graph,
                gen,
                len(self.waiting),
            )
        )
        self._since_log_tokens = 0
        self._since_log_t = now
        self._since_log_accepted = 0
        self._since_log_verify = 0
