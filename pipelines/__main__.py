"""`python -m evalbeam.pipelines TASK ...`: the `evalbeam` command, for where no script is installed
(a Dataflow flex template, a bare interpreter)."""

from evalbeam.pipelines.cli import main

if __name__ == "__main__":
    main()
