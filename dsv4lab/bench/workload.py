"""What a benchmark sends: the prompts (workloads) and how they arrive (load).

A workload is built once from a seed and is then a plain, frozen list of requests, so the A and B arms of
a comparison — and the built-in and the remote backends — send the same thing. The client has no
tokenizer (a model's tokenizer is rarely on the laptop that runs the notebook), so the prompts built here
are *targets*: random prompts are made of common English words, which many BPE tokenizers encode as about
one token each, and token-id prompts of ids from a range most vocabularies have. Before a run, random
prompts are remade under the server's own tokenizer where the server offers one
(:func:`dsv4lab.bench.tokens.fit_workload`, as ``vllm bench serve`` makes its random prompts), so that the
server counts the asked lengths; the token counts that reach the metrics come from the server's ``usage``
whenever it reports them. ``token_ids=True`` sends token ids instead of text (``/generate`` and
``/v1/completions`` accept them).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4lab.errors import BenchError, ConfigError

__all__ = [
    "LoadSpec",
    "RequestSpec",
    "Workload",
    "arrival_times",
    "cap_levels",
    "check_load",
    "parse_levels",
    "random_workload",
    "shared_prefix_workload",
    "sharegpt_workload",
]

# Common English words that GPT-2-, Llama- and DeepSeek-style BPE vocabularies hold as one token when
# preceded by a space. A prompt of N such words is therefore close to N tokens on most models.
_WORDS = tuple(
    """the of and to in is was for on that with as by at from his it an were are which this be or
    has had not first one their its new after but who they have her she two been other when there all
    during into school time may years more most only over city some world would where later up such used
    many can state about national out known university united then made also could people any between
    team than these game season well him three part film how work year back under high series group each
    great same both us long four while home age man day line name end since five place take through last
    good show way did long early own set book best next old war house water power army party music small
    life left right end week very still then church open case west north south east day land home light
    line road side room hand play game point fact level body form order head young mind river field""".split()  # noqa: SIM905
)

#: Token ids of ``token_ids=True`` random prompts before they are drawn from the server's vocabulary (and
#: when its size cannot be learnt): a range most vocabularies have, past the special tokens at the start of
#: many. A vocabulary smaller than 20,000 refuses them.
ID_LOW, ID_HIGH = 1000, 20000


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload.

    ``prompt_len`` is the intended input length in tokens (exact when ``input_ids`` is set, a target for
    text); ``output_len`` is the number of tokens asked for (``max_tokens``; with ``ignore_eos`` the server
    produces exactly that many).
    """

    index: int
    prompt: str
    prompt_len: int
    output_len: int
    input_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Workload:
    """A named, seeded list of requests plus the parameters that made it (for provenance and remote runs)."""

    name: str
    seed: int
    requests: tuple[RequestSpec, ...]
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.requests:
            raise BenchError(f"workload {self.name!r} has no requests")
        object.__setattr__(self, "params", dict(self.params))

    def __len__(self) -> int:
        return len(self.requests)

    def head(self, n: int) -> Workload:
        """The first ``n`` requests (re-indexed), e.g. for a shorter level of a sweep."""
        if n < 1:
            raise BenchError(f"a workload needs at least one request, not {n}")
        reqs = tuple(_reindex(r, i) for i, r in enumerate(self.requests[:n]))
        return Workload(self.name, self.seed, reqs, {**self.params, "num_prompts": len(reqs)})

    def to_dict(self) -> dict[str, Any]:
        """Provenance: what the workload was, not its prompts (those are reproducible from the seed)."""
        return {
            "name": self.name,
            "seed": self.seed,
            "num_prompts": len(self.requests),
            "mean_prompt_len": sum(r.prompt_len for r in self.requests) / len(self.requests),
            "mean_output_len": sum(r.output_len for r in self.requests) / len(self.requests),
            "params": dict(self.params),
        }


def _reindex(r: RequestSpec, i: int) -> RequestSpec:
    return RequestSpec(i, r.prompt, r.prompt_len, r.output_len, r.input_ids)


