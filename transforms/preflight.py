"""The inputs of a run, checked before the pipeline is built, so that a missing, empty or
unusable input stops the run at once with a readable message instead of failing on a worker:
- expand_source: a path or glob to its files (a transforms.io.Source), each a regular file of a
  known format, not empty, with a UTF-8 name;
- preflight: each file opened and its head read, to see that it holds rows of the task (a JSONL
  file: one of its first lines is a JSON object with the required fields; a Parquet file: its
  columns read as the schema);
- wrong_task_message: rows whose fields belong to another task (the IDENTIFYING_FIELDS of each
  schemas/<task>_rows.py) name the command that reads them.
Bad rows are not errors here: they are rejected one by one when the files are read.
"""

from __future__ import annotations

import os

from apache_beam.io.filesystems import FileSystems

from evalbeam.schemas.formats import format_of
from evalbeam.schemas.safe_json import MAX_ROW_BYTES, lone_surrogate
from evalbeam.transforms.input_files import InputError
from evalbeam.transforms.io import Source, check_regular_file, open_input


def expand_source(name: str, pattern: str, known_formats: bool = True) -> Source:
    """Match a path or glob; every match must be a file (of a known format unless
    known_formats is False: TREC files have no suffix) and not empty."""
    try:
        results = FileSystems.match([pattern])[0].metadata_list
    except Exception as error:  # each filesystem raises its own error types
        raise InputError(f"cannot list {pattern!r} for {name}: {error}") from None
    if not results:
        raise InputError(f"no file matches {pattern!r} (given for {name}). Check the path; "
                         "globs such as 'preds/*.jsonl' are expanded by evalbeam, so quote them.")
    files = sorted(m.path for m in results)
    for meta in sorted(results, key=lambda m: m.path):
        if lone_surrogate(meta.path):   # a name's undecodable bytes, as Python reads them
            raise InputError(f"the name of {meta.path!r} (matched for {name}) is not UTF-8 text: "
                             "evalbeam records every input file in run.json, a UTF-8 file, and "
                             "names it in rejected.jsonl. Rename the file.")
        if os.path.isdir(meta.path):
            raise InputError(f"{meta.path} (given for {name}) is a folder: give its files as a "
                             f"quoted glob, e.g. '{meta.path.rstrip('/')}/*.jsonl'.")
        if known_formats and format_of(meta.path) is None:
            raise InputError(f"{meta.path} (given for {name}) has an unknown format: use .jsonl "
                             "(or .ndjson, .json, optionally .gz) or .parquet file names.")
        check_regular_file(meta.path)
        if meta.size_in_bytes == 0:
            raise InputError(f"{meta.path} (given for {name}) is empty: there is nothing to "
                             "evaluate in it.")
    return Source(name, pattern, tuple(files))


def _task_fields() -> tuple:
    """(task, field names) pairs from each task's row format (schemas/<task>_rows.py
    IDENTIFYING_FIELDS), in the order they are tried: the tasks with the most specific fields
    first (a detection row may also hold "labels")."""
    from evalbeam.schemas import (classification_rows, detection_rows, retrieval_rows,
                                  segmentation_rows, text_rows)

    order = (("detection", detection_rows), ("segmentation", segmentation_rows),
             ("retrieval", retrieval_rows), ("text", text_rows),
             ("classification", classification_rows))
    return tuple((task, fields) for task, module in order for fields in module.IDENTIFYING_FIELDS)


def task_of_fields(fields) -> str | None:
    """The task whose rows have these fields (column names or JSON keys), or None."""
    fields = set(fields)
    for task, needed in _task_fields():
        if all(f in fields for f in needed):
            return task
    return None


def wrong_task_message(path: str, name: str, fields, task: str | None) -> str | None:
    """'these look like detection rows' when the fields belong to another task than `task`."""
    other = task_of_fields(fields)
    if task is None or other is None or other == task:
        return None
    return (f"{path} (given for {name}) holds {other} rows (fields {sorted(fields)[:8]}), not "
            f"{task} rows: evaluate it with 'evalbeam {other}'.")


def head_lines(stream, n: int = 100, max_bytes: int = MAX_ROW_BYTES) -> list[bytes]:
    """The first n non-blank lines of a stream (a line longer than max_bytes, or a last line cut
    by that limit, is left out), read no further than needed."""
    from evalbeam.schemas.safe_json import iter_lines

    lines = []
    for _, line in iter_lines(stream, max_bytes, chunk_size=1 << 20):
        if line is not None and line.strip():
            lines.append(line)
            if len(lines) >= n:
                break
    return lines


def preflight(source: Source, schema, required: tuple[str, ...], slice_keys: list[str],
              task: str | None = None) -> None:
    """Open every file and check that it holds rows of the expected shape.

    A JSONL file passes when one of its first 100 non-blank lines is a JSON object with all the
    `required` fields; a Parquet file when its columns can be read as the schema. Bad rows are not
    errors here (they are rejected one by one later); a file with no usable row at its start is,
    and so is a file whose rows belong to another task (named in the message)."""
    from evalbeam.schemas.safe_json import loads_row

    for path in source.files:
        try:
            if format_of(path) == "parquet":
                import pyarrow.parquet as pq

                with open_input(path) as stream:
                    names = pq.ParquetFile(stream).schema_arrow.names
                    other = wrong_task_message(path, source.name, names, task)
                    if other:
                        raise InputError(other)
                    if schema is None:
                        missing = [f for f in required if f not in names]
                        if missing:
                            raise TypeError(f"missing column(s) {missing}; the file has {names}")
                    else:
                        from evalbeam.schemas.classification_rows import parquet_tables

                        next(parquet_tables(stream, schema, slice_keys, batch_rows=16), None)
                continue
            with open_input(path) as stream:
                lines = head_lines(stream)
        except InputError:
            raise
        except TypeError as error:
            raise InputError(f"{path} (given for {source.name}) cannot be used: {error}.") from None
        except Exception as error:
            raise InputError(f"cannot read {path} (given for {source.name}): {error}") from None
        if not lines:
            raise InputError(f"{path} (given for {source.name}) holds no rows.")
        shapes = []
        for line in lines:
            row, _ = loads_row(line)
            if not isinstance(row, dict):
                if row is not None:
                    shapes.append(type(row).__name__)
                continue
            other = wrong_task_message(path, source.name, row, task)
            if other:
                raise InputError(other)
            if all(field in row for field in required):
                break
            shapes.append(sorted(row))
        else:
            seen = f"; the first row has {shapes[0]}" if shapes else "; no line is valid JSON"
            raise InputError(
                f"{path} (given for {source.name}) does not look like evalbeam rows: none of its "
                f"first {len(lines)} lines is a JSON object with the fields {list(required)}{seen}. "
                "See the input formats in the README.")
