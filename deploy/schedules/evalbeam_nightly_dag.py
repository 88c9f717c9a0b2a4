"""Example Airflow DAG: nightly evalbeam classification, one output folder per logical date.

Copy this file into your DAGs folder and adapt the constants below. It needs Airflow 2.4+ (for the
`schedule` argument) or 3.x, and evalbeam installed where the task runs (the Airflow worker, or the
image of a KubernetesPodOperator if you switch to one). This file is an example: it is not imported
by evalbeam itself, and only its syntax is checked here.

- Dates: `{{ ds }}` is the run's logical date (YYYY-MM-DD); it names the output folder and replaces
  {run_date} in the input paths, so a backfill or a cleared task rewrites that day and no other.
- Failures: BashOperator fails the task when the command exits non-zero. evalbeam exits non-zero when
  the run fails, when it rejected more input rows than --max_rejected_fraction allows, or when it
  could not compute what was asked (exit 4, run.json status "incomplete"), so each marks the task
  failed and reaches your alerting (on_failure_callback, e-mail, ...).
- Secrets: bash_command is rendered and shown in the UI ("Rendered Template") and in the task log.
  Never put an API key in it. With `env` unset, BashOperator passes the worker's environment through,
  so API keys (later LLM-judge tasks) come from the worker's environment or your secrets backend.
- The command is built here, at parse time, from constants quoted with shlex.quote; only `{{ ds }}` is
  templated. Do not template `params` or `dag_run.conf` into it: whoever can trigger the DAG with a
  configuration could then inject shell commands.
- On Dataflow: run evalbeam here with `--runner DataflowRunner ...` (it waits for the job), or launch
  the Flex Template of deploy/dataflow with DataflowStartFlexTemplateOperator from
  apache-airflow-providers-google (same request body as deploy/schedules/cloud_scheduler.md). With the
  Flex Template that operator follows the Dataflow job's state, but evalbeam's own exit code is not
  seen by anyone: check run.json and rejected.jsonl in the output folder (see deploy/README.md).
"""

from __future__ import annotations

import datetime
import shlex

try:  # Airflow 3
    from airflow.providers.standard.operators.bash import BashOperator
    from airflow.sdk import DAG
except ImportError:  # Airflow 2.4+
    from airflow import DAG
    from airflow.operators.bash import BashOperator

EVALBEAM = "/opt/evalbeam/venv/bin/evalbeam"
GROUNDTRUTHS = "gs://my-bucket/eval/groundtruths/*.jsonl"
PREDICTIONS = {
    "model_a": "gs://my-bucket/eval/predictions/model_a/{run_date}/*.jsonl",
    "model_b": "gs://my-bucket/eval/predictions/model_b/{run_date}/*.jsonl",
}
OUTPUT_ROOT = "gs://my-bucket/eval/out/classification"
EXTRA_ARGS = [
    "--slice", "region",
    "--score_thresholds", "0.25,0.5",
    "--max_rejected_fraction", "0.01",
    "--quiet",
    # Local multi-process run on the Airflow worker. For Dataflow, replace these two lines with
    # "--runner", "DataflowRunner", "--project", ..., "--region", ..., "--temp_location", ...,
    # "--sdk_container_image", "<image built from deploy/dataflow/Dockerfile>".
    "--direct_running_mode", "multi_processing",
    "--direct_num_workers", "4",
]


def evalbeam_command() -> str:
    """The shell command, with every argument quoted and {run_date} turned into Airflow's {{ ds }}."""
    args = [EVALBEAM, "classification", "--groundtruths", GROUNDTRUTHS]
    for name, path in PREDICTIONS.items():
        args += ["--predictions", f"{name}={path}"]
    args += ["--output", f"{OUTPUT_ROOT.rstrip('/')}/{{run_date}}", *EXTRA_ARGS]
    return " ".join(shlex.quote(arg) for arg in args).replace("{run_date}", "{{ ds }}")


with DAG(
    dag_id="evalbeam_nightly_classification",
    description="Nightly evalbeam classification; one output folder per logical date",
    schedule="15 2 * * *",  # 02:15 UTC every day
    start_date=datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc),
    catchup=False,
    max_active_runs=1,
    default_args={
        # A retry helps with a lost worker or a storage hiccup. A run failed by rejected inputs fails
        # again in the same way: fix the inputs, then clear the task.
        "retries": 1,
        "retry_delay": datetime.timedelta(minutes=15),
        "execution_timeout": datetime.timedelta(hours=6),
    },
    tags=["evalbeam"],
) as dag:
    BashOperator(
        task_id="evaluate_classification",
        bash_command=evalbeam_command(),
    )
