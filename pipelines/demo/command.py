"""`evalbeam demo`: generate a small realistic dataset, evaluate it on the DirectRunner, show it.

Two models ("model_a", stronger, and "model_b") score 5 animal classes on 5,000 datums that carry
a metadata field "region" (four values that make datums easier or harder); 1% of datums have no
prediction from a model. The job then runs with --slice region and --report, exactly as a user
would run it; output/report.html is the page to open.
"""

from __future__ import annotations

import argparse
import os
import sys

from evalbeam.pipelines.launch.common import EXIT_USAGE, UsageError, say_error
from evalbeam.pipelines.demo.synthetic import write_classification_dataset

# The demo's own record of the data files it wrote ({name: size}): it replaces only those, so a
# --folder that holds a user's groundtruths.jsonl (or a link to one) is refused, never written.
DEMO_MARK = ".evalbeam-demo.json"
DEMO_FILES = ("groundtruths.jsonl", "model_a.jsonl", "model_b.jsonl")


def write_demo_data(data: str, **options) -> dict[str, str]:
    """write_classification_dataset into `data`, touching only files the demo wrote: each of
    DEMO_FILES must be absent or listed, with its size, in DEMO_MARK (else UsageError, before
    anything is written). The files are written in a temporary folder inside `data` and moved
    into place, so a name that is a symlink is replaced, never followed."""
    import json
    import shutil
    import uuid

    try:
        with open(os.path.join(data, DEMO_MARK), encoding="utf-8") as stream:
            mark = json.load(stream)
    except (OSError, ValueError):
        mark = {}
    mark = mark if isinstance(mark, dict) else {}
    for name in DEMO_FILES:
        path = os.path.join(data, name)
        if not os.path.lexists(path):
            continue
        ours = os.path.isfile(path) and not os.path.islink(path) and \
            mark.get(name) == os.path.getsize(path)
        if not ours:
            raise UsageError(f"evalbeam demo: {path} exists and the demo did not write it; the demo "
                             "replaces only its own files. Choose another --folder, or move that "
                             "file away.")
    os.makedirs(data, exist_ok=True)
    temp = os.path.join(data, f".evalbeam-tmp-demo-{uuid.uuid4().hex[:8]}")
    try:
        written = write_classification_dataset(temp, **options)
        sizes = {}
        for name, path in written.items():
            final = os.path.join(data, os.path.basename(path))
            sizes[os.path.basename(path)] = os.path.getsize(path)
            os.replace(path, final)
            written[name] = final
        with open(os.path.join(data, DEMO_MARK), "w", encoding="utf-8") as out:
            json.dump(sizes, out)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return written


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evalbeam demo", allow_abbrev=False,
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="evalbeam-demo",
                        help="where the data and outputs go (default ./evalbeam-demo)")
    parser.add_argument("--n_datums", type=int, default=5000)
    parser.add_argument("--n_classes", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args, beam_args = parser.parse_known_args(argv)
    data = os.path.join(args.folder, "data")
    try:
        paths = write_demo_data(data, n_datums=args.n_datums, n_classes=args.n_classes,
                                seed=args.seed)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE
    print(f"evalbeam demo: wrote {args.n_datums:,} ground truths and the predictions of "
          f"{len(paths) - 1} models to {data}/", file=sys.stderr)
    from evalbeam.pipelines.tasks.classification import run as classify

    command = ["--groundtruths", paths["groundtruths"],
               *[f"--predictions={name}={path}" for name, path in paths.items() if name != "groundtruths"],
               "--output", os.path.join(args.folder, "output"), "--slice", "region",
               "--score_thresholds", "0.0,0.5", "--report", *beam_args]
    print("evalbeam demo: running  evalbeam classification " + " ".join(command) + "\n",
          file=sys.stderr)
    return classify(command)


if __name__ == "__main__":
    sys.exit(run())
