"""Blocking calls that Stop can stop: a coroutine on its own loop in a worker thread, cancelled on Ctrl-C.

Jupyter's kernel already runs an event loop, so a blocking benchmark has to run its loop in another
thread. Waiting for that thread inside ``with ThreadPoolExecutor()`` is what made the Stop button wait
for the whole benchmark: the executor's exit joins the worker. Here the caller's thread waits in short
joins (a KeyboardInterrupt lands between them), and on interrupt cancels the coroutine's task on its
own loop. The coroutine turns the cancellation into its partial result (a benchmark returns what it
measured, marked partial); that result rides on :class:`~dsv4lab.errors.Interrupted`, so the cell stops
as the user asked and nothing measured is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Protocol, TypeVar

from dsv4lab.errors import Interrupted
from dsv4lab.progress import Progress

__all__ = ["CANCEL_WAIT_S", "run_blocking", "stoppable"]

T = TypeVar("T")
P = ParamSpec("P")

#: How long an interrupted call waits for its coroutine to wind down and hand back a partial result.
CANCEL_WAIT_S = 1.0
#: How often the waiting thread wakes to draw progress and to let a KeyboardInterrupt in.
_TICK_S = 0.1


def run_blocking(
    coro: Coroutine[Any, Any, T],
    *,
    what: str,
    on_tick: Callable[[], None] | None = None,
    cancel_wait_s: float = CANCEL_WAIT_S,
) -> T:
    """Run ``coro`` to completion and return its value; on KeyboardInterrupt cancel it and raise
    :class:`Interrupted` carrying whatever it returned after the cancellation (or ``None``).

    ``on_tick`` runs in the calling thread about every 0.1 s (to draw progress made in the worker).
    """
    loop = asyncio.new_event_loop()
    box: dict[str, Any] = {}
    ready = threading.Event()
    # Waiting on an Event, not on Thread.join(): a KeyboardInterrupt landing inside join() can leave the
    # Thread object marked as finished while it still runs (CPython gh-90882), and the partial result
    # would be read before the worker wrote it.
    done = threading.Event()
    task_ref: list[asyncio.Task[T]] = []

    def worker() -> None:
        asyncio.set_event_loop(loop)
        try:
            task = loop.create_task(coro)
            task_ref.append(task)
            ready.set()
            box["value"] = loop.run_until_complete(task)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc
        finally:
            ready.set()
            with contextlib.suppress(Exception):
                _cancel_leftovers(loop)
            loop.close()
            done.set()

    thread = threading.Thread(target=worker, name=f"dsv4lab-{what}", daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        while not done.wait(_TICK_S):
            if on_tick is not None:
                on_tick()
    except KeyboardInterrupt:
        ready.wait(cancel_wait_s)
        if task_ref and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between: nothing left to cancel
                loop.call_soon_threadsafe(task_ref[0].cancel)
        done.wait(cancel_wait_s)
        if on_tick is not None:
            with contextlib.suppress(Exception):
                on_tick()
        raise Interrupted(what, box.get("value"), elapsed_s=time.monotonic() - started) from None
    if on_tick is not None:
        on_tick()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel tasks the coroutine left behind and let them finish, as ``asyncio.run`` does."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


class _Decorator(Protocol):
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, T]], /) -> Callable[P, T]: ...


def stoppable(
    *,
    title: Callable[[inspect.BoundArguments], str],
    done: Callable[[Progress, Any], None],
    stopped: Callable[[Progress, Any, inspect.BoundArguments], Interrupted],
) -> _Decorator:
    """The blocking form of a coroutine function, with the same signature (one signature per operation).

    The coroutine takes ``progress: bool | Progress``; the blocking form draws a progress line from the
    caller's thread (a worker's updates are drawn at its ticks, so they land in the right notebook cell), runs
    the coroutine with :func:`run_blocking`, and finishes the line with ``done(progress, result)``. On the
    user's Stop the coroutine hands back what it made so far (its return value after the cancellation, or
    what it kept on ``progress.kept`` as it went when it is slow to wind down), and
    ``stopped(progress, partial, arguments)`` turns that into the :class:`Interrupted` to raise. A progress
    passed in by the caller is the caller's to finish. ``title`` names the call from its bound arguments.
    """

    def decorate(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def blocking_form(*args: P.args, **kwargs: P.kwargs) -> T:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given = bound.arguments.get("progress", True)
            own = not isinstance(given, Progress)
            reporter = given if isinstance(given, Progress) else Progress(title(bound), enabled=bool(given))
            bound.arguments["progress"] = reporter
            try:
                result = run_blocking(fn(*bound.args, **bound.kwargs), what=title(bound), on_tick=reporter.tick)
            except Interrupted as exc:
                # The coroutine's own partial result (with the run the Stop cut) when it wound down in time,
                # else what it had kept on its progress as it went (the finished runs).
                partial = exc.partial if exc.partial is not None else reporter.kept
                raise stopped(reporter, partial, bound) from None
            except BaseException as exc:
                if own:
                    reporter.finish(f"failed: {exc}", "fail")
                    reporter.tick()
                raise
            if own:
                done(reporter, result)
                reporter.tick()
            return result

        blocking_form.__doc__ = (
            f"Blocking form of :func:`{fn.__name__}` (the same arguments; works in a notebook cell): Stop gives "
            "control back within about a second and raises :class:`~dsv4lab.errors.Interrupted` carrying what "
            f"was measured.\n\n{inspect.getdoc(fn) or ''}"
        )
        blocking_form.__name__ = fn.__name__.removesuffix("_async")
        blocking_form.__qualname__ = blocking_form.__name__
        return blocking_form

    return decorate
