"""Reading inputs and writing outputs through Beam's FileSystems (local, gs://, s3://, ...).

Inputs are expanded and checked before the pipeline is built (expand_source, preflight), so a
missing, empty or unusable input stops the run at once with a readable message. Outputs are
written by the pipeline into a temporary folder inside the output folder and moved into place by
the launcher only when the run has finished (finalize_outputs).
"""

from __future__ import annotations

import json
import os
import sys
import time
import typing
import uuid
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from schemas.formats import (format_of, jsonl_blocks, parquet_tables, parse_jsonl_block,
                             position_name)
from schemas.rows import reject

TAG_REJECTED = "rejected"
TAG_STATS = "stats"
TAG_VOCAB = "vocab"


class InputError(Exception):
    """An input that cannot be used at all: the run stops before it starts."""


@dataclass(frozen=True)
class Source:
    """One named input: "groundtruths" or a model name, and the files its pattern matched."""

    name: str
    pattern: str
    files: tuple[str, ...]



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
        if os.path.isdir(meta.path):
            raise InputError(f"{meta.path} (given for {name}) is a folder: give its files as a "
                             f"quoted glob, e.g. '{meta.path.rstrip('/')}/*.jsonl'.")
        if known_formats and format_of(meta.path) is None:
            raise InputError(f"{meta.path} (given for {name}) has an unknown format: use .jsonl "
                             "(or .ndjson, .json, optionally .gz) or .parquet file names.")
        if meta.size_in_bytes == 0:
            raise InputError(f"{meta.path} (given for {name}) is empty: there is nothing to "
                             "evaluate in it.")
    return Source(name, pattern, tuple(files))


def preflight(source: Source, schema, required: tuple[str, ...], slice_keys: list[str]) -> None:
    """Open every file and check that it holds rows of the expected shape.

    A JSONL file passes when one of its first 100 non-blank lines is a JSON object with all the
    `required` fields; a Parquet file when its columns can be read as the schema. Bad rows are not
    errors here (they are rejected one by one later); a file with no usable row at its start is."""
    for path in source.files:
        try:
            with FileSystems.open(path) as stream:
                if format_of(path) == "parquet" and schema is None:
                    import pyarrow.parquet as pq

                    names = pq.ParquetFile(stream).schema_arrow.names
                    missing = [f for f in required if f not in names]
                    if missing:
                        raise TypeError(f"missing column(s) {missing}; the file has {names}")
                    continue
                if format_of(path) == "parquet":
                    next(parquet_tables(stream, schema, slice_keys, batch_rows=16), None)
                    continue
                head = stream.read(1 << 20)
        except TypeError as error:
            raise InputError(f"{path} (given for {source.name}) cannot be used: {error}.") from None
        except Exception as error:
            raise InputError(f"cannot read {path} (given for {source.name}): {error}") from None
        lines = [line for line in head.split(b"\n")[:-1] if line.strip()][:100] or [head]
        if not any(line.strip() for line in lines):
            raise InputError(f"{path} (given for {source.name}) holds no rows.")
        shapes, usable = [], False
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and all(field in row for field in required):
                usable = True
                break
            shapes.append(sorted(row) if isinstance(row, dict) else type(row).__name__)
        if not usable:
            seen = f"; the first row has {shapes[0]}" if shapes else "; no line is valid JSON"
            raise InputError(
                f"{path} (given for {source.name}) does not look like evalbeam rows: none of its "
                f"first {len(lines)} lines is a JSON object with the fields {list(required)}{seen}. "
                "See the input formats in the README.")


