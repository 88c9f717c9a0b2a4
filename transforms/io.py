"""Reading inputs and writing outputs through Beam's FileSystems (local, gs://, s3://, ...).

Inputs are opened here (open_input: decompressed, truncation refused) and read by ReadFiles;
they are expanded and checked before the pipeline is built (transforms/preflight.py). Outputs are
written by the pipeline into a temporary folder inside the output folder and moved into place by
the launcher only when the run has finished (finalize_outputs).
"""

from __future__ import annotations

import bz2
import contextlib
import copy
import hashlib
import json
import gzip
import lzma
import os
import stat
import sys
import time
import typing
import uuid
import weakref
import zlib
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions

from evalbeam.schemas.formats import format_of, position_name
from evalbeam.schemas.lines import too_long_reason
from evalbeam.schemas.rejections import reject
from evalbeam.schemas.safe_json import MAX_ROW_BYTES
from evalbeam.transforms.input_files import InputError, load_json
from evalbeam.transforms.line_spans import (LineSpan, auto_split_bytes, count_newlines, first_lines,
                                            plan_spans, span_of)

TAG_REJECTED = "rejected"
TAG_STATS = "stats"
# the source name of the ground truth; every other source is a model
GROUNDTRUTHS = "groundtruths"
# A job over several datasets at once (a sweep's group of cells, pipelines/sweep/cells.py) names
# each source "<dataset>" DATASET_SEP "<name>", name "groundtruths" or the model's; a source
# name of a run alone has no separator (model names cannot hold it).
DATASET_SEP = "\x1f"


def qualified(dataset: str, name: str) -> str:
    """The source name of `name` in `dataset` (name itself when dataset is "")."""
    return f"{dataset}{DATASET_SEP}{name}" if dataset else name


def dataset_of(source: str) -> str:
    """The dataset part of a source name ("" for a run alone)."""
    return source.rsplit(DATASET_SEP, 1)[0] if DATASET_SEP in source else ""


def role_of(source: str) -> str:
    """The source name without its dataset: "groundtruths" or the model's own name."""
    return source.rsplit(DATASET_SEP, 1)[-1]


def truth_of(source: str) -> str:
    """The ground truth's source name in the dataset of `source`."""
    return qualified(dataset_of(source), GROUNDTRUTHS)


def is_truth(source: str) -> bool:
    return role_of(source) == GROUNDTRUTHS


class _StrictDeflate:
    """A raw zlib (.deflate) stream that raises EOFError when the data ends before the stream
    does, as gzip, bz2 and lzma readers do."""

    def __init__(self, raw):
        self.raw = raw
        self.inflate = zlib.decompressobj()
        self.pending = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.pending) < size:
            if self.inflate.eof:
                break
            chunk = self.raw.read(1 << 20)
            if not chunk:
                raise EOFError("compressed data ended before the end-of-stream marker")
            self.pending += self.inflate.decompress(chunk)
        if size < 0:
            out, self.pending = self.pending, b""
        else:
            out, self.pending = self.pending[:size], self.pending[size:]
        return out

    def close(self):
        self.raw.close()


READ_ERROR = "evalbeam input error: "


class ReadError(InputError):
    """An input file that cannot be read to its end (truncated or corrupt compressed data, not a
    regular file). Raised inside workers too, where Beam wraps it: its text starts with
    READ_ERROR so the launcher can tell it from a bug and report it as an input error;
    .message is the text without that mark."""

    def __init__(self, message: str):
        super().__init__(READ_ERROR + message)
        self.message = message
_DECOMPRESSORS = {CompressionTypes.GZIP: lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
                  CompressionTypes.BZIP2: lambda raw: bz2.BZ2File(raw, mode="rb"),
                  CompressionTypes.LZMA: lambda raw: lzma.LZMAFile(raw, mode="rb"),
                  CompressionTypes.DEFLATE: _StrictDeflate}


