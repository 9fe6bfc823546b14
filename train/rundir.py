"""One writer per run directory: a trainer claims `<run.out_dir>/<run.name>` while it writes it.

Two trainers writing one run directory (a relaunch while the old job still runs) delete each
other's checkpoints and log every step twice. So the trainer claims the directory before it reads
or writes anything there, and a second trainer stops with one line naming the first:

- a local (or shared, NFS) directory: an exclusive `flock` on `<run_dir>/writer.lock`. The kernel
  drops the lock when its process ends, however it ends (kill -9 included), so a claim never
  outlives its owner. The file holds the owner (host, pid, since when); a clean exit empties it,
  so a non-empty file under a free lock is a claim whose owner died, taken over with a warning.
- a bucket (gs://...): objects cannot be locked, so the claim is a lease object
  `<run_dir>/writer.lease`, created only if absent and renewed by a heartbeat thread, every write
  conditional on the generation the writer last saw (Cloud Storage's `if_generation_match`). An
  owner that stops renewing (a killed job, a lost VM) loses the lease after `ttl_s`; a trainer
  that finds an expired lease takes it over with a warning, and the old owner, should it wake,
  finds its next renewal refused and stops (`Claim.check`).

On several processes (a TPU pod) process 0 claims for the run and tells the others the outcome.
`python -m train.rundir check DIR` prints the same line without claiming (launch.tpu runs it
before it starts a trainer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import jax
import numpy as np
from etils import epath

from train import gcs
from train.config import RunConfig
from train.errors import ConfigError, disk_full_names, one_line

log = logging.getLogger(__name__)

LOCK_FILE = "writer.lock"  # a local run directory's claim
LEASE_FILE = "writer.lease"  # a bucket run directory's claim
LEASE_TTL_S = RunConfig.lease_ttl_s  # a lease not renewed for this long belongs to nobody
RENEW_EVERY = 4  # renewals per TTL: three can fail (a network blip) before the lease is at risk


@dataclasses.dataclass
class Owner:
    """Who holds a claim: host, pid, when it claimed (UTC, ISO) and a random id."""

    host: str
    pid: int
    since: str
    id: str = ""

    @classmethod
    def me(cls) -> Owner:
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return cls(socket.gethostname(), os.getpid(), now, uuid.uuid4().hex)

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        """The owner a claim file names (None: empty, or not written by this module)."""
        try:
            d = json.loads(text)
            return cls(str(d["host"]), int(d["pid"]), str(d["since"]), str(d.get("id", "")))
        except (ValueError, KeyError, TypeError):
            return None

    def dumps(self, **extra) -> str:
        return json.dumps({**dataclasses.asdict(self), **extra})

    def __str__(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {self.since}"


def busy_error(run_dir, owner: Owner | None, more: str = "") -> ConfigError:
    """The one line a second writer gets."""
    who = str(owner) if owner else "owner unknown"
    return ConfigError(
        f"run directory {run_dir} is being written by another trainer ({who}{more}): wait for it "
        "to finish, stop it (Ctrl-C or kill it, or `python -m launch.tpu stop`), or use another "
        "run.name"
    )


def _same_file(fd: int, path: str) -> bool:
    """Whether `path` still names the file open as `fd` (not removed or replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class LocalClaim:
    """flock on <run_dir>/writer.lock: held while the process lives."""

    def __init__(self, run_dir):
        self.run_dir = epath.Path(run_dir)
        self.path = os.path.join(str(run_dir), LOCK_FILE)
        self.fd = None
        self.created = False  # this claim made the run directory (released empty: removed)

    def acquire(self) -> None:
        self.created = not self.run_dir.exists()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError, PermissionError) as e:  # a file on the way
            why = {FileExistsError: "it is a file", NotADirectoryError: "a file is on its path"}
            raise ConfigError(
                f"run directory {self.run_dir} (run.out_dir / run.name) cannot be made: "
                f"{why.get(type(e), e.strerror)}"
            ) from e
        for _ in range(3):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise
                raise busy_error(self.run_dir, self.owner()) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # a releasing trainer removed that file (`release`): open the new one
        else:
            raise busy_error(self.run_dir, self.owner(), ", claimed while this trainer tried to")
        self.fd = fd
        previous = Owner.parse(os.pread(fd, 4096, 0).decode(errors="replace"))
        if previous is not None:
            log.warning(
                "took over %s: its previous writer (%s) is gone without releasing it",
                self.run_dir,
                previous,
            )
        self._write(Owner.me().dumps())

    def probe(self) -> None:
        """ConfigError (the line a second writer gets) when a live trainer holds the directory;
        nothing is claimed or written."""
        if not os.path.exists(self.path):
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            raise busy_error(self.run_dir, self.owner()) from None
        finally:
            os.close(fd)

    def owner(self) -> Owner | None:
        """The owner the lock file names (for the message of a refused claim)."""
        try:
            with open(self.path) as f:
                return Owner.parse(f.read(4096))
        except OSError:
            return None

    def _write(self, text: str) -> None:
        with disk_full_names(self.path):
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, text.encode(), 0)
            os.fsync(self.fd)

    def check(self) -> None:
        """A flock cannot be lost while its process lives."""

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):  # a full disk cannot empty it: the next writer warns
            os.ftruncate(self.fd, 0)
        if self.created and _holds_no_file(str(self.run_dir), LOCK_FILE):
            # a run that stopped before writing anything (a failed check; its checkpoints/
            # folder may exist, empty): no directory of its own is left behind. Removed while
            # still locked; `acquire` re-checks the file.
            with contextlib.suppress(OSError):
                os.unlink(self.path)
                for folder, _, _ in sorted(os.walk(str(self.run_dir)), reverse=True):
                    os.rmdir(folder)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def _holds_no_file(root: str, but: str) -> bool:
    """Whether `root` holds nothing but the file `but` and empty folders."""
    for folder, _, files in os.walk(root):
        if any(f != but or folder != root for f in files):
            return False
    return True


