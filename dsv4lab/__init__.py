"""dsv4lab: launch, watch, diagnose and benchmark SGLang servers from Jupyter, with a local twin."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
