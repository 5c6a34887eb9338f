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

import contextlib
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
    if pa.types.is_fixed_size_list(field_type):
        return [_zero(field_type.value_type)] * field_type.list_size
    if pa.types.is_struct(field_type):
        return {f.name: _zero(f.type) for f in field_type}
    if pa.types.is_string(field_type) or pa.types.is_large_string(field_type):
        return ""
    if pa.types.is_binary(field_type) or pa.types.is_large_binary(field_type):
        return b""
    if pa.types.is_boolean(field_type):
        return False
    return 0


def _variable(field_type: pa.DataType) -> bool:
    """Whether a column has no fixed number of values per row (a list, a map) or holds an extension type
    (LeRobot's language columns: ``arrow.json`` inside lists of structs), which pyarrow cannot build from Python
    values: the template writes such a column as one null row."""
    if isinstance(field_type, pa.ExtensionType) or pa.types.is_list(field_type) or \
            pa.types.is_large_list(field_type) or pa.types.is_map(field_type):
        return True
    if pa.types.is_fixed_size_list(field_type):
        return _variable(field_type.value_type)
    return pa.types.is_struct(field_type) and any(_variable(child.type) for child in field_type)


def _leaf_widths(schema: pa.Schema) -> list[int | None]:
    """Values per row of each leaf column, in file order; None for a leaf under a variable-length list."""
    widths: list[int | None] = []

    def walk(field_type: pa.DataType, width: int | None) -> None:
        if isinstance(field_type, pa.ExtensionType):
            walk(field_type.storage_type, width)
        elif pa.types.is_fixed_size_list(field_type):
            walk(field_type.value_type, None if width is None else width * field_type.list_size)
        elif pa.types.is_struct(field_type):
            for child in field_type:
                walk(child.type, width)
        elif pa.types.is_list(field_type) or pa.types.is_large_list(field_type):
            walk(field_type.value_type, None)
        elif pa.types.is_map(field_type):
            walk(field_type.key_type, None)
            walk(field_type.item_type, None)
        else:
            widths.append(width)

    for field in schema:
        walk(field.type, 1)
    return widths


def _template(schema: pa.Schema, compression: str) -> Any:
    from fastparquet.cencoding import from_buffer

    columns = [pa.nulls(1, f.type) if _variable(f.type) else pa.array([_zero(f.type)], f.type) for f in schema]
    table = pa.Table.from_arrays(columns, schema=schema)
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


def _layout(pages: list[_Page], start: int, leaves: list[tuple[int | None, bool]], rows: int
            ) -> list[list[_Page]] | None:
    """The column chunks of one row group of ``rows`` rows, from ``pages[start:]``; None when the pages do not
    make one (a group cut short). ``leaves``: (values per row or None, starts with a dictionary page) of each
    leaf column. A fixed-width chunk ends when it holds ``rows`` x width values; a variable-width one (a list)
    at the next dictionary page, which the next leaf (or the next group's first) must therefore have."""
    chunks: list[list[_Page]] = []
    at = start
    for number, (width, dictionary) in enumerate(leaves):
        chunk: list[_Page] = []
        if dictionary:
            if at >= len(pages) or pages[at].kind != _DICTIONARY_PAGE:
                return None
            chunk.append(pages[at])
            at += 1
        values = 0
        if width is not None:
            while values < rows * width and at < len(pages) and pages[at].kind != _DICTIONARY_PAGE:
                values += pages[at].values
                chunk.append(pages[at])
                at += 1
            if values != rows * width:
                return None
        else:
            if not leaves[(number + 1) % len(leaves)][1]:
                raise FooterRebuildError("a list column is followed by a column without a dictionary page: where "
                                         "its chunk ends cannot be told")
            while at < len(pages) and pages[at].kind != _DICTIONARY_PAGE:
                values += pages[at].values
                chunk.append(pages[at])
                at += 1
            if at >= len(pages) or values < rows:  # not followed by the next chunk: maybe cut short
                return None
        if len(chunk) == int(dictionary):
            return None
        chunks.append(chunk)
    return chunks


