"""The judge metrics of shards' datums: run every (datum, model, metric) program at once on the
worker's JudgeSession, add the outcomes to the per-(model, slice) states, return score rows.

A datum without a prediction row gets status "missing_prediction" for every judge metric (no
call is made: judging an empty answer would cost calls and say nothing about the model).
"""

from __future__ import annotations

import asyncio
import json

from transforms.judge.metrics import Datum, metric_programs, parameters_of, score_metric
from transforms.kernels.judge_state import JudgeMetricState


def state_key(kind: str, parameters: dict) -> str:
    """TextState.rules key: the type, plus the parameters that tell BYOP templates apart."""
    extra = {k: v for k, v in parameters.items() if k in ("template",)}
    return kind + (json.dumps(extra, sort_keys=True) if extra else "")


def judge_datums(session, config, groups: list[list]) -> list[list[dict]]:
    """groups (one per shard): [(GroundTruthRow, PredictionRow or None, model, [TextState])]
    -> the score rows of each group. Every group's programs run at once on the session, so the
    slowest retry chain of one shard does not hold back the calls of the next."""
    judge = config.judge
    # per metric once, not per datum: (type, parameters of the records, TextState key, program)
    catalogue = []
    for kind, extra, program in metric_programs(config.metrics, judge):
        parameters = parameters_of(kind, extra, judge)
        catalogue.append((kind, extra, state_key(kind, parameters), parameters, program))
    tasks, places = [], []
    for group_index, judged in enumerate(groups):
        for truth, prediction, model, states in judged:
            datum = None if prediction is None else Datum(
                question=truth.query, references=truth.references if truth.references else None,
                response=prediction.response, contexts=prediction.contexts)
            for entry in catalogue:
                index = None
                if datum is not None:
                    tasks.append(score_metric(session, judge, entry[0], entry[4], datum))
                    index = len(tasks) - 1
                places.append((group_index, truth, model, states, entry, index))

    scores = session.run(_gather(tasks)) if tasks else []
    rows: list[list[dict]] = [[] for _ in groups]
    for group_index, truth, model, states, (kind, extra, key, parameters, _), index in places:
        if index is None:
            value, status, details = None, "missing_prediction", {}
        else:
            score = scores[index]
            value, status, details = score.value, score.status, score.details
        for state in states:
            if key not in state.rules:
                state.rules[key] = JudgeMetricState(kind, parameters)
            state.rules[key].add(value, status)
        rows[group_index].append({"datum_uid": truth.uid, "model": model, "metric": kind,
                                  "parameters": extra, "value": value, "status": status,
                                  "details": details})
    return rows


async def _gather(tasks) -> list:
    return list(await asyncio.gather(*tasks))
