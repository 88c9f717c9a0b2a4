"""GroupByShard, the first of every task's two shuffles: the readers' (shard, piece) pairs
grouped by shard, each piece travelling as the bytes of its pickle or, when the run has a
temporary folder and the piece is larger than SPILL_BYTES, as the path of a file holding them.

Why not the pieces themselves: a runner that groups in Python (the DirectRunner, in-process or
multi-process, and the portable runner's embedded job service) decodes every element it groups
and encodes it again, and the multi-process runner then sends each worker its whole share of
the grouped data as one message, from its one process, while every worker waits. For a
1,000,000-datum classification run on 2 workers (2026-11-27) that was 4.5 s of one core between
the reading and the matching, 282 MB of pieces (merge.py does the same for the states). Pickled by the reader (in parallel, as the
worker encoded it anyway), a piece is copied rather than rebuilt by the runner; spilled, only
its path crosses the shuffle, and the matching worker reads the file itself (retrieval did this
alone before, for the same reason). Files are written whole (io.created_whole) under a new name
per attempt, so a retried bundle never reads a half-written piece, and they go with the run's
temporary folder. The bytes the meter counts are those of the pickled pieces either way.

Only runners that group in Python spill (groups_in_python: the DirectRunner, the portable
runner's embedded job service, evalbeam's DaskRunner, whose partitions stay in worker memory),
and the DirectRunner only into a local folder (spill_folder).
Dataflow's, Flink's and Spark's shuffles move bytes without decoding them; there a spill would
trade the shuffle for one temporary object per shard, span and source (a few hundred thousand
small writes at 100 M datums, each with its own latency and price), so every piece stays inline.

EVALBEAM_SPILL_BYTES, when set where the pipeline is built, replaces SPILL_BYTES (0: spill every
piece; the tests use it to send every piece of a small input through files).
"""

from __future__ import annotations

import os
import pickle
import struct
import typing
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from evalbeam.transforms.io import created_whole, is_local, join
from evalbeam.transforms.meters import SPILLED_BYTES, MeterShuffle, in_global_window

STAGE = "GroupByShard"
SPILL_BYTES = 1 << 16       # larger pickles go to a file in the spill folder
INLINE, SPILLED = b"I", b"F"
SIZE = struct.Struct("<Q")  # a spilled piece's pickle length, before its path


def pack(element, spill_dir: str | None, spill_bytes: int = SPILL_BYTES) -> tuple:
    """(key, value) -> (key, tag + payload): INLINE + the value's pickle, or, when spill_dir is
    set and the pickle is longer than spill_bytes, SPILLED + its length (SIZE) + the UTF-8 path
    of a file in spill_dir holding it (named after the key when it is a shard number)."""
    key, value = element
    blob = pickle.dumps(value, protocol=5)
    if spill_dir is None or len(blob) <= spill_bytes:
        return key, INLINE + blob
    prefix = f"{key:05d}" if isinstance(key, int) else "state"
    path = join(spill_dir, f"{prefix}-{uuid.uuid4().hex}.pkl")
    with created_whole(path) as out:
        out.write(blob)
    return key, SPILLED + SIZE.pack(len(blob)) + path.encode("utf-8")


def unpack(element) -> tuple:
    """(key, packed values) -> (key, [value, ...])."""
    key, packed = element
    values = []
    for value in packed:
        if value[:1] == INLINE:
            values.append(pickle.loads(value[1:]))
            continue
        path = value[1 + SIZE.size:].decode("utf-8")
        with FileSystems.open(path, compression_type="uncompressed") as stream:
            values.append(pickle.loads(stream.read()))
    return key, values


class _MeterPacked(MeterShuffle):
    """The GroupByShard meter: elements, the bytes of the pieces' pickles (in a file or not),
    and of those the bytes written to files (SPILLED_BYTES, only when some were)."""

    def start_bundle(self):
        super().start_bundle()
        self.spilled = 0

    def process(self, element):
        _, value = element
        self.elements += 1
        if value[:1] == INLINE:
            self.bytes += len(value) - 1
        else:
            size = SIZE.unpack_from(value, 1)[0]
            self.bytes += size
            self.spilled += size
        return ()

    def finish_bundle(self):
        yield from super().finish_bundle()
        if self.spilled:
            yield in_global_window(((SPILLED_BYTES, self.stage), self.spilled))


def _runner_name(options) -> str:
    from apache_beam.options.pipeline_options import StandardOptions

    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    return (runner if isinstance(runner, str) else type(runner).__name__).rsplit(".", 1)[-1].lower()


def groups_in_python(options) -> bool:
    """Whether the pipeline's runner groups its shuffles in a Python process, decoding every
    element (where spilling large pieces pays; module docstring)."""
    from apache_beam.options.pipeline_options import PortableOptions

    name = _runner_name(options)
    if name == "portablerunner":
        return options.view_as(PortableOptions).job_endpoint == "embed"
    return name in ("direct", "directrunner", "switchingdirectrunner", "bundlebaseddirectrunner",
                    "daskrunner")


def spill_folder(spill_dir: str | None, options) -> str | None:
    """spill_dir when this pipeline spills there, else None (every piece inline): only on a
    runner that groups_in_python, and on the DirectRunner, whose workers share one machine, only
    into a local folder (with an object-store --output, files would send every piece through
    the network twice for nothing: the bytes stay in the shuffle instead)."""
    if spill_dir is None or not groups_in_python(options):
        return None
    if not is_local(spill_dir) and _runner_name(options) not in ("daskrunner", "portablerunner"):
        return None
    return spill_dir


def spill_size() -> int:
    """SPILL_BYTES, or EVALBEAM_SPILL_BYTES where the pipeline is built."""
    return int(os.environ.get("EVALBEAM_SPILL_BYTES", SPILL_BYTES))


def group_by_shard(pieces, spill_dir: str | None = None):
    """(shard, piece) pairs -> ((shard, [piece, ...]) per shard, in no set order; the stats
    pairs of the GroupByShard meter). spill_dir: a folder of the run's own (its temporary
    folder), or None to keep every piece in the shuffle (rows from a user's PCollections); only
    used where spill_folder says so."""
    spill_dir = spill_folder(spill_dir, pieces.pipeline.options)
    packed = (pieces
              | "PackPieces" >> beam.Map(pack, spill_dir, spill_size())
              .with_output_types(typing.Tuple[int, bytes]))
    grouped = (packed
               | STAGE >> beam.GroupByKey()
               | "UnpackPieces" >> beam.Map(unpack))
    return grouped, packed | f"Meter{STAGE}" >> beam.ParDo(_MeterPacked(STAGE))
