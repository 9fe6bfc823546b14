"""The run directory goes through etils.epath (run.out_dir may be gs://...): the object-store
flavour of metrics.jsonl (rewrite instead of append) and is_local, tested on a local disk."""

from __future__ import annotations

from train.metrics import JsonlFile, is_local, read_jsonl


def test_url_paths_are_not_local():
    assert not is_local("gs://bucket/runs/x")
    assert is_local("runs/x") and is_local("/tmp/runs/x")


def test_rewritten_jsonl_keeps_earlier_runs_and_is_durable_only_after_sync(tmp_path):
    """What a resumed run on gs:// does: read what is there, add lines, rewrite the whole object."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')  # the previous (preempted) run
    f = JsonlFile(path, rewrite=True)
    f.write({"step": 2, "train/loss": 0.5})
    assert [r["step"] for r in read_jsonl(path)] == [1]  # nothing rewritten before sync
    f.sync()
    f.write({"step": 3})
    f.close()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]


def test_local_jsonl_appends_and_flushes_every_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    f = JsonlFile(path)
    assert not f.rewrite
    f.write({"step": 1})
    assert read_jsonl(path) == [{"step": 1}]  # visible at once: a SIGKILLed run keeps it
    f.close()
    g = JsonlFile(path)
    g.write({"step": 2})
    g.close()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
