"""The secret masker keeps prose: nothing a notebook or a report says is masked unless it is a secret, and real
secrets written into those same sentences are masked.

The prose is the real thing: every notebook's markdown cells, and the sentences the notebooks' code and the
library write into reports (``md(f"...")`` narrative, card and table text, error messages), rendered with
sample figures where they interpolate a measurement.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dsv4lab.secrets import REDACTED, collect_secrets, is_secret_name, looks_like_credential, redact_text

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: What an interpolated ``{...}`` becomes: the figures, names and states a report puts in its sentences.
SAMPLES = ("17.6", "1,024.0 tok/s", "config_a", "READY", "2 runs", "0.62")


def _strings(source: str, sample: str) -> Iterator[str]:
    """The string literals of Python source, f-strings rendered with ``sample`` in each ``{...}``; docstrings
    are left out (they quote secrets on purpose, ``HF_TOKEN=hf_x``)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    inside_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield "".join(str(v.value) if isinstance(v, ast.Constant) else sample for v in node.values)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings | inside_fstrings
        ):
            yield node.value


def _notebook_cells(path: Path) -> list[tuple[str, str]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(c["cell_type"], "".join(c["source"])) for c in cells]


def _prose() -> Iterator[tuple[str, str]]:
    """(where, text) for every piece of prose a notebook or a report shows."""
    for path in NOTEBOOKS:
        for n, (kind, source) in enumerate(_notebook_cells(path)):
            if kind == "markdown":
                yield f"{path.name} cell {n}", source
            elif kind == "code":
                for sample in SAMPLES:
                    for text in _strings(source, sample):
                        yield f"{path.name} cell {n}", text
    for path in sorted((ROOT / "dsv4lab").rglob("*.py")):
        for sample in SAMPLES:
            for text in _strings(path.read_text(encoding="utf-8"), sample):
                yield str(path.relative_to(ROOT)), text


def test_the_story_sentence_keeps_its_words() -> None:
    """The sentence of report 05 that lost a word to the masker (issue 18)."""
    text = "whose work grows with every query token: doubling the query tokens doubles the work"
    assert redact_text(text) == text


def test_nothing_a_notebook_or_a_report_says_is_masked() -> None:
    assert len(NOTEBOOKS) >= 7
    masked: list[str] = []
    count = 0
    for where, text in _prose():
        count += 1
        out = redact_text(text)
        collected = collect_secrets(text, environ={})  # a word taken for a secret would be masked everywhere
        if (out != text or collected) and not _URL_TOKEN.search(text):
            masked.append(f"{where}: {text!r} -> {out!r} (collected {sorted(collected)})")
    assert count > 1000  # the scan saw the prose, not an empty list
    assert masked == [], "\n".join(masked)


#: The one secret the library's sentences hold on purpose: JupyterLab's URL with its token (``?token=...``).
_URL_TOKEN = re.compile(r"[?&]token=")


@pytest.mark.parametrize(
    "text",
    [
        "API key: see below",
        "api_key: see the README for how to set it",
        "HF_TOKEN: not needed for the twin",
        "Bearer tokens expire; Basic checks pass",
        "secret: the sauce is in the KV pool",
        "password: none",
        "set --api-key to the same value on every host",
        "bytes per token: 15,955.85 B, kv_bytes_per_token=7705, #new-token: 8192, max_num_token = max_bs",
        "trust_host_key: SSH host-key checking (see known_hosts)",
        "`--set env.HF_TOKEN=...` sets it again",
        "**KV bytes per token:** 584 B per layer",
        "each token: a step of the decode loop",
    ],
)
def test_prose_shapes_keep_their_words(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("kv_bytes_per_token", False),
        ("bytes_per_full_token", False),
        ("max_num_token", False),
        ("new-token", False),
        ("cached-token", False),
        ("trust_host_key", False),
        ("JUPYTER_TOKEN", True),
        ("GITHUB_TOKEN", True),
        ("MY_SERVICE_TOKEN", True),
        ("token", True),
        ("password", True),
    ],
)
def test_names_that_count_tokens_are_not_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_what_looks_like_a_credential() -> None:
    for word in ("hunter42x", "aZ3kQ9pLmn", "s3cr3t-value", "x" * 30):
        assert looks_like_credential(word), word
    for word in ("doubling", "See", "memory-bound", "15955.85B", "7,705", "20GiB", "short1", "...", "None"):
        assert not looks_like_credential(word), word


# -- real secrets in the same sentences are masked -------------------------------------------------------------------

_SENTENCES = sorted(
    {
        line.strip()
        for path in NOTEBOOKS
        for kind, source in _notebook_cells(path)
        if kind == "markdown"
        for line in source.splitlines()
        if len(line.strip()) > 40
    }
)
_ALNUM = st.characters(min_codepoint=48, max_codepoint=122, categories=("Lu", "Ll", "Nd"))
#: Values with no spaces, quotes or the characters that end an unquoted value: what a token is made of.
_VALUE_CHARS = st.characters(
    codec="ascii", categories=("Lu", "Ll", "Nd", "Pc", "Pd", "Po", "Sm"), exclude_characters="\"'`,;)}]\\"
)


_BASE64 = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")


def _token_like(value: str) -> bool:
    return any(c.isalpha() for c in value) and value[0] not in "-." and value[-1] not in ".:!?*_"


def _form(draw: st.DrawFn) -> tuple[str, str]:
    """(how the secret is written, the secret)."""
    kind = draw(st.sampled_from(["hf", "sk", "env", "export", "flag", "flag=", "json", "repr", "header", "known"]))
    if kind == "hf":
        value = "hf_" + draw(st.text(_ALNUM, min_size=10, max_size=40))
        return value, value
    if kind == "sk":
        value = "sk-" + draw(st.text(_ALNUM, min_size=20, max_size=48))
        return value, value
    # A value of digits alone is a number, never masked by name (a count is not a token); `--x` is the next flag.
    value = draw(st.text(_VALUE_CHARS, min_size=10, max_size=40).filter(_token_like))
    if kind == "env":
        return f"HF_TOKEN={value}", value
    if kind == "export":
        return f"export OPENAI_API_KEY={value}", value
    if kind == "flag":
        return f"--api-key {value}", value
    if kind == "flag=":
        return f"--hf-token={value}", value
    if kind == "json":
        return f'{{"api_key": "{value}"}}', value
    if kind == "repr":
        return f"ServerArgs(model_path='m', api_key='{value}', tp_size=8)", value
    if kind == "header":
        value = draw(st.text(_BASE64, min_size=10, max_size=60).filter(_token_like))
        return f"Authorization: Bearer {value}", value
    return f"the token: {value}", value  # masked as a known value (collected from the launch's config)


@st.composite
def _secret_in_prose(draw: st.DrawFn) -> tuple[str, str, str]:
    sentence = draw(st.sampled_from(_SENTENCES))
    written, value = _form(draw)
    words = sentence.split(" ")
    at = draw(st.integers(0, len(words)))
    text = " ".join([*words[:at], written, *words[at:]])
    assume(value not in sentence)
    kind = "known" if written.startswith("the token: ") else "text"
    return text, value, kind


@settings(max_examples=300, deadline=None)
@given(_secret_in_prose())
def test_real_secrets_in_those_sentences_are_masked(case: tuple[str, str, str]) -> None:
    text, value, kind = case
    known = [value] if kind == "known" else []
    out = redact_text(text, known)
    assert value not in out, (text, out)
    assert REDACTED in out
