"""Tables that show themselves: a DataFrame a report can print as it is.

pandas' own HTML is for exploring data, not for a report a colleague reads: it shows the index, six
decimals, NaN and None, and cuts long text mid-value ("N=1024,K=4096,device_name=NVIDIA_RTX_PRO_6000_...",
a fix's flags cut mid-flag). :class:`Table` is an ordinary DataFrame — everything pandas does still works
on it — whose notebook view is the project's table (:mod:`dsv4lab.htmlview`): no index, every value
whole, numbers at a precision that suits their column, a dash for what was not measured, and an optional
title and note. Column names carry their units (``"headroom (GiB)"``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import pandas as pd

__all__ = ["Table", "column_digits", "format_cell", "frame_html", "table"]


def column_digits(values: Iterable[Any]) -> int:
    """Decimals for a column of numbers: 2 below 10, 1 below 1,000, none above (one rule per column, so
    that the numbers of a column line up)."""
    nums = [abs(float(v)) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    nums = [v for v in nums if math.isfinite(v)]
    if not nums or all(float(v).is_integer() for v in nums):
        return 0
    top = max(nums)
    return 2 if top < 10 else 1 if top < 1000 else 0


def format_cell(value: Any, digits: int) -> str:
    """One cell as text: ``–`` for missing, yes/no, thousands separators, ``digits`` decimals."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if math.isinf(value):
            return "∞"
        return f"{value:,.{digits}f}" if digits or not value.is_integer() or abs(value) >= 1e15 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_cell(v, digits) for v in value)
    text = str(value)
    return "–" if text in ("nan", "None", "NaN", "<NA>") else text


def frame_html(frame: pd.DataFrame, *, title: str = "", note: str = "", max_rows: int = 40) -> str:
    """A frame as the project's HTML table: no index (a named index becomes the first column)."""
    from dsv4lab import htmlview as hv

    data = frame.reset_index() if _meaningful_index(frame) else frame
    columns = [str(c) for c in data.columns]
    digits = {c: column_digits(data[c].tolist()) for c in data.columns}
    rows = [
        {str(c): format_cell(_native(v), digits[c]) for c, v in zip(data.columns, record, strict=True)}
        for record in data.itertuples(index=False, name=None)
    ]
    body = hv.table(rows, columns, max_rows=max_rows) if rows else hv.p("no rows")
    if note:
        body += hv.p(note)
    return hv.card(title, body) if title else body


def _native(value: Any) -> Any:
    """numpy scalars as Python ones (so that ints stay ints and NaN is seen)."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (list, tuple, str)):
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value


def _meaningful_index(frame: pd.DataFrame) -> bool:
    index = frame.index
    if index.name is not None or any(n is not None for n in getattr(index, "names", [])):
        return True
    return not isinstance(index, pd.RangeIndex)


class Table(pd.DataFrame):
    """A DataFrame with a report's view (see the module doc). ``title`` and ``note`` frame it in a
    notebook; pandas operations return plain DataFrames."""

    _metadata: ClassVar[list[str]] = ["title", "note"]
    title: str
    note: str

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return pd.DataFrame

    def _repr_html_(self) -> str:
        return frame_html(self, title=getattr(self, "title", "") or "", note=getattr(self, "note", "") or "")

    def to_frame(self) -> pd.DataFrame:
        """The data as a plain DataFrame."""
        frame: pd.DataFrame = pd.DataFrame(self)
        return frame


def table(
    rows: Sequence[dict[str, Any]] | pd.DataFrame,
    *,
    columns: Sequence[str] | None = None,
    title: str = "",
    note: str = "",
) -> Table:
    """A :class:`Table` from rows (or a frame), with its title and note."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows), columns=list(columns or []) or None)
    out: Table = Table(frame)
    out.title = title
    out.note = note
    return out
