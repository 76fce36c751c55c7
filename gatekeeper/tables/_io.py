"""Tables in, by record batches: Parquet, CSV or Arrow IPC (by suffix), on local disk or at `s3://`, `gs://` or
`az://` through pyarrow's own filesystems (credentials and endpoint from each cloud's standard environment; for S3,
`AWS_ENDPOINT_URL` for any S3-compatible store), or any object that speaks the Arrow C stream interface (pyarrow,
pandas, polars, DuckDB). The result goes out through `_out`.

A CSV's columns are read as text, as written (`02134` stays `02134`, the ids `007` and `7` stay two), unless its
types are asked to be inferred; its bytes must be UTF-8, or in the encoding named: a table in another is refused
before anything is sent, naming what it looks like. A pass may be bounded to the rows a first pass read (`limit`),
so rows appended while a job runs wait for the next run instead of being counted twice.
"""

from __future__ import annotations

import codecs
import functools
import os
import tempfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from .._errors import GatekeeperError, InputError, UsageError
from ._names import FORMATS
from ._where import IN_MEMORY, is_uri, scrub, shown

BATCH_ROWS = 4096  # rows a record batch holds (16,384: slower, and 60 MB more at a million rows)
CSV_BLOCK = 1 << 22  # bytes of a CSV parsed at once (and, with inferred types, the bytes its types are read from)


def format_of(where: str, setting: str) -> str:
    suffix = Path(where.split("?", 1)[0]).suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"{shown(where)}: a table is .parquet, .csv or .arrow (.ipc, .feather)", setting=setting)
    return FORMATS[suffix]


def filesystem(where: str, setting: str) -> tuple[pafs.FileSystem, str]:
    if not is_uri(where):
        return pafs.LocalFileSystem(), os.path.abspath(where)
    try:
        return pafs.FileSystem.from_uri(where)  # type: ignore[no-any-return]
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise UsageError(f"{shown(where)}: {scrub(str(exc).splitlines()[0], where)}", setting=setting) from None


