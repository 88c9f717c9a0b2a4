"""What a run computes from its own finished outputs just before it publishes them: the
comparison with a baseline run (comparison.jsonl), the gates' verdicts (gates.json) and the HTML
report (report.html). Done inside the publishing step (transforms.outputs.finalize_run), so
these files are part of the run's one atomic set: a killed run never shows a run.json that says
"complete" beside missing or stale verdicts.

Exit codes: a failed gate does not change run.json's status (the metrics are complete), it adds
`"gates": {"passed": false, ...}`, and the launcher exits EXIT_GATES (5) unless the run failed
(3) or is incomplete (4), which say more (pipelines/quality/gates.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from evalbeam.pipelines.quality.comparison import COMPARISON_JSONL
from evalbeam.pipelines.quality.gates import GATES_JSON

REPORT_HTML = "report.html"


@dataclass(frozen=True)
class Finishing:
    """gates: pipelines.gates.Gate tuple (empty: none); gates_source: where they came from (for
    gates.json); baseline: the baseline run's folder or None; report: write report.html."""

    gates: tuple = ()
    gates_source: str | None = None
    baseline: str | None = None
    report: bool = False

    @property
    def names(self) -> tuple:
        return ((COMPARISON_JSONL,) if self.baseline else ()) + \
            ((GATES_JSON,) if self.gates else ()) + ((REPORT_HTML,) if self.report else ())

    def __bool__(self) -> bool:
        return bool(self.names)

    def __call__(self, info: dict, folder) -> dict:
        from evalbeam.pipelines.quality import comparison
        from evalbeam.pipelines.quality import gates as gating
        from evalbeam.transforms.io import join, read_json
        from evalbeam.transforms.outputs import ERROR, INCOMPLETE, problem, write_json_atomic

        info = dict(info)
        records = comparison.read_records(folder.temp("metrics.jsonl"))
        baseline_records, rows, checks, differs, changed = None, None, None, [], None
        if self.baseline:
            baseline_metrics = join(self.baseline, "metrics.jsonl")
            try:
                baseline_records = comparison.read_records(baseline_metrics)
            except Exception as error:    # changed since the run started: this run's metrics stand
                baseline_records = []
                info["problems"] = list(info.get("problems", [])) + [problem(
                    ERROR, "baseline_unreadable", f"the baseline's metrics.jsonl ({self.baseline}) "
                    f"could not be read at the end of the run ({type(error).__name__}: {error}); "
                    "comparison.jsonl compares with nothing and change bounds are missing_baseline")]
                info["status"] = INCOMPLETE
            else:
                try:
                    baseline_info = read_json(join(self.baseline, "run.json"))
                except Exception:   # its metrics were read: the comparison stands without the check
                    baseline_info = None
                if isinstance(baseline_info, dict):
                    gated = any(g.needs_baseline for g in self.gates)
                    differs = comparison.data_differences(info, baseline_info)
                    if differs:
                        info["problems"] = list(info.get("problems", [])) + [
                            comparison.differs_problem(differs, self.baseline, gated)]
                    changed = comparison.changed_since(baseline_info, baseline_metrics)
                    if changed:
                        info["problems"] = list(info.get("problems", [])) + [
                            comparison.changed_problem(changed, self.baseline, gated)]
            rows = comparison.compare(records, baseline_records)
            comparison.write_rows(rows, folder.temp(COMPARISON_JSONL))
            info["comparison"] = dict(comparison.comparison_summary(rows), baseline=self.baseline,
                                      file=COMPARISON_JSONL)
        if self.gates:
            checks = gating.evaluate(list(self.gates), records, baseline_records,
                                     baseline_differs=differs, baseline_changed=changed)
            write_json_atomic(gating.gates_document(checks, self.gates_source, self.baseline),
                              folder.temp(GATES_JSON))
            info["gates"] = dict(gating.summarize(checks), file=GATES_JSON)
        if self.report:
            from evalbeam.pipelines.report.page import RunFiles, write_report

            try:
                write_report(RunFiles(folder.tmp, info), folder.temp(REPORT_HTML),
                             baseline=self.baseline, checks=checks, comparison=rows)
            except Exception as error:   # the metrics stand; the run says what is missing
                info["problems"] = list(info.get("problems", [])) + [problem(
                    ERROR, "report_failed", f"report.html could not be written "
                    f"({type(error).__name__}: {error}); `evalbeam report {folder.folder}` "
                    "retries it from the outputs")]
                info["status"] = INCOMPLETE
                with open_text(folder.temp(REPORT_HTML)) as out:
                    out.write("<!doctype html><title>evalbeam report</title>"
                              "<p>The report could not be written; run.json says why.</p>")
        return info


def open_text(path: str):
    import codecs

    from apache_beam.io.filesystems import FileSystems

    return codecs.getwriter("utf-8")(FileSystems.create(path))


def gates_exit(info: dict, code: int) -> int:
    """The exit code of a finished run given run.json: EXIT_GATES when a gate failed and the
    status alone says 0 or 1 (failed 3 and incomplete 4 say more)."""
    from evalbeam.pipelines.launch.common import EXIT_GATES, EXIT_OK, EXIT_REJECTED

    gates = info.get("gates")
    if gates and not gates.get("passed", True) and code in (EXIT_OK, EXIT_REJECTED):
        return EXIT_GATES
    return code


def print_gates(info: dict, folder_path: str, stream) -> None:
    """The gates' failed checks (first), then one line of totals."""
    from evalbeam.pipelines.quality import gates as gating
    from evalbeam.transforms.io import join, read_json

    gates = info.get("gates")
    if not gates:
        return
    if not gates["passed"]:
        checks = read_json(join(folder_path, GATES_JSON))["results"]
        for line in gating.failed_lines(checks):
            print(f"evalbeam: gate {line}", file=stream)
    verdict = "passed" if gates["passed"] else f"FAILED ({gates['failed']} of {gates['checks']} checks)"
    print(f"evalbeam: gates {verdict}; every check in {join(folder_path, GATES_JSON)}", file=stream)

