"""The log reader's error, defined with the rest of the hierarchy in :mod:`dsv4lab.errors`.

Reading a log should almost never fail: :func:`dsv4lab.logs.diagnose` turns every bad input into a
``Diagnosis`` with outcome ``unknown``. The lower layers (:func:`dsv4lab.logs.parse_log`) raise
:class:`LogError` for inputs that cannot be read at all (a missing file, a binary file), so a caller that
wants events rather than a verdict learns why there are none instead of getting an empty list.
"""

from __future__ import annotations

from dsv4lab.errors import LogError

__all__ = ["LogError"]
