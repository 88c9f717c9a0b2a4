"""The sweep's cells as Beam graphs: one multi-model run per group of cells that differ only in
their model, each model's outputs split out and published as that cell's own run.

A sweep of D datasets x M models has D*M cells. Given each cell its own copy of the task's graph
(launcher.TaskJob), the DirectRunner pays a fixed cost per stage of every copy (about 2 s per
classification cell here), which dominates a sweep of small cells. Cells of one dataset that
share their options are what `evalbeam <task> --predictions a=... b=...` evaluates in one run:
a task whose per-model records do not depend on the other models of the run (TaskSpec.
separable_models) runs such a group as ONE graph (CellGroupJob), which reads the ground truth
once, matches every model in the same shard step, and writes each cell's files (metrics.jsonl,
rejected.jsonl, the leaderboard sidecar, run.json) in one publishing step per cell.

What goes to which cell: records by their "model"; rejections and row counters by their source
(ground-truth ones to every cell of the group, a model's to its cell); problems by their
"model" field (a problem without one concerns the shared ground truth and goes to every cell).
The result is the files each cell's run alone writes (tests/sweep: byte-identical metrics.jsonl).
"""

from __future__ import annotations

import apache_beam as beam

from evalbeam.transforms.io import GROUNDTRUTHS


def group_key(plan) -> tuple | None:
    """What cells must share to run as one graph, or None for a cell that runs alone: the task
    (separable), the dataset and its ground truth, the options as run.json records them, the
    slices, the bootstrap and the allowed rejected fraction. Judged cells run alone (their judge
    settings are divided between the cells that call at once)."""
    import json

    if not getattr(plan.spec, "separable_models", False) or plan.judged or len(plan.models) != 1:
        return None
    gt = plan.sources[GROUNDTRUTHS]
    return (plan.cell.task, plan.cell.dataset, tuple(gt.files),
            json.dumps(plan.run_info["options"], sort_keys=True, default=str),
            repr(plan.slices), repr(plan.args.uncertainty), plan.args.max_rejected_fraction,
            tuple(plan.beam_args))


def groups_of(plans: list) -> list[list]:
    """The plans in groups that run as one graph (lists of one for cells that run alone), in
    the order of their first cell."""
    groups: dict = {}
    alone = []
    for plan in plans:
        key = group_key(plan)
        if key is None:
            alone.append([plan])
        else:
            groups.setdefault(key, []).append(plan)
    return list(groups.values()) + alone


def _by_source(element, source_of, models, part: str):
    """element -> (cell model, (part, element)) for its source's cell, or for every cell of the
    group when it comes from the shared ground truth."""
    source = source_of(element)
    if source in models:
        return [(source, (part, element))]
    return [(model, (part, element)) for model in models]


def _rejection_source(record: dict) -> str:
    return record["source"]


def _counter_source(pair) -> str:
    (_, source), _ = pair
    return source


def _problem_cells(problem: dict, models):
    model = problem.get("model")
    if model in models:
        return [(model, ("problems", problem))]
    return [(m, ("problems", problem)) for m in models]


