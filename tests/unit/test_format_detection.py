"""Self-describing segments: readers pick the format from an object's own last bytes
(docs/architecture.md, "Segment format"), never from ``format.name``.
"""

from __future__ import annotations

import io
from dataclasses import replace
from typing import BinaryIO

import pytest

from formats import (
    SegmentFormat,
    SegmentMetadata,
    SegmentReader,
    SegmentWriter,
    WriterOptions,
    detect_format,
    get_format,
    open_reader,
    sniff_format,
)
from formats import registry as registry_module
from formats.records import Record, read_all_records, records_to_batch
from formats.segment_io import SegmentUpload, open_segment, publish_segment
from replicator.core.errors import SegmentCorrupt
from replicator.core.keys import SegmentKey
from replicator.core.storage import MemoryObjectStore

FORMATS = ["parquet", "arrow"]


def key_for(start: int, end: int, level: int = 0) -> SegmentKey:
    return SegmentKey("data", "us-east-1", "orders", 1, level, start, end)


def records(start: int, n: int) -> list[Record]:
    return [Record(start + i, 1_700_000_000_000 + i, None if i % 4 == 0 else b"k%d" % i,
                   b"" if i % 5 == 0 else (None if i % 7 == 0 else b"v%d" % i),
                   (("h", None), ("h", b"\x00\xff")) if i % 2 else ())
            for i in range(n)]


def encode(name: str, recs: list[Record], key: SegmentKey) -> bytes:
    stream = io.BytesIO()
    writer = get_format(name).open_writer(stream, WriterOptions())
    writer.write_batch(records_to_batch(recs))
    writer.finish(SegmentMetadata.for_key(key, len(recs)))
    return stream.getvalue()


def publish(store: MemoryObjectStore, name: str, recs: list[Record], key: SegmentKey) -> None:
    upload = SegmentUpload(store, get_format(name), "temp", WriterOptions())
    upload.write_batch(records_to_batch(recs))
    temp = upload.finish(SegmentMetadata.for_key(key, len(recs)))
    publish_segment(store, temp.key, key)


@pytest.mark.parametrize("name", FORMATS)
def test_each_format_is_recognised_by_its_own_bytes(name: str) -> None:
    key = key_for(0, 49)
    data = encode(name, records(0, 50), key)
    assert data.endswith(get_format(name).magic)
    assert detect_format(data[-8:]).name == name
    assert sniff_format(io.BytesIO(data)).name == name
    reader = open_reader(io.BytesIO(data), key, where="s3://b/k")
    assert read_all_records(reader.iter_batches(7)) == records(0, 50)


@pytest.mark.parametrize("name", FORMATS)
def test_open_segment_reads_any_format_and_names_it(name: str) -> None:
    store = MemoryObjectStore("bucket")
    key = key_for(100, 129)
    publish(store, name, records(100, 30), key)
    with open_segment(store, key) as reader:
        assert reader.format is not None and reader.format.name == name
        assert read_all_records(reader.iter_batches(4)) == records(100, 30)


def test_one_partition_mixing_formats_reads_in_one_pass() -> None:
    """After a format change (or with segments of two regions' writers) a partition holds
    both formats: every one of them reads, whatever format.name says."""
    store = MemoryObjectStore("bucket")
    keys = [key_for(0, 9), key_for(10, 19), key_for(20, 29, level=1)]
    for name, key in zip(["parquet", "arrow", "arrow"], keys, strict=True):
        publish(store, name, records(key.start, 10), key)
    got = []
    for key in keys:
        with open_segment(store, key) as reader:
            got += read_all_records(reader.iter_batches(100))
    assert got == records(0, 10) + records(10, 10) + records(20, 10)


@pytest.mark.parametrize("body", [b"", b"PAR", b"garbage bytes, not a segment at all",
                                  b"PAR1 starts like Parquet but ends otherwise"])
def test_unknown_bytes_are_corrupt_naming_the_key(body: bytes) -> None:
    store = MemoryObjectStore("bucket")
    key = key_for(50, 59)
    store.put(key.to_key(), body)
    with pytest.raises(SegmentCorrupt, match="not a segment of any known format") as err:
        open_segment(store, key)
    assert f"s3://bucket/{key.to_key()}" in str(err.value)
    assert "parquet ends with b'PAR1'" in str(err.value)
    assert "arrow ends with b'KSR1'" in str(err.value)


@pytest.mark.parametrize("name", FORMATS)
def test_a_truncated_segment_is_corrupt_naming_the_key(name: str) -> None:
    store = MemoryObjectStore("bucket")
    key = key_for(0, 49)
    store.put(key.to_key(), encode(name, records(0, 50), key)[:-3])
    with pytest.raises(SegmentCorrupt, match=r"s3://bucket/data/us-east-1/orders/1/0/"):
        open_segment(store, key)


@pytest.mark.parametrize("name", FORMATS)
def test_right_magic_wrong_key_is_still_refused(name: str) -> None:
    data = encode(name, records(0, 20), key_for(0, 19))
    with pytest.raises(SegmentCorrupt, match="end_offset"):
        open_reader(io.BytesIO(data), key_for(0, 29), where="s3://b/k")