def _lengths(rng: random.Random, n: int, length: int, range_ratio: float) -> list[int]:
    """Uniform integers in [max(int(length * ratio), 1), length], as SGLang's ``--random-range-ratio``."""
    low = max(int(length * range_ratio), 1)
    return [rng.randint(low, length) for _ in range(n)]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise BenchError(f"{name} must be >= 1, got {value}")


def random_workload(
    num_prompts: int,
    input_len: int,
    output_len: int,
    *,
    range_ratio: float = 1.0,
    seed: int = 0,
    token_ids: bool = False,
    server_tokenizer: bool = True,
) -> Workload:
    """Random prompts of ``input_len`` tokens asking for ``output_len`` tokens.

    ``range_ratio`` 1.0 (the default) gives fixed lengths; below 1 each length is drawn uniformly from
    ``[int(len * ratio), len]``, the meaning SGLang gives ``--random-range-ratio`` (whose default of 0
    silently halves the mean lengths, a common surprise, hence not copied here). ``server_tokenizer``
    (the default) lets a run remake the prompts with the server's tokenizer so that their lengths are
    exact (see :mod:`dsv4lab.bench.tokens`); False sends the word (or id-range) prompts built here.
    """
    _check_positive(num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    if not 0.0 <= range_ratio <= 1.0:
        raise BenchError(f"range_ratio must be between 0 and 1, got {range_ratio}")
    rng = random.Random(seed)
    ins = _lengths(rng, num_prompts, input_len, range_ratio)
    outs = _lengths(rng, num_prompts, output_len, range_ratio)
    reqs: list[RequestSpec] = []
    for i, (n_in, n_out) in enumerate(zip(ins, outs, strict=True)):
        if token_ids:
            ids = tuple(rng.randrange(ID_LOW, ID_HIGH) for _ in range(n_in))
            reqs.append(RequestSpec(i, "", n_in, n_out, ids))
        else:
            reqs.append(RequestSpec(i, _words(rng, n_in), n_in, n_out))
    params = {
        "kind": "random",
        "num_prompts": num_prompts,
        "input_len": input_len,
        "output_len": output_len,
        "range_ratio": range_ratio,
        "token_ids": token_ids,
        "server_tokenizer": server_tokenizer,
    }
    return Workload("random", seed, tuple(reqs), params)


def shared_prefix_workload(
    num_groups: int,
    prompts_per_group: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
) -> Workload:
    """Groups of prompts that share a long prefix (a system prompt) and differ in a short suffix.

    This is the prefix-cache workload: the prefix is prefilled once per group. ``shuffle`` interleaves
    the groups, as concurrent users of different system prompts would.
    """
    _check_positive(
        num_groups=num_groups,
        prompts_per_group=prompts_per_group,
        prefix_len=prefix_len,
        suffix_len=suffix_len,
        output_len=output_len,
    )
    rng = random.Random(seed)
    items: list[tuple[str, int]] = []
    for _ in range(num_groups):
        prefix = _words(rng, prefix_len)
        items.extend((f"{prefix} {_words(rng, suffix_len)}", prefix_len + suffix_len) for _ in range(prompts_per_group))
    if shuffle:
        rng.shuffle(items)
    reqs = tuple(RequestSpec(i, text, n, output_len) for i, (text, n) in enumerate(items))
    params = {
        "kind": "shared_prefix",
        "num_groups": num_groups,
        "prompts_per_group": prompts_per_group,
        "prefix_len": prefix_len,
        "suffix_len": suffix_len,
        "output_len": output_len,
        "shuffle": shuffle,
    }
    return Workload("shared_prefix", seed, reqs, params)


def _estimate_tokens(text: str) -> int:
    """About four characters per token for English text; only used when no tokenizer is at hand."""
    return max(1, math.ceil(len(text) / 4))


def sharegpt_workload(
    path: str | Path,
    num_prompts: int,
    *,
    output_len: int | None = None,
    max_prompt_len: int = 1024,
    max_output_len: int = 2048,
    seed: int = 0,
    context_len: int | None = None,
) -> Workload:
    """Prompts from a ShareGPT-style JSON file: a list of ``{"conversations": [{"from", "value"}, ...]}``.

    The first human turn is the prompt; the reply that follows sets the output length (estimated from its
    text at ~4 characters per token, capped at ``max_output_len``) unless ``output_len`` fixes it (SGLang's
    ``--sharegpt-output-len``). Conversations with fewer than two turns, or prompts estimated longer than
    ``max_prompt_len``, are skipped, as other tools do; ``context_len`` also skips requests whose prompt
    plus output exceed it (SGLang's ``--sharegpt-context-len``).
    """
    _check_positive(num_prompts=num_prompts)
    if output_len is not None:
        _check_positive(output_len=output_len)
    if context_len is not None:
        _check_positive(context_len=context_len)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8 text at all
        raise BenchError(f"cannot read ShareGPT file {path}: {exc}") from exc
    if not isinstance(data, list):
        raise BenchError(f"ShareGPT file {path} must hold a JSON list of conversations")
    pairs: list[tuple[str, str]] = []
    for item in data:
        conv = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        first, second = conv[0], conv[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        prompt, reply = first.get("value"), second.get("value")
        if isinstance(prompt, str) and isinstance(reply, str) and prompt.strip():
            pairs.append((prompt, reply))
    rng = random.Random(seed)
    rng.shuffle(pairs)
    reqs: list[RequestSpec] = []
    for prompt, reply in pairs:
        n_in = _estimate_tokens(prompt)
        if n_in > max_prompt_len:
            continue
        n_out = output_len if output_len is not None else min(max_output_len, _estimate_tokens(reply))
        if context_len is not None and n_in + n_out > context_len:
            continue
        reqs.append(RequestSpec(len(reqs), prompt, n_in, n_out))
        if len(reqs) == num_prompts:
            break
    if not reqs:
        raise BenchError(f"ShareGPT file {path} has no usable conversations")
    params = {
        "kind": "sharegpt",
        "path": str(path),
        "num_prompts": len(reqs),
        "output_len": output_len,
        "max_prompt_len": max_prompt_len,
        "max_output_len": max_output_len,
        "context_len": context_len,
    }
    return Workload("sharegpt", seed, tuple(reqs), params)


@dataclass(frozen=True)
class LoadSpec:
    """How requests arrive.

    ``concurrency`` caps the requests in flight (None = no cap). ``request_rate`` in requests/s is an open
    loop with gamma inter-arrival times of shape ``burstiness`` (1.0 = Poisson); ``inf`` sends every
    request at t=0, so with a cap it is a closed loop at fixed concurrency. Each request has a scheduled
    time; the time it then waits for a free slot is measured and reported (``queue_ms``), so a saturated
    server cannot hide behind the client's semaphore. ``warmup`` requests run first and are not counted;
    ``flush_cache`` then empties the server's prefix cache before the measured requests (SGLang's
    ``--flush-cache``), so a run does not reuse what the warmup or the previous run left there.
    """

    concurrency: int | None = 1
    request_rate: float = math.inf
    burstiness: float = 1.0
    warmup: int = 1
    seed: int = 0
    flush_cache: bool = False

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise BenchError(f"concurrency must be >= 1 or None, got {self.concurrency}")
        if not self.request_rate > 0:
            raise BenchError(f"request_rate must be > 0 (inf = all at once), got {self.request_rate}")
        if not (math.isfinite(self.burstiness) and self.burstiness > 0):
            raise BenchError(f"burstiness must be a finite number > 0, got {self.burstiness}")
        if self.warmup < 0:
            raise BenchError(f"warmup must be >= 0, got {self.warmup}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "request_rate": None if math.isinf(self.request_rate) else self.request_rate,
            "burstiness": self.burstiness,
            "warmup": self.warmup,
            "seed": self.seed,
            "flush_cache": self.flush_cache,
        }


def arrival_times(n: int, load: LoadSpec) -> list[float]:
    """Scheduled send times in seconds from the start, from the load's seed (identical for A and B)."""
    if math.isinf(load.request_rate):
        return [0.0] * n
    rng = random.Random(load.seed)
    shape = load.burstiness
    scale = 1.0 / (load.request_rate * shape)
    t = 0.0
    out: list[float] = []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(shape, scale)
    return out


def concurrency_levels(spec: str | Sequence[int]) -> list[int]:
    """``"1,2,4"`` or ``[1, 2, 4]`` -> ``[1, 2, 4]`` (each >= 1, order kept, duplicates dropped)."""
    items = [s for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    levels: list[int] = []
    for item in items:
        try:
            value = int(item)
        except (TypeError, ValueError):
            raise BenchError(f"concurrency levels must be integers like 1,2,4; got {item!r}") from None
        if value < 1:
            raise BenchError(f"concurrency levels must be >= 1; got {value}")
        if value not in levels:
            levels.append(value)
    if not levels:
        raise BenchError("no concurrency levels given")
    return levels


def parse_levels(concurrencies: Sequence[int] | int | str) -> list[int]:
    """Concurrency levels from a list, one int, or text like ``"1,16"`` (a papermill ``-p`` value)."""
    if isinstance(concurrencies, str):
        parts = [p for p in concurrencies.replace(" ", ",").split(",") if p]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise BenchError(f"concurrency levels must be integers like 1,16; got {concurrencies!r}") from None
    elif isinstance(concurrencies, int):
        values = [concurrencies]
    else:
        values = list(concurrencies)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise BenchError(f"concurrency levels must be one or more integers >= 1, got {concurrencies!r}")
    return values


#: Words that mean "no concurrency cap" in a list of levels.
NO_CAP = ("inf", "none", "unlimited")


def cap_levels(concurrencies: Sequence[int | None] | int | str | None) -> list[int | None]:
    """Like :func:`parse_levels`, where ``None`` (or ``inf``/``none``/``unlimited`` in text) is a level without a
    cap. Duplicates are kept (a sweep may repeat a level on purpose)."""
    if concurrencies is None:
        return [None]
    if isinstance(concurrencies, str):
        parts = [p for p in concurrencies.replace(" ", ",").split(",") if p]
        out: list[int | None] = []
        for part in parts:
            out.extend([None] if part.lower() in NO_CAP else parse_levels(part))
        if not out:
            raise BenchError(f"concurrency levels must be integers like 1,16 or inf; got {concurrencies!r}")
        return out
    if isinstance(concurrencies, int):
        return list(parse_levels(concurrencies))
    values = list(concurrencies)
    if not values:
        raise BenchError("no concurrency levels given")
    return [None if v is None else parse_levels([v])[0] for v in values]


def check_load(
    concurrency: object, repeats: object, prompts: object, input_len: object, output_len: object, seed: object
) -> None:
    """A benchmark's load (an A/B's, a tuning's), checked before any server is asked anything (each value named
    as its argument)."""
    try:
        parse_levels(concurrency)  # type: ignore[arg-type]
    except BenchError:
        raise ConfigError("concurrency", concurrency, "one or more integers >= 1, e.g. [1, 16] or '1,16'") from None

    def integer(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for arg, value in (("repeats", repeats), ("input_len", input_len), ("output_len", output_len)):
        if not integer(value) or value < 1:  # type: ignore[operator]
            extra = " (a verdict needs 3 per arm and level)" if arg == "repeats" else ""
            raise ConfigError(arg, value, f"an integer >= 1{extra}")
    if prompts is not None and (not integer(prompts) or prompts < 1):  # type: ignore[operator]
        raise ConfigError("prompts", prompts, "an integer >= 1, or None for one wave per level")
    if not integer(seed):
        raise ConfigError("seed", seed, "an integer")
