"""An append-only JSON Lines store of benchmark results in a run directory.

Results are evidence, so the store only ever appends: a result is one line, written with a single
``write`` on an ``O_APPEND`` descriptor under an exclusive ``flock``, so concurrent writers (two notebooks,
an A/B runner with threads) never interleave and a crash leaves at most a torn last line, which
:meth:`ResultStore.load` reports instead of silently dropping. A result id already in the file is refused:
appending the same result twice would double-count it in a comparison.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from dsv4lab.bench.results import BenchResult
from dsv4lab.errors import BenchError

__all__ = ["RESULTS_FILE", "ResultStore"]

#: The store's file name inside a run directory: one JSON object per run, appended.
RESULTS_FILE = "bench_results.jsonl"


class ResultStore:
    """``<run_dir>/bench_results.jsonl`` (or any ``.jsonl`` path)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        self.path = p if p.suffix == ".jsonl" else p / RESULTS_FILE

    def append(self, result: BenchResult) -> None:
        """Append ``result`` as one line; raise :class:`BenchError` if its id is already stored."""
        from dsv4lab.secrets import collect_secrets, redact_data

        # Options already leave out header values and the API key; a token in extra_body or a label is masked.
        record = redact_data(result.to_dict(), collect_secrets())
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if result.id in self._ids():
                    raise BenchError(f"result {result.id} is already in {self.path}; results are never overwritten")
                view = memoryview(line)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _ids(self) -> set[str]:
        ids: set[str] = set()
        for _, data in self._lines():
            if isinstance(data, dict) and "id" in data:
                ids.add(str(data["id"]))
        return ids

    def _lines(self) -> Iterator[tuple[int, object]]:
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            return
        with f:
            for number, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    yield number, json.loads(raw)
                except ValueError:
                    yield number, None

    def load(self, *, strict: bool = False) -> list[BenchResult]:
        """Every stored result, in the order appended. A torn or unreadable line raises when ``strict``,
        else it is skipped with a warning naming the line."""
        import warnings

        out: list[BenchResult] = []
        for number, data in self._lines():
            if not isinstance(data, dict):
                message = f"{self.path}:{number} is not a complete result line (torn write?)"
                if strict:
                    raise BenchError(message)
                warnings.warn(message, stacklevel=2)
                continue
            out.append(BenchResult.from_dict(data))
        return out

    def __len__(self) -> int:
        return sum(1 for _ in self._lines())
