"""The sweep's cells as Beam graphs: one graph for every group of cells that share their task
and options, whatever their dataset and model, each cell's outputs split out and published as
that cell's own run.

A sweep of D datasets x M models has D*M cells. Given each cell its own copy of the task's graph
(launcher.TaskJob), the DirectRunner pays a fixed cost per stage of every copy (measured in
tests/benchmarks/README.md), which dominates a sweep of small cells. For a task whose per-model
records do not depend on the other models of a run (Task.separable_models), cells that
share their options are instead ONE run of the task (CellGroupJob) over every dataset at once:

- every source is named by its dataset (transforms.io.qualified: "<dataset>\\x1f<name>"), the
  cell's model by "<dataset>\\x1f<model>";
- each dataset's files are read as its cells alone read them (transforms.io.ReadDatasets, so a
  read is shared with any other graph that reads them) and its shards are moved to a range of
  their own (FilesJob.layout), so a shard holds one dataset and its models are matched against
  that dataset's ground truth only; datum uids and their hashes are untouched, so bootstrap
  weights are those of the cell alone;
- the task's outputs are keyed by cell: records by their "model", rejections, row counters and
  datum hashes by their source (a ground truth's go to every cell of its dataset), problems by
  their "dataset" and "model" (none: every cell of the dataset); the dataset is taken off every
  name again; and one step per cell writes its files (metrics.jsonl, rejected.jsonl, the
  leaderboard sidecar) and publishes run.json as launcher.publish_run does for a run alone.

The result is the files each cell's run alone writes (tests/sweep: byte-identical metrics.jsonl
and rejected.jsonl, equal problems and counts).
"""

from __future__ import annotations

import json

import apache_beam as beam

from evalbeam.transforms.io import dataset_of, is_truth, qualified, role_of
from evalbeam.transforms.meters import METER_COUNTERS, add_stats

NOT_IN_GROUP_KEY = ("num_shards",)   # each dataset keeps its own shards (FilesJob.layout)