class CellGroupJob(beam.PTransform):
    """Cells of one dataset that differ only in their one model, as one multi-model run of the
    task (job: a transforms.evaluated.FilesJob over the ground truth and every cell's model),
    each cell then written and published as launcher.TaskJob publishes a run.

    cells: {model: (OutputFolder, run_info, sidecar or None)}, sidecar = (path, fingerprint,
    cell id) of the cell's leaderboard inputs (pipelines/leaderboard.py), written just before
    the cell publishes. headlines, intersect: the leaderboard's headline specs and datum rule,
    the same for every cell of a group. Returns the PCollection of the published run.json dicts."""

    def __init__(self, spec, config, job, cells: dict, max_rejected_fraction: float,
                 headlines=(), intersect: bool = False):
        super().__init__()
        self.spec, self.config, self.job, self.cells = spec, config, job, cells
        self.max_rejected_fraction = max_rejected_fraction
        self.headlines, self.intersect = list(headlines), intersect

    def expand(self, pbegin):
        from evalbeam.transforms.uncertainty import finish_record

        spec, job, models = self.spec, self.job, sorted(self.cells)
        if sorted(job.models) != models or spec.extra_outputs(self.config):
            raise ValueError("CellGroupJob: one cell per model of the job, and a task without "
                             "extra outputs")
        out = pbegin | spec.title >> spec.files_transform()(self.config, job)
        parts = [
            pbegin | "Cells" >> beam.Create([(model, ("cell", None)) for model in models]),
            # the intervals of each record (transforms.uncertainty; a cell has no comparisons)
            out.metrics | "MetricsByCell" >> beam.Map(
                lambda r, b, unit: (r["model"], ("metrics", finish_record(r, b, unit))),
                job.bootstrap, spec.interval_unit),
            out.rejected | "RejectsByCell" >> beam.FlatMap(
                _by_source, _rejection_source, models, "rejected"),
            (out.stats
             | "SumStats" >> beam.CombinePerKey(sum)
             | "StatsByCell" >> beam.FlatMap(_by_source, _counter_source, models, "stats")),
            out.problems | "ProblemsByCell" >> beam.FlatMap(_problem_cells, models),
        ]
        if any(sidecar is not None for _, _, sidecar in self.cells.values()):
            specs = self.headlines
            parts.append(out.metrics | "HeadlineByCell" >> beam.FlatMap(
                lambda r: [(r["model"], ("headline", r))] if any(s.matches(r) for s in specs)
                else []))
            # a task without datum hashes has no presence: no fingerprint to check
            if out.presence is not None:
                parts.append(out.presence | "PresenceByCell" >> beam.FlatMap(
                    _by_source, _presence_source, models, "presence"))
        # Each cell's parts meet by key (not as side inputs: the runner would measure and
        # cache every record of the group for every cell).
        return (parts
                | "Parts" >> beam.Flatten()
                | "ByCell" >> beam.GroupByKey()
                | "Publish" >> beam.Map(
                    _publish_cell, self.cells, spec.plumbing().record_sort_key, job.started,
                    self.max_rejected_fraction, self.headlines, self.intersect))


def _presence_source(element) -> str:
    _, (source, _) = element
    return source


def _publish_cell(element, cells, sort_key, started, max_rejected_fraction, specs, intersect):
    """(model, [(part, value), ...]) -> write the cell's metrics.jsonl and rejected.jsonl (and its
    leaderboard sidecar) and publish it (transforms.outputs.finalize_run, as launcher._publish);
    returns its run.json."""
    from evalbeam.pipelines.launcher import _publish
    from evalbeam.pipelines.leaderboard import sidecar_content
    from evalbeam.transforms.io import write_jsonl
    from evalbeam.transforms.outputs import reject_sort_key
    from evalbeam.transforms.uncertainty import with_comparisons_last

    model, tagged = element
    parts: dict = {}
    for part, value in tagged:
        parts.setdefault(part, []).append(value)
    folder, run_info, sidecar = cells[model]
    n_metrics = write_jsonl(parts.get("metrics", []), folder.temp("metrics.jsonl"),
                            with_comparisons_last(sort_key))
    n_rejected = write_jsonl(parts.get("rejected", []), folder.temp("rejected.jsonl"),
                             reject_sort_key)
    content = None
    if sidecar is not None:
        path, fingerprint, cell_id = sidecar
        content = (path, sidecar_content(parts.get("headline", []), parts.get("presence", []),
                                         model, specs, intersect, fingerprint, cell_id))
    return _publish(parts.get("stats", []), n_metrics, n_rejected, folder, run_info, started,
                    max_rejected_fraction, problems=parts.get("problems", []), sidecar=content)