def check_regular_file(path: str) -> None:
    """A local input must be a regular file: a FIFO would block the run forever and a device
    (/dev/zero) would never end. Remote objects are always regular."""
    if "://" in path:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise ReadError(f"cannot open {path}: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ReadError(f"{path} is not a regular file (a pipe, device or socket "
                        "cannot be read as an input)")


class _Checked:
    """A decompressing reader whose truncation or corruption errors become ReadError."""

    def __init__(self, path: str, stream):
        self.path = path
        self.stream = stream

    def read(self, size: int = -1) -> bytes:
        try:
            return self.stream.read(size)
        except (EOFError, OSError, zlib.error, lzma.LZMAError) as error:
            raise ReadError(f"{self.path} does not end as a complete compressed "
                            f"file ({error}); it was probably cut short while being copied or "
                            "downloaded. Nothing of it was used.") from None

    def __iter__(self):
        rest = b""
        while True:
            chunk = self.read(1 << 20)
            if not chunk:
                break
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                yield line + b"\n"
        if rest:
            yield rest

    def close(self):
        self.stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_input(path: str):
    """Open an input file for reading, decompressing by its suffix (.gz, .bz2, .xz/.lzma,
    .deflate) with readers that fail on truncated or corrupt data: Beam's own decompressing
    reader returns a truncated .gz as if it had ended there. Zstandard files are refused (their
    truncation cannot be told from their end here)."""
    check_regular_file(path)
    kind = CompressionTypes.detect_compression_type(path)
    if kind == CompressionTypes.ZSTD:
        raise ReadError(f"{path}: Zstandard input is not supported; decompress it or "
                        "use gzip")
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if kind not in _DECOMPRESSORS:
        return raw
    return _Checked(path, _DECOMPRESSORS[kind](raw))


def open_span(path: str, start: int = 0, end: int | None = None):
    """open_input(path) for a whole file (end None), else a LineSpan of the lines of the
    (uncompressed) file that start in bytes [start, end): transforms/line_spans.py."""
    if end is None:
        return open_input(path)
    check_regular_file(path)
    return LineSpan(FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED),
                    start, end)


def line_splittable(path: str) -> bool:
    """Whether an input can be read in byte spans: uncompressed, and not Parquet (one
    structure, like a compressed stream). Line spans of JSONL and TREC files, and the pieces of
    a COCO results array or an instances file's annotations
    (transforms/detection.py), are read this way."""
    return (format_of(path) != "parquet"
            and CompressionTypes.detect_compression_type(path) == CompressionTypes.UNCOMPRESSED)


def file_size(path: str) -> int:
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


@dataclass(frozen=True)
class Source:
    """One named input: "groundtruths" or a model name, and the files its pattern matched."""

    name: str
    pattern: str
    files: tuple[str, ...]


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
        from evalbeam.transforms.collector import tune

        tune()   # fewer young collections in this worker (transforms/collector.py)
        self.progress = Progress(self.quiet, self.started)


class ParsedRows(typing.NamedTuple):
    """One source's parsed rows on their way into shard pieces: name (the source), rows (dicts),
    positions (each row's line or row number; None for rows of a PCollection), rejected
    ((position, uid, reason) of rows that did not parse), path (the file, or the source's name
    for a PCollection), file_id, where ("line" or "row": what a position counts)."""

    name: str
    rows: list
    positions: list
    rejected: list
    path: str
    file_id: int
    where: str

    @classmethod
    def of_batch(cls, source: str, batch: list) -> "ParsedRows":
        """A batch of a user's PCollection: no positions, the source named as its file."""
        return cls(source, batch, [None] * len(batch), [], source, 0, "row")

    def positions_or_minus_one(self) -> list[int]:
        """positions with None as -1, as the row formats' arrays keep them."""
        return [-1 if p is None else p for p in self.positions]

    def outcome(self, bad: list):
        """The tagged rejections and counters of these rows, bad being the (position, uid,
        reason) of rows the task's row format refused (-1: no position)."""
        for position, uid, reason in self.rejected + bad:
            position = None if position is None or position < 0 else position
            yield beam.pvalue.TaggedOutput(
                TAG_REJECTED, reject(self.name, self.path, position, reason, uid, self.where))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", self.name),
                                                   len(self.rows) + len(self.rejected)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", self.name),
                                                   len(self.rejected) + len(bad)))


