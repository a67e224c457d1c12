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

A name alone is not enough in free text, because prose uses the same words: "every query token: doubling
the query tokens doubles the work" and "API key: see below" are sentences, not secrets. So in text a
secret name masks its value outright only where the text is *structured*:

- ``NAME=value``, a quoted ``"name": "value"`` or ``name: 'value'``, a line holding only ``name: value``;
- ``--flag value`` and ``--flag=value`` (unless the value is a function word: "set --api-key to ...");

and after a bare ``name:`` in running text only when the value looks like a credential (8+ characters
with a digit or mixed case, or a long unbroken run), or, after a compound name (``HF_TOKEN:``,
``api_key:``), when it is not a plain word. Names that count tokens (``kv_bytes_per_token``,
``#new-token``) or name public keys (``trust_host_key``) are not secret names; numbers (with a unit),
``...`` and punctuation are not values. ``Bearer``/``Basic`` mask what follows after ``Authorization:``
or when it looks like a credential ("Bearer tokens expire" keeps its words).

Redaction replaces the value with :data:`REDACTED` and keeps the name, so a reader still sees *that* a
token was set. A config read back from a redacted file holds the placeholder; launching it is refused
(``render``) rather than sending the placeholder to the server as a token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "collect_secrets",
    "has_placeholder",
    "is_secret_flag",
    "is_secret_name",
    "looks_like_credential",
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
#: Words that make a ``..._TOKEN`` name a count or a size of tokens (``kv_bytes_per_token``, SGLang's
#: ``#new-token``/``#cached-token``/``#pending-token`` log fields, ``max_num_token``), not a token.
_COUNTING_WORDS = frozenset({"PER", "NUM", "MAX", "MIN", "COUNT", "TOTAL", "NEW", "CACHED", "PENDING", "USED"})
#: Keys that are public by design: an SSH host key (``trust_host_key``), a public key.
_PUBLIC_KEYS = frozenset({"HOST", "PUBLIC", "PUB"})
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
_BEARER = re.compile(
    r"(?i)(?P<header>\bAuthorization:[ \t]*)?\b(?P<scheme>Bearer|Basic)(?P<gap>\s+)(?P<value>[A-Za-z0-9._~+/=-]{6,})"
)
# NAME=value, NAME: value, "NAME": "value", name='value' (Python reprs; SGLang's server_args line).
_VALUE = r"""(?P<value>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|[^\s"'`,;)}\]]+)"""
_ASSIGN = re.compile(
    r"""(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<nq>["']?)(?P<sep>[ \t]*[:=][ \t]*)""" + _VALUE
)
# --flag value, --flag=value (a command line quoted in a log or an error message).
_FLAG = re.compile(r"""(?<![A-Za-z0-9_-])(?P<name>--[A-Za-z][A-Za-z0-9_-]*)(?P<sep>=|[ \t]+)""" + _VALUE)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?%?")
_NOT_A_VALUE = frozenset({"", "None", "none", "null", "NULL", "unset", "False", "True", "false", "true", REDACTED})
#: Values with no letter or digit (``...``, ``…``, ``**`` of markdown bold, ``->``) are never secrets.
_NO_ALNUM = re.compile(r"[^A-Za-z0-9]*")
#: A number with a unit or a thousands separator (``15955.85B``, ``7,705``, ``20GiB``): a figure in prose.
_FIGURE = re.compile(r"[-+~]?\d[\d,._]*(?:\s?[A-Za-z%/]{1,6})?")
#: A word of prose: capitalized, an acronym, hyphenated (``doubling``, ``See``, ``SSH``, ``memory-bound``).
_PLAIN_WORD = re.compile(r"(?:[A-Z]+|[A-Za-z][a-z]*)(?:-[A-Za-z][a-z]*)*")
#: Function words of English: after ``--api-key`` in a sentence ("set --api-key to ...") the sentence goes
#: on; no command line passes one of these as a key.
_FUNCTION_WORDS = frozenset(
    "a an and as at by for from if in into is it of on or so than that the then to when where which with".split()  # noqa: SIM905
)
#: What running text puts after a value, kept outside the mask.
_TRAILING = ".,:;!?`*_"


def _words(name: str) -> list[str]:
    return [w.upper() for w in _WORD_SPLIT.split(name) if w]


def is_secret_name(name: str) -> bool:
    """Whether a variable, key or flag name (``HF_TOKEN``, ``api_key``, ``--api-key``) names a secret.

    By its words. A name that counts tokens (``kv_bytes_per_token``, ``#new-token``) is not one, and only
    string values are redacted by name anyway (a number is never a token); a bare ``key`` is not a secret
    (too many tables have one).
    """
    words = _words(name)
    if not words or words == ["KEY"]:
        return False
    if words[-1] == "TOKEN" and any(w in _COUNTING_WORDS for w in words[:-1]):
        return False
    if words[-1] == "KEY" and len(words) >= 2 and words[-2] in _PUBLIC_KEYS:
        return False
    if words[-1] in _LAST_WORDS or any(w in _ANY_WORDS for w in words):
        return True
    return len(words) >= 2 and words[-2:] in (["API", "KEY"], ["ACCESS", "TOKEN"], ["AUTH", "TOKEN"])


def _is_value(value: str) -> bool:
    """Whether an assigned value could be a secret (not ``None``, a number, ``...``, the next ``--flag``
    of a command line or the placeholder itself)."""
    # "[redacted" is what the value pattern (which stops at "]") sees of a value masked by an earlier rule.
    return (
        value not in _NOT_A_VALUE
        and not _NUMBER.fullmatch(value)
        and not _NO_ALNUM.fullmatch(value)
        and not value.startswith(("--", REDACTED[:-1]))
    )


def looks_like_credential(value: str) -> bool:
    """Whether a word of running text looks like a generated secret rather than prose or a figure: 8+
    characters with a digit or a lower-to-upper case change (``hunter42x``, ``aZ3kQ9...``), or an unbroken
    run of 24+ letters and digits. ``doubling``, ``See``, ``7,705`` and ``15955.85B`` do not."""
    word = value.rstrip(_TRAILING)
    if len(word) < 8 or _FIGURE.fullmatch(word) or not _is_value(word):
        return False
    if any(c.isdigit() for c in word) or re.search(r"[a-z][A-Z]", word):
        return True
    return re.search(r"[A-Za-z0-9]{24,}", word) is not None


def _whole_line(m: re.Match[str]) -> bool:
    """Whether the match is all its line holds (``password: hunter`` alone: a key-value line, not prose)."""
    text = m.string
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    before, after = text[start : m.start()], text[m.end() : len(text) if end < 0 else end]
    return before.strip(" \t-*#>\"'") == "" and after.strip() == ""


def _secret_value(m: re.Match[str]) -> tuple[str, str] | None:
    """(quote, value) when an ``_ASSIGN`` or ``_FLAG`` match holds a secret value (see the module doc)."""
    name = m.group("name").lstrip("-")
    if not is_secret_name(name):
        return None
    quote, value = _unquote(m.group("value"))
    if not _is_value(value):
        return None
    sep = m.group("sep")
    flag = m.group("name").startswith("-")
    if flag and not quote and "=" not in sep and value.rstrip(_TRAILING).lower() in _FUNCTION_WORDS:
        return None
    structured = bool(quote) or flag or "=" in sep or bool(m.groupdict().get("nq"))
    if structured or _whole_line(m) or looks_like_credential(value):
        return quote, value
    if len(_words(name)) >= 2 and not _PLAIN_WORD.fullmatch(value.rstrip(_TRAILING)):
        return quote, value  # HF_TOKEN: s3cr3t (a compound name, and not a word of prose)
    return None


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
        for pattern in (_ASSIGN, _FLAG):
            for _, secret in _assignments(pattern, obj):
                if secret is not None:
                    found.add(secret[1])


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every secret value replaced by :data:`REDACTED` (see the module doc for the rules)."""
    if not text:
        return text
    for value in sorted({v for v in known if len(v) >= MIN_KNOWN_LEN}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _SHAPES.sub(REDACTED, text)
    text = _BEARER.sub(_redact_scheme, text)
    text = _mask_assignments(_FLAG, text)
    return _mask_assignments(_ASSIGN, text)


def _redact_scheme(m: re.Match[str]) -> str:
    value = m.group("value")
    if not (m.group("header") or looks_like_credential(value)) or not _is_value(value):
        return m.group(0)
    return m.group(0)[: m.start("value") - m.start()] + REDACTED


def _assignments(pattern: re.Pattern[str], text: str) -> Iterator[tuple[re.Match[str], tuple[str, str] | None]]:
    """Each match of ``pattern`` with its secret (quote, value) or None. After a match that holds no secret the
    search goes on from its name, not its end: in "Config A: HF_TOKEN=hf..." the non-secret "A: HF_TOKEN=..."
    must not hide the assignment inside its value."""
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        secret = _secret_value(m)
        yield m, secret
        pos = m.end() if secret is not None else m.end("name")


def _mask_assignments(pattern: re.Pattern[str], text: str) -> str:
    out: list[str] = []
    done = 0
    for m, secret in _assignments(pattern, text):
        if secret is None:
            continue
        quote, value = secret
        tail = "" if quote else value[len(value.rstrip(_TRAILING)) :]  # "password: hunter42." keeps its full stop
        out += [text[done : m.start("value")], quote, REDACTED, quote, tail]
        done = m.end()
    return "".join(out) + text[done:]


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
