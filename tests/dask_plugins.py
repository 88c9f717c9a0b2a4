"""A dask worker plugin for tests/test_dask.py, in its own module so that the test's workers
(started with this folder on PYTHONPATH) can unpickle it without importing pytest."""

from __future__ import annotations

import os

from distributed import WorkerPlugin


class CrashOnce(WorkerPlugin):
    """Kills the worker process it runs in (as an out-of-memory kill or a lost machine would)
    when a task whose key contains `pattern` starts executing, once per flag file."""

    name = "evalbeam-crash-once"

    def __init__(self, flag: str, pattern: str):
        self.flag, self.pattern = flag, pattern

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and self.pattern in str(key):
            try:
                fd = os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, f"{os.getpid()} {key}\n".encode())
            os.close(fd)
            os._exit(1)
