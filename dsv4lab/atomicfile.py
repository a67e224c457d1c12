"""Files written whole or not at all, private to the user; JSON records safe to share.

Every record and report dsv4lab writes goes through here: a temp file beside the target (0600 from its
creation), renamed into place. A crash or a full disk leaves the old copy or none, never half a file; and a
file people share is never readable by other users of the machine on its way there. JSON records are made
JSON-safe (:func:`to_jsonable`) and redacted (:mod:`dsv4lab.secrets`) on the way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsv4lab.secrets import collect_secrets, redact_data

__all__ = ["to_jsonable", "write_json_atomic", "write_text_atomic"]


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole (a temp file renamed into place), mode 0600; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def to_jsonable(value: Any) -> Any:
    """A JSON-safe copy: dataclasses and ``to_dict()`` objects become dicts, NaN becomes null, others str."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_jsonable(to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    return str(value)


def write_json_atomic(path: Path, data: Any, *, redact: bool = True) -> None:
    """Write JSON whole or not at all (a temp file renamed into place): a crash never leaves half a file.

    The file is private to the user (0600), and with ``redact`` (the default: every JSON file dsv4lab
    writes — params, results, server and readiness records — is one people read and share) secret values
    are replaced first (:mod:`dsv4lab.secrets`): a token in a parameter or a figure never reaches disk.
    """
    record = to_jsonable(data)
    if redact:
        record = redact_data(record, collect_secrets())
    write_text_atomic(path, json.dumps(record, indent=2) + "\n")
