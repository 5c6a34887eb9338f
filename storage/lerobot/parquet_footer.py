"""Read a Parquet file whose writer was killed before ``close()``: the row groups are on disk, the footer that
lists them is not (LeRobot keeps its data writer open until ``finalize()``).

Written by hand because no library reads such a file: pyarrow and fastparquet both start from the footer. The
pieces are libraries': fastparquet's Thrift codec parses each page header and serialises a new footer, and
pyarrow writes a one-row file with the writer's schema and settings whose footer is the template for every
column chunk (types, paths, codec, the arrow schema). What is done here is only the layout: the pages, in file
order, grouped into column chunks (each opens with a dictionary page, as the writer was told to use
dictionaries) and row groups (one chunk per leaf column); a row group is kept only when every one of its
chunks is whole and all agree on the number of rows. The file itself is never modified.
"""

from __future__ import annotations

import copy
import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MAGIC = b"PAR1"
_DICTIONARY_PAGE, _DATA_PAGE, _DATA_PAGE_V2 = 2, 0, 3


class FooterRebuildError(ValueError):
    """The file's pages cannot be laid out as row groups of the expected schema (not what the writer wrote)."""


@dataclass(frozen=True)
class RecoveredParquet:
    """What a footer-less file held: its whole row groups as a table, and the bytes after them (a row group
    the kill cut short)."""

    table: pa.Table
    row_groups: int
    data_bytes: int  # bytes of the file that the recovered row groups cover (from the start)
    trailing_bytes: int


@dataclass(frozen=True)
class _Page:
    offset: int
    header_bytes: int
    kind: int
    compressed: int
    uncompressed: int
    values: int

    @property
    def end(self) -> int:
        return self.offset + self.header_bytes + self.compressed


def has_footer(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, io.SEEK_END)
        size = f.tell()
        if size < 12:
            return False
        f.seek(size - 4)
        return f.read(4) == MAGIC


def _zero(field_type: pa.DataType) -> Any:
    if pa.types.is_fixed_size_list(field_type) or pa.types.is_list(field_type) or \
            pa.types.is_large_list(field_type):
        size = field_type.list_size if pa.types.is_fixed_size_list(field_type) else 1
        return [_zero(field_type.value_type)] * size
    if pa.types.is_struct(field_type):
        return {f.name: _zero(f.type) for f in field_type}
    if pa.types.is_string(field_type) or pa.types.is_large_string(field_type):
        return ""
    if pa.types.is_binary(field_type) or pa.types.is_large_binary(field_type):
        return b""
    if pa.types.is_boolean(field_type):
        return False
    return 0


def _leaf_widths(schema: pa.Schema) -> list[int]:
    """Values per row of each leaf column, in file order; a variable-length list has no fixed width."""
    widths: list[int] = []

    def walk(field_type: pa.DataType, width: int) -> None:
        if pa.types.is_fixed_size_list(field_type):
            walk(field_type.value_type, width * field_type.list_size)
        elif pa.types.is_struct(field_type):
            for child in field_type:
                walk(child.type, width)
        elif pa.types.is_list(field_type) or pa.types.is_large_list(field_type) or pa.types.is_map(field_type):
            raise FooterRebuildError(f"a variable-length list column ({field_type}) has no fixed number of values "
                                     "per row")
        else:
            widths.append(width)

    for field in schema:
        walk(field.type, 1)
    return widths


def _template(schema: pa.Schema, compression: str) -> Any:
    from fastparquet.cencoding import from_buffer

    table = pa.Table.from_pylist([{f.name: _zero(f.type) for f in schema}], schema=schema)
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, schema, compression=compression, use_dictionary=True) as writer:
        writer.write_table(table)
    data = sink.getvalue()
    length = struct.unpack("<i", data[-8:-4])[0]
    return from_buffer(data[-8 - length:-8], "FileMetaData")


