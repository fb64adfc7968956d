"""Segment formats (docs/architecture.md, "Segment format"): ``parquet`` (default) and
``arrow``. Writers use the format named by ``format.name``; readers the one a segment's own
bytes name (``open_reader``, ``formats.segment_io.open_segment``).
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
from formats.registry import (
    available_formats,
    detect_format,
    get_format,
    open_reader,
    register_format,
    sniff_format,
)

__all__ = [
    "FORMAT_VERSION",
    "SEGMENT_SCHEMA",
    "SegmentFormat",
    "SegmentMetadata",
    "SegmentReader",
    "SegmentWriter",
    "WriterOptions",
    "available_formats",
    "detect_format",
    "get_format",
    "open_reader",
    "register_format",
    "sniff_format",
]
