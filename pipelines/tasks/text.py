"""`evalbeam text`: text generation metrics on Apache Beam, end to end: ROUGE, BLEU and
rule-based guardrails locally, LLM-judge and embedding metrics through an endpoint.

    evalbeam text --groundtruths PATH --predictions [NAME=]PATH ... --output DIR
        [--metrics ROUGE,BLEU,Faithfulness,...|all] [--judge_url URL --judge_* ...]
        [options] [Beam pipeline options]
    python -m evalbeam.pipelines.tasks.text ...   (same flags)

The task's declaration (pipelines/tasks/task.py); the launcher (pipelines/launch/launcher.py) does the rest.
Reference: pipelines/tasks/text.md.
"""

from __future__ import annotations

from evalbeam.pipelines.launch.common import UsageError, parse_float_list
from evalbeam.pipelines.tasks.judge_options import add_judge_arguments
from evalbeam.pipelines.tasks.summary import inputs_table, metric_records, text_table
from evalbeam.pipelines.tasks.task import Task
from evalbeam.schemas.formats import format_of
from evalbeam.schemas.limits import MAX_TEXT_CHARS
from evalbeam.transforms.judge.metrics import CLASSIFIER_METRICS, JUDGE_METRICS, LIKELIHOOD_METRICS
from evalbeam.transforms.kernels.text import LOCAL_METRICS, TextConfig

NAME = "text"
# scoring is the work: enough shards for the workers to share it, and for bounded memory per shard
MIN_SHARDS = 16
METRICS = LOCAL_METRICS + JUDGE_METRICS