class LostClaim(ConfigError):
    """Another trainer took over this run directory's expired lease."""


class GcsObject:
    """One Cloud Storage object with generation preconditions (google-cloud-storage, which the
    `gcs` extra installs with gcsfs). `read` -> (text, generation) or (None, 0); `write` and
    `delete` raise Conflict unless the object is at `generation` (0: absent)."""

    def __init__(self, url: str):
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import storage  # lazy: only for gs:// run directories

        bucket, _, self.name = url.removeprefix("gs://").partition("/")
        self.url = url
        try:
            self.bucket = storage.Client().bucket(bucket)
        except DefaultCredentialsError as e:
            raise ConfigError(
                f"{url}: no Google Cloud credentials on this machine to reach the bucket: "
                "gcloud auth application-default login (a TPU VM has its service account's)"
            ) from e

    def _blob(self):
        """A new handle on every call: a Blob that has read or written the object keeps that
        generation and reads, or deletes, exactly it afterwards (gone once another writer
        replaced it: a 404, which read as "no lease")."""
        return self.bucket.blob(self.name)

    def read(self) -> tuple[str | None, int]:
        from google.api_core import exceptions

        blob = self._blob()
        try:
            text = blob.download_as_text()
        except exceptions.NotFound:
            return None, 0
        return text, int(blob.generation)

    def write(self, text: str, generation: int) -> int:
        from google.api_core import exceptions

        blob = self._blob()
        try:
            blob.upload_from_string(text, if_generation_match=generation)
        except exceptions.PreconditionFailed as e:
            raise Conflict(self.url) from e
        return int(blob.generation)

    def delete(self, generation: int) -> None:
        from google.api_core import exceptions

        try:
            self._blob().delete(if_generation_match=generation)
        except (exceptions.PreconditionFailed, exceptions.NotFound) as e:
            raise Conflict(self.url) from e


class Conflict(Exception):
    """The object is not at the generation a conditional write expected."""


