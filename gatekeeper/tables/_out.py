"""The result table out, whole or not at all: written to a temporary file by record batches, then renamed (local) or
uploaded (object storage, through pyarrow's filesystems: an object appears only once its upload completes). What the
format cannot hold is said before anything is sent (`writable_schema`), and a local result's folder is checked
then too (`check_destination`)."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from .._errors import OutputError, UsageError
from ._io import filesystem, format_of
from ._where import is_uri, scrub, shown

_VIEWS = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}


def writable_schema(where: str, schema: pa.Schema) -> pa.Schema:
    """The schema `schema` is written as in `where`'s format: as it is, or, for CSV, its view columns (string_view,
    binary_view) as string and binary; a column the format cannot hold at all (a list, struct or map in CSV) is a
    usage error naming it, said before anything is sent."""
    kind = format_of(where, "out")
    if kind == "csv":
        schema = pa.schema([f.with_type(_VIEWS.get(f.type, f.type)) for f in schema])
    for field in schema:
        try:
            _probe(kind, field)
        except (pa.ArrowException, OSError) as exc:
            fix = "write Parquet or Arrow (.parquet, .arrow), or leave the column out" if kind == "csv" else \
                "write Arrow (.arrow), or leave the column out"
            raise UsageError(f"{shown(where)}: {kind} cannot hold the column {field.name!r} ({field.type}: "
                             f"{str(exc).splitlines()[0]}); {fix}", setting="out") from None
    return schema


def _probe(kind: str, field: pa.Field) -> None:
    """Write one null value of `field` in `kind` to memory (what fails, fails as the real write would)."""
    one = pa.record_batch([pa.nulls(1, field.type)], schema=pa.schema([field.with_nullable(True)]))
    sink = io.BytesIO()
    writer: Any = (pq.ParquetWriter(sink, one.schema) if kind == "parquet" else
                   pacsv.CSVWriter(sink, one.schema) if kind == "csv" else pa.ipc.new_file(sink, one.schema))
    writer.write_batch(one)
    writer.close()


def check_destination(where: str) -> None:
    """A local result's folder exists and can be written, said before anything is sent (object storage is only
    known when the result is put there)."""
    if is_uri(where):
        return
    full = os.path.abspath(where)
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise OutputError(f"cannot write the result table {where}: folder {folder} {what}")
    if os.path.isdir(full) or not os.access(folder, os.W_OK):
        raise OutputError(f"cannot write the result table {where}: "
                          f"{'it is a folder' if os.path.isdir(full) else f'folder {folder} is not writable'}")


class TableWriter:
    """The result table, written to a temporary file by record batches and put in place whole on `commit`; mode as
    the umask makes a new file (readers running as another user can open it)."""

    def __init__(self, where: str, schema: pa.Schema) -> None:
        self.where, self.kind = where, format_of(where, "out")
        self.schema = writable_schema(where, schema)
        self._fs, self._path = filesystem(where, "out")
        local = isinstance(self._fs, pafs.LocalFileSystem)
        folder = os.path.dirname(self._path) if local else tempfile.gettempdir()
        try:
            self._tmp = _new_file(folder, Path(self._path).suffix)
            self._writer: Any = (pq.ParquetWriter(self._tmp, self.schema) if self.kind == "parquet" else
                                 pacsv.CSVWriter(self._tmp, self.schema) if self.kind == "csv" else
                                 pa.ipc.new_file(self._tmp, self.schema))
        except OSError as exc:
            raise OutputError(f"cannot write the result table beside {shown(where)}: {exc.strerror or exc}") from None

    def write(self, batch: pa.RecordBatch) -> None:
        try:
            if batch.schema != self.schema:
                batch = pa.record_batch([c.cast(t) for c, t in zip(batch.columns, self.schema.types)], schema=self.schema)
            self._writer.write_batch(batch)
        except (OSError, pa.ArrowException) as exc:
            self.abort()
            raise OutputError(f"cannot write the result table {shown(self.where)}: "
                              f"{scrub(str(exc).splitlines()[0], self.where)}") from None

    def commit(self) -> None:
        try:
            self._writer.close()
            if isinstance(self._fs, pafs.LocalFileSystem):
                os.replace(self._tmp, self._path)
            else:
                pafs.copy_files(self._tmp, self._path, source_filesystem=pafs.LocalFileSystem(),
                                destination_filesystem=self._fs)
        except (OSError, pa.ArrowException) as exc:
            raise OutputError(f"cannot put the result table at {shown(self.where)}: "
                              f"{scrub(str(exc).splitlines()[0], self.where)}") from None
        finally:
            self.abort()

    def abort(self) -> None:
        try:
            os.unlink(self._tmp)
        except OSError:
            pass


def _new_file(folder: str, suffix: str) -> str:
    """A new file of a name of its own in `folder`, its mode from the umask (mkstemp's would be 0600)."""
    while True:
        path = os.path.join(folder, f".gatekeeper-{os.urandom(6).hex()}{suffix}")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return path
        except FileExistsError:
            continue
