"""The --judge_* options every task that calls an LLM judge shares, and the run.json report.

add_judge_arguments(parser) adds them; judge_setup(args, beam_args) turns them into
(JudgeSettings, JudgeMetricConfig, journal root); judge_report(counters) is run.json's "judge"
section; judge_table(report) the lines printed after a run (or a dry run).
"""

from __future__ import annotations

import argparse
import math

from pipelines.common import UsageError, parse_optional_number

DEFAULT_URL_HINT = "e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1"


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("LLM judge (any OpenAI-compatible endpoint)")
    g.add_argument("--judge_url", default=None, metavar="URL",
                   help=f"base URL of the chat-completions API ({DEFAULT_URL_HINT}); without it no "
                        "judge metric runs")
    g.add_argument("--judge_model", default="gpt-4o-mini", help="judge model (default gpt-4o-mini)")
    g.add_argument("--judge_embedding_model", default="text-embedding-3-small",
                   help="model of /embeddings for the similarity metrics (default text-embedding-3-small)")
    g.add_argument("--judge_api_key_env", default="OPENAI_API_KEY", metavar="NAME",
                   help="name of the environment variable holding the API key (default OPENAI_API_KEY); "
                        "the key itself is never an option")
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
                   help="send nothing: count the calls, tokens and cost per metric")
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


def _workers(beam_args: list[str]) -> int:
    for name in ("--direct_num_workers", "--max_num_workers", "--num_workers"):
        for i, arg in enumerate(beam_args):
            value = None
            if arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
            elif arg == name and i + 1 < len(beam_args):
                value = beam_args[i + 1]
            if value is not None:
                try:
                    return max(1, int(value))
                except ValueError:
                    pass
    return 1


def judge_setup(args, beam_args: list[str]):
    """(JudgeSettings, JudgeMetricConfig, journal root) from the parsed options."""
    from transforms.judge.metrics import JudgeMetricConfig
    from transforms.judge.templates import TemplateError, load_byop
    from transforms.judge.transform import JudgeSettings

    if not args.judge_url:
        raise UsageError("judge metrics need --judge_url (an OpenAI-compatible API base URL, "
                         f"{DEFAULT_URL_HINT}); or pick metrics without a judge with --metrics")
    for option, value in (("--judge_rpm", args.judge_rpm), ("--judge_concurrency", args.judge_concurrency),
                          ("--judge_timeout", args.judge_timeout), ("--judge_max_attempts", args.judge_max_attempts)):
        if value is None or not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise UsageError(f"{option} must be a positive number")
    if args.judge_tpm is not None and not args.judge_tpm > 0:
        raise UsageError("--judge_tpm must be a positive number")
    if not 0.0 <= args.judge_similarity_weight <= 1.0:
        raise UsageError("--judge_similarity_weight must lie in [0, 1]")
    try:
        byop = tuple(load_byop(path) for path in args.judge_byop)
    except (TemplateError, OSError) as error:
        raise UsageError(f"--judge_byop: {error}") from None
    names = [t.name for t in byop]
    if len(set(names)) != len(names):
        raise UsageError("--judge_byop: two templates have the same name")
    workers = args.judge_workers or _workers(beam_args)
    settings = JudgeSettings(
        url=args.judge_url, api_key_env=args.judge_api_key_env, rpm=args.judge_rpm, tpm=args.judge_tpm,
        concurrency=max(args.judge_concurrency, workers), timeout_s=args.judge_timeout,
        deadline_s=args.judge_deadline, max_attempts=args.judge_max_attempts, workers=workers,
        max_calls=args.judge_max_calls, max_cost=args.judge_max_cost,
        price_prompt_1k=args.judge_price_prompt_1k, price_completion_1k=args.judge_price_completion_1k,
        dry_run=args.judge_dry_run)
    config = JudgeMetricConfig(
        model=args.judge_model, embedding_model=args.judge_embedding_model,
        temperature=args.judge_temperature, seed=args.judge_seed, top_logprobs=args.judge_top_logprobs,
        similarity_weight=args.judge_similarity_weight,
        both_empty=parse_optional_number(args.judge_both_empty, "--judge_both_empty", float, 0.0, 1.0),
        no_statements_relevance=parse_optional_number(
            args.judge_no_statements_relevance, "--judge_no_statements_relevance", float, 0.0, 1.0),
        no_claims_faithfulness=parse_optional_number(
            args.judge_no_claims_faithfulness, "--judge_no_claims_faithfulness", float, 0.0, 1.0),
        byop=byop)
    journal = args.judge_journal or args.output.rstrip("/") + "/judge-journal"
    return settings, config, journal


def judge_options_info(settings, config, journal: str) -> dict:
    """What run.json records of the judge options (never the key: only its variable's name)."""
    from transforms.judge.journal import endpoint_host

    return {"endpoint_host": endpoint_host(settings.url), "model": config.model,
            "embedding_model": config.embedding_model, "api_key_env": settings.api_key_env,
            "rpm": settings.rpm, "tpm": settings.tpm, "concurrency": settings.concurrency,
            "workers": settings.workers, "timeout_s": settings.timeout_s, "deadline_s": settings.deadline_s,
            "max_attempts": settings.max_attempts, "temperature": config.temperature, "seed": config.seed,
            "journal": journal, "max_calls": settings.max_calls, "max_cost": settings.max_cost,
            "price_prompt_1k": settings.price_prompt_1k,
            "price_completion_1k": settings.price_completion_1k, "dry_run": settings.dry_run,
            "byop": [t.name for t in config.byop]}


def judge_report(counters: dict) -> dict:
    """run.json's "judge" section from the merged session counters."""
    c = dict(counters or {})
    statuses = {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("status:")}
    failed = {s: n for s, n in statuses.items() if s not in ("ok", "dry_run", "not_sent")}
    per_metric: dict = {}
    for key, value in c.items():
        if "@" in key:
            counter, metric = key.split("@", 1)
            per_metric.setdefault(metric, {})[counter] = value
    sent = c.get("sent", 0)
    span = c.get("max:last_done", 0) - c.get("min:first_send", 0)
    return {
        "requests": c.get("requests", 0), "cached": c.get("cached", 0), "shared": c.get("shared", 0),
        "sent": sent, "ok": statuses.get("ok", 0), "failed_by_status": dict(sorted(failed.items())),
        "not_sent": statuses.get("not_sent", 0), "dry_run": statuses.get("dry_run", 0),
        "prompt_tokens": c.get("prompt_tokens", 0), "completion_tokens": c.get("completion_tokens", 0),
        "estimated_cost": round(c.get("cost", 0.0), 6),
        "achieved_requests_per_minute": round(sent / span * 60.0, 2) if sent and span > 0 else None,
        "per_metric": {m: {k: (round(v, 6) if isinstance(v, float) else v) for k, v in sorted(d.items())}
                       for m, d in sorted(per_metric.items())},
    }


def judge_table(report: dict) -> str:
    """Per metric: requests, sent (or counted in a dry run), estimated cost; then the totals."""
    from pipelines.summary import _table

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
              + (f"; {report['not_sent']:,} not sent (budget reached)" if report.get("not_sent") else ""))
    return f"\n{head}\n{_table(['metric', 'requests', 'counted' if dry else 'sent', 'est. cost'], rows)}\n{totals}"
