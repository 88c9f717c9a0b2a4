"""The output folder of a run: what evalbeam writes, what it never touches, how it publishes.

evalbeam writes only the files named in OUTPUT_NAMES, plus one hidden temporary folder
`.evalbeam-tmp-<token>` per run, all directly inside --output. It recognises its own earlier
outputs by run.json: a run.json that carries WRITTEN_BY lists, under "files", every output of its
run with its size in bytes; a file of one of those names that is absent from that list, or whose
size differs, was not written by evalbeam (or was changed since), and a folder holding one is
refused (InputError, exit 2) unless the user passes --overwrite. An output name taken by a folder
(or anything but a file or a symlink to one) is refused even with --overwrite: evalbeam never
wrote a folder there, and --overwrite replaces files. An input file is never removed: an input
that is one of the files the run would write is refused even with --overwrite. A temporary folder
is removed only when it is provably evalbeam's: it holds TEMP_MARKER naming it (written when the
folder is made), or its name is the "temp" of evalbeam's own run.json (a run killed before
marking it); other entries named like one are the user's and are left alone.

The sequence (check() changes nothing on disk; everything after it is start() and publish()):
1. check(): refuse foreign outputs, inputs among the outputs, a live run in the same folder.
2. start(): write run.json with "status": "running" that still lists the earlier run's files,
   delete those files and the temporary folders of killed runs, make (and mark) this run's
   temporary folder.
3. The pipeline writes every output into the temporary folder.
4. publish(): rewrite the "running" run.json to list the new files and their sizes, move the
   files into place, then write the final run.json (one atomic rename on local disks).
A kill at any point leaves either a run.json that says "running" (the run did not finish) next
to files it lists, or the complete new set. A failed pipeline leaves run.json "failed" (with the
reason) and rejected.jsonl if it was written; never a metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
import uuid

from apache_beam.io.filesystems import FileSystems

from evalbeam.transforms.io import InputError, created_whole, is_local, join, read_json
from evalbeam.transforms.meters import METER_COUNTERS, datums_report, shuffle_report

WRITTEN_BY = "evalbeam"
OUTPUT_NAMES = ("metrics.jsonl", "run.json", "rejected.jsonl", "scores.jsonl", "per_query.jsonl",
                "comparison.jsonl", "gates.json", "report.html")
TEMP_PREFIX = ".evalbeam-tmp-"
TEMP_MARKER = "evalbeam-temp.json"   # inside each temporary folder: {"written_by", "temp": its name}

# Run statuses, worst last, and the exit code each ends with.
COMPLETE, WITH_REJECTIONS, INCOMPLETE, FAILED, RUNNING = (
    "complete", "complete_with_rejections", "incomplete", "failed", "running")
EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_FAILED, EXIT_INCOMPLETE = 0, 1, 2, 3, 4
EXIT_CODES = {COMPLETE: EXIT_OK, WITH_REJECTIONS: EXIT_REJECTED, INCOMPLETE: EXIT_INCOMPLETE,
              FAILED: EXIT_FAILED}


class ForeignOutputs(InputError):
    """OutputFolder.check's refusal of a folder holding files that evalbeam did not write:
    .folder and .names (those files) too, so that a command whose remedy is not --overwrite
    (evalbeam sweep, whose cells are folders of its own) can say what it accepts."""

    def __init__(self, message: str, folder: str, names: list[str]):
        super().__init__(message)
        self.folder, self.names = folder, list(names)


def same_path(a: str, b: str) -> bool:
    """Whether two paths name the same file or folder: resolved (symlinks, "..") on a local
    disk; on an object store, the same name but for a trailing "/" (names there are literal)."""
    if is_local(a) and is_local(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return a.rstrip("/") == b.rstrip("/")


def _size(path: str) -> int | None:
    """Size in bytes of the file at path, None when there is no such file."""
    if is_local(path):
        return os.path.getsize(path) if os.path.isfile(path) else None
    try:
        found = FileSystems.match([path])[0].metadata_list
    except Exception:
        return None
    return found[0].size_in_bytes if len(found) == 1 else None


def _not_a_file(path: str) -> str | None:
    """What stands at path when it is neither a regular file nor a symlink to one ("a folder",
    "a symlink to a folder", "a special file"), else None. Local paths only: an object store
    has no folders to mistake for a file."""
    if not is_local(path):
        return None
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symlink to a folder" if os.path.isdir(path) else None
    return "a folder" if stat.S_ISDIR(mode) else "a special file (pipe, socket or device)"


def _own_temp(folder: str, name: str, recorded: str | None) -> bool:
    """Whether folder/name is a temporary folder evalbeam made: a real folder (not a symlink)
    that is the one evalbeam's own run.json recorded (a run killed before marking it), or holds
    TEMP_MARKER naming it (a copy of one renamed by the user names another folder, and is the
    user's)."""
    path = join(folder, name)
    if is_local(path) and (os.path.islink(path) or not os.path.isdir(path)):
        return False
    if name == recorded:
        return True
    try:
        mark = read_json(join(path, TEMP_MARKER))
    except Exception:
        return False
    return isinstance(mark, dict) and mark.get("written_by") == WRITTEN_BY and \
        mark.get("temp") == name


def _objects_matching(pattern: str) -> list[str]:
    """The paths of the objects (files) that match a glob pattern ("**" crosses "/")."""
    return [m.path for m in FileSystems.match([pattern])[0].metadata_list]


def path_exists(path: str) -> bool:
    """Whether anything stands at path: on a local disk any entry, a dangling link included
    (os.path.lexists); elsewhere the object (FileSystems.exists)."""
    if is_local(path):
        return os.path.lexists(path)
    return FileSystems.exists(path)


def write_json_atomic(obj, path: str) -> None:
    """Write JSON so that a reader (or a kill) sees the old file or the new one, never half
    (transforms.io.created_whole, fsync'd)."""
    with created_whole(path, sync=True) as out:
        out.write((json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def _read_own_run_json(path: str) -> dict | None:
    """The run.json at path if evalbeam wrote it, else None."""
    try:
        info = read_json(path)
    except Exception:
        return None
    if isinstance(info, dict) and info.get("written_by") == WRITTEN_BY and \
            isinstance(info.get("files"), dict):
        return info
    return None


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


class OutputFolder:
    """The output folder of one run (see the module docstring for the protocol).

    `names` are the outputs this run writes: metrics.jsonl, run.json and rejected.jsonl, plus the
    task's `extra` ones (scores.jsonl, per_query.jsonl) and those written from the finished
    outputs just before publishing (`after`: comparison.jsonl, gates.json, report.html), all
    published before run.json."""

    FINAL = ("metrics.jsonl", "run.json", "rejected.jsonl")

    def __init__(self, folder: str, extra: tuple = (), overwrite: bool = False, after: tuple = ()):
        self.folder = folder
        self.extra = tuple(extra)
        self.after = tuple(after)
        self.overwrite = overwrite
        self.token = uuid.uuid4().hex[:12]
        self.tmp = join(folder, TEMP_PREFIX + self.token)
        self.previous: dict[str, int] = {}   # earlier outputs (name: size) that start() removes
        self.recorded_temp: str | None = None  # the temporary folder named by its own run.json

    @property
    def names(self) -> tuple:
        return self.FINAL + self.extra + self.after

    def final(self, name: str) -> str:
        return join(self.folder, name)

    def temp(self, name: str) -> str:
        return join(self.tmp, name)

    def check(self, inputs: list[str]) -> None:
        """Raise InputError when this run may not write into the folder; changes nothing."""
        for path in inputs:
            for name in OUTPUT_NAMES:
                if same_path(path, self.final(name)):
                    raise InputError(
                        f"the input {path} is the file {name} of the output folder, which a run "
                        f"replaces: move the input elsewhere or choose another --output. evalbeam "
                        "never removes an input.")
            if is_local(path) and os.path.basename(os.path.dirname(os.path.realpath(path))
                                                 ).startswith(TEMP_PREFIX):
                raise InputError(f"the input {path} lies in a temporary folder of evalbeam, "
                                 "which a later run removes: move it elsewhere.")
        if is_local(self.folder) and os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise InputError(f"--output {self.folder} is a file, not a folder: name a folder "
                             "(it is created if needed).")
        try:
            present = [n for n in OUTPUT_NAMES if path_exists(self.final(n))]
        except Exception as error:
            raise InputError(f"cannot read the output folder {self.folder!r}: {error}") from None
        taken = [(n, what) for n in present if (what := _not_a_file(self.final(n)))]
        if taken:
            raise InputError(
                f"the output folder {self.folder} holds "
                f"{', '.join(f'{n} (which is {what})' for n, what in taken)} under the name of an "
                "output evalbeam writes. evalbeam replaces only files, never a folder or its "
                "contents, even with --overwrite: move or rename "
                f"{'it' if len(taken) == 1 else 'them'}, or choose another --output.")
        own = _read_own_run_json(self.final("run.json")) if "run.json" in present else None
        owned = {}
        if own is not None:
            owned["run.json"] = None
            temp = own.get("temp")
            if isinstance(temp, str) and temp.startswith(TEMP_PREFIX) and "/" not in temp \
                    and temp not in (".", "..") and "\\" not in temp:
                self.recorded_temp = temp
            for name, size in own["files"].items():
                if name in present and name in OUTPUT_NAMES and name != "run.json" \
                        and _size(self.final(name)) == size:
                    owned[name] = size
            if own.get("status") == RUNNING and own.get("host") == socket.gethostname() \
                    and own.get("pid") != os.getpid() and _pid_alive(own.get("pid")):
                raise InputError(
                    f"another evalbeam run (process {own.get('pid')}, started "
                    f"{own.get('started_at')}) is writing to {self.folder}; wait for it to end or "
                    "choose another --output.")
        foreign = [n for n in present if n not in owned]
        if foreign and not self.overwrite:
            raise ForeignOutputs(
                f"the output folder {self.folder} holds {', '.join(foreign)}, which evalbeam did "
                "not write (or which changed since it wrote them); a run would replace "
                f"{'it' if len(foreign) == 1 else 'them'}. Choose an empty or new --output, "
                "move the file(s) away, or pass --overwrite to replace them.", self.folder, foreign)
        self.previous = {n: owned.get(n) for n in present}

    def start(self, run_info: dict) -> None:
        """Mark the folder as taken by this run, then remove the earlier outputs and the
        temporary folders of killed runs. Raises InputError when the folder is not writable;
        once run.json said "running", it then says "failed" with the reason and lists the
        earlier outputs still there (a removal can fail half way: an undeletable file, a
        folder whose permissions changed), so the folder never claims a run that is not one."""
        listed = None
        try:
            if not FileSystems.exists(self.folder):
                FileSystems.mkdirs(self.folder)
            listed = {n: s for n, s in self.previous.items() if n != "run.json" and s is not None}
            self._write_run_json(dict(run_info, status=RUNNING, files=listed))
            stale = [self.final(n) for n in self.previous if n != "run.json"]
            stale += self.temp_folders()
            if stale:
                FileSystems.delete(stale)
            self._write_run_json(dict(run_info, status=RUNNING, files={}))
            self.make_temp()
        except Exception as error:
            message = str(error) if isinstance(error, InputError) else \
                f"cannot write to the output folder {self.folder!r}: {error}"
            if listed is not None:
                left = {n: size for n, size in listed.items() if path_exists(self.final(n))}
                try:
                    self._write_run_json(dict(run_info, status=FAILED, files=left, error=message))
                except Exception:   # the folder refuses even that: "running" stays, not "complete"
                    pass
            raise InputError(message) from None

    def make_temp(self) -> str:
        """Make this run's temporary folder and mark it as evalbeam's (TEMP_MARKER), so that a
        later run may remove it if this one is killed; returns its path."""
        FileSystems.mkdirs(self.tmp)
        write_json_atomic({"written_by": WRITTEN_BY, "temp": os.path.basename(self.tmp)},
                          self.temp(TEMP_MARKER))
        return self.tmp

    def temp_folders(self) -> list[str]:
        """The temporary folders of earlier (killed) runs that are provably evalbeam's: marked
        (TEMP_MARKER), or named by its own run.json. Anything else named like one is left."""
        mine = os.path.basename(self.tmp)
        if is_local(self.folder):
            names = [n for n in sorted(os.listdir(self.folder)) if n.startswith(TEMP_PREFIX)]
            return [join(self.folder, n) for n in names
                    if n != mine and _own_temp(self.folder, n, self.recorded_temp)]
        # an object store: a folder is the objects under its prefix
        try:
            found = _objects_matching(join(self.folder, TEMP_PREFIX + "*/**"))
        except Exception:
            return []
        prefix = self.folder.rstrip("/") + "/"
        by_folder: dict[str, list[str]] = {}
        for path in found:
            if path.startswith(prefix) and "/" in path[len(prefix):]:
                by_folder.setdefault(path[len(prefix):].split("/", 1)[0], []).append(path)
        return sorted(p for n, paths in by_folder.items()
                      if n != mine and _own_temp(self.folder, n, self.recorded_temp) for p in paths)

    def _write_run_json(self, info: dict) -> None:
        info = dict(info, written_by=WRITTEN_BY)
        if info["status"] == RUNNING:
            info.update(host=socket.gethostname(), pid=os.getpid(), temp=os.path.basename(self.tmp))
        write_json_atomic(info, self.final("run.json"))

    def publish(self, run_info: dict) -> None:
        """Move every output into place with run.json last: a metrics.jsonl never stands next to
        a run.json that does not describe it."""
        names = [n for n in self.names if n != "run.json"]
        sizes = {n: _size(self.temp(n)) for n in names}
        missing = [n for n, s in sizes.items() if s is None]
        if missing:
            raise RuntimeError(f"the run did not write {missing} into {self.tmp}")
        self._write_run_json(dict(run_info, status=RUNNING, files=sizes))
        FileSystems.rename([self.temp(n) for n in names], [self.final(n) for n in names])
        self._write_run_json(dict(run_info, files=sizes))
        self.cleanup()

    def fail(self, run_info: dict) -> None:
        """Leave run.json (status failed, with the reason) and rejected.jsonl if it was written;
        remove whatever else this run had published already (a failure during publishing must
        not leave a metrics.jsonl behind)."""
        files = {}
        try:
            mine = _read_own_run_json(self.final("run.json")) or {"files": {}}
            published = [self.final(n) for n in mine["files"]
                         if n not in ("run.json", "rejected.jsonl") and path_exists(self.final(n))]
            if published:
                FileSystems.delete(published)
            if FileSystems.exists(self.temp("rejected.jsonl")):
                FileSystems.rename([self.temp("rejected.jsonl")], [self.final("rejected.jsonl")])
            if "rejected.jsonl" in mine["files"] or path_exists(self.final("rejected.jsonl")):
                files["rejected.jsonl"] = _size(self.final("rejected.jsonl"))
            self._write_run_json(dict(run_info, status=FAILED, files=files))
        finally:
            self.cleanup()

    def read_temp_json(self, name: str):
        return read_json(self.temp(name))

    def cleanup(self) -> None:
        """Remove this run's temporary folder. On an object store that is every object under its
        prefix: no object bears the folder's own name, so asking GCS, S3 or Azure whether it
        exists says no, and deleting that name deletes nothing."""
        try:
            if is_local(self.tmp):
                if os.path.lexists(self.tmp):
                    FileSystems.delete([self.tmp])
                return
            found = _objects_matching(join(self.tmp, "**"))
            if found:
                FileSystems.delete(found)
        except Exception:  # a leftover is hidden, and the next run removes it
            pass


# ---- the end of a run: counts, problems, status ----

ERROR, WARNING = "error", "warning"


def problem(severity: str, code: str, message: str, model: str | None = None) -> dict:
    """One finding about a run, for run.json's "problems" and the printed summary. An "error"
    means the run could not compute what was asked (its status becomes "incomplete"); a
    "warning" means the numbers are computed but probably not what the user meant. model: the
    one model it concerns, when it concerns one (a sweep gives it to that model's cell only)."""
    found = {"severity": severity, "code": code, "message": message}
    if model is not None:
        found["model"] = model
    return found


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
    """{source: {rows_read, rows_evaluated, rows_rejected}} from ((counter, source), n) pairs
    (the meters of transforms/meters.py are left out)."""
    counts = {name: {"rows_read": 0, "rows_evaluated": 0, "rows_rejected": 0} for name in names}
    for (counter, source), value in stats:
        if counter in METER_COUNTERS:
            continue
        counts.setdefault(source, {"rows_read": 0, "rows_evaluated": 0, "rows_rejected": 0})
        counts[source][counter] += value
    return counts


def count_problems(counts: dict) -> list[dict]:
    """A source none of whose rows could be evaluated. Every row rejected is an error (its metrics
    would be a table of zeros, or there is nothing to evaluate against); a model whose files hold
    no rows at all (an empty COCO results array: it detected nothing) is evaluated as such, with
    a warning."""
    out = []
    for name, c in counts.items():
        if c["rows_evaluated"]:
            continue
        what = "ground-truth row" if name == "groundtruths" else f"prediction row of model {name!r}"
        if c["rows_read"]:
            out.append(problem(ERROR, "nothing_evaluated",
                               f"no {what} could be evaluated: all {c['rows_read']:,} were rejected "
                               "(see rejected.jsonl)."))
        elif name == "groundtruths":
            out.append(problem(ERROR, "nothing_evaluated", "the ground truth holds no rows."))
        else:
            out.append(problem(WARNING, "no_predictions",
                               f"model {name!r} has no prediction rows: it is evaluated as having "
                               "predicted nothing."))
    return out


def slice_problems(metrics_path: str, slices: list) -> list[dict]:
    """A --slice key that no evaluated ground-truth row has a value for: every datum falls in
    the slice `null`, which is certainly a misspelt key, not a finding about the model."""
    keys = sorted({key for spec in slices for key in spec})
    if not keys:
        return []
    valued: set = set()
    any_record = False
    with FileSystems.open(metrics_path) as stream:
        for line in stream:
            slice_value = json.loads(line)["slice"]
            any_record = True
            valued.update(k for k, v in slice_value.items() if v is not None)
    if not any_record:
        return []
    return [problem(ERROR, "slice_key_missing",
                    f"--slice {key}: no evaluated ground-truth row has a value for metadata "
                    f"{key!r}, so every datum fell in the slice {key}=null. Check the key's "
                    "spelling (and, for COCO files, that it is in each image's \"metadata\").")
            for key in keys if key not in valued]


def run_status(problems: list[dict], rejected: int, read: int, allowed: float) -> str:
    if any(p["severity"] == ERROR for p in problems):
        return INCOMPLETE
    if rejected == 0 or (read > 0 and rejected / read <= allowed):
        return COMPLETE
    return WITH_REJECTIONS


def reject_sort_key(record: dict):
    """The order of rejected.jsonl: source, file, line (or Parquet row), reason."""
    return (record["source"], record["file"], record.get("line", record.get("row")) or 0,
            record["reason"])


def finalize_run(stats: list, n_metrics: int, n_rejected: int, folder: OutputFolder,
                 run_info: dict, started: float, allowed_rejected_fraction: float,
                 extra_rows: dict | None = None, problems: list | None = None,
                 finish=None) -> dict:
    """The last step of a pipeline: check the counts, judge the run, publish the outputs, return
    run.json.

    Runs inside the pipeline (after every output is written), so a job launched without a
    waiting client (a Dataflow flex template) still publishes complete outputs. `problems` are
    the task's own findings (problem() dicts); the checks every task shares are added here.
    finish(info, folder) -> info: writes the files of `folder.after` from the finished outputs
    (still in folder.temp) and returns run.json's content with what they add to it.
    extra_rows: {file name: rows written} of the task's extra outputs (scores.jsonl,
    per_query.jsonl), recorded as run.json's "<stem>_written"."""
    counts = source_counts(stats, run_info["sources"])
    for name, c in counts.items():
        if c["rows_read"] != c["rows_evaluated"] + c["rows_rejected"]:
            raise RuntimeError(f"the row counts of {name} do not add up: {c}")
    read = sum(c["rows_read"] for c in counts.values())
    rejected = sum(c["rows_rejected"] for c in counts.values())
    if rejected != n_rejected:
        raise RuntimeError(f"{n_rejected} rejected rows were written but {rejected} were counted")
    found = (count_problems(counts) + slice_problems(folder.temp("metrics.jsonl"),
                                                     run_info.get("slices") or [])
             + list(problems or []))
    found.sort(key=lambda p: (p["severity"] != ERROR, p["code"], p["message"]))
    info = dict(run_info)
    info.update(
        status=run_status(found, rejected, read, allowed_rejected_fraction),
        problems=found,
        counts=counts, rows_read=read, rows_rejected=rejected, metrics_written=n_metrics,
        first_rejections=first_records(folder.temp("rejected.jsonl"), 3),
        outputs={name: folder.final(name) for name in folder.names},
        wall_time_seconds=round(time.time() - started, 3),
        shuffles=shuffle_report(stats),
    )
    datums = datums_report(stats)
    if datums is not None:
        info["datums"] = datums
    for name, n_rows in sorted((extra_rows or {}).items()):
        info[f"{name.split('.')[0]}_written"] = n_rows
    if finish is not None:
        info = finish(info, folder)
    folder.publish(info)
    return info


def _some(values, n: int = 5) -> str:
    values = sorted(values, key=str)
    shown = ", ".join(repr(v) for v in values[:n])
    return shown + (f", ... ({len(values)} in all)" if len(values) > n else "")


def label_problems(groundtruth: dict, predicted: dict) -> list[dict]:
    """Findings on label vocabularies that cannot mean what the user meant.

    groundtruth: {label key: set of values}; predicted: {model: {label key: set of values}}.
    Tasks with one label per annotation (detection, segmentation) pass the key None.
    - error `label_keys_disjoint`: none of a model's label keys occurs in the ground truth (every
      ground truth is a miss and every prediction a hallucination by construction);
    - error `label_values_disjoint`: keys are shared, but no value the model predicts for them is
      a ground-truth value of that key (no prediction can ever be right: a mapping mistake, such
      as class ids against class names);
    - warning `label_key_unmatched`: some of the model's keys never occur in the ground truth;
    - warning `label_values_unmatched`: for one shared key, no predicted value occurs in the
      ground truth (while other keys do overlap)."""
    out = []
    for model in sorted(predicted):
        keys = {k for k, v in predicted[model].items() if v}
        if not keys:
            continue
        shared = sorted((k for k in keys if groundtruth.get(k)), key=str)
        if not shared:
            if keys == {None}:
                text, code = (f"model {model!r}: none of its labels "
                              f"({_some(predicted[model][None])}) occurs among the ground truth's "
                              f"({_some(groundtruth.get(None, ()))}); no prediction can be right.",
                              "label_values_disjoint")
            else:
                text, code = (f"model {model!r}: none of its label keys ({_some(keys)}) occurs in "
                              f"the ground truth (keys {_some(k for k in groundtruth if groundtruth[k])})"
                              "; no prediction can be right.", "label_keys_disjoint")
            out.append(problem(ERROR, code, text, model))
            continue
        for key in sorted(keys - set(shared), key=str):
            out.append(problem(WARNING, "label_key_unmatched",
                               f"model {model!r} predicts label key {key!r}, which no ground truth "
                               "has: those predictions count only as false positives.", model))
        disjoint = [k for k in shared if not predicted[model][k] & groundtruth[k]]
        for key in disjoint:
            name = "" if key is None else f" for key {key!r}"
            text = (f"model {model!r}: no value it predicts{name} ({_some(predicted[model][key])}) "
                    f"is a ground-truth value ({_some(groundtruth[key])})")
            if len(disjoint) == len(shared):
                out.append(problem(ERROR, "label_values_disjoint",
                                   f"{text}: no prediction can be right. Are the values named the "
                                   "same way on both sides (class ids against names)?", model))
            else:
                out.append(problem(WARNING, "label_values_unmatched", text + ".", model))
    return out