def _pages(data: np.ndarray, start: int) -> tuple[list[_Page], int]:
    """Page headers from ``start`` on, while each header parses and its page lies inside the file; the offset
    where parsing stopped."""
    from fastparquet.cencoding import NumpyIO, ThriftObject

    pages: list[_Page] = []
    pos, size = start, len(data)
    while pos < size:
        reader = NumpyIO(data[pos:])
        try:
            header = ThriftObject.from_buffer(reader, "PageHeader")
            kind, compressed = header.type, header.compressed_page_size
        except Exception:  # noqa: BLE001 - bytes the kill cut short do not parse: the end of what is whole
            break
        head = reader.tell()
        if kind not in (_DICTIONARY_PAGE, _DATA_PAGE, _DATA_PAGE_V2) or compressed is None or compressed < 0 or \
                pos + head + compressed > size:
            break
        if kind == _DICTIONARY_PAGE:
            values = header.dictionary_page_header.num_values
        elif kind == _DATA_PAGE:
            values = header.data_page_header.num_values
        else:
            values = header.data_page_header_v2.num_values
        pages.append(_Page(pos, head, kind, compressed, header.uncompressed_page_size, int(values)))
        pos += head + compressed
    return pages, pos


def read_without_footer(path: Path, schema: pa.Schema, *, compression: str = "snappy") -> RecoveredParquet:
    """The whole row groups of a footer-less Parquet file written with ``schema``, ``compression`` and
    dictionaries (pyarrow's ``ParquetWriter(..., use_dictionary=True)``), read through a rebuilt footer."""
    from fastparquet.cencoding import ThriftObject

    raw = Path(path).read_bytes()
    if raw[:4] != MAGIC:
        raise FooterRebuildError(f"{path.name} does not start with the Parquet magic bytes")
    template = _template(schema, compression)
    chunk_template = template.row_groups[0].columns
    widths = _leaf_widths(schema)
    if len(widths) != len(chunk_template):
        raise FooterRebuildError(f"{path.name}: {len(chunk_template)} leaf columns written, {len(widths)} expected")
    pages, _ = _pages(np.frombuffer(raw, dtype=np.uint8), 4)
    chunks: list[list[_Page]] = []
    for page in pages:
        if page.kind == _DICTIONARY_PAGE or not chunks:
            chunks.append([page])
        else:
            chunks[-1].append(page)
    leaves = len(widths)
    row_groups: list[Any] = []
    end = 4
    for first in range(0, len(chunks) - leaves + 1, leaves):
        group = chunks[first:first + leaves]
        counts: list[int] = []
        columns = []
        for chunk, width, template_column in zip(group, widths, chunk_template):
            values = sum(p.values for p in chunk if p.kind != _DICTIONARY_PAGE)
            if chunk[0].kind != _DICTIONARY_PAGE or values % width:
                counts = []
                break
            counts.append(values // width)
            column = ThriftObject("ColumnChunk", copy.deepcopy(template_column.contents))
            meta = column.meta_data
            meta.num_values = values
            meta.total_compressed_size = chunk[-1].end - chunk[0].offset
            meta.total_uncompressed_size = sum(p.header_bytes + p.uncompressed for p in chunk)
            meta.dictionary_page_offset = chunk[0].offset
            meta.data_page_offset = next((p.offset for p in chunk if p.kind != _DICTIONARY_PAGE), chunk[0].offset)
            for name in ("statistics", "encoding_stats", "size_statistics"):
                if getattr(meta, name, None) is not None:
                    delattr(meta, name)
            column.file_offset = chunk[0].offset
            columns.append(column)
        if not counts or len(set(counts)) != 1:
            break  # a row group cut short (or not laid out as the writer lays them out): the end of what is whole
        group_end = group[-1][-1].end
        row_group = ThriftObject("RowGroup", copy.deepcopy(template.row_groups[0].contents))
        row_group.columns = columns
        row_group.num_rows = counts[0]
        row_group.total_byte_size = sum(c.meta_data.total_uncompressed_size for c in columns)
        row_group.file_offset = group[0][0].offset
        row_group.total_compressed_size = group_end - group[0][0].offset
        row_groups.append(row_group)
        end = group_end
    footer = ThriftObject("FileMetaData", copy.deepcopy(template.contents))
    footer.row_groups = row_groups
    footer.num_rows = sum(g.num_rows for g in row_groups)
    encoded = bytes(footer.to_bytes())
    rebuilt = raw[:end] + encoded + struct.pack("<i", len(encoded)) + MAGIC
    try:
        table = pq.read_table(pa.BufferReader(rebuilt))
    except (pa.ArrowException, OSError) as exc:
        raise FooterRebuildError(f"{path.name}: the row groups found do not read back ({exc})") from None
    if not table.schema.equals(schema):
        raise FooterRebuildError(f"{path.name}: the recovered schema differs from the dataset's features")
    return RecoveredParquet(table, len(row_groups), end, len(raw) - end)
