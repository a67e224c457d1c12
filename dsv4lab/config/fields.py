"""The typed-field machinery every engine config shares (SGLang's :class:`ServerConfig`, vLLM's :class:`VllmConfig`).

Both configs are frozen dataclasses whose fields are set from four places: Python values, TOML/JSON files,
``--set key=value`` text and widgets. Each path must apply the same type rules and produce the same errors,
so the rules live here once; a second engine that copied them would drift from the first the day one of
them learned a new case. Each config keeps only what is its own: its fields, its checks and its one nested
table (``speculative``), which it passes in as ``nested``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from dsv4lab.errors import ConfigError, UnknownNameError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "ENV_NAME",
    "HOST",
    "apply_override",
    "apply_values",
    "check_env",
    "check_flag_list",
    "check_types",
    "config_data",
    "data_from_json",
    "data_from_toml",
    "field_help_of",
    "field_names_of",
    "flatten",
    "fmt",
    "from_plain",
    "help_meta",
    "nested_from_dict",
    "no_control_chars",
    "parse_scalar",
    "refuse_placeholder",
    "to_plain",
    "type_hints",
]

#: A shell environment variable name: what ``export NAME=...`` accepts.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A host name or IP address (v6 in brackets or bare): nothing a shell or a URL would read specially.
HOST = re.compile(r"^[A-Za-z0-9._:\[\]-]+$")
_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*(=.*)?$", re.DOTALL)
_NEGATIVE_NUMBER = re.compile(r"^-\d")

_C = TypeVar("_C")

#: The nested tables of a config, by field name (``{"speculative": SpeculativeConfig}``).
Nested = Mapping[str, type]


def help_meta(text: str) -> dict[str, str]:
    """Field metadata carrying the one help line the CLI, the widgets and ``_repr_html_`` show."""
    return {"help": text}


_HINTS: dict[type, dict[str, Any]] = {}


def type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass's fields, cached: resolving them is slow and every
    construction needs them. Class variables (``engine``) are left out: they are not settable."""
    hints = _HINTS.get(cls)
    if hints is None:
        names = {f.name for f in dataclasses.fields(cls)}
        hints = _HINTS[cls] = {k: v for k, v in typing.get_type_hints(cls).items() if k in names}
    return hints


def _describe(tp: Any) -> str:
    names = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _check_value(name: str, value: Any, tp: Any) -> None:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            _check_value(name, value, inner[0])
            return
    if dataclasses.is_dataclass(tp) or origin is Mapping:
        return  # nested tables and env are normalised and checked by the config itself
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(name, value, f"a list of {_describe(args[0])}")
        for item in value:
            _check_value(name, item, args[0])
        return
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(name, value, "true or false")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, value, "an integer")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(name, value, "a number")
    elif tp is str and not isinstance(value, str):
        raise ConfigError(name, value, "a string")


def check_types(cls: type, values: Mapping[str, Any], prefix: str = "") -> None:
    """Refuse a value of the wrong type by field name before any range check reads it: ``tp="8"`` from a
    JSON file would otherwise fail as a confusing comparison error, or pass where ``"8" * 2`` works."""
    hints = type_hints(cls)
    for name, value in values.items():
        _check_value(prefix + name, value, hints[name])


def no_control_chars(name: str, value: str) -> None:
    """Refuse NUL, CR and LF: the value ends up in a shell script line and in a log line."""
    if any(ch in value for ch in ("\x00", "\n", "\r")):
        raise ConfigError(name, value, "a single line without NUL, CR or LF characters")


def check_env(env: Mapping[str, str]) -> None:
    """Refuse names ``export`` would not take and values a C environment cannot hold."""
    for key, value in env.items():
        if not ENV_NAME.match(key):
            raise ConfigError("env", key, "variable names of letters, digits and _, not starting with a digit")
        if "\x00" in value:
            raise ConfigError(f"env.{key}", value, "a string without NUL bytes")


def check_flag_list(args: tuple[str, ...], owned: Callable[[], Mapping[str, str]], *, example: str) -> None:
    """Refuse pass-through flags argparse would misread, and flags a field already renders.

    A value that starts with ``-`` must be glued (``--flag=-x``) or argparse takes it for a flag; a flag a
    field owns (``owned()``: flag -> field, every release's spelling) would be rendered twice, and the
    one argparse keeps is whichever comes last, not the one the user meant. ``owned`` is called only when
    there are flags, because building the table imports the release data.
    """
    expect_flag = True
    for i, token in enumerate(args):
        if "\x00" in token:
            raise ConfigError("extra_args", token, "strings without NUL bytes")
        if token.startswith("-") and not _NEGATIVE_NUMBER.match(token):
            if not _FLAG.match(token):
                if i > 0 and _FLAG.match(args[i - 1]) and "=" not in args[i - 1]:
                    raise ConfigError(
                        "extra_args",
                        token,
                        f"a value that starts with '-' glued to its flag ({args[i - 1]}={token}), "
                        "or argparse would read it as a flag",
                    )
                raise ConfigError("extra_args", token, f"long flags like {example} (lower case, digits, dashes)")
            expect_flag = False
        elif expect_flag and i == 0:
            raise ConfigError("extra_args", token, "a list that starts with a --flag, each value after its flag")
    if args:
        table = owned()
        for token in args:
            flag = token.split("=", 1)[0]
            if flag in table:
                raise ConfigError(
                    "extra_args",
                    token,
                    f"flags not covered by a field; set {table[flag]} instead of passing {flag}",
                )