class ReadRowFile(ProgressDoFn):
    """(source name, file id) -> the shard pieces of one file of JSON rows (JSONL or Parquet,
    parsed by parse_rows), with rejections and counters tagged. A task's reader subclasses it and
    defines pieces(parsed: ParsedRows), the same function of parsed rows that its
    <Task>RowsFromDicts uses for rows of a PCollection."""

    def __init__(self, sources: dict, slice_keys: list[str], num_shards: int, quiet: bool,
                 started: float):
        super().__init__(quiet, started)
        self.sources = sources
        self.slice_keys = slice_keys
        self.num_shards = num_shards

    def pieces(self, parsed: ParsedRows):
        raise NotImplementedError

    def splits(self, path: str) -> bool:
        """Whether ReadFiles may hand this reader byte spans of the file."""
        return line_splittable(path)

    def process(self, element):
        name, file_id, start, end, first_line = span_of(element)
        path = self.sources[name].files[file_id]
        rows, positions, rejected = parse_rows(path, span=(start, end, first_line))
        yield from self.pieces(ParsedRows(name, rows, positions, rejected, path, file_id,
                                          position_name(path)))
        self.progress.say(path, f"read {len(rows) + len(rejected):,} rows of {path}"
                                f"{span_text(start, end)}", force=True)


class RowsFromDicts(beam.DoFn):
    """(source, [row dict, ...]) batches of a user's PCollections -> the same shard pieces as the
    task's file reader: the base of <Task>RowsFromDicts. keys_of(source): the --slice keys
    that source's rows carry (only the ground truth's)."""

    def __init__(self, slice_keys: list[str], num_shards: int):
        self.slice_keys = slice_keys
        self.num_shards = num_shards

    def keys_of(self, source: str) -> list[str]:
        return self.slice_keys if source == GROUNDTRUTHS else []


SHARD_PIECE = typing.Tuple[int, typing.Any]


class ReadFiles(beam.PTransform):
    """Every file of every source, read by `reader` (a DoFn of (source name, file id)): the
    main output "pieces" of (shard, (source, rows)) and the reader's tagged outputs.

    A reader with a splits(path) method that says yes gets a file larger than the pipeline's
    split size (split_inputs; default 64 MiB) as several elements (source name, file id,
    start, end, first line), one per byte span, so that several workers read one large file;
    line numbers stay the whole file's (transforms/line_spans.py). A reader with cuttable(name,
    path) and cut(...) methods cuts such files itself, in a step before the reading (CutFiles).
    Small files keep the graph of one element per file.

    In a pipeline marked by share_reads() (a sweep: many runs in one pipeline), a source that
    several jobs read is read on its own, and a later ReadFiles that reads it with an equal
    reader (the same settings, the same files, the same source name) reuses its PCollections:
    a ground truth that ten cells evaluate is read once. The sources that only this job reads
    (share_reads' `uses`) are read together, as in a run alone: every separate read costs the
    runner its own steps."""

    def __init__(self, sources: dict, reader: beam.DoFn, tags: tuple[str, ...]):
        super().__init__()
        self.sources = sources
        self.reader = reader
        self.tags = tags

    def expand(self, pbegin):
        settings = pbegin.pipeline.options.view_as(ReadOptions)
        if not settings.evalbeam_share_reads:
            return self._read(pbegin, self.sources, self.reader, "")
        shared = _SHARED_READS.setdefault(pbegin.pipeline, {})
        uses = settings.read_uses()
        parts, own = [], []
        for name, source in sorted(self.sources.items()):
            # uses name sources as runs alone name them (a multi-dataset read qualifies them)
            if uses.get((role_of(name), tuple(source.files)), 2) < 2:
                own.append(name)
                continue
            reader = self._narrowed([name])
            key = (name, tuple(source.files), _reader_digest(reader))
            if key not in shared:
                shared[key] = self._read(pbegin, {name: source}, reader, f"[{name}]")
            parts.append(shared[key])
        if own:
            parts.append(self._read(pbegin, {name: self.sources[name] for name in own},
                                    self._narrowed(own), "[own]"))
        if len(parts) == 1:
            return parts[0]
        flat = {tag: [p[tag] for p in parts] | f"Flatten[{tag}]" >> beam.Flatten()
                for tag in self.tags}
        flat["pieces"] = [p.pieces for p in parts] | "Flatten[pieces]" >> beam.Flatten()
        return SharedRead(flat)

    def _narrowed(self, names: list[str]) -> beam.DoFn:
        """The reader with its per-source settings (dicts keyed by every source: sources,
        schemas) narrowed to `names`, so that two jobs reading a source with the same settings
        have equal readers."""
        if set(names) == set(self.sources):
            return self.reader
        reader = copy.copy(self.reader)
        for attribute, value in vars(self.reader).items():
            if isinstance(value, dict) and value and set(value) == set(self.sources):
                setattr(reader, attribute, {name: value[name] for name in names})
        return reader

    def _read(self, pbegin, sources: dict, reader: beam.DoFn, suffix: str):
        split = pbegin.pipeline.options.view_as(ReadOptions).evalbeam_input_split_bytes
        splits = getattr(reader, "splits", lambda _: False)
        cuttable = getattr(reader, "cuttable", lambda name, path: False)
        if split is None:
            split = auto_split_bytes(sum(file_size(path) for name, source in sources.items()
                                         for path in source.files
                                         if splits(path) or cuttable(name, path)))
        files, spans = [], []
        for name, source in sorted(sources.items()):
            for i, path in enumerate(source.files):
                cuts = (plan_spans(file_size(path), split)
                        if split > 0 and splits(path) else [])
                if len(cuts) > 1:
                    spans += [(name, i, start, end) for start, end in cuts]
                else:
                    files.append((name, i))
        elements = pbegin | f"Files{suffix}" >> beam.Create(files)
        if spans:
            elements = (elements, _numbered_spans(pbegin, spans, sources, suffix)) | (
                f"AllFiles{suffix}" >> beam.Flatten())
        if split > 0 and any(cuttable(name, path) and file_size(path) > split
                             for name, source in sources.items() for path in source.files):
            elements = (elements
                        | f"SpreadFiles{suffix}" >> beam.Reshuffle()
                        | f"Cut{suffix}" >> beam.ParDo(CutFiles(reader, split)))
        return (elements
                | f"Spread{suffix}" >> beam.Reshuffle()  # lets a cluster read different files at once
                | f"Read{suffix}" >> beam.ParDo(reader).with_output_types(SHARD_PIECE)
                .with_outputs(*self.tags, main="pieces"))


