"""Every task evalbeam runs, by command name: where its Task lives and one line about it.

A task's module is imported only when its command runs (Beam and the task's libraries are slow
to import). Adding a task: one line here, see pipelines/DESIGN.md.
"""

from __future__ import annotations

import importlib

# command: (module holding TASK, one line for `evalbeam --help`)
TASKS = {
    "classification": ("evalbeam.pipelines.tasks.classification",
                       "evaluate classification predictions"),
    "detection": ("evalbeam.pipelines.tasks.detection",
                  "evaluate object detections, COCO or Valor protocol"),
    "segmentation": ("evalbeam.pipelines.tasks.segmentation", "evaluate semantic segmentation masks"),
    "text": ("evalbeam.pipelines.tasks.text",
             "evaluate generated text: ROUGE, BLEU, rule-based guardrails, LLM judge"),
    "retrieval": ("evalbeam.pipelines.tasks.retrieval",
                  "evaluate retrieval runs against qrels, trec_eval compatible"),
}


def task_of(name: str):
    """The Task (pipelines/tasks/task.py) of a task command."""
    module, _ = TASKS[name]
    return importlib.import_module(module).TASK
