"""Random prompts of the asked length under the server's own tokenizer.

The client has no tokenizer (a model's tokenizer is rarely on the laptop that runs the notebook), and a
guess is not good enough: against a real vLLM serving a small BPE model, 64 "one-token" English words were
108 tokens, and random token ids from a range "every real vocabulary has" were refused outright (HTTP 400
``Token id 19837 is out of vocabulary``: that model has 3,000 tokens). So the server is asked.

``vllm bench serve --dataset-name random`` draws token ids inside the tokenizer's vocabulary (special tokens
left out), decodes them to text, re-encodes the text and truncates or tops up the ids until the text is the
asked number of tokens (a few rounds: decoding and re-encoding is not an identity for byte-level BPE); the
prompt goes out as text, one special token shorter when the tokenizer adds a BOS, so that the server counts
exactly the asked length. It does this with a local copy of the tokenizer and then checks the first prompt
against the server's ``/tokenize``. Here the server's tokenizer is the only one: the same procedure runs on
``POST /detokenize`` and ``POST /tokenize`` (vLLM's request and answer shapes), which is also what makes the
counts the server's by construction. ``token_ids=True`` prompts skip the text and send ids drawn from the
same vocabulary.

What the server cannot answer is learnt elsewhere or left as it was, and the workload says which
(``params["prompts"]``): the vocabulary size from ``/detokenize`` (ids past the tokenizer decode to nothing;
a search over blocks of ids finds the edge in ~30 requests), else the model's ``config.json`` when its folder
is readable (on the server's host, or here for a server on this machine); the special tokens from the
tokenizer's files when readable, else only those the server adds itself. A server without ``/tokenize``
(the twin; SGLang releases that lack it or answer in another shape) keeps the word prompts, whose lengths
are then targets and whose real counts come from the server's ``usage``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from dsv4lab.bench.client import http_error
from dsv4lab.bench.workload import ID_HIGH, ID_LOW, RequestSpec, Workload
from dsv4lab.hosts import Host

__all__ = ["ServerTokenizer", "TokenizerUnavailable", "fit_workload", "vocab_size_by_search"]

#: Decode/re-encode rounds before a prompt is taken at the length it has (vLLM's bound too).
MAX_ROUNDS = 10
#: Ids per ``/detokenize`` probe of the vocabulary's edge: one id can decode to nothing inside a vocabulary
#: (a lone SentencePiece space); sixteen in a row do not.
PROBE_BLOCK = 16
#: Largest vocabulary searched for (the largest today are ~260k).
MAX_VOCAB = 1 << 24
#: Requests to the tokenizer endpoints in flight at once.
CONCURRENCY = 16
#: The twin's engine name (:func:`dsv4lab.bench.serverinfo.engine_of`).
TWIN = "dsv4lab-twin"
#: A short text for learning how many tokens the server adds around a prompt.
_PROBE_TEXT = "The quick brown fox jumps over the lazy dog"


class TokenizerUnavailable(Exception):
    """The server has no usable ``/tokenize`` / ``/detokenize`` (missing, refused, or another schema)."""


class ServerTokenizer:
    """``POST /tokenize`` and ``/detokenize`` on one server, in vLLM's shapes."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, model: str | None, headers: Mapping[str, str]
    ) -> None:
        self.session = session
        self.base = base_url
        self.model = model
        self.headers = dict(headers)
        self._sem = asyncio.Semaphore(CONCURRENCY)

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        if self.model is not None:
            body = {"model": self.model, **body}
        try:
            async with self._sem, self.session.post(self.base + path, json=body, headers=self.headers) as resp:
                body_bytes = await resp.read()
                if resp.status != 200:
                    raise TokenizerUnavailable(f"POST {path}: {http_error(resp.status, body_bytes[:2000])[:300]}")
                return json.loads(body_bytes)
        except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError, ValueError) as exc:
            raise TokenizerUnavailable(f"POST {path}: {type(exc).__name__}: {exc}") from None

    async def tokenize(self, text: str, *, special: bool) -> list[int]:
        """The ids of ``text``; ``special`` adds what the server adds to a completions prompt (a BOS)."""
        data = await self._post("/tokenize", {"prompt": text, "add_special_tokens": special})
        return _ids(data, "/tokenize")

    async def tokenize_chat(self, text: str) -> list[int]:
        """The ids of ``text`` as one user message under the chat template, ready for the reply."""
        body = {"messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
        return _ids(await self._post("/tokenize", body), "/tokenize (messages)")

    async def detokenize(self, ids: Sequence[int]) -> str:
        data = await self._post("/detokenize", {"tokens": list(ids)})
        text = data.get("prompt", data.get("text")) if isinstance(data, dict) else None  # vLLM's key, or "text"
        if not isinstance(text, str):
            raise TokenizerUnavailable("POST /detokenize: no 'prompt' in the answer")
        return text


def _ids(data: Any, what: str) -> list[int]:
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise TokenizerUnavailable(f"POST {what}: no list of 'tokens' in the answer")
    return tokens


async def vocab_size_by_search(decodes: Callable[[int], Awaitable[bool]]) -> int | None:
    """The vocabulary size, given ``decodes(start)``: whether any id in ``[start, start + PROBE_BLOCK)``
    decodes to text. Doubling finds a block past the edge, bisection the last block that still decodes; that
    block starts at the last id. None when id 0 decodes to nothing or no edge shows below ``MAX_VOCAB``."""
    if not await decodes(0):
        return None
    lo, hi = 0, 1024
    while await decodes(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_VOCAB:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await decodes(mid):
            lo = mid
        else:
            hi = mid
    return lo + 1


async def _vocab_from_server(tok: ServerTokenizer) -> int | None:
    async def decodes(start: int) -> bool:
        try:
            return bool(await tok.detokenize(range(start, start + PROBE_BLOCK)))
        except TokenizerUnavailable:  # a tokenizer that raises on unknown ids: ask for the first id alone
            with contextlib.suppress(TokenizerUnavailable):
                return bool(await tok.detokenize([start]))
            return False

    return await vocab_size_by_search(decodes)


@dataclasses.dataclass
class _ModelFiles:
    """What the model's folder says: vocabulary size (config.json) and special-token ids (tokenizer files)."""

    vocab_size: int | None = None
    special_ids: frozenset[int] = frozenset()
    where: str | None = None


def _read_json(host: Host, path: str) -> Any:
    with contextlib.suppress(Exception):  # any failure to read or parse is "not known"
        text = host.read_text(path, max_bytes=32 << 20)
        if text is not None:
            return json.loads(text)
    return None


def _special_ids(host: Host, folder: str) -> frozenset[int]:
    """The special tokens of tokenizer_config.json's ``added_tokens_decoder``, else tokenizer.json's
    ``added_tokens``."""
    tok_config = _read_json(host, f"{folder}/tokenizer_config.json")
    decoder = tok_config.get("added_tokens_decoder") if isinstance(tok_config, dict) else None
    if isinstance(decoder, dict):
        found = {int(k) for k, v in decoder.items() if k.isdigit() and isinstance(v, dict) and v.get("special")}
        if found:
            return frozenset(found)
    tok_json = _read_json(host, f"{folder}/tokenizer.json")
    added = tok_json.get("added_tokens") if isinstance(tok_json, dict) else None
    if not isinstance(added, list):
        return frozenset()
    specials = (a for a in added if isinstance(a, dict) and a.get("special"))
    return frozenset(a["id"] for a in specials if isinstance(a.get("id"), int))


def _model_files(host: Host | None, folders: Sequence[str]) -> _ModelFiles:
    """config.json's ``vocab_size`` (or its ``text_config``'s) and the special ids, from the first folder
    that has a config.json."""
    if host is None:
        return _ModelFiles()
    for folder in folders:
        config = _read_json(host, f"{folder}/config.json")
        if not isinstance(config, dict):
            continue
        vocab = config.get("vocab_size")
        text_config = config.get("text_config")
        if not isinstance(vocab, int) and isinstance(text_config, dict):
            vocab = text_config.get("vocab_size")
        known = vocab if isinstance(vocab, int) and vocab > 0 else None
        return _ModelFiles(known, _special_ids(host, folder), folder)
    return _ModelFiles()


def _picker(vocab: int, excluded: frozenset[int]) -> Callable[[random.Random], int]:
    """Uniform ids of the vocabulary, the excluded (special) ones redrawn."""
    if len(excluded) >= vocab:
        excluded = frozenset()

    def pick(rng: random.Random) -> int:
        while True:
            i = rng.randrange(vocab)
            if i not in excluded:
                return i

    return pick


def _request_rng(seed: int, index: int) -> random.Random:
    """One generator per request, so prompts do not depend on the order the server answers in."""
    return random.Random(f"dsv4lab-prompt/{seed}/{index}")


async def _fit_text(
    tok: ServerTokenizer, n: int, rng: random.Random, pick: Callable[[random.Random], int]
) -> tuple[str, int]:
    """A text that the server encodes as ``n`` tokens (without its added ones), and its count.

    Truncating the ids can end the text inside a UTF-8 character, which decodes to U+FFFD and re-encodes
    as more tokens than were cut; when an overshoot repeats, a few more ids are cut and redrawn instead.
    """
    ids = [pick(rng) for _ in range(n)]
    text, got, last = "", [], -1
    for _ in range(MAX_ROUNDS):
        text = await tok.detokenize(ids)
        got = await tok.tokenize(text, special=False)
        if len(got) == n:
            break
        keep = min(len(got), n)
        if len(got) > n and len(got) == last:
            keep = max(0, n - 2 * (len(got) - n) - 2)
        last = len(got)
        ids = got[:keep] + [pick(rng) for _ in range(n - keep)]
    return text, len(got)


async def _added_tokens(tok: ServerTokenizer, api: str) -> int:
    """How many tokens the server puts around a prompt's own: the BOS of a completions or /generate prompt,
    the chat template's tokens on the chat API."""
    plain = await tok.tokenize(_PROBE_TEXT, special=False)
    framed = await (tok.tokenize_chat(_PROBE_TEXT) if api == "chat" else tok.tokenize(_PROBE_TEXT, special=True))
    return max(0, len(framed) - len(plain))


def _bos_ids(plain: Sequence[int], framed: Sequence[int]) -> set[int]:
    """The ids the server adds to a prompt (framed minus plain, in order): special tokens by definition."""
    return {i for i in framed if i not in set(plain)}


async def _learn(
    tok: ServerTokenizer, api: str, files: Callable[[], _ModelFiles], token_ids: bool
) -> tuple[dict[str, Any], int, int | None, frozenset[int]]:
    """What the prompts need: (facts for the workload, tokens the server adds, vocabulary, special ids)."""
    facts: dict[str, Any] = {}
    added = 0
    specials: set[int] = set()
    tokenizer_error: str | None = None
    try:
        added = await _added_tokens(tok, api)
        plain = await tok.tokenize(_PROBE_TEXT, special=False)
        specials |= _bos_ids(plain, await tok.tokenize(_PROBE_TEXT, special=True))
        vocab = await _vocab_from_server(tok)
        vocab_from = "POST /detokenize" if vocab is not None else None
    except TokenizerUnavailable as exc:
        if not token_ids:  # text prompts need the server's tokenizer; ids only the vocabulary's size
            raise
        tokenizer_error = str(exc)
        vocab, vocab_from = None, None
    model = await asyncio.to_thread(files)
    specials |= model.special_ids
    if vocab is None and model.vocab_size is not None:
        vocab, vocab_from = model.vocab_size, f"{model.where}/config.json"
    facts.update(
        vocab_size=vocab,
        vocab_from=vocab_from,
        special_ids_excluded=len(specials),
        special_ids_from=("tokenizer files in " + model.where) if model.special_ids and model.where else "the server",
    )
    if tokenizer_error is not None:
        facts["tokenizer"] = f"unavailable: {tokenizer_error}"
    else:
        facts["tokenizer"] = "the server's (POST /tokenize, /detokenize)"
        facts["added_by_server"] = added
    return facts, added, vocab, frozenset(specials)


async def fit_workload(
    base_url: str,
    workload: Workload,
    *,
    api: str,
    model: str | None,
    headers: Mapping[str, str],
    host: Host | None = None,
    model_folders: Sequence[str] = (),
    engine: str = "unknown",
    timeout_s: float = 30.0,
) -> Workload:
    """``workload`` with its random prompts remade under the server's tokenizer (see the module docstring);
    any other workload, or one built with ``server_tokenizer=False``, comes back as it was. ``host`` is where
    ``model_folders`` (absolute paths from ``/v1/models``' ``root`` or the launch config) can be read.
    ``params["prompts"]`` says what was done and from what, or why not. The twin (``engine``) is not asked:
    it has no tokenizer, and counts one token per word, so the word prompts are its exact lengths."""
    params = dict(workload.params)
    if params.get("kind") != "random" or not params.get("server_tokenizer", True):
        return workload
    if engine == TWIN:
        return _as_is(workload, "word prompts: the twin counts one token per word")
    token_ids = bool(params.get("token_ids"))
    folders = [f for f in dict.fromkeys(model_folders) if f.startswith("/")]
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tok = ServerTokenizer(session, base_url, model, headers)
        try:
            facts, added, vocab, specials = await _learn(tok, api, lambda: _model_files(host, folders), token_ids)
        except TokenizerUnavailable as exc:
            return _as_is(workload, f"word prompts (lengths are targets): no tokenizer on the server ({exc})")
        if token_ids:
            return _with_ids(workload, facts, vocab, specials)
        pick = _picker(vocab if vocab is not None else ID_HIGH, specials)
        try:
            fitted = await asyncio.gather(
                *(_fit_one(tok, r, added, _request_rng(workload.seed, r.index), pick) for r in workload.requests)
            )
        except TokenizerUnavailable as exc:
            return _as_is(workload, f"word prompts (lengths are targets): fitting them failed ({exc})")
    off = sum(1 for r, f in zip(workload.requests, fitted, strict=True) if f.prompt_len != r.prompt_len)
    facts.update(method="text of random token ids, fitted with the server's tokenizer", prompts_off_target=off)
    return dataclasses.replace(workload, requests=tuple(fitted), params={**params, "prompts": facts})


async def _fit_one(
    tok: ServerTokenizer, r: RequestSpec, added: int, rng: random.Random, pick: Callable[[random.Random], int]
) -> RequestSpec:
    text, count = await _fit_text(tok, max(1, r.prompt_len - added), rng, pick)
    return RequestSpec(r.index, text, count + added, r.output_len)


def _with_ids(workload: Workload, facts: dict[str, Any], vocab: int | None, specials: frozenset[int]) -> Workload:
    if vocab is None:
        facts["method"] = (
            f"token ids from {ID_LOW}-{ID_HIGH - 1}: the vocabulary is unknown (a smaller one refuses them)"
        )
        pick = _picker(ID_HIGH - ID_LOW, frozenset())
        draw: Callable[[random.Random], int] = lambda rng: ID_LOW + pick(rng)  # noqa: E731
    else:
        facts["method"] = "token ids drawn from the model's vocabulary"
        draw = _picker(vocab, specials)
    reqs = []
    for r in workload.requests:
        rng = _request_rng(workload.seed, r.index)
        reqs.append(RequestSpec(r.index, "", r.prompt_len, r.output_len, tuple(draw(rng) for _ in range(r.prompt_len))))
    return dataclasses.replace(workload, requests=tuple(reqs), params={**workload.params, "prompts": facts})


def _as_is(workload: Workload, why: str) -> Workload:
    return dataclasses.replace(workload, params={**workload.params, "prompts": {"method": why}})