def group_key(plan) -> tuple | None:
    """What cells must share to run as one graph, or None for a cell that runs alone: the task
    (separable), the options as run.json records them (but the shard count), the slices, the
    bootstrap, the allowed rejected fraction and the Beam options. Judged cells run alone
    (their judge settings are divided between the cells that call at once)."""
    if not plan.spec.separable_models or plan.judged or len(plan.models) != 1:
        return None
    options = {k: v for k, v in plan.run_info["options"].items() if k not in NOT_IN_GROUP_KEY}
    return (plan.cell.task, json.dumps(options, sort_keys=True, default=str),
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


def group_job(group: list, started: float, sidecars: bool):
    """(FilesJob, cells) of a group of plans (groups_of): the sources of every cell named by
    their dataset, each dataset's shards after the previous one's, and the cells as
    CellGroupJob takes them."""
    from evalbeam.transforms.evaluated import FilesJob

    sources, layout, first = {}, {}, 0
    for p in sorted(group, key=lambda p: (p.cell.dataset, p.cell.model)):
        for name, source in p.sources.items():
            sources[qualified(p.cell.dataset, name)] = source
        if p.cell.dataset not in layout:
            count = p.run_info["options"]["num_shards"]
            layout[p.cell.dataset] = (first, count)
            first += count
    cells = {qualified(p.cell.dataset, p.cell.model):
             (p.folder, p.run_info, (p.sidecar_path, p.fingerprint, p.cell.id) if sidecars else None)
             for p in group}
    p = group[0]
    # the task writes no file of its own here (CellGroupJob takes no task with extra outputs)
    job = FilesJob(sources, tuple(sorted(cells)), tuple(p.slices), first, True, started,
                   p.folder.temp, p.args.uncertainty, None, presence=sidecars, layout=layout)
    return job, cells


def _by_source(element, source_of, rename, cells, part: str):
    """element -> (cell, (part, element renamed)) for its source's cell, or for every cell of
    the dataset when it comes from that dataset's ground truth."""
    source = source_of(element)
    value = (part, rename(element))
    if source in cells:
        return [(source, value)]
    if is_truth(source):
        dataset = dataset_of(source)
        return [(cell, value) for cell in cells if dataset_of(cell) == dataset]
    raise ValueError(f"an output of the group names an unknown source {source!r}")


def _rejection_source(record: dict) -> str:
    return record["source"]


def _rejection_renamed(record: dict) -> dict:
    return dict(record, source=role_of(record["source"]))


def _counter_source(pair) -> str:
    (_, source), _ = pair
    return source


def _counter_renamed(pair):
    (counter, source), n = pair
    return (counter, role_of(source)), n


def _stats_by_cell(pair, cells):
    """A summed stats pair -> (cell, ("stats", pair)): a row counter to its source's cell (see
    _by_source); a shuffle meter to every cell, since the cells of a group share the pipeline
    and its shuffles."""
    (counter, _), _ = pair
    if counter in METER_COUNTERS:
        return [(cell, ("stats", pair)) for cell in cells]
    return _by_source(pair, _counter_source, _counter_renamed, cells, "stats")


def _presence_source(element) -> str:
    _, (source, _) = element
    return source


def _presence_renamed(element):
    slice_json, (source, hashes) = element
    return slice_json, (role_of(source), hashes)


def _problem_cells(problem: dict, cells):
    """A problem -> its cell (by "dataset" and "model"), or every cell of its dataset."""
    problem = dict(problem)
    dataset = problem.pop("dataset", "")
    model = problem.get("model")
    if model is not None and qualified(dataset, model) in cells:
        return [(qualified(dataset, model), ("problems", problem))]
    return [(cell, ("problems", problem)) for cell in cells if dataset_of(cell) == dataset]


def _record_cell(record: dict, bootstrap, unit: str, finish):
    """A record -> (its cell, ("metrics", the record with its intervals and its own model
    name)): transforms.uncertainty.finish_record, as a cell has no comparisons."""
    cell = record["model"]
    return cell, ("metrics", dict(finish(record, bootstrap, unit), model=role_of(cell)))


def _headline_cell(record: dict, specs):
    if not any(spec.matches(record) for spec in specs):
        return []
    return [(record["model"], ("headline", dict(record, model=role_of(record["model"]))))]


class CellGroupJob(beam.PTransform):
    """Cells that share their task and options (groups_of), as one run of the task over every
    dataset (job, cells: group_job), each cell then written and published as launcher.TaskJob
    publishes a run.

    cells: {"<dataset>\\x1f<model>": (OutputFolder, run_info, sidecar or None)}, sidecar =
    (path, fingerprint, cell id) of the cell's leaderboard inputs (pipelines/sweep/leaderboard.py),
    written just before the cell publishes. headlines, intersect: the leaderboard's headline
    specs and datum rule, the same for every cell of a group. Returns the PCollection of the
    published run.json dicts."""

    def __init__(self, spec, config, job, cells: dict, max_rejected_fraction: float,
                 headlines=(), intersect: bool = False):
        super().__init__()
        self.spec, self.config, self.job, self.cells = spec, config, job, cells
        self.max_rejected_fraction = max_rejected_fraction
        self.headlines, self.intersect = list(headlines), intersect

    def expand(self, pbegin):
        from evalbeam.transforms.uncertainty import finish_record

        spec, job, cells = self.spec, self.job, sorted(self.cells)
        if sorted(job.models) != cells or spec.extra_outputs(self.config):
            raise ValueError("CellGroupJob: one cell per model of the job, and a task without "
                             "extra outputs")
        out = pbegin | spec.title >> spec.files_transform()(self.config, job)
        parts = [
            pbegin | "Cells" >> beam.Create([(cell, ("cell", None)) for cell in cells]),
            out.metrics | "MetricsByCell" >> beam.Map(
                _record_cell, job.bootstrap, spec.interval_unit, finish_record),
            out.rejected | "RejectsByCell" >> beam.FlatMap(
                _by_source, _rejection_source, _rejection_renamed, cells, "rejected"),
            (out.stats
             | "SumStats" >> beam.CombinePerKey(add_stats)
             | "StatsByCell" >> beam.FlatMap(_stats_by_cell, cells)),
            out.problems | "ProblemsByCell" >> beam.FlatMap(_problem_cells, cells),
        ]
        if any(sidecar is not None for _, _, sidecar in self.cells.values()):
            parts.append(out.metrics | "HeadlineByCell" >> beam.FlatMap(
                _headline_cell, self.headlines))
            # a task without datum hashes has no presence: no fingerprint to check
            if out.presence is not None:
                parts.append(out.presence | "PresenceByCell" >> beam.FlatMap(
                    _by_source, _presence_source, _presence_renamed, cells, "presence"))
        # Each cell's parts meet by key (not as side inputs: the runner would measure and
        # cache every record of the group for every cell).
        return (parts
                | "Parts" >> beam.Flatten()
                | "ByCell" >> beam.GroupByKey()
                | "Publish" >> beam.Map(
                    _publish_cell, self.cells, spec.graph.record_sort_key, job.started,
                    self.max_rejected_fraction, self.headlines, self.intersect))


def _publish_cell(element, cells, sort_key, started, max_rejected_fraction, specs, intersect):
    """(cell, [(part, value), ...]) -> write the cell's metrics.jsonl and rejected.jsonl (and
    its leaderboard sidecar) and publish it (transforms.outputs.finalize_run, as
    launcher.publish_run); returns its run.json."""
    from evalbeam.pipelines.launch.launcher import publish_run
    from evalbeam.pipelines.sweep.leaderboard import sidecar_content
    from evalbeam.transforms.io import write_jsonl
    from evalbeam.transforms.outputs import reject_sort_key
    from evalbeam.transforms.uncertainty import with_comparisons_last

    cell, tagged = element
    parts: dict = {}
    for part, value in tagged:
        parts.setdefault(part, []).append(value)
    folder, run_info, sidecar = cells[cell]
    n_metrics = write_jsonl(parts.get("metrics", []), folder.temp("metrics.jsonl"),
                            with_comparisons_last(sort_key))
    n_rejected = write_jsonl(parts.get("rejected", []), folder.temp("rejected.jsonl"),
                             reject_sort_key)
    content = None
    if sidecar is not None:
        path, fingerprint, cell_id = sidecar
        content = (path, sidecar_content(parts.get("headline", []), parts.get("presence", []),
                                         role_of(cell), specs, intersect, fingerprint, cell_id))
    return publish_run(parts.get("stats", []), n_metrics, n_rejected, folder, run_info, started,
                       max_rejected_fraction, problems=parts.get("problems", []), sidecar=content)