def refuse_placeholder(field: str, values: Sequence[str]) -> None:
    """A config read back from a redacted file (``config.toml``, ``handle.json``) holds the placeholder where
    a secret was: sending that to the server as a token would fail later and more confusingly."""
    from dsv4lab.secrets import REDACTED

    for value in values:
        if REDACTED in value:
            raise ConfigError(
                field,
                value,
                f"the real value, not the {REDACTED} placeholder of a redacted file: set it again "
                "(--set env.HF_TOKEN=...) or source it from one of env_files on the host",
            )


def fmt(value: Any) -> str:
    """A value as a person reads it in a diff or a table: ``(unset)``, ``true``, ``[1, 2]``."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def parse_scalar(name: str, raw: str, tp: Any) -> Any:
    """Text typed by a user (``--set``, a papermill parameter, a widget) as the field's type; ``none``
    (or ``null``, ``unset``, empty) unsets an optional field."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if raw.strip().lower() in ("none", "null", "unset", ""):
            return None
        inner = [a for a in args if a is not type(None)]
        return parse_scalar(name, raw, inner[0])
    if origin is tuple:
        parts = [p for p in re.split(r"[,\s]+", raw.strip().strip("[]")) if p]
        return [parse_scalar(name, p, args[0]) for p in parts]
    if tp is bool:
        low = raw.strip().lower()
        if low in ("true", "yes", "on", "1"):
            return True
        if low in ("false", "no", "off", "0"):
            return False
        raise ConfigError(name, raw, "true or false")
    if tp is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(name, raw, "an integer") from None
    if tp is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(name, raw, "a number") from None
    return raw


# -- a config as plain data ------------------------------------------------------------------------------


def _table_hint(ncls: type) -> str:
    shown = [f.name for f in dataclasses.fields(ncls)][:3]
    return f"a table with {', '.join(shown)}, ..."