class Progress:
    """Throttled progress lines on stderr (at most one a second per process, per kind)."""

    def __init__(self, quiet: bool, started: float):
        self.quiet = quiet
        self.started = started
        self._last: dict[str, float] = {}

    def say(self, kind: str, text: str, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.time()
        if force or now - self._last.get(kind, 0.0) >= 1.0:
            self._last[kind] = now
            print(f"evalbeam: {text} ({now - self.started:.1f} s)", file=sys.stderr, flush=True)


class ProgressDoFn(beam.DoFn):
    """A DoFn that reports progress on stderr: quiet and the run's start time are settings, the
    Progress object is made per worker in setup()."""

    def __init__(self, quiet: bool, started: float):
        super().__init__()
        self.quiet = quiet
        self.started = started

    def setup(self):
        self.progress = Progress(self.quiet, self.started)


class ReadRows(ProgressDoFn):
    """(source name, file id) -> validated rows split by shard.

    Main output: (shard, (source name, rows)) for each shard present in each block. Tagged
    outputs: TAG_REJECTED reject records, TAG_STATS ((counter, source), n), TAG_VOCAB
    {label key: set of values}. `validate(table, file_id)` is the task's validation function
    (a module-level function, so the DoFn pickles)."""

    def __init__(self, sources: dict[str, Source], schemas: dict, validate, vocabulary,
                 slice_keys: list[str], num_shards: int, quiet: bool, started: float):
        super().__init__(quiet, started)
        self.sources = sources
        self.schemas = schemas
        self.validate = validate
        self.vocabulary = vocabulary
        self.slice_keys = slice_keys
        self.num_shards = num_shards

    def process(self, element):
        name, file_id = element
        source = self.sources[name]
        path = source.files[file_id]
        schema = self.schemas[name]
        position = position_name(path)
        slice_keys = self.slice_keys if name == "groundtruths" else []
        read = 0
        with FileSystems.open(path) as stream:
            if format_of(path) == "parquet":
                tables = ((table, []) for table in parquet_tables(stream, schema, slice_keys))
            else:
                tables = (parse_jsonl_block(block, first, schema, slice_keys)
                          for block, first in jsonl_blocks(stream))
            for table, unparsed in tables:
                rows, rejects = self.validate(table, file_id)
                for line, reason in unparsed:
                    yield beam.pvalue.TaggedOutput(
                        TAG_REJECTED, reject(name, path, line, reason, None, position))
                for line, uid, reason in rejects:
                    yield beam.pvalue.TaggedOutput(
                        TAG_REJECTED, reject(name, path, line, reason, uid, position))
                n = table.num_rows + len(unparsed)
                read += n
                yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", name), n))
                yield beam.pvalue.TaggedOutput(
                    TAG_STATS, (("rows_rejected", name), len(unparsed) + len(rejects)))
                yield beam.pvalue.TaggedOutput(TAG_VOCAB, self.vocabulary(rows))
                for shard, piece in rows.partition(self.num_shards).items():
                    yield shard, (name, piece)
                self.progress.say(path, f"read {read:,} rows of {path}")
        self.progress.say(path, f"read {read:,} rows of {path}, done", force=True)


SHARD_PIECE = typing.Tuple[int, typing.Any]


class ReadFiles(beam.PTransform):
    """Every file of every source, read by `reader` (a DoFn of (source name, file id)): the
    main output "pieces" of (shard, (source, rows)) and the reader's tagged outputs."""

    def __init__(self, sources: dict, reader: beam.DoFn, tags: tuple[str, ...]):
        super().__init__()
        self.sources = sources
        self.reader = reader
        self.tags = tags

    def expand(self, pbegin):
        files = [(name, i) for name, source in sorted(self.sources.items())
                 for i in range(len(source.files))]
        return (pbegin
                | "Files" >> beam.Create(files)
                | "Spread" >> beam.Reshuffle()  # lets a cluster read different files at once
                | "Read" >> beam.ParDo(self.reader).with_output_types(SHARD_PIECE)
                .with_outputs(*self.tags, main="pieces"))


def parse_rows(path: str):
    """(rows, positions, [(position, None, reason)]) of a whole JSONL (line numbers) or Parquet
    (row numbers) file, for row formats with nested values (detection, segmentation)."""
    rows, positions, rejected = [], [], []
    with FileSystems.open(path) as stream:
        if format_of(path) == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(stream)
            rows = table.to_pylist()
            return rows, list(range(len(rows))), []
        for number, raw in enumerate(stream.read().split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                rows.append(json.loads(raw))
                positions.append(number)
            except ValueError as error:
                rejected.append((number, None, f"malformed JSON: {error}"))
    return rows, positions, rejected


def merge_sorted_parts(parts: list, path: str, key_field: str) -> int:
    """Merge part files [(path, rows)] into one file at path, sorted by the JSON text of each
    line's first field key_field; returns the rows. The parts are deleted.

    Lines must start with {"<key_field>": <JSON value>, "model": ... (json.dumps' separators).
    Inside a JSON string every quote is escaped, so the first ', "model": ' ends the value, and
    bytes compare as the str keys sort (UTF-8 keeps code point order). All lines of one key must
    sit together, in order, in one part: heapq.merge is stable between equal keys of one part."""
    import heapq

    start, end = len(f'{{"{key_field}": '.encode()), b', "model": '
    streams = [FileSystems.open(p) for p, _ in sorted(parts)]
    try:
        n = 0
        with FileSystems.create(path) as out:
            for line in heapq.merge(*streams, key=lambda line: line[start:line.index(end)]):
                out.write(line)
                n += 1
    finally:
        for stream in streams:
            stream.close()
    if parts:
        FileSystems.delete([p for p, _ in parts])
    return n


class MergeStates(beam.CombineFn):
    """Combines partial states that have copy() and merge() (the per-task states: sums, counts,
    exact totals); merging is exact and order-free, so any bundling gives the same state."""

    def create_accumulator(self):
        return None

    def add_input(self, acc, state):
        return state.copy() if acc is None else acc.merge(state)

    def merge_accumulators(self, accs):
        out = None
        for acc in accs:
            if acc is not None:
                out = acc.copy() if out is None else out.merge(acc)
        return out

    def extract_output(self, acc):
        return acc


def unique_rows(rows: list, repeated) -> dict:
    """{uid: row} of the rows whose .uid appears once; repeated(row, copies) is called for every
    copy of a repeated uid (the caller rejects them: keeping one would depend on input order)."""
    seen: dict = {}
    for row in rows:
        seen.setdefault(row.uid, []).append(row)
    out = {}
    for uid, copies in seen.items():
        if len(copies) == 1:
            out[uid] = copies[0]
        else:
            for row in copies:
                repeated(row, len(copies))
    return out


def tagged_batches(pcolls: dict, names: list[str], batch_size: int) -> list:
    """(source, [row dict, ...]) batches of each named PCollection, for the tasks' PTransforms
    that take rows from a user's pipeline instead of files."""
    return [pcolls[name]
            | f"Batch[{name}]" >> beam.BatchElements(min_batch_size=1, max_batch_size=batch_size)
            | f"Tag[{name}]" >> beam.Map(lambda batch, source: (source, batch), name)
            for name in names]


def read_pcollections(pcolls: dict, batch_size: int, reader: beam.DoFn, tags: tuple, what: str):
    """(model names, read) for a task's PTransform on a user's PCollections of row dicts: the
    batches of every source through `reader` (a DoFn of (source, [row, ...]) like the file
    readers), main output "pieces" plus the tagged outputs."""
    if "groundtruths" not in pcolls:
        raise ValueError(f"{what} needs a 'groundtruths' PCollection")
    models = sorted(name for name in pcolls if name != "groundtruths")
    read = (tagged_batches(pcolls, ["groundtruths"] + models, batch_size)
            | "Batches" >> beam.Flatten()
            | "Rows" >> beam.ParDo(reader).with_outputs(*tags, main="pieces"))
    return models, read


class WriteJsonl(beam.PTransform):
    """Write all elements (dicts) to one JSONL file, sorted by sort_key: small outputs only."""

    def __init__(self, path: str, sort_key):
        super().__init__()
        self.path = path
        self.sort_key = sort_key

    def expand(self, pcoll):
        return (pcoll
                | "Gather" >> beam.combiners.ToList()
                | "Write" >> beam.Map(write_jsonl, self.path, self.sort_key))


def write_jsonl(records: list, path: str, sort_key=None) -> int:
    if sort_key is not None:
        records = sorted(records, key=sort_key)
    with FileSystems.create(path) as out:
        for record in records:
            out.write((json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8"))
    return len(records)


def write_json(obj, path: str) -> None:
    with FileSystems.create(path) as out:
        out.write((json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def read_json(path: str):
    with FileSystems.open(path) as stream:
        return json.loads(stream.read().decode("utf-8"))


def join(folder: str, name: str) -> str:
    return FileSystems.join(folder, name)


def delete_if_exists(paths: list[str]) -> None:
    existing = [p for p in paths if FileSystems.exists(p)]
    if existing:
        FileSystems.delete(existing)


def move(source: str, destination: str) -> None:
    delete_if_exists([destination])
    FileSystems.rename([source], [destination])


class OutputFolder:
    """The output folder of one run: final names, a private temporary folder, finalisation.

    At the start the final files of an earlier run are removed, so a failed run never leaves a
    metrics.jsonl behind that could be taken for its result."""

    FINAL = ("metrics.jsonl", "run.json", "rejected.jsonl")

    def __init__(self, folder: str, extra: tuple = ()):
        self.folder = folder
        self.tmp = join(folder, f".evalbeam-tmp-{uuid.uuid4().hex[:12]}")
        self.extra = tuple(extra)   # more outputs of a task (scores.jsonl), published before run.json

    @property
    def names(self) -> tuple:
        return self.FINAL + self.extra

    def final(self, name: str) -> str:
        return join(self.folder, name)

    def temp(self, name: str) -> str:
        return join(self.tmp, name)

    def prepare(self) -> None:
        try:
            if not FileSystems.exists(self.folder):
                FileSystems.mkdirs(self.folder)
            delete_if_exists([self.final(n) for n in self.names])
            FileSystems.mkdirs(self.tmp)
        except Exception as error:
            raise InputError(f"cannot write to the output folder {self.folder!r}: {error}") from None

    def finish(self, run_info: dict) -> None:
        """Move rejected.jsonl into place, write run.json, then metrics.jsonl last, so that a
        metrics.jsonl never exists without the run.json that describes it."""
        move(self.temp("rejected.jsonl"), self.final("rejected.jsonl"))
        for name in self.extra:
            move(self.temp(name), self.final(name))
        write_json(run_info, self.final("run.json"))
        move(self.temp("metrics.jsonl"), self.final("metrics.jsonl"))
        self.cleanup()

    def fail(self, run_info: dict) -> None:
        """Leave only run.json (status failed) and rejected.jsonl if it was written."""
        try:
            if self._exists(self.temp("rejected.jsonl")):
                move(self.temp("rejected.jsonl"), self.final("rejected.jsonl"))
            write_json(run_info, self.final("run.json"))
        finally:
            self.cleanup()

    def read_temp_json(self, name: str):
        return read_json(self.temp(name))

    def cleanup(self) -> None:
        try:
            if FileSystems.exists(self.tmp):
                FileSystems.delete([self.tmp])
        except Exception:  # leftovers are hidden, and a later run ignores them
            pass

    @staticmethod
    def _exists(path: str) -> bool:
        return FileSystems.exists(path)


def first_records(path: str, n: int) -> list[dict]:
    """The first n JSON lines of a file."""
    out = []
    with FileSystems.open(path) as stream:
        for line in stream:
            if len(out) >= n:
                break
            out.append(json.loads(line))
    return out


def source_counts(stats: list, names: list[str]) -> dict:
    """{source: {rows_read, rows_evaluated, rows_rejected}} from ((counter, source), n) pairs."""
    counts = {name: {"rows_read": 0, "rows_evaluated": 0, "rows_rejected": 0} for name in names}
    for (counter, source), value in stats:
        counts.setdefault(source, {"rows_read": 0, "rows_evaluated": 0, "rows_rejected": 0})
        counts[source][counter] += value
    return counts


def finalize_run(stats: list, n_metrics: int, n_rejected: int, folder: OutputFolder,
                 run_info: dict, started: float, allowed_rejected_fraction: float,
                 n_scores: int | None = None) -> dict:
    """The last step of a pipeline: check the counts, publish the outputs, return run.json.

    Runs inside the pipeline (after both outputs are written), so a job launched without a
    waiting client (a Dataflow flex template) still publishes complete outputs."""
    counts = source_counts(stats, run_info["sources"])
    for name, c in counts.items():
        if c["rows_read"] != c["rows_evaluated"] + c["rows_rejected"]:
            raise RuntimeError(f"the row counts of {name} do not add up: {c}")
    read = sum(c["rows_read"] for c in counts.values())
    rejected = sum(c["rows_rejected"] for c in counts.values())
    if rejected != n_rejected:
        raise RuntimeError(f"{n_rejected} rejected rows were written but {rejected} were counted")
    within = rejected == 0 or (read > 0 and rejected / read <= allowed_rejected_fraction)
    info = dict(run_info)
    info.update(
        status="complete" if within else "complete_with_rejections",
        counts=counts, rows_read=read, rows_rejected=rejected, metrics_written=n_metrics,
        first_rejections=first_records(folder.temp("rejected.jsonl"), 3),
        outputs={name: folder.final(name) for name in folder.names},
        wall_time_seconds=round(time.time() - started, 3),
    )
    if n_scores is not None:   # the rows of the task's extra output (scores.jsonl, per_query.jsonl)
        info[f"{folder.extra[0].split('.')[0]}_written"] = n_scores
    folder.finish(info)
    return info