class CutFiles(beam.DoFn):
    """(source name, file id) -> what `reader` is to read of the file: the element itself, or,
    for a file larger than split_bytes that reader.cuttable(name, path) allows, the pieces
    reader.cut(name, file id, path, split_bytes) returns (None: read it whole). Readers that
    cut a file themselves, because only its content says where (a COCO file's array:
    transforms/detection.py), plan here, in a worker, since only workers are sure to see the
    files; every parse happens after the Reshuffle that follows."""

    def __init__(self, reader: beam.DoFn, split_bytes: int):
        super().__init__()
        self.reader = reader
        self.split_bytes = split_bytes

    def setup(self):
        self.reader.setup()

    def process(self, element):
        if len(element) == 2:
            name, file_id = element
            path = self.reader.sources[name].files[file_id]
            if self.reader.cuttable(name, path) and file_size(path) > self.split_bytes:
                pieces = self.reader.cut(name, file_id, path, self.split_bytes)
                if pieces:
                    yield from pieces
                    return
        yield element


def _numbered_spans(pbegin, spans: list, sources: dict, suffix: str):
    """(name, file id, start, end, first line) of every span: the spans' newlines are counted
    in parallel, then numbered from the counts (transforms/line_spans.py)."""
    spread = (pbegin
              | f"Spans{suffix}" >> beam.Create(spans)
              | f"SpreadSpans{suffix}" >> beam.Reshuffle())
    numbers = (spread
               | f"CountLines{suffix}" >> beam.Map(_count_span, sources)
               | f"AllCounts{suffix}" >> beam.combiners.ToList()
               | f"FirstLines{suffix}" >> beam.Map(first_lines))
    return spread | f"NumberSpans{suffix}" >> beam.Map(_numbered, beam.pvalue.AsSingleton(numbers))


def _count_span(span: tuple, sources: dict):
    name, file_id, start, end = span
    path = sources[name].files[file_id]
    check_regular_file(path)
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        return (name, file_id, start), count_newlines(raw, start, end)


def _numbered(span: tuple, numbers: dict) -> tuple:
    name, file_id, start, end = span
    return name, file_id, start, end, numbers[(name, file_id, start)]


