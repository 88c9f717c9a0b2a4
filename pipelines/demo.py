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

from evalbeam.pipelines.synthetic import write_classification_dataset


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
    paths = write_classification_dataset(data, n_datums=args.n_datums, n_classes=args.n_classes,
                                         seed=args.seed)
    print(f"evalbeam demo: wrote {args.n_datums:,} ground truths and the predictions of "
          f"{len(paths) - 1} models to {data}/", file=sys.stderr)
    from evalbeam.pipelines.classification import run as classify

    command = ["--groundtruths", paths["groundtruths"],
               *[f"--predictions={name}={path}" for name, path in paths.items() if name != "groundtruths"],
               "--output", os.path.join(args.folder, "output"), "--slice", "region",
               "--score_thresholds", "0.0,0.5", "--report", *beam_args]
    print("evalbeam demo: running  evalbeam classification " + " ".join(command) + "\n",
          file=sys.stderr)
    return classify(command)


if __name__ == "__main__":
    sys.exit(run())