class LeaseClaim:
    """A lease object renewed by a heartbeat thread (bucket run directories).

    `store` is an object with GcsObject's read / write / delete (generation preconditions)."""

    def __init__(self, run_dir, store=None, ttl_s: float = LEASE_TTL_S):
        self.run_dir = str(run_dir)
        self.store = store if store is not None else GcsObject(f"{self.run_dir}/{LEASE_FILE}")
        self.ttl_s = ttl_s
        self.me = Owner.me()
        self.generation = 0
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = None

    def _record(self) -> str:
        return self.me.dumps(renewed=time.time(), ttl_s=self.ttl_s)

    def _age_unless_live(self, text: str | None) -> float | None:
        """Seconds since the lease `text` was last renewed (None: no lease); ConfigError while
        that is under its TTL (a live owner)."""
        if text is None:
            return None
        record = _parse(text)
        age, ttl = time.time() - record.get("renewed", 0.0), record.get("ttl_s", self.ttl_s)
        if age < ttl:
            more = f", renewed {age:.0f} s ago, expires in {ttl - age:.0f} s"
            raise busy_error(self.run_dir, Owner.parse(text), more)
        return age

    def probe(self) -> None:
        """ConfigError when a live trainer holds the lease; nothing is written."""
        self._age_unless_live(self.store.read()[0])

    def _mine(self, text: str | None) -> bool:
        """Whether the lease `text` is this claim's own record. google-cloud-storage retries a
        conditional write whose answer was lost (a connection reset); when the first attempt had
        landed, the retry's precondition fails against this claim's own write."""
        owner = Owner.parse(text or "")
        return owner is not None and owner.id == self.me.id

    def acquire(self) -> None:
        taken = None  # (text, age) of the expired lease this claim replaces
        for _ in range(3):  # a lost race re-reads the object
            text, generation = self.store.read()
            if self._mine(text):  # the write of the attempt before landed
                self.generation = generation
                break
            age = self._age_unless_live(text)
            taken = (text, age) if text is not None else taken
            try:
                self.generation = self.store.write(self._record(), generation)
            except Conflict:
                continue
            break
        else:
            raise busy_error(self.run_dir, None, ", claimed while this trainer tried to")
        if taken is not None:
            log.warning(
                "took over %s: its previous writer (%s) stopped renewing its lease %.0f s ago",
                self.run_dir,
                Owner.parse(taken[0]) or "owner unknown",
                taken[1],
            )
        self._thread = threading.Thread(target=self._heartbeat, name="rundir-lease", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / RENEW_EVERY):
            try:
                self.generation = self.store.write(self._record(), self.generation)
            except Conflict:
                text, generation = self.store.read()
                if self._mine(text):  # this renewal's first attempt landed
                    self.generation = generation
                    continue
                who = Owner.parse(text or "") or "owner unknown"
                self.lost = f"another trainer ({who}) took over its lease"
                return
            except Exception as e:  # a network error: the next renewal tries again
                log.warning("%s: cannot renew the lease (%s); retrying", self.run_dir, one_line(e))

    def check(self) -> None:
        """LostClaim once another trainer has taken the lease over (this one stalled)."""
        if self.lost is not None:
            raise LostClaim(
                f"run directory {self.run_dir}: {self.lost} after this trainer did not renew it "
                f"for {self.ttl_s:.0f} s; stopping without writing more"
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # a renewal in flight to a bucket that stopped answering retries for minutes: the
            # lease is left to expire
            self._thread.join(timeout=self.ttl_s / RENEW_EVERY)
            if self._thread.is_alive():
                return
        if self.lost is None and self.generation:
            with contextlib.suppress(Exception):  # an unreleased lease just expires
                self.store.delete(self.generation)


def _parse(text: str) -> dict:
    try:
        d = json.loads(text)
        return d if isinstance(d, dict) else {}
    except ValueError:
        return {}


def make_claim(run_dir, ttl_s: float = LEASE_TTL_S):
    """The claim that fits `run_dir`: a flock locally, a lease (of `ttl_s`) in a bucket."""
    if "://" in str(run_dir):
        return LeaseClaim(run_dir, ttl_s=ttl_s)
    return LocalClaim(run_dir)


@contextlib.contextmanager
def claim(run_dir, ttl_s: float = LEASE_TTL_S) -> Iterator:
    """Claims `run_dir` for this run (process 0; the others learn whether it could) and releases
    it at exit. ConfigError (one line) when another trainer holds it. Yields the claim, whose
    `check()` the trainer calls every step (None on processes other than 0)."""
    held, error = None, None
    if jax.process_index() == 0:
        held = make_claim(run_dir, ttl_s)
        try:
            held.acquire()
        except ConfigError as e:
            held, error = None, e
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
        if error is None and not int(ok):
            error = ConfigError(f"process 0 could not claim {run_dir} (its log says why)")
    if error is not None:
        raise error
    try:
        yield held
    finally:
        if held is not None:
            held.release()


# `python -m train.rundir check DIR` exit statuses (2: usage)
CHECK_FREE, CHECK_HELD, CHECK_ABSENT = 0, 1, 3


def main(argv: list[str] | None = None) -> int:
    """`python -m train.rundir check DIR`: one line, nothing claimed or written. Exit 0 when no
    live trainer holds DIR (free), 1 with the error line a second writer would get (held: its
    host, pid and start), 3 when DIR does not exist (a new run would create it), 2 on usage."""
    gcs.configure()  # STORAGE_EMULATOR_HOST set: every gs:// client goes to that server
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "check":
        print(
            "usage: python -m train.rundir check RUN_DIR  (exit 0: free, 1: held by a live "
            "trainer, 3: no such run directory)",
            file=sys.stderr,
        )
        return 2
    run_dir = args[1]
    if not epath.Path(run_dir).exists():
        print(f"{run_dir}: no such run directory (a new run creates it)")
        return CHECK_ABSENT
    try:
        make_claim(run_dir).probe()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return CHECK_HELD
    print(f"{run_dir}: free (no live trainer holds it)")
    return CHECK_FREE


if __name__ == "__main__":
    sys.exit(main())
