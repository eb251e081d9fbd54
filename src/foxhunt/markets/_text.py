"""Small text helpers shared by the OHLCV loader's modules: header-name normalisation and the
one-line renderings of values, numbers and timestamps in messages. Separate so that every loader
module can use them without importing another's logic."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd


def _norm(name: object) -> str:
    text = str(name).strip().lower().replace("_", " ").replace("-", " ")
    text = text.replace("<", "").replace(">", "").rstrip("*").rstrip(".")
    text = re.sub(r"\s*\([$€£¥]\)$", "", text)  # a currency sign as the unit: "Close ($)"
    text = re.sub(r"^\d\.\s+", "", text)  # Alpha Vantage's JSON keys: "1. open"
    return " ".join(text.split())


def _printable(text: str, limit: int = 400) -> str:
    """``text`` for a one-line message: control characters escaped (a binary file's bytes read
    as text), cut at ``limit`` characters."""
    text = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(value: object) -> str:
    """A short one-line rendering of an offending value."""
    if isinstance(value, float | np.floating):
        text = repr(float(value))
    elif isinstance(value, pd.Timestamp):
        text = str(value)
    else:
        text = repr(value.item() if isinstance(value, np.generic) else value)
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _stamp(ts: pd.Timestamp) -> str:
    """A timestamp for messages: the date alone when it is midnight."""
    return str(ts.date()) if ts == ts.normalize() else str(ts)
