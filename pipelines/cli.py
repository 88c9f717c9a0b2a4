"""The `evalbeam` command: one subcommand per task, plus `demo`."""

from __future__ import annotations

import sys

USAGE = """usage: evalbeam COMMAND [options]

commands:
  classification   evaluate classification predictions (evalbeam classification --help)
  detection        evaluate object detections, COCO or Valor protocol (evalbeam detection --help)
  segmentation     evaluate semantic segmentation masks (evalbeam segmentation --help)
  text             evaluate generated text: ROUGE, BLEU, rule-based guardrails (evalbeam text --help)
  retrieval        evaluate retrieval runs against qrels, trec_eval compatible (evalbeam retrieval --help)
  judge-server     a local stand-in for an OpenAI-compatible judge endpoint (tests, dry runs)
  demo             make a small synthetic dataset, evaluate it and show the results

See the README for input formats, options and outputs."""


def quiet_logs() -> None:
    """Beam logs warnings of optional cloud clients on import, and tracebacks of failing steps;
    a CLI user needs none of them. EVALBEAM_LOG_LEVEL (e.g. INFO) brings them back."""
    import logging
    import os

    level = os.environ.get("EVALBEAM_LOG_LEVEL")
    logging.getLogger().setLevel((level or "ERROR").upper())
    if level is None:
        # Beam logs a failing step's traceback at ERROR; the launcher says what failed in one
        # paragraph (and run.json records it), so by default the traceback is not shown.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    quiet_logs()
    if command == "classification":
        from pipelines.classification import run
    elif command == "detection":
        from pipelines.detection import run
    elif command == "segmentation":
        from pipelines.segmentation import run
    elif command == "text":
        from pipelines.text import run
    elif command == "retrieval":
        from pipelines.retrieval import run
    elif command == "judge-server":
        from pipelines.judge_server import run
    elif command == "demo":
        from pipelines.demo import run
    else:
        print(f"evalbeam: error: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(rest))


if __name__ == "__main__":
    main()
