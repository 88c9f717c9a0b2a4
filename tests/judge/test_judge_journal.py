"""The judge journal: concurrent writers never clash, cut files lose only their last line, only
reusable statuses are served, the first record of a hash wins, no credentials are kept."""

from __future__ import annotations

import threading

from evalbeam.transforms.judge.journal import REUSABLE, JournalWriter, endpoint_host, read_journal


def record(h: str, status: str = "ok", **extra) -> dict:
    return {"hash": h, "status": status, "content": {"verdict": 1}, **extra}


def test_writers_in_threads_never_clash_and_everything_is_read(tmp_path):
    root = str(tmp_path / "journal")

    def write(k: int):
        writer = JournalWriter(root, flush_every=7, flush_seconds=60)
        for i in range(100):
            writer.append(record(f"{k}-{i}"))
        writer.flush()

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    found = read_journal(root)
    assert set(found) == {f"{k}-{i}" for k in range(4) for i in range(100)}
    assert len(list((tmp_path / "journal").iterdir())) == 4 * 15       # ceil(100 / 7) files each


def test_statuses_duplicates_and_cut_files(tmp_path):
    root = str(tmp_path / "j")
    assert read_journal(root) == {}                                      # no folder yet
    writer = JournalWriter(root, flush_every=100)
    writer.append(record("a", "timeout"))                                # not reusable: retried
    writer.append(record("b", "truncated"))
    writer.append(record("c", "ok", content={"first": True}))
    writer.append(record("c", "ok", content={"first": False}))
    writer.flush()
    part = next((tmp_path / "j").iterdir())
    with open(part, "a", encoding="utf-8") as f:
        f.write('{"hash": "d", "status": "ok", "cont')                     # killed mid-line
    found = read_journal(root)
    assert set(found) == {"b", "c"} and found["c"]["content"] == {"first": True}
    assert REUSABLE == {"ok", "invalid_output", "truncated", "refused"}


def test_endpoint_host_drops_credentials():
    assert endpoint_host("https://user:s3cret@api.example.com:8443/v1?key=abc") == "api.example.com:8443"
    assert endpoint_host("http://127.0.0.1:9000/v1") == "127.0.0.1:9000"
    assert endpoint_host("https://api.openai.com/v1") == "api.openai.com"
