#!/usr/bin/env bash
# Build the evalbeam Dataflow Flex Template and launch a classification job from it.
#
#   deploy/dataflow/build_and_run.sh build   # image on Cloud Build, then the template spec on GCS
#   deploy/dataflow/build_and_run.sh run     # launch one job from the spec
#   deploy/dataflow/build_and_run.sh all     # build, then run with the image just built
#
# Set DRY_RUN=1 to print the commands without running them.
#
# Required environment:
#   PROJECT   Google Cloud project id
#   REGION    Dataflow / Artifact Registry region, e.g. europe-west1
#   BUCKET    bucket name (no gs://) for the template spec, staging and temp files
# Required for `run`:
#   GROUNDTRUTHS  e.g. gs://my-bucket/eval/gt/*.jsonl
#   PREDICTIONS   NAME=PATH entries separated by ';', e.g. 'model_a=gs://b/a/*.jsonl;model_b=gs://b/b/*.jsonl'
# Optional:
#   OUTPUT (default gs://$BUCKET/evalbeam/classification/{run_date}; {run_date} becomes the launch
#   date, UTC), SLICE, SCORE_THRESHOLDS, HARDMAX (true|false), PR_CURVE_THRESHOLDS, MAX_EXAMPLES,
#   METRICS, NUM_SHARDS, MAX_REJECTED_FRACTION, QUIET (true|false),
#   REPOSITORY (Artifact Registry repository, default evalbeam), BEAM_VERSION (default 2.77.0),
#   IMAGE (default for build: a new timestamped tag; for run: the image recorded in the spec),
#   TEMPLATE_FILE (default gs://$BUCKET/templates/evalbeam-classification.json),
#   SERVICE_ACCOUNT (worker service account e-mail), MAX_WORKERS, MACHINE_TYPE.
#
# Needs an authenticated gcloud (`gcloud auth login`, or a service account on CI) and the Cloud
# Build, Artifact Registry, Dataflow and Cloud Storage APIs enabled. No local Docker is needed.
#
# Secrets: none go through this script. Template parameters and command lines end up in the job's
# metadata, console logs and shell history, so an API key (e.g. for an LLM judge) must never be a
# parameter; the job reads it on the workers from Secret Manager or the environment.
#
# Which Beam option makes the workers use the custom image: --sdk_container_image. `run` passes it
# as the template parameter sdk_container_image=$IMAGE; without it the workers run Beam's stock
# image, in which evalbeam cannot be imported.
set -euo pipefail

: "${PROJECT:?set PROJECT (Google Cloud project id)}"
: "${REGION:?set REGION (e.g. europe-west1)}"
: "${BUCKET:?set BUCKET (bucket name, without gs://)}"
REPOSITORY="${REPOSITORY:-evalbeam}"
BEAM_VERSION="${BEAM_VERSION:-2.77.0}"
TEMPLATE_FILE="${TEMPLATE_FILE:-gs://${BUCKET}/templates/evalbeam-classification.json}"
IMAGE_REPO="${REGION}-docker.pkg.dev/${PROJECT}/${REPOSITORY}/evalbeam"
DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${DEPLOY_DIR}/../.." && pwd)"