class _Short(io.RawIOBase):
    """A raw stream that returns at most 3 bytes per read (short reads are legal)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._inner.seek(offset, whence)

    def tell(self) -> int:
        return self._inner.tell()

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(min(3, len(b)))
        b[: len(data)] = data
        return len(data)


def test_sniffing_survives_short_reads() -> None:
    data = encode("arrow", records(0, 5), key_for(0, 4))
    stream = _Short(data)
    assert sniff_format(stream).name == "arrow"  # type: ignore[arg-type]
    assert stream.tell() == 0


class _TaggedFormat(SegmentFormat):
    """A plugin format: the arrow encoding under another magic."""

    name = "tagged"
    magic = b"TAG9"

    def open_writer(self, stream: BinaryIO, options: WriterOptions) -> SegmentWriter:
        raise NotImplementedError

    def open_reader(self, stream: BinaryIO, expected: SegmentKey | None = None,
                    *, where: str = "") -> SegmentReader:
        raise SegmentCorrupt(f"{where}: tagged reader reached")


def test_registered_plugin_formats_are_recognised_too(monkeypatch: pytest.MonkeyPatch) -> None:
    get_format("parquet")  # the built-ins first
    monkeypatch.setitem(registry_module._FACTORIES, "tagged", _TaggedFormat)
    assert detect_format(b"....TAG9").name == "tagged"
    with pytest.raises(SegmentCorrupt, match="tagged reader reached"):
        open_reader(io.BytesIO(b"payloadTAG9"), where="s3://b/k")
    with pytest.raises(SegmentCorrupt, match="tagged ends with b'TAG9'"):
        detect_format(b"unknown!", where="s3://b/k")


def test_compaction_merges_inputs_of_any_format_into_the_configured_one() -> None:
    """Compaction's call sites: inputs in parquet and arrow (a format change between them),
    the output in the format compaction is configured with, read back by its bytes."""
    from compaction.merge import TaskSpec, merge_segments

    store = MemoryObjectStore("bucket")
    inputs = [key_for(0, 9), key_for(10, 19), key_for(20, 29)]
    for name, key in zip(["arrow", "parquet", "arrow"], inputs, strict=True):
        publish(store, name, records(key.start, 10), key)
    output = key_for(0, 29, level=1)
    spec = TaskSpec([k.to_key() for k in inputs], [1, 1, 1], output.to_key(), 4)
    result = merge_segments(store, get_format("parquet"), WriterOptions(), "temp", spec)
    assert result.ok and result.records == 30
    with open_segment(store, output) as reader:
        assert reader.format is not None and reader.format.name == "parquet"
        assert read_all_records(reader.iter_batches(100)) == [
            r for k in inputs for r in records(k.start, 10)]


@pytest.mark.parametrize("name", FORMATS)
def test_footer_carries_the_record_time_range_of_what_was_uploaded(name: str) -> None:
    """``SegmentUpload`` records min/max record timestamps in the footer (optional keys),
    whatever the order of record times; the callers' metadata does not mention them."""
    store = MemoryObjectStore("bucket")
    recs = records(0, 30)
    recs[3] = replace(recs[3], timestamp_ms=1_600_000_000_000)  # times are not ordered
    recs[20] = replace(recs[20], timestamp_ms=1_800_000_000_000)
    key = key_for(0, 29)
    upload = SegmentUpload(store, get_format(name), "temp", WriterOptions(row_group_size=65536))
    for lo in range(0, 30, 7):
        upload.write_batch(records_to_batch(recs[lo:lo + 7]))
    publish_segment(store, upload.finish(SegmentMetadata.for_key(key, 30)).key, key)
    with open_segment(store, key) as reader:
        assert (reader.metadata.min_timestamp, reader.metadata.max_timestamp) == \
            (1_600_000_000_000, 1_800_000_000_000)
        assert reader.metadata.to_footer()["min_timestamp"] == "1600000000000"


@pytest.mark.parametrize("name", FORMATS)
def test_segments_without_footer_times_still_read(name: str) -> None:
    """Segments written before the footer had record times: the keys are optional."""
    key = key_for(0, 9)
    data = encode(name, records(0, 10), key)  # a bare writer: metadata without times
    reader = open_reader(io.BytesIO(data), key)
    assert reader.metadata.min_timestamp is None and reader.metadata.max_timestamp is None
    assert "min_timestamp" not in reader.metadata.to_footer()


def test_footer_parsing_ignores_keys_it_does_not_know() -> None:
    """What lets older readers open segments with the time keys (and later ones)."""
    footer = SegmentMetadata.for_key(key_for(0, 9), 10).to_footer()
    old_keys = dict(footer)
    meta = SegmentMetadata.from_footer({**old_keys, "min_timestamp": "5", "max_timestamp": "9",
                                        "some_future_key": "x"}, where="k")
    assert (meta.min_timestamp, meta.max_timestamp) == (5, 9)
    with pytest.raises(SegmentCorrupt, match="bad footer value"):
        SegmentMetadata.from_footer({**old_keys, "min_timestamp": "x", "max_timestamp": "9"},
                                    where="k")
