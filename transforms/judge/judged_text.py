"""The judge metrics of shards' datums: run every (datum, model, metric) program at once on the
worker's JudgeSession, add the outcomes to the per-(model, slice) states, return score rows.

A datum without a prediction row gets status "missing_prediction" for every judge metric (no
call is made: judging an empty answer would cost calls and say nothing about the model).

At most JUDGE_WINDOW (datum, metric) programs run at once: a bundle of a million datums then
holds a million small Scores, not a million programs with their answers (a local LM's answer
holds a log-probability per token), and the client's concurrency cap, far below the window,
still has requests waiting for it.
"""

from __future__ import annotations

import asyncio
import json
import typing

from evalbeam.transforms.judge.metrics import metric_programs, parameters_of
from evalbeam.transforms.judge.program import Datum, score_metric
from evalbeam.transforms.kernels.judge_state import JudgeMetricState


def state_key(kind: str, parameters: dict) -> str:
    """TextState.rules key: the type, plus the parameters that tell BYOP templates (and
    GPTScore's aspects, a classifier's labels) apart."""
    extra = {k: v for k, v in parameters.items() if k in ("template", "aspect", "label", "component")}
    return kind + (json.dumps(extra, sort_keys=True) if extra else "")


# programs running at once in judge_datums: far above any judge's concurrency, and as many as a
# model on the workers batches at once (transforms/judge/local_models.py)
JUDGE_WINDOW = 4096

# judge metrics whose per-datum value is a verdict, 0 or 1: their mean is a share of datums
VERDICT_METRICS = frozenset({"ContactInformation", "LanguageMismatch", "Sexism", "SummarizationJudge"})


class _Metric(typing.NamedTuple):
    """One requested judge metric, prepared once per call of judge_datums."""
    kind: str
    extra: dict          # the parameters that tell records of the same type apart (BYOP template)
    key: str             # TextState.rules key
    parameters: dict     # the records' parameters
    program: typing.Any  # the metric's async program
    binary: bool         # the value of a datum is 0 or 1 (VERDICT_METRICS, pass/fail BYOP)


def _binary(kind: str, extra: dict, judge) -> bool:
    if kind in VERDICT_METRICS:
        return True
    if kind == "BYOP":
        # a pass/fail template's answer has a "verdict" (transforms/judge/metrics.byop_program)
        for template in judge.byop:
            if template.name == extra.get("template"):
                return "verdict" in (template.schema or {}).get("properties", {})
    return False


def judge_datums(session, config, groups: list[list], idf=None) -> list[list[dict]]:
    """groups (one per shard): [(GroundTruthRow, PredictionRow or None, model, [TextState],
    bootstrap column or None)] -> the score rows of each group. Every group's programs run at
    once on the session, so the slowest retry chain of one shard does not hold back the calls
    of the next. idf: BERTScore's idf table of the dataset (--bertscore_idf), or None."""
    judge = config.judge
    catalogue = []  # per metric once, not per datum
    for kind, extra, program in metric_programs(config.metrics, judge):
        parameters = parameters_of(kind, extra, judge)
        catalogue.append(_Metric(kind, extra, state_key(kind, parameters), parameters, program,
                                 _binary(kind, extra, judge)))
    work, places = [], []
    for group_index, judged in enumerate(groups):
        for truth, prediction, model, states, column in judged:
            datum = None if prediction is None else Datum(
                question=truth.query, references=truth.references if truth.references else None,
                response=prediction.response, contexts=prediction.contexts)
            for metric in catalogue:
                index = None
                if datum is not None:
                    work.append((metric, datum))
                    index = len(work) - 1
                places.append((group_index, truth, model, states, column, metric, index))

    def program(index: int):
        metric, datum = work[index]
        return score_metric(session, judge, metric.kind, metric.program, datum, idf)

    scores = session.run(in_window(program, len(work), JUDGE_WINDOW)) if work else []
    rows: list[list[dict]] = [[] for _ in groups]
    for group_index, truth, model, states, column, metric, index in places:
        if index is None:
            value, status, details = None, "missing_prediction", {}
        else:
            score = scores[index]
            value, status, details = score.value, score.status, score.details
        for state in states:
            if metric.key not in state.rules:
                state.rules[metric.key] = JudgeMetricState(metric.kind, metric.parameters,
                                                           binary=metric.binary)
            state.rules[metric.key].add(value, status, column)
        rows[group_index].append({"datum_uid": truth.uid, "model": model, "metric": metric.kind,
                                  "parameters": metric.extra, "value": value, "status": status,
                                  "details": details})
    return rows


async def in_window(start, n: int, window: int) -> list:
    """[await start(0), ..., await start(n - 1)], with at most `window` of them running at once
    (start(i) makes the i-th coroutine, when a place in the window is free, in order of i). An
    exception of one ends the whole, as asyncio.gather's would."""
    results: list = [None] * n
    indices = iter(range(n))

    async def lane():
        for index in indices:
            results[index] = await start(index)

    await asyncio.gather(*(lane() for _ in range(min(window, n))))
    return results