def _reader_digest(reader: beam.DoFn) -> str:
    """A digest of a reader's settings, equal for equal settings: Sources as JSON text, since a
    pickle differs when equal strings are one object in one reader and two in the other."""
    plain = copy.copy(reader)
    for attribute, value in vars(reader).items():
        if isinstance(value, dict):
            setattr(plain, attribute, {key: json.dumps([item.name, item.pattern, list(item.files)])
                                       if isinstance(item, Source) else item
                                       for key, item in value.items()})
    return hashlib.sha256(pickler.dumps(plain)).hexdigest()


class ReadDatasets(beam.PTransform):
    """A multi-dataset job's reading (FilesJob.layout): (pieces, rejects, stats). reader(sources,
    shard count, layout) -> the task's file reader (a DoFn for ReadFiles) of those sources;
    tags: its tagged outputs (TAG_REJECTED and TAG_STATS among them).

    Datasets none of whose sources another graph of the pipeline reads (share_reads' uses) are
    read together in one step, under their qualified names, each source's rows split into its
    dataset's shard range (layout). A dataset with a source that another graph reads is read as
    a run of that dataset alone reads it (own names, own shard count), so that share_reads can
    share the read, then renamed into the job: names qualified, shards moved to its range.

    layout: {dataset: (first shard, shard count)}; sources: {qualified name: Source}."""

    def __init__(self, layout: dict, reader, sources: dict, tags: tuple = (TAG_REJECTED, TAG_STATS)):
        super().__init__()
        self.layout, self.reader, self.sources, self.tags = layout, reader, sources, tags

    def _read(self, pbegin, label: str, sources: dict, shards: int, layout) -> tuple:
        read = pbegin | label >> ReadFiles(sources, self.reader(sources, shards, layout), self.tags)
        return read.pieces, read[TAG_REJECTED], read[TAG_STATS]

    def expand(self, pbegin):
        uses = pbegin.pipeline.options.view_as(ReadOptions).read_uses()

        def shared(dataset):
            return any(uses.get((role_of(n), tuple(s.files)), 1) > 1
                       for n, s in self.sources.items() if dataset_of(n) == dataset)

        apart = [d for d in sorted(self.layout) if shared(d)]
        together = {n: s for n, s in self.sources.items() if dataset_of(n) not in apart}
        outputs = ([], [], [])
        if together:
            total = sum(count for _, count in self.layout.values())
            read = self._read(pbegin, "Read", together, total, self.layout)
            for i, pcoll in enumerate(read):
                outputs[i].append(pcoll)
        for dataset in apart:
            first, count = self.layout[dataset]
            mine = {role_of(name): source for name, source in self.sources.items()
                    if dataset_of(name) == dataset}
            pieces, rejects, stats = self._read(pbegin, f"Read[{dataset}]", mine, count, None)
            outputs[0].append(pieces | f"Pieces[{dataset}]" >> beam.Map(_piece_in, dataset, first))
            outputs[1].append(rejects | f"Rejects[{dataset}]" >> beam.Map(_reject_in, dataset))
            outputs[2].append(stats | f"Stats[{dataset}]" >> beam.Map(_counter_in, dataset))
        if not apart:
            return tuple(parts[0] for parts in outputs)
        return tuple(parts | f"Flatten[{i}]" >> beam.Flatten() for i, parts in enumerate(outputs))


def shard_range(layout: dict | None, source: str, num_shards: int) -> tuple[int, int]:
    """(first shard, shard count) of the rows of `source`: its dataset's range in a
    multi-dataset read (ReadDatasets), else 0 and num_shards."""
    if layout:
        return layout[dataset_of(source)]
    return 0, num_shards


def _piece_in(element, dataset: str, first: int):
    shard, (name, rows) = element
    return first + shard, (qualified(dataset, name), rows)


def _reject_in(record: dict, dataset: str) -> dict:
    return dict(record, source=qualified(dataset, record["source"]))


def _counter_in(pair, dataset: str):
    (counter, name), n = pair
    return (counter, qualified(dataset, name)), n


