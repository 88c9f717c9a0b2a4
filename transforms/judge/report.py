"""What a run says about its judge calls: run.json's "judge" section (judge_report) and the
run's findings on datums the judge could not score (judge_problems)."""

from __future__ import annotations

# Datum statuses of a judge metric that are results or deliberate choices, not failures: any
# other status (a judge call's failure status: http_error, timeout, invalid_output, ...) means
# the metric could not be computed for that datum.
NOT_FAILED = ("ok", "no_statements", "not_applicable", "missing_prediction", "dry_run", "not_sent")
# ... and those of them that were not meant to be judged at all (outside the denominator).
NOT_ASKED = ("not_applicable", "missing_prediction", "dry_run")


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
    samples = {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("sample:")}
    return {
        "requests": c.get("requests", 0), "cached": c.get("cached", 0), "shared": c.get("shared", 0),
        "sent": sent, "local": c.get("local", 0), "ok": statuses.get("ok", 0), "failed_by_status": dict(sorted(failed.items())),
        "error_samples": dict(sorted(samples.items())),
        "not_sent": statuses.get("not_sent", 0), "dry_run": statuses.get("dry_run", 0),
        "prompt_tokens": c.get("prompt_tokens", 0), "completion_tokens": c.get("completion_tokens", 0),
        "estimated_cost": round(c.get("cost", 0.0), 6),
        "achieved_requests_per_minute": round(sent / span * 60.0, 2) if sent and span > 0 else None,
        "per_metric": {m: {k: (round(v, 6) if isinstance(v, float) else v) for k, v in sorted(d.items())}
                       for m, d in sorted(per_metric.items())},
    }


def _metric_label(record: dict) -> str:
    label = (record["parameters"].get("template") or record["parameters"].get("aspect")
             or record["parameters"].get("label") or record["parameters"].get("component"))
    return record["type"] + (f" ({label})" if label else "")


def judge_problems(records: list[dict], max_failed_fraction: float,
                   samples: dict | None = None) -> list[dict]:
    """The run's findings on datums the judge could not score (transforms.outputs.problem dicts).

    records: the judge metrics' records of the whole dataset (slice {}), one per model and
    metric, with "counts" per datum status. Per metric (BYOP per template), over all models:
    failed = the datums whose status is a failure (any status not in NOT_FAILED: http_error,
    timeout, invalid_output, ...), asked = all datums but those in NOT_ASKED. An error
    "judge_failed" (the run is incomplete) when failed / asked > max_failed_fraction or no datum
    was judged ok (the metric has no value, whatever the fraction allows), a warning
    "judge_failed_within_limit" when some failed within it; one warning "judge_not_sent" for the
    datums a --judge_max_calls / --judge_max_cost budget left unjudged. samples: {status: the
    first error text of that status} (redacted by the client), quoted in the messages."""
    from evalbeam.transforms.outputs import ERROR, WARNING, problem

    totals: dict = {}
    for record in records:
        counts = totals.setdefault(_metric_label(record), {})
        for status, n in record["counts"].items():
            counts[status] = counts.get(status, 0) + n
    out, not_sent = [], {}
    for label in sorted(totals):
        counts = totals[label]
        if counts.get("not_sent"):
            not_sent[label] = counts["not_sent"]
        failed = {s: n for s, n in sorted(counts.items()) if s not in NOT_FAILED and n}
        if not failed:
            continue
        n_failed = sum(failed.values())
        asked = sum(n for s, n in counts.items() if s not in NOT_ASKED)
        judged = counts.get("ok", 0)
        # a metric no datum could be judged for was not computed, whatever the fraction allows
        over = n_failed / asked > max_failed_fraction or not judged
        statuses = ", ".join(f"{s} {n:,}" for s, n in failed.items())
        example = next((f"; e.g. {s}: {samples[s][:200]}" for s in failed if (samples or {}).get(s)), "")
        value = (f"its value is the mean over the {judged:,} datums judged ok" if judged else
                 "it has no value")
        text = (f"judge metric {label}: {n_failed:,} of {asked:,} datums could not be judged "
                f"({statuses}{example}); ")
        if over:
            if set(failed) == {"model_error"}:    # a model on the workers, not an endpoint
                hint = " Fix the model (--lm_uri, --model_uri) or the texts it refused and run again."
            else:
                hint = ("" if any(p["code"] == "judge_failed" for p in out) else
                        " Fix the endpoint and run again: answers already received are reused "
                        "from the journal.")
            limit = (f"more than --judge_max_failed_fraction {max_failed_fraction:g} allows, and"
                     if n_failed / asked > max_failed_fraction else "none was judged, so")
            out.append(problem(ERROR, "judge_failed", text + f"{limit} {value}.{hint}"))
        else:
            out.append(problem(WARNING, "judge_failed_within_limit", text + (
                f"within --judge_max_failed_fraction {max_failed_fraction:g}; {value}.")))
    if not_sent:
        listed = ", ".join(f"{label} {n:,}" for label, n in not_sent.items())
        out.append(problem(WARNING, "judge_not_sent", (
            f"the judge budget (--judge_max_calls / --judge_max_cost) was reached: datums not "
            f"judged: {listed}; their status is not_sent.")))
    return out