@dataclass
class TableSource:
    """A table to read (again): a path or URI (a CSV's `encoding`, None for UTF-8, and whether its types are
    inferred), or a table in memory. A table given as a stream is spooled once, on first use, to an Arrow file in
    `spool_dir` (default: the temporary folder), read back mapped, a record batch at a time."""

    where: str | None
    table: pa.Table | None = None
    encoding: str | None = None
    infer_types: bool = False
    stream: pa.RecordBatchReader | None = None
    spool_dir: str | None = None
    grew: bool = False  # a bounded pass found rows after those a first pass read
    # a CSV of a header alone without a newline, given one (pyarrow reads no such header)
    _padded: bytes | None = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, source: Any, *, encoding: str | None = None, infer_types: bool = False) -> TableSource:
        if isinstance(source, TableSource):
            return source
        if isinstance(source, (str, os.PathLike)):
            where = os.fspath(source)
            return cls(where, encoding=_csv_encoding(where, encoding, infer_types), infer_types=infer_types)
        if encoding or infer_types:
            raise UsageError("encoding and infer_types are how a CSV file is read: a table in memory has its types",
                             setting="encoding")
        if isinstance(source, pa.RecordBatch):
            source = pa.Table.from_batches([source])
        if isinstance(source, pa.Table):
            return cls(None, source)
        try:
            if hasattr(source, "__arrow_c_stream__"):  # (pandas, polars, DuckDB: streamed, never taken whole)
                return cls(None, stream=pa.RecordBatchReader.from_stream(source))
            return cls(None, pa.table(source))
        except (TypeError, pa.ArrowException) as exc:
            raise UsageError(f"the table given is neither a path nor a table that speaks Arrow ({exc})",
                             setting="source") from None

    @property
    def name(self) -> str:
        """The table as it may be printed (a URI's credentials masked)."""
        return IN_MEMORY if self.where is None else shown(self.where)

    @property
    def kind(self) -> str:
        return "memory" if self.where is None else format_of(self.where, "source")

    def schema(self) -> pa.Schema:
        if self.where is None:
            return self._table().schema
        if self.kind == "parquet" and self._footer is not None:  # (no batch read)
            return self._footer.schema.to_arrow_schema()
        if self.kind == "csv":
            return self._csv_schema
        return self._ipc_schema()

    @property
    def rows_hint(self) -> int:
        """How many rows the table has, when that costs no pass (a table in memory, Parquet's footer), else 0."""
        if self.where is None:
            return int(self._table().num_rows)
        return 0 if self._footer is None else int(self._footer.num_rows)

    def _table(self) -> pa.Table:
        """The table in memory: given, or a stream spooled to a file and mapped (memory: the pages read)."""
        if self.table is None:
            assert self.stream is not None
            self.table, self.stream = _spooled(self.stream, self.spool_dir), None
        return self.table

    @functools.cached_property
    def _footer(self) -> pq.FileMetaData | None:
        """A Parquet file's footer, read once (None: not Parquet, or unreadable: the pass that reads it says why)."""
        if self.where is None or self.kind != "parquet":
            return None
        fs, path = filesystem(self.where, "source")
        try:
            with fs.open_input_file(path) as f:
                return pq.ParquetFile(f).metadata
        except (pa.ArrowException, OSError):
            return None

    @functools.cached_property
    def _csv_schema(self) -> pa.Schema:
        """A CSV's columns: every one text, or, with `infer_types`, as pyarrow infers them from the first block."""
        with self._opened() as f:
            self._check_wide(f)
            try:
                reader = pacsv.open_csv(f, read_options=self._csv_read(), convert_options=self._csv_convert(None, []))
            except pa.ArrowInvalid as exc:
                if "Empty CSV" not in str(exc):
                    raise self._unreadable(exc) from None
                self._padded = self._header_alone(f)
                if self._padded is None:
                    raise InputError(f"{self.name}: the CSV is empty (not even a header row)") from None
                reader = pacsv.open_csv(pa.BufferReader(self._padded), read_options=self._csv_read(),
                                        convert_options=self._csv_convert(None, []))
            except UnicodeError:  # (the encoding named cannot read it)
                raise self._not_in_encoding() from None
            names = reader.schema.names
            self._check_text(reader.schema)
            if self.infer_types:
                return reader.schema
            return pa.schema([pa.field(n, pa.string()) for n in names])

    def _header_alone(self, f: Any) -> bytes | None:
        """The CSV with a newline after it, when it is a header alone that ends without one (an empty result, as
        with the newline); None when it is empty, or in an encoding whose newline is not one byte."""
        f.seek(0)
        head = f.read(CSV_BLOCK + 1)
        newline = "\n".encode(self.encoding or "utf8")
        if len(head) > CSV_BLOCK or len(newline) != 1 or not head.strip(b" \t\xef\xbb\xbf") or b"\n" in head \
                or b"\r" in head:
            return None
        return bytes(head) + newline

    def _ipc_schema(self) -> pa.Schema:
        with self._opened() as f:
            try:
                return pa.ipc.open_file(f).schema
            except pa.ArrowInvalid:
                f.seek(0)
                try:
                    return pa.ipc.open_stream(f).schema
                except pa.ArrowException as exc:
                    raise self._unreadable(exc) from None

    def batches(self, columns: list[str] | None = None, limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """The rows in order, a record batch at a time (memory: one batch); of `columns` only, when given (Parquet
        and CSV then decode no other); the first `limit` rows only, when given: fewer is an error (the table
        changed under the job), more are noted (`grew`) and left for the next run."""
        seen = 0
        every = self._batches(columns)
        try:
            for batch in every:
                if limit is not None and seen + batch.num_rows >= limit:
                    cut = limit - seen
                    self.grew = self.grew or cut < batch.num_rows or any(b.num_rows for b in every)
                    if cut:
                        yield batch.slice(0, cut)
                    seen = limit
                    break
                seen += batch.num_rows
                yield batch
        finally:
            every.close()
        if limit is not None and seen < limit:
            raise InputError(f"{self.name} changed while the job ran: it had {limit:,} rows when they were judged and "
                             f"has {seen:,} now (the answers are kept: run again to judge it anew)")

    def _batches(self, columns: list[str] | None) -> Generator[pa.RecordBatch, None, None]:
        if self.where is None:
            table = self._table()
            yield from (table if columns is None else table.select(columns)).to_batches(max_chunksize=BATCH_ROWS)
            return
        kind = self.kind
        if kind == "csv":
            self._csv_schema  # noqa: B018  (first: a header alone is then read with its newline)
        with self._opened() as f:
            try:
                if kind == "csv":
                    yield from self._csv(f, columns)
                else:
                    yield from _read(kind, f, columns)
            except (pa.ArrowException, OSError) as exc:
                raise self._unreadable(exc) from None
            except UnicodeError:  # (the encoding named cannot read it: Python's codec, under pyarrow's reader)
                raise self._not_in_encoding() from None

    def _csv(self, f: Any, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        names = self._csv_schema.names
        reader = pacsv.open_csv(f, read_options=self._csv_read(), convert_options=self._csv_convert(names, columns))
        for batch in reader:
            if self.infer_types:
                self._check_text(batch.schema)
            yield batch

    def _csv_read(self) -> pacsv.ReadOptions:
        return pacsv.ReadOptions(block_size=CSV_BLOCK, encoding=self.encoding or "utf8")

    def _csv_convert(self, names: list[str] | None, columns: list[str] | None) -> pacsv.ConvertOptions:
        """Every column as text (unless inferred); an empty cell is null."""
        types = None if self.infer_types or names is None else dict.fromkeys(names, pa.string())
        return pacsv.ConvertOptions(strings_can_be_null=True, include_columns=columns or [], column_types=types)

    def _check_text(self, schema: pa.Schema) -> None:
        """A UTF-8 CSV's inferred binary column is bytes that are not UTF-8: the table's encoding is another."""
        if self.encoding is None and any(pa.types.is_binary(t) for t in schema.types):
            raise self._not_utf8()

    def _opened(self) -> Any:
        assert self.where is not None
        if self._padded is not None:
            return pa.BufferReader(self._padded)
        fs, path = filesystem(self.where, "source")
        try:
            return fs.open_input_file(path)
        except FileNotFoundError:
            raise InputError(f"{self.name}: no such table") from None
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{self.name}: cannot be read ({scrub(str(exc).splitlines()[0], self.where)})") from None

    def _unreadable(self, exc: BaseException) -> GatekeeperError:
        assert self.where is not None
        text = str(exc).splitlines()[0]
        if self.encoding is None and "invalid UTF8" in text:
            return self._not_utf8()
        hint = (f" (its types were inferred from its first {CSV_BLOCK >> 20} MB: read its columns as text, the "
                "default)") if self.infer_types and "conversion error" in text else ""
        return InputError(f"{self.name}: cannot be read as {self.kind} ({scrub(text, self.where)}){hint}")

    def _check_wide(self, f: Any) -> None:
        """A UTF-8 CSV that starts as UTF-16 or UTF-32 does (a byte-order mark, or NULs in alternate places without
        one) is refused naming it: its NULs read as UTF-8 (a cold tester's UTF-16 CSV was refused as "Expected 2
        columns, got 1", or its names were read with NULs in them). `f` is left at its start."""
        from ._encoding import HEAD, wide_of

        if self.encoding is None:
            wide = wide_of(f.read(HEAD))
            f.seek(0)
            if wide is not None:
                raise UsageError(f"{self.name} is not UTF-8: {wide}", setting="encoding")

    def _not_in_encoding(self) -> UsageError:
        from ._encoding import not_in

        assert self.encoding is not None
        with self._opened() as f:
            return UsageError(f"{self.name} {not_in(f, self.encoding)}", setting="encoding")

    def _not_utf8(self) -> UsageError:
        from ._encoding import not_utf8

        with self._opened() as f:
            return UsageError(f"{self.name} {not_utf8(f)}", setting="encoding")


def _csv_encoding(where: str, encoding: str | None, infer_types: bool) -> str | None:
    """A CSV's encoding as pyarrow is given it (None: UTF-8, read natively and checked); a table that is not CSV
    takes neither option."""
    if not (encoding or infer_types):
        return None
    kind = format_of(where, "source")
    if kind != "csv":
        raise UsageError(f"{shown(where)} is {kind}: only a CSV is read with an encoding or inferred types",
                         setting="encoding" if encoding else "infer_types")
    if not encoding:
        return None
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise UsageError(f"encoding {encoding!r}: no such encoding (utf-8, cp1252, latin-1, utf-16, ...)",
                         setting="encoding") from None
    return None if name == "utf-8" else name


def _read(kind: str, f: Any, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    if kind == "parquet":
        # (pre_buffer keeps every column chunk read until the file is closed: 195 MB more at 6.5M rows; a buffered
        # stream reads a column chunk 1 MB at a time, not whole: 51 MB less on a row group of 1M rows)
        yield from pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20).iter_batches(batch_size=BATCH_ROWS,
                                                                                         columns=columns)
    else:
        yield from (b if columns is None else b.select(columns) for b in _ipc(f))


def _ipc(f: Any) -> Iterator[pa.RecordBatch]:
    try:
        reader: Any = pa.ipc.open_file(f)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    except pa.ArrowInvalid:
        f.seek(0)
        yield from pa.ipc.open_stream(f)


def _spooled(stream: pa.RecordBatchReader, folder: str | None) -> pa.Table:
    """A stream written once to an Arrow file and mapped back: the passes read it again from there, a record batch
    at a time, and the file is gone (unlinked at once; the mapping keeps it until the table is dropped)."""
    fd, path = tempfile.mkstemp(dir=folder, prefix=".gatekeeper-table-", suffix=".arrow")
    os.close(fd)
    try:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, stream.schema) as writer:
            for batch in stream:
                writer.write_batch(batch)
        return pa.ipc.open_file(pa.memory_map(path)).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"the table given could not be read ({str(exc).splitlines()[0]})") from None
    finally:
        os.unlink(path)
