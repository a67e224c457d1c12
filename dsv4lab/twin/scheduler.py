"""Continuous batching, like SGLang's scheduler loop, as a discrete-event simulation on the twin's clock.

Each iteration is either a prefill batch (waiting requests admitted up to the chunked-prefill budget, the
running-request cap and the KV pool; the first output token comes out of prefill) or one decode step over
every running request. A decode step advances each request by one token, or under speculative decoding by
an accepted length drawn from a seeded acceptance model (i.i.d. per draft position, mean ``1 + alpha``
for one draft token), and lasts what :class:`timing.TimingModel` says.

Time is the scheduler's own (:mod:`.clock`): ``t`` is modelled seconds, and a step moves it by the step's
modelled duration. In virtual time (the default) that is all a step does: the loop runs as fast as the host
computes, so every arrival, token and finish lands at the same modelled moment on any machine under any
load. Requests of an announced session (:mod:`.sessions`) arrive when the session says; the loop never runs
a step past an arrival it has not received yet. Paced, the loop also sleeps ``pace`` x each duration on the
wall clock, for what needs real time on the wire. Every token the loop hands to the HTTP handlers carries
the modelled moment it was produced at, which the handlers put in each chunk for the client.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dsv4lab.config.versions import SGLangRelease
from dsv4lab.twin import logfmt
from dsv4lab.twin.clock import TwinClock
from dsv4lab.twin.logfmt import LogWriter
from dsv4lab.twin.sessions import REJECTED, SESSION_WAIT_S, Session
from dsv4lab.twin.timing import SpeedDrift, StepCost, TimingModel

__all__ = ["Request", "Scheduler", "SchedulerLimits", "Stats", "Token"]

_ids = itertools.count(1)

#: How far (wall seconds) a paced loop may fall behind its modelled clock and still catch up. Behind by more
#: (a suspended laptop, a pace so small that the loop is processing-bound) it restarts from now rather than
#: bursting. Virtual time has no such limit: it never looks at the wall.
MAX_CATCH_UP_S = 5.0

#: One notification to the HTTP handler: new tokens, whether the request is finished, and the modelled
#: moment (scheduler seconds) they were produced at.
Token = tuple[int, bool, float]


class TokenChannel:
    """Scheduler -> HTTP handler notifications, lighter than an asyncio.Queue on the per-token path."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: list[Token] = []
        self.waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Token) -> None:
        self.items.append(item)
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def get_all(self) -> list[Token]:
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
    """One generation request as the scheduler tracks it (times are scheduler seconds)."""

    prompt_tokens: int
    max_new_tokens: int
    rid: str = field(default_factory=lambda: f"{next(_ids):032x}")
    created: float = 0.0
    prefilled: int = 0
    generated: int = 0
    verify_steps: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    #: The announced session this request belongs to (its stamps are relative to the session's start).
    session: Session | None = None
    #: (new tokens, finished, when) notifications for the HTTP handler.
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
    """Counters for /server_info and /metrics (times in modelled seconds)."""

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
    #: Paced only: the furthest (wall seconds) the loop has been behind its modelled clock.
    behind_s_max: float = 0.0
    #: Sessions dropped because their client stopped sending (see :data:`.sessions.SESSION_WAIT_S`).
    sessions_dropped: int = 0

    @property
    def avg_spec_accept_length(self) -> float:
        return self.spec_accepted_total / self.spec_verify_total if self.spec_verify_total else 0.0


