"""Files written whole or not at all, private to the user.

Every record and report dsv4lab writes goes through here: a temp file beside the target (0600 from its
creation), renamed into place. A crash or a full disk leaves the old copy or none, never half a file; and a
file people share is never readable by other users of the machine on its way there.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["write_text_atomic"]


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
