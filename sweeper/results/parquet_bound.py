"""A Parquet file from elsewhere (a row file, a replay table) decoded under a byte budget measured
on what is decoded, not on what the file's footer claims: the footer's sizes can be edited, a few
kilobytes of zstd can expand to gigabytes, and a dictionary of one long string repeated by a
run-length code expands to its length times the rows.

Two bounds before anything is decompressed, one before anything is expanded:
- the footer's claim (`total_byte_size` of each row group), the cheap first refusal;
- the pages' own headers, walked in the file's bytes: each page's `uncompressed_page_size` is what
  the reader allocates to decompress it (a page that decompresses to more is an error, not a
  bigger buffer), and its value count what the decoded column holds;
- strings are decoded as dictionaries first, and the lengths their indices take are summed before
  the column is expanded.
Each failure is one FileRefused line naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sweeper.files import FileRefused

_VALUE_BYTES = 8  # an index, an offset or a number per decoded value: what a value costs beyond its bytes


def read_parquet_bounded(data: bytes, path: Path, *, max_decoded: int) -> pa.Table:
    """The table of the Parquet file `data` (read from `path`), refused when decoding it would take
    more than `max_decoded` bytes, by the footer's claim, the pages' headers or the strings' lengths."""
    buf = pa.py_buffer(data)
    try:
        meta = pq.read_metadata(pa.BufferReader(buf))
    except (pa.ArrowException, OSError) as e:
        raise FileRefused(f"{path}: not a Parquet file ({' '.join(str(e).split())[:120]})") from None
    claimed = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if claimed > max_decoded:
        raise FileRefused(f"{path}: {claimed} bytes once decompressed; at most {max_decoded} are decoded here")
    pages = _page_bytes(data, meta, path)
    if pages > max_decoded:
        raise FileRefused(f"{path}: its pages decompress to {pages} bytes; at most {max_decoded} are decoded here")
    try:
        schema = meta.schema.to_arrow_schema()
        text = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_binary(f.type)]
        # the one file's reader, not `pq.read_table`: the same table, without importing pyarrow.dataset
        # (about 0.3 s of CPU in every command that reads a row)
        table = pq.ParquetFile(pa.BufferReader(buf), read_dictionary=text).read()
    except (pa.ArrowException, OSError) as e:
        raise FileRefused(f"{path}: unreadable Parquet ({' '.join(str(e).split())[:120]})") from None
    expanded = sum(_expanded_bytes(table.column(name)) for name in text)
    if expanded + pages > max_decoded:
        raise FileRefused(f"{path}: its strings expand to {expanded} bytes; at most {max_decoded} are decoded here")
    return pa.Table.from_arrays([_plain(table.column(i)) for i in range(table.num_columns)], schema=schema)


def _expanded_bytes(column: pa.ChunkedArray) -> int:
    """The bytes a dictionary-encoded string column takes once every index is replaced by its string."""
    total = 0
    for chunk in column.chunks:
        if isinstance(chunk, pa.DictionaryArray) and len(chunk.dictionary):
            lengths = pc.fill_null(pc.binary_length(chunk.dictionary), 0)
            total += int(pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0)  # a null index takes nothing
    return total


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        return pa.chunked_array([c.dictionary_decode() for c in column.chunks], type=column.type.value_type)
    return column


def _page_bytes(data: bytes, meta: pq.FileMetaData, path: Path) -> int:
    """Sum over every page of every column chunk: its uncompressed size and its values' cost."""
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            if start is None or not 0 <= start < len(data):
                raise FileRefused(f"{path}: a column chunk starts outside the file")
            end = min(len(data), start + max(col.total_compressed_size, 0))
            at = start
            while at < end:
                header, at = _struct(data, at, path)
                unpacked, packed = header.get(2), header.get(3)
                if not isinstance(unpacked, int) or not isinstance(packed, int) or unpacked < 0 or packed < 0:
                    raise FileRefused(f"{path}: a page header without its sizes")
                values = max((h.get(1, 0) for k in (5, 7, 8) if isinstance(h := header.get(k), dict)), default=0)
                total += unpacked + _VALUE_BYTES * max(int(values), 0)
                at += packed
    return total


# ---- Thrift's compact protocol: just enough to read a page header and skip what it does not need ----
def _varint(data: bytes, at: int, path: Path) -> tuple[int, int]:
    out, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise FileRefused(f"{path}: a page header runs past the file")
        b = data[at]
        at += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, at


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(data: bytes, at: int, kind: int, path: Path, depth: int) -> tuple[Any, int]:
    if depth > 8:
        raise FileRefused(f"{path}: a page header nested too deep")
    if kind in (1, 2):  # booleans: the type is the value
        return kind == 1, at
    if kind == 3:
        return data[at] if at < len(data) else 0, at + 1
    if kind in (4, 5, 6):
        n, at = _varint(data, at, path)
        return _zigzag(n), at
    if kind == 7:
        return None, at + 8
    if kind == 8:
        n, at = _varint(data, at, path)
        return None, at + n
    if kind in (9, 10):  # list, set: size and element type in one byte (15: size follows)
        head = data[at] if at < len(data) else 0
        size, elem, at = head >> 4, head & 0x0F, at + 1
        if size == 15:
            size, at = _varint(data, at, path)
        for _ in range(size):  # a boolean element is a byte of its own
            _, at = (None, at + 1) if elem in (1, 2) else _value(data, at, elem, path, depth + 1)
        return None, at
    if kind == 11:
        size, at = _varint(data, at, path)
        if size:
            types = data[at] if at < len(data) else 0
            at += 1
            for _ in range(size):
                _, at = _value(data, at, types >> 4, path, depth + 1)
                _, at = _value(data, at, types & 0x0F, path, depth + 1)
        return None, at
    if kind == 12:
        return _struct(data, at, path, depth + 1)
    raise FileRefused(f"{path}: a page header holds an unknown field type {kind}")


def _struct(data: bytes, at: int, path: Path, depth: int = 0) -> tuple[dict[int, Any], int]:
    fields: dict[int, Any] = {}
    last = 0
    while True:
        if at >= len(data):
            raise FileRefused(f"{path}: a page header runs past the file")
        head = data[at]
        at += 1
        if head == 0:
            return fields, at
        delta, kind = head >> 4, head & 0x0F
        if delta:
            field = last + delta
        else:
            n, at = _varint(data, at, path)
            field = _zigzag(n)
        fields[field], at = _value(data, at, kind, path, depth)
        last = field
