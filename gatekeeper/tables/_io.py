"""Tables in and out, by record batches: Parquet, CSV or Arrow IPC (by suffix), on local disk or at `s3://`, `gs://`
or `az://` through pyarrow's own filesystems (credentials and endpoint from each cloud's standard environment; for
S3, `AWS_ENDPOINT_URL` for any S3-compatible store), or any object that speaks the Arrow C stream interface
(pyarrow, pandas, polars, DuckDB). A result is written whole or not at all: to a temporary file, then renamed (local)
or uploaded (object storage, whose object appears only once the upload completes)."""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from .._errors import InputError, OutputError, UsageError
from ._names import FORMATS, SCHEMES

BATCH_ROWS = 4096  # rows a record batch holds (16,384: slower, and 60 MB more at a million rows)


def format_of(where: str, setting: str) -> str:
    suffix = Path(where.split("?", 1)[0]).suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"{where}: a table is .parquet, .csv or .arrow (.ipc, .feather)", setting=setting)
    return FORMATS[suffix]


def _filesystem(where: str, setting: str) -> tuple[pafs.FileSystem, str]:
    if not where.startswith(SCHEMES):
        return pafs.LocalFileSystem(), os.path.abspath(where)
    try:
        return pafs.FileSystem.from_uri(where)  # type: ignore[no-any-return]
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise UsageError(f"{where}: {str(exc).splitlines()[0]}", setting=setting) from None


@dataclass
class TableSource:
    """A table to read (again): a path or URI, or an in-memory table."""

    where: str | None
    table: pa.Table | None = None

    @classmethod
    def of(cls, source: Any) -> TableSource:
        if isinstance(source, TableSource):
            return source
        if isinstance(source, (str, os.PathLike)):
            return cls(os.fspath(source))
        try:
            return cls(None, pa.table(source))  # (the Arrow C stream interface: pyarrow, pandas, polars, DuckDB)
        except (TypeError, pa.ArrowException) as exc:
            raise UsageError(f"the table given is neither a path nor a table that speaks Arrow ({exc})",
                             setting="source") from None

    @property
    def name(self) -> str:
        return self.where or "the table given"

    def schema(self) -> pa.Schema:
        if self.table is not None:
            return self.table.schema
        if self._footer is not None:  # (Parquet: no batch read)
            return self._footer.schema.to_arrow_schema()
        for batch in self.batches():
            return batch.schema
        raise InputError(f"{self.name}: the table is empty")

    @property
    def rows_hint(self) -> int:
        """How many rows the table has, when that costs no pass (an in-memory table, Parquet's footer), else 0."""
        if self.table is not None:
            return int(self.table.num_rows)
        return 0 if self._footer is None else int(self._footer.num_rows)

    @functools.cached_property
    def _footer(self) -> pq.FileMetaData | None:
        """A Parquet file's footer, read once (None: not Parquet, or unreadable: the pass that reads it says why)."""
        if self.where is None or format_of(self.where, "source") != "parquet":
            return None
        fs, path = _filesystem(self.where, "source")
        try:
            with fs.open_input_file(path) as f:
                return pq.ParquetFile(f).metadata
        except (pa.ArrowException, OSError):
            return None

    def batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The rows in order, a record batch at a time (memory: one batch); of `columns` only, when given (Parquet
        and CSV then decode no other)."""
        if self.table is not None:
            yield from (self.table if columns is None else self.table.select(columns)).to_batches(max_chunksize=BATCH_ROWS)
            return
        assert self.where is not None
        kind = format_of(self.where, "source")
        fs, path = _filesystem(self.where, "source")
        try:
            with fs.open_input_file(path) as f:
                yield from _read(kind, f, columns)
        except FileNotFoundError:
            raise InputError(f"{self.where}: no such table") from None
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{self.where}: cannot be read as {kind} ({str(exc).splitlines()[0]})") from None


def _read(kind: str, f: Any, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    if kind == "parquet":
        # (pre_buffer keeps every column chunk read until the file is closed: 195 MB more at 6.5M rows; a buffered
        # stream reads a column chunk 1 MB at a time, not whole: 51 MB less on a row group of 1M rows)
        yield from pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20).iter_batches(batch_size=BATCH_ROWS,
                                                                                         columns=columns)
    elif kind == "csv":
        yield from pacsv.open_csv(f, read_options=pacsv.ReadOptions(block_size=1 << 22),  # (an empty cell is null)
                                  convert_options=pacsv.ConvertOptions(strings_can_be_null=True,
                                                                       include_columns=columns or []))
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


class TableWriter:
    """The result table, written to a temporary file by record batches and put in place whole on `commit`."""

    def __init__(self, where: str, schema: pa.Schema) -> None:
        self.where, self.kind = where, format_of(where, "out")
        self._fs, self._path = _filesystem(where, "out")
        local = isinstance(self._fs, pafs.LocalFileSystem)
        folder = os.path.dirname(self._path) if local else None
        try:
            fd, self._tmp = tempfile.mkstemp(dir=folder, prefix=".gatekeeper-", suffix=Path(self._path).suffix)
            os.close(fd)
            self._writer: Any = (pq.ParquetWriter(self._tmp, schema) if self.kind == "parquet" else
                                 pacsv.CSVWriter(self._tmp, schema) if self.kind == "csv" else
                                 pa.ipc.new_file(self._tmp, schema))
        except OSError as exc:
            raise OutputError(f"cannot write the result table beside {where}: {exc.strerror or exc}") from None

    def write(self, batch: pa.RecordBatch) -> None:
        try:
            self._writer.write_batch(batch)
        except (OSError, pa.ArrowException) as exc:
            self.abort()
            raise OutputError(f"cannot write the result table {self.where}: {exc}") from None

    def commit(self) -> None:
        try:
            self._writer.close()
            if isinstance(self._fs, pafs.LocalFileSystem):
                os.replace(self._tmp, self._path)
            else:
                pafs.copy_files(self._tmp, self._path, source_filesystem=pafs.LocalFileSystem(),
                                destination_filesystem=self._fs)
        except (OSError, pa.ArrowException) as exc:
            raise OutputError(f"cannot put the result table at {self.where}: {str(exc).splitlines()[0]}") from None
        finally:
            self.abort()

    def abort(self) -> None:
        try:
            os.unlink(self._tmp)
        except OSError:
            pass