class ReadOptions(PipelineOptions):
    """How ReadFiles reads, set by the launcher and the sweep on the pipeline's options (they
    travel with the pipeline to any runner, where attributes set on the Pipeline object would
    not): evalbeam_input_split_bytes, the size above which a line-based file is read in byte
    spans (split_inputs); evalbeam_share_reads, read each source once for every job of the
    pipeline (share_reads); evalbeam_read_uses, JSON [[source name, [files], jobs reading
    it], ...]."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--evalbeam_input_split_bytes", type=int, default=None,
                            help="set by --input_split_bytes (transforms.io.split_inputs)")
        parser.add_argument("--evalbeam_share_reads", action="store_true", default=False,
                            help="set by evalbeam sweep (transforms.io.share_reads)")
        parser.add_argument("--evalbeam_read_uses", default=None,
                            help="set by evalbeam sweep (transforms.io.share_reads)")

    def read_uses(self) -> dict:
        """{(source name, tuple of its files): how many jobs read it}."""
        items = json.loads(self.evalbeam_read_uses or "[]")
        return {(name, tuple(files)): n for name, files, n in items}


# The reads made so far in each pipeline under share_reads, by (source name, files, reader
# digest): PCollections, which exist only while the graph is built, in the launching process.
_SHARED_READS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def share_reads(pipeline, uses: dict | None = None) -> None:
    """Mark a pipeline so that its ReadFiles read each source once (see ReadFiles). uses:
    {(source name, tuple of its files): how many jobs read it}; a source read by one job is
    read together with that job's other such sources (without it every source is read on its
    own, to be shared)."""
    settings = pipeline.options.view_as(ReadOptions)
    settings.evalbeam_share_reads = True
    settings.evalbeam_read_uses = json.dumps(
        [[name, list(files), n] for (name, files), n in sorted((uses or {}).items())])


def split_inputs(pipeline, split_bytes: int | None) -> None:
    """Set the size above which ReadFiles reads a line-based file (JSONL, TREC, uncompressed)
    in byte spans, each its own element (transforms/line_spans.py); 0: every file whole; None
    (the default): line_spans.auto_split_bytes of each read's splittable bytes."""
    pipeline.options.view_as(ReadOptions).evalbeam_input_split_bytes = (
        None if split_bytes is None else int(split_bytes))


class SharedRead:
    """ReadFiles' result in a pipeline that shares reads: .pieces and [tag], like the outputs
    of a ParDo with tagged outputs."""

    def __init__(self, outputs: dict):
        self._outputs = outputs

    @property
    def pieces(self):
        return self._outputs["pieces"]

    def __getitem__(self, tag):
        return self._outputs[tag]


def span_text(start: int, end: int | None) -> str:
    """How progress names a span of a file: "" for the whole file."""
    return "" if end is None else f" (bytes {start:,} to {end:,})"


def parse_rows(path: str, max_row_bytes: int = MAX_ROW_BYTES, span: tuple = (0, None, 1)):
    """(rows, positions, [(position, None, reason)]) of a whole JSONL (line numbers) or Parquet
    (row numbers) file, for row formats with nested values (detection, segmentation), or of
    the JSONL lines that start in a byte span: span (start, end, number of its first line),
    end None for the whole file (transforms/line_spans.py). JSONL lines are parsed by
    schemas.safe_json.loads_row: a line too long, too deeply nested, not JSON or holding a lone
    surrogate is rejected with its reason."""
    from evalbeam.schemas.safe_json import iter_lines, loads_row

    start, end, first_line = span
    rows, positions, rejected = [], [], []
    with open_span(path, start, end) as stream:
        if format_of(path) == "parquet":
            import pyarrow.parquet as pq

            return _parquet_rows(pq.read_table(stream))
        for number, raw in iter_lines(stream, max_row_bytes, first_line=first_line):
            if raw is None:
                rejected.append((number, None, too_long_reason(max_row_bytes)))
                continue
            if not raw.strip():
                continue
            row, reason = loads_row(raw)
            if reason is None:
                rows.append(row)
                positions.append(number)
            else:
                rejected.append((number, None, reason))
    return rows, positions, rejected


def _parquet_rows(table):
    """parse_rows for a Parquet table: Arrow does not check that string columns hold valid UTF-8
    when it reads them, so a row whose text is not (the bytes of a lone surrogate, say) is found
    when converted and rejected alone; the rest convert at Arrow's speed."""
    try:
        rows = table.to_pylist()
        return rows, list(range(len(rows))), []
    except UnicodeDecodeError:
        pass
    rows, positions, rejected = [], [], []
    for i in range(table.num_rows):
        try:
            rows.append(table.slice(i, 1).to_pylist()[0])
            positions.append(i)
        except UnicodeDecodeError as error:
            rejected.append((i, None, f"holds text that is not valid UTF-8 ({error.reason} at "
                                      f"byte {error.start})"))
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


