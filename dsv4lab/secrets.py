"""What counts as a secret, and how it is kept out of everything a person reads or copies.

A campaign's record (run dirs, reports, results, copies of server logs) is shared, attached to issues and
kept for years; a Hugging Face token or an API key in it is a leak that outlives the campaign. So every
file dsv4lab writes for people goes through :func:`redact_data` or :func:`redact_text` first, and the one
file that must hold the real value — ``env.sh`` in the run dir, which the launch script sources so the
server gets its token — is written 0600 in a 0700 run dir and is never copied.

Three rules decide what is secret, from cheapest to broadest:

- a **name**: environment variables, config keys and ``--flags`` whose words end in TOKEN, KEY, SECRET,
  PASSWORD, PASSWD or CREDENTIALS, or contain SECRET, PASSWORD or APIKEY (``HF_TOKEN``, ``OPENAI_API_KEY``,
  ``AWS_SECRET_ACCESS_KEY``, ``--api-key``, ``api_key='...'`` in SGLang's ``server_args`` line);
- a **shape**: values that look like well-known tokens wherever they appear (``hf_...``, ``sk-...``,
  ``ghp_...``, ``github_pat_...``, ``xox?-...``, AWS access key ids, ``Bearer ...``);
- a **known value**: the values of secret-named variables of this process's environment and of a config
  being launched, replaced wherever they occur (a token printed by a notebook cell on its own).

Redaction replaces the value with :data:`REDACTED` and keeps the name, so a reader still sees *that* a
token was set. A config read back from a redacted file holds the placeholder; launching it is refused
(``render``) rather than sending the placeholder to the server as a token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "collect_secrets",
    "has_placeholder",
    "is_secret_flag",
    "is_secret_name",
    "redact_argv",
    "redact_data",
    "redact_text",
]

#: What a secret value becomes. Plain ASCII without shell or HTML meaning, and obviously not a token.
REDACTED = "[redacted]"

#: Known values shorter than this are not replaced as free text ("1", "yes" would wreck a log, and a short
#: value is more likely to sit inside a path a record must keep); their name-based redaction still applies.
MIN_KNOWN_LEN = 8

_LAST_WORDS = frozenset({"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS", "CREDENTIAL", "APIKEY"})
_ANY_WORDS = frozenset({"SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS"})
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

#: Values that are tokens by their shape, wherever they appear.
_SHAPES = re.compile(
    r"\bhf_[A-Za-z0-9]{8,}"
    r"|\bsk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{16,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{16,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
)
_BEARER = re.compile(r"(?i)\b(Bearer|Basic)(\s+)([A-Za-z0-9._~+/=-]{6,})")
# NAME=value, NAME: value, "NAME": "value", name='value' (Python reprs; SGLang's server_args line).
_VALUE = r"""(?P<value>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|[^\s"',;)}\]]+)"""
_ASSIGN = re.compile(
    r"""(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)["']?(?P<sep>[ \t]*[:=][ \t]*)""" + _VALUE
)
# --flag value, --flag=value (a command line quoted in a log or an error message).
_FLAG = re.compile(r"""(?<![A-Za-z0-9_-])(?P<name>--[A-Za-z][A-Za-z0-9_-]*)(?P<sep>=|[ \t]+)""" + _VALUE)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?%?")
_NOT_A_VALUE = frozenset({"", "None", "none", "null", "NULL", "unset", "False", "True", "false", "true", REDACTED})


def _words(name: str) -> list[str]:
    return [w.upper() for w in _WORD_SPLIT.split(name) if w]


def is_secret_name(name: str) -> bool:
    """Whether a variable, key or flag name (``HF_TOKEN``, ``api_key``, ``--api-key``) names a secret.

    By its words: ``kv_bytes_per_token`` ends in TOKEN too, which is why only string values are redacted by
    name (a number is never a token); a bare ``key`` is not a secret (too many tables have one).
    """
    words = _words(name)
    if not words or words == ["KEY"]:
        return False
    if words[-1] in _LAST_WORDS or any(w in _ANY_WORDS for w in words):
        return True
    return len(words) >= 2 and words[-2:] in (["API", "KEY"], ["ACCESS", "TOKEN"], ["AUTH", "TOKEN"])


def _is_value(value: str) -> bool:
    """Whether an assigned value could be a secret (not ``None``, a number or the placeholder itself)."""
    # "[redacted" is what the value pattern (which stops at "]") sees of a value masked by an earlier rule.
    return value not in _NOT_A_VALUE and not _NUMBER.fullmatch(value) and not value.startswith(REDACTED[:-1])


def _unquote(value: str) -> tuple[str, str]:
    """(quote character or '', the value inside the quotes)."""
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        return value[0], value[1:-1]
    return "", value


def is_secret_flag(token: str) -> bool:
    """Whether a command-line word is a flag whose value is a secret (``--api-key``, ``--hf-token=...``)."""
    return token.startswith("-") and is_secret_name(token.split("=", 1)[0].lstrip("-"))


def collect_secrets(*sources: Any, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The secret values to replace wherever they occur: those of secret-named variables in ``environ``
    (this process's environment by default) and in ``sources`` (mappings, configs, lists, override text
    like ``"env.HF_TOKEN=hf_x"``), long enough not to be ordinary words."""
    found: set[str] = set()
    env = os.environ if environ is None else environ
    for name, value in env.items():
        if is_secret_name(name) and len(value) >= MIN_KNOWN_LEN:
            found.add(value)
    for source in sources:
        _collect(source, found)
    return frozenset(v for v in found if len(v) >= MIN_KNOWN_LEN and v != REDACTED)


def _collect(obj: Any, found: set[str]) -> None:
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict) and not isinstance(obj, Mapping):
        obj = to_dict()
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if isinstance(value, str) and is_secret_name(str(key)):
                found.add(value)
            else:
                _collect(value, found)
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
        for i, item in enumerate(items):
            if isinstance(item, str) and is_secret_flag(item):
                _, eq, value = item.partition("=")
                if eq:
                    found.add(value)
                elif i + 1 < len(items) and isinstance(items[i + 1], str):
                    found.add(items[i + 1])
            else:
                _collect(item, found)
    elif isinstance(obj, str):
        for m in (*_ASSIGN.finditer(obj), *_FLAG.finditer(obj)):
            if is_secret_name(m.group("name").lstrip("-")):
                value = _unquote(m.group("value"))[1]
                if _is_value(value):
                    found.add(value)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every secret value replaced by :data:`REDACTED` (see the module doc for the rules)."""
    if not text:
        return text
    for value in sorted({v for v in known if len(v) >= MIN_KNOWN_LEN}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _SHAPES.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _FLAG.sub(_redact_assignment, text)
    return _ASSIGN.sub(_redact_assignment, text)


def _redact_assignment(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name").lstrip("-")):
        return m.group(0)
    quote, value = _unquote(m.group("value"))
    if not _is_value(value):
        return m.group(0)
    head = m.group(0)[: m.start("value") - m.start()]
    return f"{head}{quote}{REDACTED}{quote}"


def redact_argv(argv: Iterable[str], known: Iterable[str] = ()) -> list[str]:
    """An argv with the value after (or glued to) every secret flag replaced, and known values masked."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if is_secret_flag(word):
            flag, eq, _ = word.partition("=")
            out.append(f"{flag}={REDACTED}" if eq else word)
            hide_next = not eq
            continue
        out.append(redact_text(word, known))
    return out


def redact_data(obj: Any, known: Iterable[str] = (), *, skip_keys: Collection[str] = ()) -> Any:
    """A copy of JSON-like data with secret values replaced: string values under secret-named keys, values
    after secret flags in lists, and secrets inside any other string. Numbers and booleans are kept (a
    ``kv_bytes_per_token`` figure is not a token); values under ``skip_keys`` (base64 images) are kept."""
    return _redact(obj, frozenset(known), frozenset(skip_keys))


def _redact(obj: Any, known: frozenset[str], skip: frozenset[str]) -> Any:
    if isinstance(obj, str):
        return redact_text(obj, known)
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            if key in skip:
                out[key] = value
            elif isinstance(value, str) and is_secret_name(str(key)) and _is_value(value):
                out[key] = REDACTED
            else:
                out[key] = _redact(value, known, skip)
        return out
    if isinstance(obj, (list, tuple)):
        items = list(obj)
        if any(isinstance(x, str) and is_secret_flag(x) for x in items) and all(isinstance(x, str) for x in items):
            redacted: list[Any] = redact_argv(items, known)
        else:
            redacted = [_redact(x, known, skip) for x in items]
        return type(obj)(redacted) if isinstance(obj, tuple) else redacted
    return obj


def has_placeholder(values: Iterable[str]) -> bool:
    """Whether any value is (or contains) the redaction placeholder: a config read back from a redacted file."""
    return any(REDACTED in v for v in values)
