"""Dataflow Flex Template entry point for evalbeam (the Dockerfile points FLEX_TEMPLATE_PYTHON_PY_FILE here).

On the launcher VM, Dataflow runs `python flex_launcher.py --name=value ...`: one `--name=value` per
template parameter given at launch, then the pipeline options the service adds itself (--runner,
--project, --region, --temp_location, --staging_location, --job_name, --sdk_container_image, ...).
A template parameter is always one `name=value` string, so this module rewrites the few evalbeam
flags that a single string cannot express, then runs `python -m evalbeam.pipelines.tasks.<task>` in this
process with the result (the same entry point as `evalbeam <task>`):

    task=classification               which evalbeam.pipelines.tasks.<task> module to run (default: classification)
    predictions=a=gs://x*;b=gs://y*    --predictions a=gs://x* --predictions b=gs://y*
    hardmax=true | false               --hardmax | --no_hardmax
    quiet=true | false                 --quiet | (nothing)
    {run_date} inside groundtruths, predictions or output
                                       the launch date in UTC (YYYY-MM-DD), so one fixed launch
                                       request (Cloud Scheduler) still writes one folder per day
    name= (empty value)                dropped, as if the parameter had not been given

Every other argument is passed on unchanged, in order.

Try it locally without Dataflow (prints the rewritten command and exits):
    python deploy/dataflow/flex_launcher.py --print_only --groundtruths=gt.jsonl \
        --predictions='a=a.jsonl;b=b.jsonl' --output=out/{run_date} --hardmax=false
"""

from __future__ import annotations

import datetime
import logging
import re
import runpy
import sys

# Template parameters whose value may be empty (an unset optional parameter); an empty one is dropped.
EVALBEAM_PARAMETERS = {
    "task", "groundtruths", "predictions", "output", "slice", "score_thresholds", "hardmax",
    "pr_curve_thresholds", "max_examples", "metrics", "num_shards", "max_rejected_fraction", "quiet",
    "iou_type", "protocol", "iou_thresholds", "pr_curve_iou_threshold",  # detection
    "score_bins",
    "label_names", "ignore_id", "unlabeled_id",  # segmentation
    "rouge_types", "rouge_use_stemmer", "bleu_weights",  # text
    "k", "relevance_level", "max_docs", "complete", "per_query",  # retrieval
}
PATH_PARAMETERS = {"groundtruths", "predictions", "output"}
BOOLEAN_PARAMETERS = {"hardmax", "quiet", "rouge_use_stemmer", "complete", "per_query"}
PREDICTIONS_SEPARATOR = ";"
RUN_DATE_TOKEN = "{run_date}"
TASK_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _split_flag(arg: str) -> tuple[str, str | None]:
    """'--name=value' -> ('name', 'value'); '--name' -> ('name', None)."""
    name, sep, value = arg[2:].partition("=")
    return name, (value if sep else None)


def translate(argv: list[str], run_date: str) -> tuple[str, list[str]]:
    """Turn Flex Template arguments into (task, evalbeam arguments). Raises ValueError on a bad value."""
    task = "classification"
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--"):
            out.append(arg)
            continue
        name, value = _split_flag(arg)
        if name not in EVALBEAM_PARAMETERS:
            out.append(arg)  # a Beam pipeline option or a flag this module does not rewrite
            continue
        if value is None and name not in BOOLEAN_PARAMETERS:
            # '--name value' form (handy when testing by hand); the launcher itself uses '--name=value'
            if i >= len(argv):
                raise ValueError(f"--{name} needs a value")
            value = argv[i]
            i += 1
        if value == "":
            continue
        if name in PATH_PARAMETERS:
            value = value.replace(RUN_DATE_TOKEN, run_date)
        if name == "task":
            if not TASK_NAME.match(value):
                raise ValueError(f"task must be a module name under pipelines/tasks/, got {value!r}")
            task = value
        elif name == "predictions":
            entries = [entry.strip() for entry in value.split(PREDICTIONS_SEPARATOR)]
            for entry in entries:
                if entry:
                    out += ["--predictions", entry]
        elif name in BOOLEAN_PARAMETERS:
            flag = "true" if value is None else value.strip().lower()
            if flag in _TRUE:
                out.append(f"--{name}")
            elif flag in _FALSE:
                if name == "hardmax":
                    out.append("--no_hardmax")
            else:
                raise ValueError(f"--{name} takes true or false, got {value!r}")
        else:
            out.append(f"--{name}={value}")
    return task, out


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    argv = list(sys.argv[1:] if argv is None else argv)
    print_only = "--print_only" in argv
    argv = [arg for arg in argv if arg != "--print_only"]
    run_date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    try:
        task, args = translate(argv, run_date)
    except ValueError as error:
        sys.exit(f"flex_launcher: {error}")
    module = f"evalbeam.pipelines.tasks.{task}"
    if print_only:
        print(" ".join(["python", "-m", module, *args]))
        return
    # Log flag names only: values are paths and options, and nothing here should ever hold a secret,
    # but the launcher's console log is kept in the temp bucket, so keep it minimal.
    logging.info("flex_launcher: python -m %s %s", module,
                 " ".join(sorted({a.split("=", 1)[0] for a in args if a.startswith("--")})))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