def nested_from_dict(ncls: type[_C], data: Any, where: str) -> _C:
    """A nested table (``speculative``) from plain data, unknown keys refused by their dotted name."""
    if isinstance(data, ncls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(where, data, _table_hint(ncls))
    known = {f.name for f in dataclasses.fields(ncls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise UnknownNameError(f"{where} field", unknown[0], sorted(known), field=f"{where}.{unknown[0]}")
    check_types(ncls, data, prefix=f"{where}.")
    return ncls(**data)


def to_plain(config: Any, nested: Nested) -> dict[str, Any]:
    """Plain data (lists, dicts, scalars), unset fields and empty nested tables omitted: the TOML/JSON form
    (TOML has no null, so an unset field can only be an absent one)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is None:
            continue
        if f.name in nested:
            table = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
            if table:
                out[f.name] = table
        elif f.name == "env":
            out["env"] = dict(value)
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        else:
            out[f.name] = value
    return out


def from_plain(cls: type[_C], data: Any, nested: Nested, *, required: Mapping[str, str]) -> _C:
    """Build a config from plain data, refusing unknown keys by name and naming a missing required one."""
    if not isinstance(data, Mapping):
        raise ConfigError("config", data, "a table/object of field names to values")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise UnknownNameError("config field", unknown[0], sorted(known), field=unknown[0])
    for name, allowed in required.items():
        if name not in data:
            raise ConfigError(name, None, allowed)
    kwargs = dict(data)
    for name, ncls in nested.items():
        if kwargs.get(name) is not None:
            kwargs[name] = nested_from_dict(ncls, kwargs[name], name)
    return cls(**kwargs)


def flatten(config: Any, nested: Nested) -> dict[str, Any]:
    """Every leaf value under its dotted name (``speculative.num_steps``, ``env.NCCL_PROTO``): what a diff
    compares and a table shows, nested tables included when unset so that two configs line up."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in nested:
            table = value or nested[f.name]()
            for sf in dataclasses.fields(table):
                out[f"{f.name}.{sf.name}"] = getattr(table, sf.name)
        elif f.name == "env":
            for k, v in value.items():
                out[f"env.{k}"] = v
        else:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


# -- names, help and overrides -------------------------------------------------------------------------


def field_names_of(cls: type, nested: Nested) -> list[str]:
    """Every settable name: the top-level fields in declaration order, then each nested table's, dotted."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in nested]
    for head, ncls in nested.items():
        names += [f"{head}.{sf.name}" for sf in dataclasses.fields(ncls)]
    return names


def field_help_of(cls: type, nested: Nested, name: str) -> str:
    """The one-line help of a field (dotted for nested; ``env.X`` gets the env help)."""
    head, _, tail = name.partition(".")
    if head in nested and tail:
        fields = {f.name: f for f in dataclasses.fields(nested[head])}
        if tail in fields:
            return str(fields[tail].metadata["help"])
    if head == "env" and tail:
        return f"environment variable {tail}"
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if head in fields:
        return str(fields[head].metadata["help"])
    raise UnknownNameError("config field", name, field_names_of(cls, nested))


def apply_override(data: dict[str, Any], key: str, raw: str, cls: type, nested: Nested) -> None:
    """Apply one ``key=value`` typed by a user to plain data (``to_plain``'s form), in place.

    Dotted names reach nested settings (``speculative.num_steps=2``, ``env.NCCL_PROTO=LL``); the literal
    ``none`` unsets an optional field (and an env variable).
    """
    head, _, tail = key.partition(".")
    if head == "env" and tail:
        env = dict(data.get("env", {}))
        if raw.strip().lower() in ("none", "unset"):
            env.pop(tail, None)
        else:
            env[tail] = raw
        data["env"] = env
        return
    if head in nested and tail:
        hints = type_hints(nested[head])
        if tail not in hints:
            raise UnknownNameError("config field", key, field_names_of(cls, nested), field=key)
        table = dict(data.get(head, {}))
        value = parse_scalar(key, raw, hints[tail])
        if value is None:
            table.pop(tail, None)
        else:
            table[tail] = value
        if table:
            data[head] = table
        else:
            data.pop(head, None)
        return
    hints = type_hints(cls)
    if key not in hints or key in nested or key == "env":
        raise UnknownNameError("config field", key, field_names_of(cls, nested), field=key, also="env.NAME")
    value = parse_scalar(key, raw, hints[key])
    if value is None:
        data.pop(key, None)
    else:
        data[key] = value


def apply_values(data: dict[str, Any], values: Mapping[str, Any], cls: type, nested: Nested) -> None:
    """Apply overrides given as Python values *or* as text, by field name, to plain data in place.

    ``__`` stands for the first dot (``speculative__num_steps``), so names can be keyword arguments while an
    environment variable's own double underscores survive (``env__MY__VAR`` sets ``MY__VAR``); text goes
    through :func:`apply_override`, ``None`` unsets.
    """
    for raw_key, value in values.items():
        key = raw_key if "." in raw_key else raw_key.replace("__", ".", 1)
        if isinstance(value, str) or value is None:
            apply_override(data, key, "none" if value is None else value, cls, nested)
            continue
        head, _, tail = key.partition(".")
        if head == "env" and tail:
            raise ConfigError(key, value, "a string (environment values are text)")
        if head in nested and tail:
            if tail not in type_hints(nested[head]):
                raise UnknownNameError("config field", key, field_names_of(cls, nested), field=key)
            data[head] = {**data.get(head, {}), tail: value}
            continue
        if key not in type_hints(cls):
            raise UnknownNameError("config field", key, field_names_of(cls, nested), field=key, also="env.NAME")
        if key in nested and isinstance(value, nested[key]):
            value = {k: v for k, v in dataclasses.asdict(typing.cast(Any, value)).items() if v is not None}
        data[key] = list(value) if isinstance(value, tuple) else value


def config_data(config: Any, nested: Any, *, redact: bool) -> dict[str, Any]:
    """A config's plain data (:func:`to_plain`); with ``redact`` its secret values (``env.HF_TOKEN``,
    ``--api-key ...``; :mod:`dsv4lab.secrets`) replaced by a placeholder, the form for files people read."""
    data = to_plain(config, nested)
    if not redact:
        return data
    from dsv4lab.secrets import collect_secrets, redact_data

    redacted: dict[str, Any] = redact_data(data, collect_secrets(config))
    return redacted


def data_from_toml(text: str) -> dict[str, Any]:
    """TOML text as plain data; invalid TOML is a ConfigError that shows where it starts."""
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("toml", text[:60], "valid TOML", detail=str(exc)) from exc
    return data


def data_from_json(text: str) -> Any:
    """JSON text as plain data; invalid JSON is a ConfigError that shows where it starts."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("json", text[:60], "valid JSON", detail=str(exc)) from exc
