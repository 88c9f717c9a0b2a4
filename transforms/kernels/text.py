"""Per-datum text scores and their mergeable per-(model, slice) state (no Beam, no LLM).

score_datum() turns one datum (ground truth and the model's prediction, or none) into score rows
for scores.jsonl and adds them to a TextState; state_records() gives a merged state's records.
Statuses of a score row: "ok"; "missing_prediction" (no prediction row: the response is taken as
empty, so overlap scores are 0 and count in the means); "no_references" (ROUGE, BLEU, CorpusBLEU
need references: the datum is left out of those means, value null); "no_condition" (TextMatching
needs a condition: left out). Rule evaluators (transforms/kernels/rule_metrics.py) add their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evalbeam.schemas.limits import MAX_TEXT_CHARS
from evalbeam.transforms.kernels.exact_sum import ExactSum
from evalbeam.transforms.kernels.text_overlap import (BLEU_ORDER, ROUGE_TYPES, corpus_bleu, corpus_bleu_stats,
                                             rouge, sentence_bleu)

OVERLAP_METRICS = ("ROUGE", "BLEU", "CorpusBLEU")
RULE_METRICS = ("TextMatching", "PIILeakage", "SensitiveDataLeakage", "EncodingGuardrail",
                "LoopingDetection")
# the metrics computed without a judge, in the order of metrics.jsonl
LOCAL_METRICS = OVERLAP_METRICS + RULE_METRICS


@dataclass(frozen=True)
class TextConfig:
    metrics: frozenset = frozenset(OVERLAP_METRICS)
    rouge_types: tuple = ROUGE_TYPES
    rouge_use_stemmer: bool = False
    bleu_weights: tuple = (0.25, 0.25, 0.25, 0.25)
    # rows whose response or a reference is longer are rejected (schemas/limits.py MAX_TEXT_CHARS)
    max_text_chars: int = MAX_TEXT_CHARS
    # LLM-judge metrics (transforms/judge/metrics.py): what to ask (JudgeMetricConfig), how to
    # call (JudgeSettings) and where the journal is; None when no judge metric is wanted
    judge: object = None
    judge_settings: object = None
    journal_root: str | None = None
    # the largest fraction of a judge metric's datums that may fail before the run is incomplete
    judge_max_failed_fraction: float = 0.0
    # what the checks of the model folders found before the run (a tokenizer far smaller than
    # its model: pipelines/judge_options.check_model_folder), transforms.outputs.problem dicts
    # added to run.json's problems
    model_problems: tuple = ()


@dataclass
class TextState:
    """Per metric key, the sums over the datums scored, exact so that shards may add them in any
    order: "ROUGE/<type>" -> [ExactSum] x 3 (precision, recall, F), "BLEU" -> [ExactSum];
    "CorpusBLEU" -> int64[10] (corpus_bleu_stats, integers); counts: datums in each key; rules:
    {record type (judge metrics: transforms/judge/judged_text.py's key): a rule-count or judge
    metric state with merge(), copy() and records()}.

    Bootstrap (kernels/bootstrap.py; empty when off): replicates: per key, the same sums of R
    replicates, each datum weighted by its Poisson weight: ROUGE and BLEU keys ->
    judge_state.ReplicateSums (weighted counts and exact weighted sums), "CorpusBLEU" ->
    int64[R, 11] (the weighted statistics, then the weighted datum count); replicate_count: R;
    notes: the current shard's (columns, values) per key, until seal(weights) turns them into
    replicate sums in one matrix product per key."""

    sums: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    rules: dict = field(default_factory=dict)
    replicates: dict = field(default_factory=dict)
    replicate_count: int = 0
    notes: dict = field(default_factory=dict)

    def add_datum(self, key: str, values, column: int | None = None) -> None:
        """One datum's scores under key: a tuple of floats (added to the ExactSums) or an int64
        array (corpus statistics, added as integers); the key's datum count goes up by one.
        column: the datum's column in the shard's bootstrap weights (None: not bootstrapping)."""
        if isinstance(values, np.ndarray) and values.dtype.kind == "i":
            self.sums[key] = self.sums[key] + values if key in self.sums else values.copy()
        else:
            sums = self.sums.setdefault(key, [ExactSum() for _ in values])
            for total, value in zip(sums, values):
                total.add(float(value))
        self.counts[key] = self.counts.get(key, 0) + 1
        if column is not None:
            columns, rows = self.notes.setdefault(key, ([], []))
            columns.append(column)
            rows.append(values)

    def seal(self, weights: np.ndarray) -> "TextState":
        """Add the noted datums of one shard to the replicates: weights uint8[R, n] are the
        shard's bootstrap weights (kernels.bootstrap.Bootstrap.weights of its datums' hashes),
        the notes' columns index them. Vectorised: per key, one [R, m] x [m, c] product of
        integers (CorpusBLEU) or the components at once with exact_sum.weighted_totals (means)."""
        from evalbeam.transforms.kernels.bootstrap import weighted_sums
        from evalbeam.transforms.kernels.judge_state import ReplicateSums

        self.replicate_count = max(self.replicate_count, int(weights.shape[0]))
        notes, self.notes = self.notes, {}
        for key, (columns, rows) in notes.items():
            if key == "CorpusBLEU":
                stats = np.column_stack([np.stack(rows), np.ones(len(rows), np.int64)])
                part = weighted_sums(weights, np.asarray(columns, np.int64), stats)
                self.replicates[key] = self.replicates[key] + part if key in self.replicates else part
            else:
                part_weights = weights[:, np.asarray(columns, np.int64)]
                part = ReplicateSums.of(part_weights, np.asarray(rows, np.float64))
                self.replicates[key] = self.replicates[key].merge(part) if key in self.replicates else part
        for rule in self.rules.values():
            rule.seal(weights)
        return self

    def merge(self, other: "TextState") -> "TextState":
        for key, values in other.sums.items():
            if isinstance(values, np.ndarray):
                self.sums[key] = self.sums[key] + values if key in self.sums else values.copy()
            elif key in self.sums:
                for mine, theirs in zip(self.sums[key], values):
                    mine.merge(theirs)
            else:
                self.sums[key] = [v.copy() for v in values]
            self.counts[key] = self.counts.get(key, 0) + other.counts[key]
        for key, rule in other.rules.items():
            self.rules[key] = self.rules[key].merge(rule) if key in self.rules else rule.copy()
        for key, part in other.replicates.items():
            if key not in self.replicates:
                self.replicates[key] = part.copy()
            elif isinstance(part, np.ndarray):
                self.replicates[key] = self.replicates[key] + part
            else:
                self.replicates[key].merge(part)
        self.replicate_count = max(self.replicate_count, other.replicate_count)
        return self

    def copy(self) -> "TextState":
        sums = {k: v.copy() if isinstance(v, np.ndarray) else [x.copy() for x in v]
                for k, v in self.sums.items()}
        return TextState(sums, dict(self.counts), {k: v.copy() for k, v in self.rules.items()},
                         {k: v.copy() for k, v in self.replicates.items()}, self.replicate_count)

    def means(self, key: str, width: int) -> list[float]:
        """The mean of each component of key (zeros when no datum was scored)."""
        if key not in self.sums:
            return [0.0] * width
        return [total.mean() for total in self.sums[key]]

    def replicate_means(self, key: str, width: int) -> list[list[float | None]]:
        """[component][replicate] weighted means of key (None where a replicate weighs no
        datum of it)."""
        if key not in self.replicates:
            return [[None] * self.replicate_count for _ in range(width)]
        return self.replicates[key].means()

    def replicate_corpus_bleu(self) -> list[dict | None]:
        """Per replicate, corpus_bleu() of the weighted statistics (None for a replicate that
        weighs no datum with references)."""
        part = self.replicates.get("CorpusBLEU")
        if part is None:
            return [None] * self.replicate_count
        return [corpus_bleu(row[:-1]) if row[-1] else None for row in part]


def state_records(state: TextState, config: TextConfig, side=None) -> list[dict]:
    """Aggregate records (type, value, parameters) of a merged state: means over the datums
    scored (zeros when none was), then the rule and judge states' records by record type.

    A bootstrapped state (replicate_count R > 0) adds kernels.bootstrap.REPLICATES to each
    record: [R values] for a scalar value (BLEU, judge metrics), {field: [R values]} for the
    fields of a dict value that are metrics (ROUGE: precision, recall, fmeasure; CorpusBLEU:
    score, bp; rules: the rates and looping means), None where a replicate has no datum; and
    PROPORTION [k, n] (or {rate: [k, n]}) where the value is a share of datums. A value that no
    datum was counted in (0 by convention: no datum with references, no contexts checked) gets
    neither."""
    from evalbeam.transforms.kernels.bootstrap import REPLICATES

    boot = state.replicate_count > 0
    out = []
    if "ROUGE" in config.metrics:
        for rouge_type in config.rouge_types:
            mean = state.means(f"ROUGE/{rouge_type}", 3)
            record = {"type": "ROUGE",
                      "value": {"precision": float(mean[0]), "recall": float(mean[1]),
                                "fmeasure": float(mean[2])},
                      "parameters": {"rouge_type": rouge_type,
                                     "rouge_use_stemmer": config.rouge_use_stemmer}}
            if boot and f"ROUGE/{rouge_type}" in state.counts:
                record[REPLICATES] = dict(zip(("precision", "recall", "fmeasure"),
                                              state.replicate_means(f"ROUGE/{rouge_type}", 3)))
            out.append(record)
    if "BLEU" in config.metrics:
        record = {"type": "BLEU", "value": state.means("BLEU", 1)[0],
                  "parameters": {"weights": list(config.bleu_weights)}}
        if boot and "BLEU" in state.counts:
            record[REPLICATES] = state.replicate_means("BLEU", 1)[0]
        out.append(record)
    if "CorpusBLEU" in config.metrics:
        stats = state.sums.get("CorpusBLEU", np.zeros(2 + 2 * BLEU_ORDER, np.int64))
        record = {"type": "CorpusBLEU", "value": corpus_bleu(stats),
                  "parameters": {"tokenize": "13a", "smooth_method": "exp", "lowercase": False}}
        if boot and "CorpusBLEU" in state.counts:
            scores = state.replicate_corpus_bleu()
            record[REPLICATES] = {name: [None if s is None else s[name] for s in scores]
                                  for name in ("score", "bp")}
        out.append(record)
    for kind in sorted(state.rules):
        out.extend(state.rules[kind].records())
    return out


def _row(uid, model, metric, value, status, parameters=None, details=None) -> dict:
    row = {"datum_uid": uid, "model": model, "metric": metric, "parameters": parameters or {},
           "value": value, "status": status}
    if details:
        row["details"] = details
    return row


def score_overlap(config: TextConfig, uid: str, model: str, references: list[str],
                  response: str | None, states: list[TextState], column: int | None = None) -> list[dict]:
    """ROUGE, BLEU and CorpusBLEU of one datum: score rows, and the sums added to every state
    (one per slice the datum belongs to); column: the datum's bootstrap column (or None)."""
    rows = []
    wanted = [m for m in OVERLAP_METRICS if m in config.metrics]
    if not wanted:
        return rows
    if not references:
        for metric in wanted:
            if metric == "ROUGE":
                rows.extend(_row(uid, model, metric, None, "no_references", {"rouge_type": t})
                            for t in config.rouge_types)
            elif metric == "BLEU":
                rows.append(_row(uid, model, metric, None, "no_references"))
        return rows
    status = "ok" if response is not None else "missing_prediction"
    text = response if response is not None else ""
    if "ROUGE" in config.metrics:
        scores = rouge(text, references, config.rouge_types, config.rouge_use_stemmer)
        for rouge_type, (p, r, f) in scores.items():
            for state in states:
                state.add_datum(f"ROUGE/{rouge_type}", (p, r, f), column)
            rows.append(_row(uid, model, "ROUGE", f, status, {"rouge_type": rouge_type},
                             {"precision": p, "recall": r}))
    if "BLEU" in config.metrics:
        value = sentence_bleu(text, references, config.bleu_weights)
        for state in states:
            state.add_datum("BLEU", (value,), column)
        rows.append(_row(uid, model, "BLEU", value, status))
    if "CorpusBLEU" in config.metrics:
        stats = corpus_bleu_stats(text, references)
        for state in states:
            state.add_datum("CorpusBLEU", stats, column)
    return rows


def score_datum(config: TextConfig, truth, prediction, model: str, states: list[TextState],
                column: int | None = None) -> list[dict]:
    """Every configured score of one datum for one model (prediction None: no prediction row);
    returns score rows and adds to every state. truth: schemas.text_rows.GroundTruthRow,
    prediction: PredictionRow or None; column: the datum's column in the shard's bootstrap
    weights (TextState.seal), None when not bootstrapping."""
    response = prediction.response if prediction is not None else None
    rows = score_overlap(config, truth.uid, model, truth.references, response, states, column)
    if set(config.metrics) - set(OVERLAP_METRICS):
        from evalbeam.transforms.kernels.rule_metrics import score_rules

        rows.extend(score_rules(config, truth, prediction, model, states, column))
    return rows