def _row_counts(pages: list[_Page], start: int, leaf: tuple[int | None, bool]) -> list[int]:
    """The row counts the first leaf's chunk could hold: one per data page it could end after."""
    width, dictionary = leaf
    if width is None:
        raise FooterRebuildError("the first column is a list: a row group's row count cannot be told")
    at, values, counts = start + int(dictionary), 0, []
    while at < len(pages) and pages[at].kind != _DICTIONARY_PAGE:
        values += pages[at].values
        if values % width == 0:
            counts.append(values // width)
        at += 1
    return counts


def _column(template_column: Any, chunk: list[_Page]) -> Any:
    from fastparquet.cencoding import ThriftObject

    column = ThriftObject("ColumnChunk", copy.deepcopy(template_column.contents))
    meta = column.meta_data
    data = [p for p in chunk if p.kind != _DICTIONARY_PAGE]
    meta.num_values = sum(p.values for p in data)
    meta.total_compressed_size = chunk[-1].end - chunk[0].offset
    meta.total_uncompressed_size = sum(p.header_bytes + p.uncompressed for p in chunk)
    if chunk[0].kind == _DICTIONARY_PAGE:
        meta.dictionary_page_offset = chunk[0].offset
    meta.data_page_offset = data[0].offset
    for name in ("statistics", "encoding_stats", "size_statistics"):
        if getattr(meta, name, None) is not None:
            delattr(meta, name)
    column.file_offset = chunk[0].offset
    return column


def read_without_footer(path: Path, schema: pa.Schema, *, compression: str = "snappy") -> RecoveredParquet:
    """The whole row groups of a footer-less Parquet file written with ``schema``, ``compression`` and
    dictionaries (pyarrow's ``ParquetWriter(..., use_dictionary=True)``: every column but booleans starts its
    chunks with a dictionary page), read through a rebuilt footer."""
    from fastparquet.cencoding import ThriftObject

    raw = Path(path).read_bytes()
    if raw[:4] != MAGIC:
        raise FooterRebuildError(f"{path.name} does not start with the Parquet magic bytes")
    template = _template(schema, compression)
    chunk_template = template.row_groups[0].columns
    widths = _leaf_widths(schema)
    if len(widths) != len(chunk_template):
        raise FooterRebuildError(f"{path.name}: {len(chunk_template)} leaf columns written, {len(widths)} expected")
    leaves = [(width, getattr(column.meta_data, "dictionary_page_offset", None) is not None)
              for width, column in zip(widths, chunk_template)]
    with contextlib.redirect_stdout(io.StringIO()):  # fastparquet prints "Corrupted thrift data" where parsing stops
        pages, _ = _pages(np.frombuffer(raw, dtype=np.uint8), 4)
    groups: list[tuple[int, list[list[_Page]]]] = []  # (rows, column chunks) of each whole row group
    at = 0
    try:
        while at < len(pages):
            found = next(((rows, chunks) for rows in _row_counts(pages, at, leaves[0])
                          if (chunks := _layout(pages, at, leaves, rows)) is not None), None)
            if found is None:
                break  # a row group cut short (or not laid out as the writer lays them out): the end of what is whole
            groups.append(found)
            at += sum(len(chunk) for chunk in found[1])
    except FooterRebuildError as exc:
        raise FooterRebuildError(f"{path.name}: {exc}") from None
    while True:  # a group that does not read back ends what is whole, as a cut one does
        table, end = _read_back(raw, template, chunk_template, groups)
        if table is not None or not groups:
            break
        groups.pop()
    if table is None:
        raise FooterRebuildError(f"{path.name}: no whole row group reads back")
    if not table.schema.equals(schema):
        raise FooterRebuildError(f"{path.name}: the recovered schema differs from the dataset's features")
    return RecoveredParquet(table, len(groups), end, len(raw) - end)


def _read_back(raw: bytes, template: Any, chunk_template: Any, groups: list[tuple[int, list[list[_Page]]]]
               ) -> tuple[pa.Table | None, int]:
    """The table the groups make with a footer listing them (None if it does not read), and where they end."""
    from fastparquet.cencoding import ThriftObject

    row_groups: list[Any] = []
    end = 4
    for rows, chunks in groups:
        columns = [_column(t, chunk) for t, chunk in zip(chunk_template, chunks)]
        row_group = ThriftObject("RowGroup", copy.deepcopy(template.row_groups[0].contents))
        row_group.columns = columns
        row_group.num_rows = rows
        row_group.total_byte_size = sum(c.meta_data.total_uncompressed_size for c in columns)
        row_group.file_offset = chunks[0][0].offset
        end = chunks[-1][-1].end
        row_group.total_compressed_size = end - chunks[0][0].offset
        row_groups.append(row_group)
    footer = ThriftObject("FileMetaData", copy.deepcopy(template.contents))
    footer.row_groups = row_groups
    footer.num_rows = sum(g.num_rows for g in row_groups)
    encoded = bytes(footer.to_bytes())
    rebuilt = raw[:end] + encoded + struct.pack("<i", len(encoded)) + MAGIC
    try:
        return pq.read_table(pa.BufferReader(rebuilt)), end
    except (pa.ArrowException, OSError):
        return None, end
