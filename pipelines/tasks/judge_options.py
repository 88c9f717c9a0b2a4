"""The --judge_* options every task that calls an LLM judge shares, and the run.json report.

add_judge_arguments(parser) adds them; judge_setup(args, beam_args) turns them into
(JudgeSettings, JudgeMetricConfig, journal root); check_judge(settings, ...) checks the key's
variable and the endpoint before the run; judge_options_info(...) records them in run.json;
judge_table(report) prints run.json's "judge" section (transforms.judge.report) after a run.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import math
import os
import re

from evalbeam.pipelines.launch.common import UsageError, parse_optional_number

DEFAULT_URL_HINT = "e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
# How long the check before a run waits for the endpoint's answer to GET /models.
CHECK_TIMEOUT_S = 5.0


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("LLM judge (any OpenAI-compatible endpoint)")
    g.add_argument("--judge_url", default=None, metavar="URL",
                   help=f"base URL of the chat-completions API ({DEFAULT_URL_HINT}); without it no "
                        "judge metric runs")
    g.add_argument("--judge_model", default="gpt-4o-mini", help="judge model (default gpt-4o-mini)")
    g.add_argument("--judge_embedding_model", default="text-embedding-3-small",
                   help="model of /embeddings for the similarity metrics (default text-embedding-3-small)")
    g.add_argument("--judge_lm_model", default="gpt2-medium", metavar="MODEL",
                   help="completions model whose prompt log-probabilities (/completions with echo "
                        "and logprobs: vLLM, llama.cpp's server) score Perplexity and the GPTScore "
                        "metrics (default gpt2-medium)")
    g.add_argument("--lm_uri", default=None, metavar="DIR",
                   help="a causal LM exported to ONNX (model.onnx + tokenizer.json, a local path "
                        "or any Beam filesystem URI), run on the workers with ONNX Runtime for "
                        "Perplexity and the GPTScore metrics instead of the endpoint (needs "
                        "evalbeam[models])")
    g.add_argument("--lm_batch_size", type=int, default=128, metavar="N",
                   help="sequences per model call with --lm_uri and --model_uri (default 128; "
                        "at most 8,192 padded tokens whatever N)")
    g.add_argument("--model_threads", type=int, default=None, metavar="N",
                   help="ONNX Runtime threads of each worker process for --lm_uri and --model_uri "
                        "(default: the cores shared out among the processes of the multi-process "
                        "DirectRunner, else ONNX Runtime's own choice, every core; set 1 on "
                        "Dataflow, which runs one SDK process per vCPU)")
    g.add_argument("--model_uri", action="append", default=[], metavar="METRIC=DIR|URL",
                   help="the model of a metric scored on the workers: a text classifier for "
                        "ToxicityClassifier, FairnessBias, HHEM (model.onnx, tokenizer.json, "
                        "config.json), an encoder for BERTScore (model.onnx, tokenizer.json); "
                        "ONNX, repeatable, needs evalbeam[models]. Or a served classifier's "
                        "scoring route: http://HOST/predict (TEI; add #multi_label for a "
                        "multi-label model), .../classify or .../score (vLLM)")
    g.add_argument("--model_rpm", type=float, default=None, metavar="R",
                   help="requests per minute to the scoring endpoints of --model_uri, all workers "
                        "(default: no limit; --judge_concurrency still bounds the calls in flight)")
    g.add_argument("--model_api_key_env", default=None, metavar="NAME",
                   help="environment variable holding the key of the scoring endpoints of "
                        "--model_uri (default: none sent; the judge's key is never sent there)")
    g.add_argument("--bertscore_baseline", default=None, metavar="P,R,F",
                   help="rescale BERTScore with these baselines of the model (bert-score's "
                        "rescale_with_baseline files): (v - b) / (1 - b)")
    g.add_argument("--bertscore_idf", action="store_true",
                   help="weight BERTScore's tokens by their idf over the references of the "
                        "ground truths (bert-score's idf=True)")
    g.add_argument("--judge_api_key_env", default=None, metavar="NAME",
                   help=f"name of the environment variable holding the API key (default {DEFAULT_KEY_ENV}, "
                        "sent when set); the key itself is never an option. A variable named here "
                        "must be set")
    g.add_argument("--judge_rpm", type=float, default=500.0, help="requests per minute, all workers (default 500)")
    g.add_argument("--judge_tpm", type=float, default=None, help="tokens per minute, all workers (default none)")
    g.add_argument("--judge_concurrency", type=int, default=8, help="requests in flight, all workers (default 8)")
    g.add_argument("--judge_timeout", type=float, default=60.0, metavar="S", help="seconds per attempt (default 60)")
    g.add_argument("--judge_deadline", type=float, default=300.0, metavar="S",
                   help="seconds per call, retries included (default 300)")
    g.add_argument("--judge_max_attempts", type=int, default=6, help="HTTP attempts per call (default 6)")
    g.add_argument("--judge_seed", type=int, default=None, help="sampling seed sent to the judge")
    g.add_argument("--judge_temperature", type=float, default=0.0, help="sampling temperature (default 0)")
    g.add_argument("--judge_journal", default=None, metavar="URI",
                   help="journal of judge answers, reused by later runs (default OUTPUT/judge-journal)")
    g.add_argument("--judge_max_calls", type=int, default=None, help="send at most this many requests")
    g.add_argument("--judge_max_cost", type=float, default=None, help="stop sending at this estimated cost")
    g.add_argument("--judge_price_prompt_1k", type=float, default=0.0, metavar="P",
                   help="price of 1,000 prompt tokens (for the cost estimate and --judge_max_cost)")
    g.add_argument("--judge_price_completion_1k", type=float, default=0.0, metavar="P",
                   help="price of 1,000 completion tokens")
    g.add_argument("--judge_dry_run", action="store_true",
                   help="send nothing: count the calls, tokens and cost per metric (no endpoint "
                        "check either)")
    g.add_argument("--judge_skip_check", action="store_true",
                   help="start without checking the key's variable and GET URL/models first")
    g.add_argument("--judge_max_failed_fraction", type=float, default=0.0, metavar="F",
                   help="a judge metric whose calls failed for more than this fraction of its "
                        "datums makes the run incomplete (exit 4; default 0: any failure)")
    g.add_argument("--judge_workers", type=int, default=None,
                   help="workers calling the judge at once, which share the limits (default: "
                        "--direct_num_workers, else --max_num_workers/--num_workers, else 1)")
    g.add_argument("--judge_byop", action="append", default=[], metavar="FILE",
                   help="a prompt template of your own (TOML, see the README; repeatable): metric BYOP")
    g.add_argument("--judge_similarity_weight", type=float, default=0.0, metavar="W",
                   help="AnswerCorrectness = (1-W) F1 + W AnswerSemanticSimilarity (RAGAS: 0.25; default 0)")
    g.add_argument("--judge_both_empty", default="1", metavar="V|none",
                   help="AnswerCorrectness when neither side has statements (default 1, RAGAS)")
    g.add_argument("--judge_no_statements_relevance", default="1", metavar="V|none",
                   help="AnswerRelevance of an answer without statements (default 1, DeepEval)")
    g.add_argument("--judge_no_claims_faithfulness", default="none", metavar="V|none",
                   help="Faithfulness of an answer without claims (default none = status no_statements, "
                        "RAGAS; DeepEval: 1)")
    g.add_argument("--judge_top_logprobs", type=int, default=5,
                   help="top logprobs asked for SummaryCoherence (0: plain integer; default 5)")


def _beam_option(beam_args: list[str], name: str) -> str | None:
    """The value of a Beam option in the pass-through arguments (--name=V or --name V), or None."""
    for i, arg in enumerate(beam_args):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(beam_args):
            return beam_args[i + 1]
    return None


def _workers(beam_args: list[str]) -> int:
    for name in ("--direct_num_workers", "--max_num_workers", "--num_workers"):
        value = _beam_option(beam_args, name)
        if value is not None:
            try:
                return max(1, int(value))
            except ValueError:
                pass
    return 1


def model_threads(requested: int | None, beam_args: list[str]) -> int | None:
    """ONNX Runtime's intra-op threads per worker process (None: its own choice, one per core).
    Left to itself, each of N worker processes on one machine starts a thread per core, N times
    more threads than cores, which measured 15.2 s against 12.6 s with one thread each (two
    processes, two cores, 10,000 texts). On the multi-process DirectRunner the processes are
    known: the cores are shared out among them. The outputs do not depend on it: the reference
    architectures (GPT-2, BERT, RoBERTa, DistilBERT, HHEM's T5) and the test models give the same
    bits with 1, 2 and 4 threads."""
    if requested is not None:
        if requested < 1:
            raise UsageError("--model_threads must be 1 or more")
        return requested
    if _beam_option(beam_args, "--direct_running_mode") == "multi_processing":
        processes = _workers(beam_args)
        if processes > 1:
            return max(1, (os.cpu_count() or 1) // processes)
    return None


def model_uris(values: list[str]) -> dict:
    """{metric: folder} of --model_uri METRIC=DIR options; raises UsageError for a metric that
    takes no classifier or a metric given twice."""
    from evalbeam.transforms.judge import scoring
    from evalbeam.transforms.judge.metrics import CLASSIFIER_METRICS

    out: dict = {}
    for value in values:
        metric, _, uri = value.partition("=")
        if metric not in CLASSIFIER_METRICS or not uri:
            raise UsageError(f"--model_uri takes METRIC=DIR or METRIC=URL with METRIC one of "
                             f"{', '.join(CLASSIFIER_METRICS)}; got {value!r}")
        if metric in out:
            raise UsageError(f"--model_uri names {metric} twice")
        if scoring.is_endpoint(uri):
            try:
                scoring.check_metric(metric, scoring.parse_endpoint(uri))
            except ValueError as error:
                raise UsageError(f"--model_uri {metric}={scoring.shown_uri(uri)}: {error} "
                                 "(pipelines/tasks/text.md, Scoring endpoints)") from None
            out[metric] = uri
        else:
            out[metric] = uri.rstrip("/")
    return out


# Real models have more output (and embedding) rows than their tokenizer has ids: the rows are
# padded for faster matrix products. GPT-2's 50,257 tokens with logits padded to 50,304
# (nanoGPT), Qwen2's 151,646 tokens of 151,936 rows, T5's 32,100 of 32,128, Phi-2's 50,295 of
# 51,200: 98% or more of the rows, the gap up to 905 rows, more than padding to a multiple of
# 128 or 256 would leave (Qwen2: 290, Phi-2: 905). So a ratio, not a gap: a tokenizer covering
# fewer than this fraction of the rows is most likely another model's (a warning: the run still
# computes, and a user who means it can ignore it).
MIN_VOCABULARY_COVERED = 0.9
# ... unless the rows are its size rounded up to one of these multiples, which is what padding
# does (nanoGPT 64, Megatron-LM 128) and more than 10% of a vocabulary below 1,280 ids: a test
# model's 50 tokens of 64 logits.
PADDING_MULTIPLES = (64, 128)


def vocabulary_far_smaller(tokens: int, rows: int) -> bool:
    """Whether a tokenizer of `tokens` ids is far smaller than a model taking `rows` ids: under
    MIN_VOCABULARY_COVERED of them, and rows not tokens rounded up to a PADDING_MULTIPLES."""
    if tokens >= MIN_VOCABULARY_COVERED * rows:
        return False
    return not any(rows == -(-tokens // multiple) * multiple for multiple in PADDING_MULTIPLES)


def _model_vocabulary(option: str, uri: str, found, causal: bool) -> tuple | None:
    """(the number of token ids the model takes, what says so) or None when unknown: the
    smallest of a causal LM's logits (their last dimension) and the rows of the embedding table
    input_ids index, read from the graph (onnx_file.read_onnx_file); else config.json's
    vocab_size when the folder has one."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.input_files import MAX_SETTINGS_BYTES, FileRefused, load_json

    sizes = []
    if causal and found.logits:
        sizes.append((found.logits, f"its logits have {found.logits:,} entries, one per token id"))
    if found.embedding:
        name, rows = found.embedding
        sizes.append((rows, f"its embedding table {repr(name)[:60]} has {rows:,} rows"))
    config = FileSystems.join(uri.rstrip("/"), "config.json")
    if not sizes and FileSystems.exists(config):
        try:
            value = load_json(config, MAX_SETTINGS_BYTES, f"{option}: config.json")
        except FileRefused as error:
            raise UsageError(error.message) from None
        size = value.get("vocab_size") if isinstance(value, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            sizes.append((size, f"its config.json's vocab_size is {size:,}"))
    return min(sizes, key=lambda pair: pair[0]) if sizes else None


def check_model_folder(option: str, uri: str, needed: tuple, what: str, causal: bool = False) -> str | None:
    """A model for the workers (--lm_uri, --model_uri): ONNX Runtime must be installed, the
    folder must hold the `needed` files, each a regular file within its size bound (read through
    transforms.input_files, as the workers read them), its model.onnx must be a whole ONNX model
    (onnx_file.read_onnx_file), its tokenizer.json must load, and the tokenizer's ids must be
    ids the model takes (below its logits' size for a causal LM, below its embedding table's
    rows, else below config.json's vocab_size; unknown sizes are not checked); else UsageError
    (one paragraph), before anything is read or written. Returns a warning for run.json's
    problems when the tokenizer is far smaller than the model (vocabulary_far_smaller), else
    None. what: the kind of model, for the message."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.input_files import MAX_MODEL_BYTES, FileRefused, open_bounded
    from evalbeam.transforms.judge.local_models import missing_runtime, read_tokenizer, tokenizer_size
    from evalbeam.transforms.judge.onnx_file import OnnxFile, read_onnx_file

    problem = missing_runtime(option.split()[0])
    if problem:
        raise UsageError(problem)
    try:
        FileSystems.get_filesystem(uri)
    except ValueError:
        raise UsageError(f"{option}: no Beam filesystem reads {uri.split('://')[0]}:// paths; give a "
                         "local folder or a URI of an installed filesystem (gs:// with "
                         "apache-beam[gcp], s3:// with apache-beam[aws])") from None
    missing = [name for name in needed if not FileSystems.exists(FileSystems.join(uri.rstrip("/"), name))]
    if missing:
        raise UsageError(f"{option}: no {' and no '.join(missing)} there; the folder must hold an "
                         f"ONNX export of {what} ({', '.join(needed)}; pipelines/tasks/text.md)")
    path = FileSystems.join(uri.rstrip("/"), "model.onnx")
    try:
        with open_bounded(path, MAX_MODEL_BYTES, f"{option}: model.onnx") as stream:
            found = read_onnx_file(stream)
    except FileRefused as error:    # not a regular file (a FIFO, /dev/zero), too large
        raise UsageError(error.message) from None
    except OSError as error:
        found = OnnxFile(f"it cannot be read ({error})")
    if found.problem:
        raise UsageError(f"{option}: model.onnx is not a model ONNX Runtime can load: {found.problem}. "
                         f"The folder must hold an ONNX export of {what}; export it again or copy "
                         "it whole (pipelines/tasks/text.md).")
    try:
        tokenizer = read_tokenizer(uri, f"{option}: tokenizer.json")
    except FileRefused as error:
        raise UsageError(error.message) from None
    except Exception as error:  # the tokenizers library raises plain Exception for a bad file
        raise UsageError(f"{option}: tokenizer.json cannot be read as a Hugging Face tokenizer "
                         f"({type(error).__name__}: {str(error)[:200]}); copy it again from the "
                         "model's export (pipelines/tasks/text.md).") from None
    known = _model_vocabulary(option, uri, found, causal)
    tokens, last = tokenizer_size(tokenizer)
    if known is None or not tokens:
        return None
    rows, source = known
    if tokens > rows:
        raise UsageError(f"{option}: tokenizer.json's token ids go up to {tokens - 1:,} "
                         f"({repr(last)[:40]}), but the model takes ids below {rows:,} only "
                         f"({source}): the tokenizer is another model's, and every text holding "
                         "such a token would fail. Use the tokenizer.json of this model's export "
                         "(pipelines/tasks/text.md, Model vocabularies).")
    if vocabulary_far_smaller(tokens, rows):
        return (f"{option}: tokenizer.json has {tokens:,} token ids, under "
                f"{MIN_VOCABULARY_COVERED:.0%} of the {rows:,} the model takes ({source}) and more "
                "than padding explains: it is most likely another model's tokenizer, and the "
                "scores, computed with it, are then not this model's. Check that tokenizer.json "
                "comes from this model's export (pipelines/tasks/text.md, Model vocabularies).")
    return None


def bertscore_baseline(text: str | None) -> tuple | None:
    """(P, R, F) of --bertscore_baseline, each below 1; None without it."""
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or not all(math.isfinite(v) and v < 1 for v in values):
        raise UsageError("--bertscore_baseline takes three numbers below 1: P,R,F (bert-score's "
                         f"baseline of the model and layer); got {text!r}")
    return values


def classifier_models(values: list[str], key_env: str | None = None, timeout_s: float | None = None,
                      warnings: list | None = None) -> tuple:
    """((metric, folder or URL, label names), ...) of the --model_uri options, each checked: a
    folder must hold model.onnx, tokenizer.json and config.json with readable labels (ONNX
    Runtime installed; check_model_folder, whose warnings are appended to `warnings`); a scoring
    endpoint must answer its labels (scoring.labels_of, with the key of the variable key_env).
    Raises UsageError (one paragraph) before anything runs."""
    uris = model_uris(values)
    if not uris:
        return ()
    from evalbeam.transforms.input_files import FileRefused
    from evalbeam.transforms.judge import scoring
    from evalbeam.transforms.judge.local_classifier import read_config

    key = ""
    if key_env is not None:
        key = os.environ.get(key_env, "")
        if not key:
            raise UsageError(f"--model_api_key_env names {key_env} (the key of --model_uri's "
                             "scoring endpoints), which is "
                             f"{'empty' if key_env in os.environ else 'not set'} in this environment: "
                             f"export {key_env}=<the scoring endpoint's key> before the run.")
    out = []
    for metric, uri in sorted(uris.items()):
        if scoring.is_endpoint(uri):
            endpoint = scoring.parse_endpoint(uri)
            try:
                labels = scoring.labels_of(endpoint, key, CHECK_TIMEOUT_S if timeout_s is None else timeout_s)
            except ValueError as error:
                raise UsageError(f"--model_uri {metric}={endpoint.shown}: the scoring endpoint "
                                 f"cannot tell its labels: {error}. Fix the server or the URL "
                                 "(pipelines/tasks/text.md, Scoring endpoints).") from None
            out.append((metric, uri, labels))
            continue
        option = f"--model_uri {metric}={uri}"
        if metric == "BERTScore":
            found = check_model_folder(option, uri, ("model.onnx", "tokenizer.json"), "a text encoder")
        else:
            found = check_model_folder(option, uri, ("model.onnx", "tokenizer.json", "config.json"),
                                       "a text classifier")
        if found and warnings is not None:
            warnings.append(found)
        if metric == "BERTScore":
            out.append((metric, uri, ()))
            continue
        try:
            labels = read_config(uri, f"{option}: config.json")["labels"]
        except FileRefused as error:
            raise UsageError(error.message) from None
        except (ValueError, TypeError, AttributeError) as error:
            raise UsageError(f"{option}: config.json cannot be read ({error})") from None
        out.append((metric, uri, tuple(labels)))
    return tuple(out)


def judge_setup(args, beam_args: list[str], needs_url: bool = True, warnings: list | None = None):
    """(JudgeSettings, JudgeMetricConfig, journal root) from the parsed options. needs_url
    False: only metrics that models on the workers answer are asked (--lm_uri, --model_uri),
    so no endpoint is needed. warnings: a list the checks of --model_uri folders append their
    warnings to (classifier_models)."""
    from evalbeam.transforms.judge.program import JudgeMetricConfig
    from evalbeam.transforms.judge.templates import TemplateError, load_byop
    from evalbeam.transforms.judge.transform import JudgeSettings

    local_only = not needs_url
    if not args.judge_url and not local_only:
        raise UsageError("judge metrics need --judge_url (an OpenAI-compatible API base URL, "
                         f"{DEFAULT_URL_HINT}); or pick metrics without a judge with --metrics")
    from urllib.parse import urlsplit

    url = urlsplit(args.judge_url or "")
    if args.judge_url and (url.scheme not in ("http", "https") or not url.hostname):
        raise UsageError("--judge_url must start with http:// or https:// and name a host "
                         f"({DEFAULT_URL_HINT})")
    for option, value in (("--judge_rpm", args.judge_rpm), ("--judge_concurrency", args.judge_concurrency),
                          ("--judge_timeout", args.judge_timeout), ("--judge_max_attempts", args.judge_max_attempts)):
        if value is None or not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise UsageError(f"{option} must be a positive number")
    if args.judge_tpm is not None and not args.judge_tpm > 0:
        raise UsageError("--judge_tpm must be a positive number")
    model_rpm = args.model_rpm
    if model_rpm is not None and not (model_rpm > 0 and math.isfinite(model_rpm)):
        raise UsageError("--model_rpm must be a positive number")
    if not 0.0 <= args.judge_similarity_weight <= 1.0:
        raise UsageError("--judge_similarity_weight must lie in [0, 1]")
    if not 0.0 <= args.judge_max_failed_fraction <= 1.0:
        raise UsageError("--judge_max_failed_fraction must lie in [0, 1]")
    try:
        byop = tuple(load_byop(path) for path in args.judge_byop)
    except (TemplateError, OSError) as error:
        raise UsageError(f"--judge_byop: {error}") from None
    names = [t.name for t in byop]
    if len(set(names)) != len(names):
        raise UsageError("--judge_byop: two templates have the same name")
    workers = args.judge_workers or _workers(beam_args)
    if args.lm_batch_size < 1:
        raise UsageError("--lm_batch_size must be 1 or more")
    classifiers = classifier_models(args.model_uri, args.model_api_key_env, warnings=warnings)
    settings = JudgeSettings(
        url=args.judge_url or "", lm_uri=args.lm_uri or None, lm_batch_size=args.lm_batch_size,
        model_threads=model_threads(args.model_threads, beam_args),
        model_api_key_env=args.model_api_key_env or "", model_rpm=model_rpm,
        api_key_env=args.judge_api_key_env or DEFAULT_KEY_ENV, rpm=args.judge_rpm,
        tpm=args.judge_tpm,
        concurrency=max(args.judge_concurrency, workers), timeout_s=args.judge_timeout,
        deadline_s=args.judge_deadline, max_attempts=args.judge_max_attempts, workers=workers,
        max_calls=args.judge_max_calls, max_cost=args.judge_max_cost,
        price_prompt_1k=args.judge_price_prompt_1k, price_completion_1k=args.judge_price_completion_1k,
        dry_run=args.judge_dry_run)
    config = JudgeMetricConfig(
        model=args.judge_model, embedding_model=args.judge_embedding_model,
        lm_model=args.lm_uri or args.judge_lm_model, classifiers=classifiers,
        bertscore_baseline=bertscore_baseline(args.bertscore_baseline),
        bertscore_idf=args.bertscore_idf,
        temperature=args.judge_temperature, seed=args.judge_seed, top_logprobs=args.judge_top_logprobs,
        similarity_weight=args.judge_similarity_weight,
        both_empty=parse_optional_number(args.judge_both_empty, "--judge_both_empty", float, 0.0, 1.0),
        no_statements_relevance=parse_optional_number(
            args.judge_no_statements_relevance, "--judge_no_statements_relevance", float, 0.0, 1.0),
        no_claims_faithfulness=parse_optional_number(
            args.judge_no_claims_faithfulness, "--judge_no_claims_faithfulness", float, 0.0, 1.0),
        byop=byop)
    journal = args.judge_journal or args.output.rstrip("/") + "/judge-journal"
    from evalbeam.transforms.judge.journal import check_journal

    problem = check_journal(journal)
    if problem:
        raise UsageError(f"--judge_journal: {problem}; the journal's part files are evalbeam's "
                         "own, so remove that one or give another journal folder")
    return settings, config, journal


def _shown_url(url: str) -> str:
    """The URL without user, password, query or fragment (any of which may hold a secret)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"


def check_judge(settings, key_named: bool, timeout_s: float | None = None) -> None:
    """Raise UsageError when the judge cannot work, before anything is read or written:
    - the key's variable was named with --judge_api_key_env (key_named) but is unset or empty;
    - GET <url>/models (served by OpenAI, vLLM, Ollama, llama.cpp, TGI, LiteLLM and the
      stand-in) cannot be sent (not a URL, no connection, no answer within timeout_s), or is
      answered 401/403 (the key refused, or none sent), 404 (not the API's base URL), 429
      insufficient_quota, or 5xx. Any other answer passes (a 429 rate limit included).
    The key is sent as the judge calls send it (Authorization: Bearer) and never shown: the
    messages quote no server text, only its status and error code."""
    timeout_s = CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    name = settings.api_key_env
    key = os.environ.get(name, "")
    if key_named and not key:
        raise UsageError(
            f"--judge_api_key_env names {name}, which is {'empty' if name in os.environ else 'not set'} "
            f"in this environment: export {name}=<your key> before the run (or pass "
            "--judge_skip_check to start anyway).")
    where = _shown_url(settings.url).rstrip("/")
    status, code = asyncio.run(_get_models(settings.url, key, timeout_s, where))
    code = code if code and re.fullmatch(r"[\w.\-]{1,64}", code) and (not key or key not in code) else None
    said = f"HTTP {status}" + (f" {code}" if code else "")
    skip = "Fix it, or pass --judge_skip_check to start anyway."
    if status in (401, 403):
        if key:
            raise UsageError(f"the judge endpoint {where} refused the key in {name} ({said} to "
                             f"GET /models): check the key and that it may use this endpoint. {skip}")
        raise UsageError(f"the judge endpoint {where} refused a request without a key ({said} to "
                         f"GET /models): {name} is not set; export it, or name the variable that "
                         f"holds the key with --judge_api_key_env. {skip}")
    if status == 404:
        raise UsageError(f"the judge endpoint {where} answered {said} to GET /models: --judge_url "
                         "must be the API's base URL, which usually ends in /v1 (e.g. "
                         "http://127.0.0.1:8000/v1). If this server has no /models, pass "
                         "--judge_skip_check.")
    if status == 429 and code == "insufficient_quota":
        raise UsageError(f"the judge endpoint {where} says the key in {name} has no quota left "
                         f"({said} to GET /models). {skip}")
    if status >= 500:
        raise UsageError(f"the judge endpoint {where} answered {said} to GET /models: the server "
                         "is failing. Try again later, or pass --judge_skip_check to start anyway.")


async def _get_models(url: str, key: str, timeout_s: float, where: str) -> tuple[int, str | None]:
    """(HTTP status, error code of an OpenAI error body or None) of GET <url>/models; raises
    UsageError when no answer comes."""
    import json

    import aiohttp

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            async with session.get(url.rstrip("/") + "/models") as resp:
                # an error body is small; a server sending more is not read past 64 KiB
                text = (await resp.content.read(1 << 16)).decode("utf-8", "replace")
                status = resp.status
    except asyncio.TimeoutError:
        raise UsageError(f"the judge endpoint {where} did not answer GET /models within "
                         f"{timeout_s:g} s: is the server up and the URL right? Pass "
                         "--judge_skip_check to start anyway.") from None
    except aiohttp.InvalidURL:
        raise UsageError(f"--judge_url {where!r} is not a URL ({DEFAULT_URL_HINT})") from None
    except aiohttp.ClientConnectorError as error:
        refused = getattr(error.os_error, "errno", None) == errno.ECONNREFUSED
        reason = "connection refused" if refused else (error.strerror or type(error.os_error).__name__)
        raise UsageError(f"cannot connect to the judge endpoint {where}: {reason}. Is the server "
                         "running, and are host and port right? Pass --judge_skip_check to start "
                         "anyway.") from None
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise UsageError(f"cannot reach the judge endpoint {where} ({type(error).__name__}). "
                         "Pass --judge_skip_check to start anyway.") from None
    code = None
    try:
        error = json.loads(text).get("error")
        if isinstance(error, dict):
            code = str(error.get("code") or error.get("type") or "") or None
    except (ValueError, AttributeError):
        pass
    return status, code


def judge_options_info(settings, config, journal: str) -> dict:
    """What run.json records of the judge options (never the key: only its variable's name)."""
    from evalbeam.transforms.judge import scoring
    from evalbeam.transforms.judge.journal import endpoint_host

    return {"endpoint_host": endpoint_host(settings.url), "model": config.model,
            "embedding_model": config.embedding_model, "lm_model": config.lm_model,
            "lm_uri": settings.lm_uri, "model_threads": settings.model_threads,
            "api_key_env": settings.api_key_env,
            "rpm": settings.rpm, "tpm": settings.tpm, "concurrency": settings.concurrency,
            "workers": settings.workers, "timeout_s": settings.timeout_s, "deadline_s": settings.deadline_s,
            "max_attempts": settings.max_attempts, "temperature": config.temperature, "seed": config.seed,
            "journal": journal, "max_calls": settings.max_calls, "max_cost": settings.max_cost,
            "price_prompt_1k": settings.price_prompt_1k,
            "price_completion_1k": settings.price_completion_1k, "dry_run": settings.dry_run,
            "byop": [t.name for t in config.byop],
            "model_uris": {metric: scoring.shown_model(uri) for metric, uri, _ in config.classifiers},
            "model_api_key_env": settings.model_api_key_env or None, "model_rpm": settings.model_rpm}


def judge_table(report: dict) -> str:
    """Per metric: requests, sent (or counted in a dry run), estimated cost; then the totals."""
    from evalbeam.pipelines.tasks.summary import text_table

    dry = report.get("dry_run", 0) > 0
    rows = [[metric, f"{d.get('requests', 0):,}", f"{d.get('dry_run' if dry else 'sent', 0):,}",
             f"{d.get('cost', 0.0):.4f}"] for metric, d in report["per_metric"].items()]
    head = "Judge calls (dry run: nothing was sent)" if dry else "Judge calls"
    rate = report.get("achieved_requests_per_minute")
    totals = (f"{report['requests']:,} requests: {report['cached']:,} from the journal, "
              f"{report['shared']:,} shared, {report['sent']:,} sent"
              + (f", {report['dry_run']:,} counted (dry run)" if dry else "")
              + f"; tokens {report['prompt_tokens']:,} prompt + {report['completion_tokens']:,} completion; "
              f"estimated cost {report['estimated_cost']:.4f}"
              + (f"; {rate:,.0f} requests/minute" if rate else "")
              + (f"; failed: {report['failed_by_status']}" if report["failed_by_status"] else "")
              + (f"; {report['not_sent']:,} not sent (budget reached)" if report.get("not_sent") else "")
              + "".join(f"\n  {status}, e.g.: {text[:200]}"
                        for status, text in report.get("error_samples", {}).items()))
    return f"\n{head}\n{text_table(['metric', 'requests', 'counted' if dry else 'sent', 'est. cost'], rows)}\n{totals}"