run() {  # run a command, or only print it when DRY_RUN is set
  if [[ -n "${DRY_RUN:-}" ]]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

build() {
  IMAGE="${IMAGE:-${IMAGE_REPO}:$(date -u +%Y%m%d-%H%M%S)}"

  # One-time: a Docker repository in Artifact Registry.
  if [[ -n "${DRY_RUN:-}" ]] || ! gcloud artifacts repositories describe "${REPOSITORY}" \
      --project="${PROJECT}" --location="${REGION}" >/dev/null 2>&1; then
    run gcloud artifacts repositories create "${REPOSITORY}" --project="${PROJECT}" \
      --location="${REGION}" --repository-format=docker \
      --description="evalbeam Flex Template and worker images"
  fi

  # The image: built on Cloud Build from the repository root (Dockerfile and upload filter in
  # deploy/dataflow/). With a local Docker instead:
  #   docker build -f deploy/dataflow/Dockerfile --build-arg BEAM_VERSION=... -t "$IMAGE" . && docker push "$IMAGE"
  run gcloud builds submit "${REPO_ROOT}" --project="${PROJECT}" \
    --config="${DEPLOY_DIR}/cloudbuild.yaml" \
    --ignore-file=deploy/dataflow/gcloudignore \
    --substitutions="_IMAGE=${IMAGE},_BEAM_VERSION=${BEAM_VERSION}"

  # The template spec: a small JSON file on GCS naming the image and the parameters (metadata.json).
  # The same image is the launcher and, through sdk_container_image, the workers' SDK container.
  run gcloud dataflow flex-template build "${TEMPLATE_FILE}" --project="${PROJECT}" \
    --image="${IMAGE}" \
    --sdk-language=PYTHON \
    --metadata-file="${DEPLOY_DIR}/metadata.json"

  echo "built ${IMAGE}" >&2
  echo "template spec ${TEMPLATE_FILE}" >&2
}

launch() {
  : "${GROUNDTRUTHS:?set GROUNDTRUTHS (e.g. gs://my-bucket/eval/gt/*.jsonl)}"
  : "${PREDICTIONS:?set PREDICTIONS (NAME=PATH entries separated by ;)}"
  local output="${OUTPUT:-gs://${BUCKET}/evalbeam/classification/{run_date}}"

  if [[ -z "${IMAGE:-}" ]]; then
    if [[ -n "${DRY_RUN:-}" ]]; then
      IMAGE="<image recorded in ${TEMPLATE_FILE}>"
    else
      # Workers must run the very image the launcher runs: read it back from the template spec.
      IMAGE="$(gcloud storage cat "${TEMPLATE_FILE}" --project="${PROJECT}" \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["image"])')"
    fi
  fi

  local params=(
    "groundtruths=${GROUNDTRUTHS}"
    "predictions=${PREDICTIONS}"
    "output=${output}"
    "sdk_container_image=${IMAGE}"
  )
  local var
  for var in SLICE SCORE_THRESHOLDS HARDMAX PR_CURVE_THRESHOLDS MAX_EXAMPLES METRICS NUM_SHARDS \
      MAX_REJECTED_FRACTION QUIET; do
    if [[ -n "${!var:-}" ]]; then
      params+=("$(printf '%s' "${var}" | tr '[:upper:]' '[:lower:]')=${!var}")
    fi
  done

  # Values such as score_thresholds=0.25,0.5 contain commas, gcloud's list separator, so the list
  # uses gcloud's alternate delimiter syntax (`gcloud topic escaping`): ^~^a=1,2~b=3.
  local joined="" p
  for p in "${params[@]}"; do
    if [[ "${p}" == *"~"* ]]; then
      echo "a parameter value contains '~', the delimiter used here: ${p%%=*}" >&2
      exit 2
    fi
    joined+="~${p}"
  done

  local args=(
    gcloud dataflow flex-template run "evalbeam-classification-$(date -u +%Y%m%d-%H%M%S)"
    --project="${PROJECT}"
    --region="${REGION}"
    --template-file-gcs-location="${TEMPLATE_FILE}"
    --staging-location="gs://${BUCKET}/staging"
    --temp-location="gs://${BUCKET}/tmp"
    --parameters="^~^${joined#\~}"
  )
  if [[ -n "${SERVICE_ACCOUNT:-}" ]]; then args+=(--service-account-email="${SERVICE_ACCOUNT}"); fi
  if [[ -n "${MAX_WORKERS:-}" ]]; then args+=(--max-workers="${MAX_WORKERS}"); fi
  if [[ -n "${MACHINE_TYPE:-}" ]]; then args+=(--worker-machine-type="${MACHINE_TYPE}"); fi
  run "${args[@]}"

  # The command returns once the job is submitted, not when it finishes: the launcher process ends
  # after it has built the job graph. Follow the job with
  #   gcloud dataflow jobs list --region="$REGION" --status=active
  # and check the output folder's run.json / rejected.jsonl when it is done.
}

case "${1:-}" in
  build) build ;;
  run) launch ;;
  all) build; launch ;;
  *) echo "usage: $0 build|run|all   (see the comments at the top of this file)" >&2; exit 2 ;;
esac