def reject_row(files: dict, source: str, row, reason: str):
    """The tagged rejection of a parsed row (with .file_id, .position, .uid) found after reading
    (in a shard): by file and position, or by source name alone for rows of a PCollection, which
    have no file (source not in files) and no position (-1)."""
    if source in files:
        path = files[source][row.file_id]
        where = position_name(path)
    else:
        path, where = source, "row"
    position = row.position if row.position >= 0 else None
    return beam.pvalue.TaggedOutput(TAG_REJECTED, reject(source, path, position, reason, row.uid, where))


def unique_or_rejected(files: dict, source: str, rows: list, outputs: list) -> dict:
    """{uid: row} of the uids that appear once; every copy of a repeated uid is rejected
    (reject_row, appended to outputs)."""
    return unique_rows(rows, lambda row, n: outputs.append(
        reject_row(files, source, row, f"datum_uid appears {n} times in {source}")))


def unique_by_source(files: dict, pieces, models: list, outputs: list) -> tuple[dict, dict]:
    """A shard's pieces [(source, rows)] -> ({uid: ground-truth row}, {model: {uid: row}}) of
    the uids that appear once in their source; every copy of a repeated uid is rejected
    (appended to outputs: the ground truth's first, then each model's in order)."""
    by_source: dict = {}
    for source, rows in pieces:
        by_source.setdefault(source, []).extend(rows)
    truths = unique_or_rejected(files, GROUNDTRUTHS, by_source.get(GROUNDTRUTHS, []), outputs)
    predictions = {m: unique_or_rejected(files, m, by_source.get(m, []), outputs) for m in models}
    return truths, predictions


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
    if GROUNDTRUTHS not in pcolls:
        raise ValueError(f"{what} needs a 'groundtruths' PCollection")
    models = sorted(name for name in pcolls if name != GROUNDTRUTHS)
    read = (tagged_batches(pcolls, [GROUNDTRUTHS] + models, batch_size)
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
        # the elements as a side input of one write: the same list as ToList, in far fewer
        # transforms (a sweep has a WriteJsonl per output of every cell)
        return (pcoll.pipeline
                | "Once" >> beam.Create([None])
                | "Write" >> beam.Map(_write_all, beam.pvalue.AsList(pcoll), self.path,
                                      self.sort_key))


def _write_all(_, records, path: str, sort_key) -> int:
    return write_jsonl(list(records), path, sort_key)


def is_local(path: str) -> bool:
    """A path on this machine's file system (not an object store URI such as gs://)."""
    return "://" not in path


@contextlib.contextmanager
def created_whole(path: str, sync: bool = False):
    """A binary stream that writes path, which readers (and a kill) see whole or not at all.
    Workers write their parts under names fixed by the shard, and a retried bundle (a lost
    worker on Dask or Dataflow) writes the same name again while a reader of the first copy may
    still read it; run.json is replaced while a run is watched. On a local disk the bytes go to
    a sibling file renamed over path at the end (atomic on POSIX; sync: fsync'd first); an
    object store shows an object only once it is whole, so there path is written directly."""
    if not is_local(path):
        with FileSystems.create(path) as out:
            yield out
        return
    partial = f"{path}.{uuid.uuid4().hex[:8]}.partial"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)   # as FileSystems.create does
    try:
        with open(partial, "wb") as out:
            yield out
            out.flush()
            if sync:
                os.fsync(out.fileno())
        os.replace(partial, path)   # fails when path is a folder: no partial file is left either
    except BaseException:
        if os.path.lexists(partial):
            os.remove(partial)
        raise


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
    """The JSON of a file evalbeam wrote (run.json, gates.json, a mark), read as every such
    file is: through transforms.input_files.load_json (a regular file, size and depth bounded,
    strict JSON; FileMissing when absent, FileRefused otherwise)."""
    return load_json(path)


def join(folder: str, name: str) -> str:
    return FileSystems.join(folder, name)
