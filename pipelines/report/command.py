"""`evalbeam report DIR [--baseline DIR] [-o FILE]`: the HTML report of a finished run or sweep
folder (pipelines/report/report.md), made from its outputs without running anything again.

Without -o the report is DIR/report.html; written into a run's own folder, it is added to
run.json's list of the run's files (so a later run into the folder replaces it like any output
of evalbeam's). With -o FILE, an existing FILE is replaced only when it is a page evalbeam wrote.
A folder that is neither an evalbeam run nor a sweep exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from evalbeam.pipelines.launch.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, say_error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalbeam report", allow_abbrev=False,
        description="Write the self-contained HTML report of a finished run or sweep folder.")
    parser.add_argument("folder", metavar="DIR", help="a run's --output folder, or a sweep's")
    parser.add_argument("--baseline", metavar="DIR", default=None,
                        help="an earlier run (or sweep) folder to compare with")
    parser.add_argument("-o", "--output", metavar="FILE", default=None,
                        help="where to write the page (default DIR/report.html)")
    return parser


def run(argv: list[str]) -> int:
    from evalbeam.pipelines.quality import comparison
    from evalbeam.pipelines.report import page as report
    from evalbeam.transforms.io import InputError, join
    from evalbeam.transforms.outputs import same_path

    parser = build_parser()
    parser.error = _raise
    try:
        args = parser.parse_args(argv)
        folder = args.folder
        out = args.output or join(folder, "report.html")
        own_page = args.output is None or same_path(args.output, join(folder, "report.html"))
        sweep = _exists(join(folder, "sweep.json"))
        if sweep:
            info = comparison.check_baseline(folder, sweep=True, option="evalbeam report")
            if args.baseline:
                comparison.check_baseline(args.baseline, sweep=True)
        else:
            info = comparison.check_baseline(folder, option="evalbeam report")
            if args.baseline:
                comparison.check_baseline(args.baseline, info.get("task"))
        if own_page:
            _check_own(folder, info, sweep)
        else:
            _check_replaceable(out)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE
    try:
        if sweep:
            checks = _gates_of(folder)
            report.write_sweep_report(folder, out, checks=checks, baseline=args.baseline)
            if own_page:
                _list_in_sweep_json(folder, info, "report.html")
        else:
            report.write_report(report.RunFiles(folder, info), out, baseline=args.baseline)
            if own_page:
                _list_in_run_json(folder, info, "report.html")
    except InputError as error:     # a file of the folder refused by the reading door
        say_error(f"the report of {folder} could not be made: {getattr(error, 'message', error)}")
        return EXIT_USAGE
    except OSError as error:
        say_error(f"cannot write the report to {out}: {error}")
        return EXIT_USAGE
    except Exception as error:      # one paragraph, never a traceback
        say_error(f"the report of {folder} could not be made ({type(error).__name__}: {error})")
        return EXIT_FAILED
    print(f"evalbeam: report in {out}", file=sys.stderr)
    return EXIT_OK


def _raise(message: str):
    raise UsageError(message)


def _exists(path: str) -> bool:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.exists(path)


def _gates_of(folder: str):
    from evalbeam.transforms.io import join, read_json

    path = join(folder, "gates.json")
    return read_json(path).get("results") if _exists(path) else None


GENERATOR = b'<meta name="generator" content="evalbeam">'


def _check_replaceable(path: str) -> None:
    """-o FILE may replace only a page evalbeam wrote (its generator mark in the first 4 KiB;
    pages from before the mark: the doctype and a title starting "evalbeam"): a data file, a
    run's metrics.jsonl or a page of the user's given by mistake is refused."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.io import is_local

    if is_local(path):
        if not os.path.lexists(path):
            return
        if not os.path.isfile(path):
            raise UsageError(f"-o {path} is not a file: name the page's file.")
    elif not _exists(path):
        return
    try:
        with FileSystems.open(path, compression_type="uncompressed") as stream:
            head = stream.read(4096)
    except Exception as error:
        raise UsageError(f"-o {path} exists and cannot be read ({error}); name a new file.") from None
    legacy = head.lower().startswith(b"<!doctype html>") and b"<title>evalbeam " in head
    if GENERATOR not in head and not legacy:
        raise UsageError(f"-o {path} exists and is not a report evalbeam wrote: evalbeam replaces "
                         "only its own files. Name a new file, or move that one away.")


def _check_own(folder: str, info: dict, sweep: bool) -> None:
    """DIR/report.html may be replaced only if this run or sweep wrote it (run.json lists it
    with its size; sweep.json lists it): evalbeam touches only files it wrote."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.io import join

    path = join(folder, "report.html")
    if not _exists(path):
        return
    listed = info.get("files") or {}
    if sweep:
        ours = "report.html" in listed
    else:
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        ours = isinstance(listed, dict) and listed.get("report.html") == size
    if not ours:
        raise UsageError(f"{path} exists and evalbeam did not write it (or it changed since); "
                         "move it away, or write the report elsewhere with -o FILE")


def _list_in_sweep_json(folder: str, info: dict, name: str) -> None:
    from evalbeam.transforms.io import join
    from evalbeam.transforms.outputs import write_json_atomic

    files = sorted(set(info.get("files") or []) | {name})
    write_json_atomic(dict(info, files=files), join(folder, "sweep.json"))


def _list_in_run_json(folder: str, info: dict, name: str) -> None:
    """Add a file evalbeam wrote into a finished run's folder to run.json's `files`."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.io import join
    from evalbeam.transforms.outputs import write_json_atomic

    size = FileSystems.match([join(folder, name)])[0].metadata_list[0].size_in_bytes
    files = dict(info.get("files") or {}, **{name: size})
    write_json_atomic(dict(info, files=files), join(folder, "run.json"))

