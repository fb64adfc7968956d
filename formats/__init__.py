"""Segment formats, chosen by name (docs/architecture.md, "Segment format"): ``parquet``
(default) and ``arrow``.
"""

from __future__ import annotations

from formats.base import (
    FORMAT_VERSION,
    SEGMENT_SCHEMA,
    SegmentFormat,
    SegmentMetadata,
    SegmentReader,
    SegmentWriter,
    WriterOptions,
)
from formats.registry import available_formats, get_format, register_format

__all__ = [
    "FORMAT_VERSION",
    "SEGMENT_SCHEMA",
    "SegmentFormat",
    "SegmentMetadata",
    "SegmentReader",
    "SegmentWriter",
    "WriterOptions",
    "available_formats",
    "get_format",
    "register_format",
]
