"""The `evalbeam` command: one subcommand per task (pipelines/tasks/registry.py), plus the tools."""

from __future__ import annotations

import sys

from evalbeam.pipelines.launch.common import quiet_logs
from evalbeam.pipelines.tasks.registry import TASKS

# commands that are not tasks: (module with run(argv) -> exit code, one line)
TOOLS = {
    "judge-server": ("evalbeam.pipelines.runners.judge_server",
                     "a local stand-in for an OpenAI-compatible judge endpoint (tests, dry runs)"),
    "sweep": ("evalbeam.pipelines.sweep.command",
              "many models x many datasets in one pipeline, resumable, with a leaderboard "
              "(evalbeam sweep --help)"),
    "report": ("evalbeam.pipelines.report.command",
               "the self-contained HTML report of a finished run or sweep folder "
               "(evalbeam report DIR [--baseline DIR] [-o FILE])"),
    "demo": ("evalbeam.pipelines.demo.command",
             "make a small synthetic dataset, evaluate it and show the results"),
}


def usage() -> str:
    lines = ["usage: evalbeam COMMAND [options]", "", "commands:"]
    for name, (_, line) in TASKS.items():
        lines.append(f"  {name:<16} {line} (evalbeam {name} --help)")
    for name, (_, line) in TOOLS.items():
        lines.append(f"  {name:<16} {line}")
    lines += ["", "Options: pipelines/launch/options.md; each task's input formats: pipelines/tasks/<task>.md."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    quiet_logs()
    from evalbeam.transforms.collector import tune

    tune()   # fewer young collections in the launcher and the in-process runner (collector.py)
    if command in TASKS:
        from evalbeam.pipelines.launch.launcher import run_task
        from evalbeam.pipelines.tasks.registry import task_of

        sys.exit(run_task(task_of(command), rest))
    if command in TOOLS:
        sys.exit(importlib.import_module(TOOLS[command][0]).run(rest))
    print(f"evalbeam: error: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