def parse_metrics(text: str, judge: bool = False, byop: bool = False, lm: bool = False,
                  classifiers=()) -> frozenset:
    """The metric names asked; 'all' is every local metric, plus the judge metrics when a judge
    is configured (BYOP only with templates; the log-likelihood metrics by name, or with a local
    model, lm: a chat judge's endpoint usually cannot echo prompt log-probabilities; the
    classifier metrics whose model --model_uri gives)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if names == ["all"]:
        wanted = set(LOCAL_METRICS)
        if judge:
            wanted |= (set(JUDGE_METRICS) - set(LIKELIHOOD_METRICS) - set(CLASSIFIER_METRICS)
                       - ({"BYOP"} if not byop else set()))
        if lm:
            wanted |= set(LIKELIHOOD_METRICS)
        wanted |= set(classifiers)
        return frozenset(wanted)
    unknown = sorted(set(names) - set(METRICS))
    if unknown or not names:
        raise UsageError(f"--metrics takes 'all' or names from {', '.join(METRICS)}; got "
                         f"{unknown or 'none'}")
    return frozenset(names)


def text_summary(metrics_path: str, counts: dict) -> str:
    """One row per (model, slice): mean ROUGE-L F, mean BLEU, corpus BLEU and rule pass rates;
    then one row per judge metric: mean over the datums judged ok, ok/all, other statuses."""
    found: dict = {}
    judged: list = []
    for record in metric_records(metrics_path):
        where = ", ".join(f"{k}={v}" for k, v in record["slice"].items()) or "(all)"
        cells = found.setdefault((record["model"], where), {})
        kind, value = record["type"], record["value"]
        if "counts" in record:   # a judge metric: one line each, below
            label = (record["parameters"].get("template") or record["parameters"].get("aspect")
                     or record["parameters"].get("label") or record["parameters"].get("component"))
            name = kind + (f" ({label})" if label else "")
            n = sum(record["counts"].values())
            others = ", ".join(f"{k} {v}" for k, v in record["counts"].items() if k != "ok")
            judged.append([record["model"], where, name, "" if value is None else f"{value:.4f}",
                           f"{record['counts'].get('ok', 0)}/{n}", others])
        elif kind == "ROUGE" and record["parameters"].get("rouge_type") == "rougeL":
            cells["ROUGE-L F"] = f"{value['fmeasure']:.4f}"
        elif kind == "BLEU":
            cells["BLEU"] = f"{value:.4f}"
        elif kind == "CorpusBLEU":
            cells["corpus BLEU"] = f"{value['score']:.2f}"
        elif isinstance(value, dict) and "pass" in value:
            cells[f"{kind} pass"] = f"{value['pass']:.3f}"
    columns = sorted({c for cells in found.values() for c in cells})
    rows = [[model, where] + [cells.get(c, "") for c in columns] for (model, where), cells in found.items()]
    inputs = inputs_table(counts)
    judge = ("\n\nJudge metrics (means over the datums judged ok)\n"
             + text_table(["model", "slice", "metric", "value", "ok", "other statuses"], judged)) if judged else ""
    return f"\nText summary (means over datums; per-datum scores in scores.jsonl)\n" \
           f"{text_table(['model', 'slice', *columns], rows) if columns else '(no local metrics)'}{judge}\n\n{inputs}"


def text_report_blocks(records, charts) -> list:
    """The report's tables and charts of one model and slice's records (Task.report_blocks)."""
    from evalbeam.pipelines.report.elements import fmt, interval_text, params_text, table
    rows = []
    for r in records:
        value = r.get("value")
        interval = r.get("interval") or {}
        params = params_text(r.get("parameters"), ("template_version", "judge_model", "embedding_model"))
        counts = ", ".join(f"{k} {v:,}" for k, v in sorted((r.get("counts") or {}).items()))
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    rows.append([r["type"] + "." + k, params, fmt(v), interval_text(interval.get(k)), counts])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            rows.append([r["type"], params, fmt(value), interval_text(interval), counts])
        elif value is None:
            rows.append([r["type"], params, "–", "", counts])
    return [table("Metrics", ["metric", "parameters", "value", "interval", "datums by status"], rows)] if rows else []


class TextTask(Task):
    """`evalbeam text`: the task's command-side declaration (pipelines/tasks/task.py)."""

    name = NAME
    summary = ("evaluate generated text of one or more models: ROUGE, BLEU and rule-based "
               "guardrails locally, and LLM-judge and embedding metrics through any OpenAI-"
               "compatible endpoint (--judge_url)")
    plumbing = "evalbeam.transforms.text"
    min_shards = MIN_SHARDS
    report_blocks = staticmethod(text_report_blocks)   # (records, charts) -> blocks
    headlines = ("ROUGE.fmeasure[rouge_type=rougeL]", "BLEU", "AnswerCorrectness", "Faithfulness",
                 "AnswerRelevance")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--metrics", default="all", metavar="NAMES",
                            help="metric types, comma-separated, or 'all' (default: every local metric, "
                                 "plus every judge metric when --judge_url is given, BYOP with "
                                 "--judge_byop; the log-likelihood metrics, which need a completions "
                                 "model (--judge_lm_model), only by name or with --lm_uri; the "
                                 f"classifier metrics with --model_uri): {', '.join(METRICS)}")
        parser.add_argument("--rouge_types", default="rouge1,rouge2,rougeL,rougeLsum", metavar="TYPES",
                            help="ROUGE types (rougeN, rougeL, rougeLsum; default all four)")
        parser.add_argument("--rouge_use_stemmer", action="store_true",
                            help="Porter-stem tokens longer than 3 characters before ROUGE")
        parser.add_argument("--bleu_weights", default="0.25,0.25,0.25,0.25", metavar="W[,W...]",
                            help="n-gram weights of sentence BLEU (default 0.25 x 4)")
        parser.add_argument("--max_text_chars", type=int, default=MAX_TEXT_CHARS, metavar="N",
                            help=f"reject a row whose response or a reference is longer (default "
                                 f"{MAX_TEXT_CHARS:,} characters: ROUGE-L's cost grows with the product "
                                 "of two texts' lengths)")
        add_judge_arguments(parser)

    def configure(self, args) -> TextConfig:
        """The TextConfig of the options; with judge metrics, also the check of the judge's key
        variable and endpoint (check_judge), before any input is read or anything written: a judge
        that cannot answer would otherwise cost a whole run of failed calls (a dry run sends
        nothing: no check)."""
        rouge_types = tuple(t.strip() for t in args.rouge_types.split(",") if t.strip())
        for rouge_type in rouge_types:
            if rouge_type not in ("rougeL", "rougeLsum") and not (
                    rouge_type.startswith("rouge") and rouge_type[5:].isdigit() and len(rouge_type) == 6
                    and rouge_type[5] != "0"):
                raise UsageError(f"--rouge_types: {rouge_type!r} is not rouge1..rouge9, rougeL or rougeLsum")
        if not rouge_types:
            raise UsageError("--rouge_types is empty")
        if args.max_text_chars < 1:
            raise UsageError(f"--max_text_chars must be at least 1; got {args.max_text_chars}")
        weights = parse_float_list(args.bleu_weights, "--bleu_weights")
        if not weights or any(w < 0 for w in weights):
            raise UsageError("--bleu_weights takes one or more non-negative numbers")
        from evalbeam.pipelines.tasks.judge_options import check_model_folder, model_uris

        classifiers = model_uris(args.model_uri)
        metrics = parse_metrics(args.metrics, bool(args.judge_url), bool(args.judge_byop), bool(args.lm_uri),
                                classifiers)
        judge = {}
        warnings: list = []     # the model folders' checks' (check_model_folder), for run.json
        if args.lm_uri and metrics & set(LIKELIHOOD_METRICS):
            warnings.append(check_model_folder(f"--lm_uri {args.lm_uri}", args.lm_uri,
                                               ("model.onnx", "tokenizer.json"), "a causal language model",
                                               causal=True))
        unserved = sorted(set(CLASSIFIER_METRICS) & metrics - set(classifiers))
        if unserved:
            raise UsageError(f"{', '.join(unserved)} need their classifier: --model_uri "
                             f"{unserved[0]}=DIR (pipelines/tasks/text.md, Classifier metrics)")
        if metrics & set(JUDGE_METRICS):
            from evalbeam.pipelines.tasks.judge_options import judge_setup

            local = set(CLASSIFIER_METRICS) | (set(LIKELIHOOD_METRICS) if args.lm_uri else set())
            needs_url = bool(metrics & (set(JUDGE_METRICS) - local))
            settings, judge_config, journal = judge_setup(args, args.beam_args, needs_url, warnings)
            if "BYOP" in metrics and not judge_config.byop:
                raise UsageError("metric BYOP needs at least one --judge_byop FILE")
            judge = dict(judge=judge_config, judge_settings=settings, journal_root=journal)
        from evalbeam.transforms.outputs import WARNING, problem

        model_problems = tuple(problem(WARNING, "tokenizer_smaller_than_model", text)
                               for text in warnings if text)
        config = TextConfig(metrics=metrics, rouge_types=rouge_types,
                            rouge_use_stemmer=args.rouge_use_stemmer, bleu_weights=tuple(weights),
                            max_text_chars=args.max_text_chars, judge_max_failed_fraction=args.judge_max_failed_fraction,
                            model_problems=model_problems, **judge)
        settings = config.judge_settings
        if settings is not None and settings.url and not settings.dry_run and not args.judge_skip_check:
            from evalbeam.pipelines.tasks.judge_options import check_judge

            check_judge(settings, key_named=args.judge_api_key_env is not None)
        return config

    def options(self, config: TextConfig, args) -> dict:
        out = {"metrics": sorted(config.metrics), "rouge_types": list(config.rouge_types),
               "rouge_use_stemmer": config.rouge_use_stemmer, "bleu_weights": list(config.bleu_weights),
               "max_text_chars": config.max_text_chars}
        if config.judge is not None:
            from evalbeam.pipelines.tasks.judge_options import judge_options_info

            out["judge"] = dict(judge_options_info(config.judge_settings, config.judge, config.journal_root),
                                max_failed_fraction=args.judge_max_failed_fraction,
                                skip_check=args.judge_skip_check)
        return out

    def option_files(self, args) -> tuple:
        return tuple(args.judge_byop)

    def check_source(self, name: str, source, config: TextConfig, slices) -> None:
        from evalbeam.transforms.io import InputError
        from evalbeam.transforms.preflight import preflight

        for path in source.files:
            if format_of(path) not in ("jsonl", "parquet") or path.lower().endswith(".json"):
                raise InputError(f"{path} (given for {name}) is not a .jsonl or .parquet file of text "
                                 "rows; see pipelines/tasks/text.md for the format.")
        required = ("datum_uid",) if name == "groundtruths" else ("datum_uid", "response")
        preflight(source, None, required, [], task=NAME)

    def extra_outputs(self, config: TextConfig) -> tuple:
        return ("scores.jsonl",)

    def summarize(self, metrics_path: str, info: dict, config: TextConfig) -> str:
        text = text_summary(metrics_path, info["counts"])
        if config.judge is not None:
            from evalbeam.pipelines.tasks.judge_options import judge_table

            text += "\n" + judge_table(info["judge"])
        return text


TASK = TextTask()


run = TASK.run

if __name__ == "__main__":
    TASK.main()
