#!/usr/bin/env bash
# Run an evalbeam classification job on an existing Flink cluster with Beam's portable FlinkRunner.
#
#   FLINK_MASTER=flink-jobmanager:8081 GROUNDTRUTHS='s3://b/gt/*.jsonl' \
#   PREDICTIONS='model_a=s3://b/a/*.jsonl model_b=s3://b/b/*.jsonl' OUTPUT=s3://b/out/2025-01-31 \
#   ENVIRONMENT_TYPE=DOCKER SDK_IMAGE=registry.example.com/evalbeam:TAG deploy/flink/run_flink.sh
#
# Set DRY_RUN=1 to print the command without running it. Extra arguments to this script are passed
# on to evalbeam (e.g. --slice region --score_thresholds 0.25,0.5).
#
# How it runs. The submitting machine (where this script runs) builds the pipeline, starts Beam's
# Flink job server (a Java program) and submits the job to the cluster's REST endpoint
# (--flink_master). The job server jar, beam-runners-flink-<flink version>-job-server-<beam
# version>.jar, is not part of the Python package: Beam downloads it from Maven Central at run time
# into ~/.apache_beam/cache/jars. So the submitting machine needs network access to Maven Central
# (or a local copy: FLINK_JOB_SERVER_JAR=/path/to/that.jar) and a Java runtime (`java` on PATH).
# With FLINK_SUBMIT_UBER_JAR=1, Beam instead packs the pipeline into that jar and uploads it to the
# cluster: no local Java is needed, but the jar is still downloaded.
#
# FLINK_VERSION must be the cluster's Flink major.minor (Beam 2.77 publishes job servers for 1.19,
# 1.20, 2.0, 2.1 and 2.2).
#
# Where the Python code runs (--environment_type), i.e. where `import evalbeam.pipelines`
# must work:
#   DOCKER    (the usual choice for a real cluster) Each TaskManager starts the SDK harness in a
#             container of SDK_IMAGE. Build it with deploy/dataflow/Dockerfile: a Beam Python SDK
#             image with evalbeam installed, ENTRYPOINT /opt/apache/beam/boot, same Beam version as
#             the submitter. Needs a Docker daemon on every TaskManager host that can pull the
#             image (not available inside most Kubernetes pods: use EXTERNAL there).
#   PROCESS   Each TaskManager starts the harness as a local process: PROCESS_COMMAND (default
#             /opt/apache/beam/boot, which can be copied out of the image above) must exist on every
#             TaskManager host, with Python 3.11, the same apache-beam and evalbeam installed.
#   LOOPBACK  The harness runs inside this submitting process; TaskManagers call back into it. Only
#             for trying the setup on a local or tiny cluster: every element goes through this one
#             machine, and the TaskManagers must be able to reach it over the network.
#   EXTERNAL  (not one of the three above, common on Kubernetes) Run the image above as a sidecar
#             of each TaskManager with the argument --worker_pool (it listens on port 50000), and
#             set ENVIRONMENT_TYPE=EXTERNAL WORKER_POOL=localhost:50000. This is the set-up
#             tests/test_portable.py runs on every CI run, with Beam's embedded job service in
#             place of Flink's (deploy/README.md, "The portable path, tested here").
#
# Paths: the workers read the inputs and write the output, so GROUNDTRUTHS, PREDICTIONS and OUTPUT
# must be on storage every TaskManager (and its containers) can reach: gs://, s3:// (needs
# apache-beam[aws] in the image and AWS credentials on the workers), or a shared mount. A path local
# to the submitting machine only works with LOOPBACK.
#
# Secrets: credentials for the storage and, in later tasks, LLM-judge API keys reach the workers
# through their environment (the container's env, a secret mount, instance or workload identity),
# never through this command line.
#
# Exit code: the FlinkRunner waits for the job to finish, so evalbeam's own exit code (non-zero when
# the run failed or rejected too many input rows) is this script's exit code.
set -euo pipefail

: "${FLINK_MASTER:?set FLINK_MASTER, the Flink REST endpoint, e.g. flink-jobmanager:8081}"
: "${GROUNDTRUTHS:?set GROUNDTRUTHS (path or glob)}"
: "${PREDICTIONS:?set PREDICTIONS (space-separated NAME=PATH entries)}"
: "${OUTPUT:?set OUTPUT (output folder)}"
FLINK_VERSION="${FLINK_VERSION:-1.19}"
ENVIRONMENT_TYPE="${ENVIRONMENT_TYPE:-DOCKER}"
PARALLELISM="${PARALLELISM:-4}"
EVALBEAM="${EVALBEAM:-evalbeam}"

cmd=("${EVALBEAM}" classification --groundtruths "${GROUNDTRUTHS}")
read -r -a predictions <<< "${PREDICTIONS}"  # split on spaces, no glob expansion
for p in "${predictions[@]}"; do
  cmd+=(--predictions "${p}")
done
cmd+=(
  --output "${OUTPUT}"
  --runner FlinkRunner
  --flink_master "${FLINK_MASTER}"
  --flink_version "${FLINK_VERSION}"
  --parallelism "${PARALLELISM}"
  --environment_type "${ENVIRONMENT_TYPE}"
)

case "${ENVIRONMENT_TYPE}" in
  DOCKER)
    : "${SDK_IMAGE:?set SDK_IMAGE, an image built from deploy/dataflow/Dockerfile}"
    cmd+=(--environment_options "docker_container_image=${SDK_IMAGE}")
    ;;
  PROCESS)
    cmd+=(--environment_options "process_command=${PROCESS_COMMAND:-/opt/apache/beam/boot}")
    ;;
  EXTERNAL)
    # --environment_config, not --environment_options external_service_address=...: in Beam 2.77
    # the latter fails in ExternalEnvironment.from_options when environment_config is unset.
    cmd+=(--environment_config "${WORKER_POOL:-localhost:50000}")
    ;;
  LOOPBACK) ;;
  *) echo "ENVIRONMENT_TYPE must be DOCKER, PROCESS, EXTERNAL or LOOPBACK" >&2; exit 2 ;;
esac

if [[ -n "${FLINK_JOB_SERVER_JAR:-}" ]]; then
  cmd+=(--flink_job_server_jar "${FLINK_JOB_SERVER_JAR}")
fi
if [[ -n "${FLINK_SUBMIT_UBER_JAR:-}" ]]; then
  cmd+=(--flink_submit_uber_jar)
fi
cmd+=("$@")

if [[ -n "${DRY_RUN:-}" ]]; then
  printf '+'; printf ' %q' "${cmd[@]}"; printf '\n'
  exit 0
fi
exec "${cmd[@]}"
