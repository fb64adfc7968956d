"""The archive as Apache Iceberg tables: one table per replicated topic whose data files are
the segments themselves (docs/archive.md).

Modules: ``naming`` (table identity and name), ``plan`` (which segments a table lists:
pure), ``footers`` (Parquet footers read from the bucket), ``committer`` (keeps tables in
step with the bucket; compaction's swap hook), ``follow`` (the committer's loop and lease),
``query`` (SQL over a table with DuckDB).
"""
