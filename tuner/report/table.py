"""Tables as CSV text: one header line of column names, then one line per row (``csv`` defaults)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """``rows`` under ``columns`` (every row holds exactly those keys)."""
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows(rows)
    return table.getvalue()