class Scheduler:
    """The batching loop. ``submit`` a request (or announce a session and ``submit`` into it), then read the
    request's ``events``."""

    def __init__(
        self,
        timing: TimingModel,
        limits: SchedulerLimits,
        release: SGLangRelease,
        log: LogWriter,
        clock: TwinClock,
        seed: int,
        on_step: Callable[[float, StepCost | None, float], None] | None = None,
    ) -> None:
        self.timing = timing
        self.limits = limits
        self.release = release
        self.log = log
        self.clock = clock
        self.seed = seed
        self._reseed("")
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: Requests outside any session, not yet seen by the loop (virtual time: they arrive when it looks).
        self.inbox: list[Request] = []
        self.sessions: dict[str, Session] = {}
        self.stats = Stats()
        self.on_step = on_step
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Modelled seconds: the loop's time ``t`` and the clock's reading ``base`` that ``t`` counts from.
        self.t = 0.0
        self.base = clock.now()
        self._since_log_tokens = 0
        self._since_log_t = 0.0
        self._since_log_accepted = 0
        self._since_log_verify = 0
        self.spec = timing.speculative is not None
        self._last_end: float | None = None

    def _reseed(self, key: str) -> None:
        """Fresh random streams (acceptance, speed drift) for a run: named by its session's key, so one run
        draws the same numbers whatever ran before it."""
        tc = self.timing.hardware.timing
        self.rng = random.Random(f"{self.seed}|{key}|accept")
        self.drift = SpeedDrift(tc.speed_drift_cv, tc.speed_drift_tau_s, f"{self.seed}|{key}|drift")

    # -- public ------------------------------------------------------------------------------------------

    def start(self) -> None:
        loop = self._loop_virtual() if self.clock.virtual else self._loop_paced()
        self._task = asyncio.get_running_loop().create_task(loop)

    @property
    def now(self) -> float:
        """The loop's modelled time (scheduler seconds)."""
        return self.t if self.clock.virtual else self.clock.now() - self.base

    def submit(self, req: Request) -> Request:
        """A request outside any session: it arrives now (virtual time: when the loop next looks)."""
        self.stats.num_requests_total += 1
        if self.clock.virtual:
            self.inbox.append(req)
        else:
            req.created = self.now
            self.waiting.append(req)
        self._wake.set()
        return req

    def open_session(self, schedule: list[object], cap: object, key: object) -> Session:
        """Announce a client's run. An idle twin starts the session's timeline at 0 with random streams of
        its own, so the run's figures do not depend on anything before it."""
        idle = not self.busy
        if idle and self.clock.virtual:
            self.base, self.t, self._since_log_t = self.clock.now(), 0.0, 0.0
        if idle:
            self._reseed(str(key or ""))
        session = Session.announce(schedule, cap, key, self.now)
        self.sessions[session.sid] = session
        self._wake.set()
        return session

    def close_session(self, sid: str) -> bool:
        session = self.sessions.pop(sid, None)
        if session is None:
            return False
        session.closed = True
        session.waiter.set()
        self._wake.set()
        return True

    def submit_to(self, session: Session, seq: int, req: Request | None) -> None:
        """Request ``seq`` of ``session`` was received (None: refused before scheduling; its slot frees)."""
        if req is not None:
            self.stats.num_requests_total += 1
            req.session = session
            if not self.clock.virtual:
                req.created = self.now
                self.waiting.append(req)
                self._wake.set()
                return
        session.receive(seq, req if req is not None else REJECTED)
        self._wake.set()

    def abort(self, req: Request) -> None:
        req.aborted = True
        self._wake.set()

    @property
    def busy(self) -> bool:
        """Work in hand, or (virtual time) a session with requests still to come."""
        if self.waiting or self.running or self.inbox:
            return True
        return self.clock.virtual and any(not s.done for s in self.sessions.values())

    @property
    def used_tokens(self) -> int:
        return sum(r.context for r in self.running) + sum(r.prefilled for r in self.waiting)

    @property
    def token_usage(self) -> float:
        return self.used_tokens / max(self.limits.max_total_tokens, 1)

    # -- virtual time ------------------------------------------------------------------------------------

    async def _loop_virtual(self) -> None:
        while True:
            self._drop_aborted()
            self._take_inbox()
            if not self.waiting and not self.running:
                nxt = self._next_arrival()
                if nxt is None:
                    await self._idle()
                    continue
                self.t = max(self.t, nxt)
            if not await self._arrivals_until(self.t):
                continue
            batch = self._admit()
            cost: StepCost | None = None
            if batch:
                modelled = self.timing.prefill_s(sum(n for _, n in batch))
                duration = modelled * self.drift.factor(modelled)
                start, self.t = self.t, self.t + duration
                self._finish_prefill(batch, duration)
            elif self.running:
                cost = self._decode_cost()
                duration = cost.total_s * self.drift.factor(cost.total_s)
                start, self.t = self.t, self.t + duration
                self._advance(duration)
            else:
                self._refuse_unfit()
                continue
            self.stats.busy_s += duration
            self.clock.advance_to(self.base + self.t)
            if self.on_step:
                self.on_step(self.base + start, cost, duration)
            await asyncio.sleep(0)  # the handlers write what this step produced

    async def _idle(self) -> None:
        """Nothing to do: the clock follows the wall until something arrives."""
        self.clock.idle()
        self._wake.clear()
        if not self._has_work():
            await self._wake.wait()
        now = self.clock.busy()
        if any(not s.done for s in self.sessions.values()):
            self.base = now - self.t  # a session's timeline goes on where it was
        else:
            self.base, self.t, self._since_log_t = now, 0.0, 0.0

    def _refuse_unfit(self) -> None:
        """The first waiting request cannot be admitted with nothing running to make room: it never fits the
        KV pool, so it ends with what it has (nothing), rather than holding the queue for ever."""
        req = self.waiting.popleft()
        self.log.log(f"dsv4lab twin: request {req.rid} needs more KV cache than the pool holds; aborted")
        req.aborted = True
        self._finish(req, self.t)
        req.events.put_nowait((0, True, self.t))

    def _has_work(self) -> bool:
        if self.inbox or self.waiting or self.running:
            return True
        return any(s.next_arrival() is not None and s.next_seq in s.received for s in self.sessions.values())

    def _take_inbox(self) -> None:
        for req in self.inbox:
            req.created = self.t
            self.waiting.append(req)
        self.inbox.clear()

    def _next_arrival(self) -> float | None:
        times = [t for s in self.sessions.values() if (t := s.next_arrival()) is not None]
        return min(times, default=None)

    async def _arrivals_until(self, t: float) -> bool:
        """Every session request due by ``t`` joins the queue; True when none was missing. A missing one is
        waited for (wall clock) and False returned, so the caller looks at the queue again."""
        for session in list(self.sessions.values()):
            while (due := session.next_arrival()) is not None and due <= t:
                item = session.take()
                if item is None:
                    if not await session.wait_for_next(SESSION_WAIT_S):
                        self.log.log(f"dsv4lab twin: session {session.sid} sent nothing for {SESSION_WAIT_S:g} s")
                        self.stats.sessions_dropped += 1
                        self.close_session(session.sid)
                    return False
                if item is REJECTED or not isinstance(item, Request):
                    session.slot_freed(due)
                    continue
                item.created = due
                self._enqueue(item)
            if session.done and not any(r.session is session for r in (*self.waiting, *self.running)):
                self.sessions.pop(session.sid, None)
        return True

    def _enqueue(self, req: Request) -> None:
        """Into the waiting queue in arrival order (sessions interleave)."""
        if not self.waiting or self.waiting[-1].created <= req.created:
            self.waiting.append(req)
            return
        keys = [r.created for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(keys, req.created), req)

    # -- paced ---------------------------------------------------------------------------------------------

    async def _loop_paced(self) -> None:
        pace = self.clock.pace or 1.0
        while True:
            self._drop_aborted()
            if not self.waiting and not self.running:
                self._wake.clear()
                self._last_end = None
                await self._wake.wait()
                continue
            now = self.now
            # Busy back to back, a step starts when the last one was due to end, so neither the event loop's
            # wake-up lateness nor a short stall of the process accumulates; idle, when the first waiting
            # request arrived, with only what had arrived by then.
            last_end = self._last_end
            due = self.waiting[0].created if last_end is None else last_end
            behind_wall = (now - due) * pace
            self.stats.behind_s_max = max(self.stats.behind_s_max, behind_wall)
            start, arrived_by = now, float("inf")
            if behind_wall < MAX_CATCH_UP_S:
                start = due
                if last_end is None:
                    arrived_by = due
            batch = self._admit(arrived_by)
            cost: StepCost | None = None
            if batch:
                start = max(start, max(req.created for req, _ in batch))
                modelled = self.timing.prefill_s(sum(n for _, n in batch))
                duration = modelled * self.drift.factor(modelled)
            else:
                cost = self._decode_cost()
                duration = cost.total_s * self.drift.factor(cost.total_s)
            self._last_end = self.t = start + duration
            await asyncio.sleep(max(0.0, (start + duration - self.now) * pace))
            if batch:
                self._finish_prefill(batch, duration)
            else:
                self._advance(duration)
            self.stats.busy_s += duration
            if self.on_step:
                self.on_step(self.base + start, cost, duration)

    # -- steps -----------------------------------------------------------------------------------------------

    def _drop_aborted(self) -> None:
        for req in (*self.running, *self.waiting):
            if req.aborted and req.session is not None and req.finished_at is None:
                req.finished_at = self.t
                req.session.slot_freed(self.t)
        if any(r.aborted for r in self.running):
            self.running = [r for r in self.running if not r.aborted]
        if any(r.aborted for r in self.waiting):
            self.waiting = deque(r for r in self.waiting if not r.aborted)

    def _admit(self, arrived_by: float = float("inf")) -> list[tuple[Request, int]]:
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
        now = self.t
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
                req.events.put_nowait((1, True, now))
            else:
                self.running.append(req)
                req.events.put_nowait((1, False, now))
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
        now = self.t
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
            req.events.put_nowait((n, done, now))
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
        if req.session is not None:
            req.session.slot_freed(now)
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
