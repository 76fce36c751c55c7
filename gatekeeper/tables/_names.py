"""What names a table: read without pyarrow, so the CLI tells a table from JSONL before importing it."""

from __future__ import annotations

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".arrow": "ipc", ".ipc": "ipc",
           ".feather": "ipc"}
SCHEMES = ("s3://", "gs://", "gcs://", "az://", "abfs://", "abfss://")


def names_a_table(where: str) -> bool:
    """Whether a path or URI names a table: an object-storage scheme, or a table's suffix."""
    suffix = where.split("?", 1)[0].rpartition("/")[2].rpartition(".")[2].lower()
    return where.startswith(SCHEMES) or f".{suffix}" in FORMATS
