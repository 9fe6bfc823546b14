"""One switch for every gs:// access of a process: `STORAGE_EMULATOR_HOST=http://HOST:PORT`.

A run directory in a bucket is reached by three clients, each with its own endpoint setting:

- gcsfs (etils.epath's gs:// backend: metrics, config.yaml, final.json, Orbax's step directories
  and metadata) and google-cloud-storage (the run directory's lease, train/rundir.py) honour
  STORAGE_EMULATOR_HOST themselves;
- TensorStore, which writes and reads Orbax's arrays, does not: it reads TENSORSTORE_GCS_HTTP_URL,
  and looks for Google credentials (a credentials file, else the GCE metadata server) before its
  first request. Without these a run whose metrics reach the emulator hangs at its first save,
  its array writes retrying against storage.googleapis.com.

`configure()` maps the one variable onto what each client needs, with no credentials: TensorStore
gets the endpoint and a fixed placeholder token (GOOGLE_AUTH_TOKEN_FOR_TESTING: no credential
lookup), gcsfs anonymous access and its plain file system (its default one first asks the Storage
Control gRPC API, which an emulator lacks, for the bucket's layout, warning at every file
operation). Every command calls it first, before any gs:// path is touched (etils caches its
gcsfs file system at the first use); without the variable it changes nothing.
docs/tpu_runbook.md, "A local Cloud Storage server", says what the server cannot show.
"""

from __future__ import annotations

import logging
import os
import sys

EMULATOR_VAR = "STORAGE_EMULATOR_HOST"  # the variable google-cloud-storage and gcsfs read
TENSORSTORE_URL_VAR = "TENSORSTORE_GCS_HTTP_URL"  # TensorStore's endpoint in place of Google's
TENSORSTORE_TOKEN_VAR = "GOOGLE_AUTH_TOKEN_FOR_TESTING"  # TensorStore: this token, no lookup
PLACEHOLDER_TOKEN = "storage-emulator"  # sent as the bearer token; an emulator ignores it


def emulator_url() -> str | None:
    """The URL STORAGE_EMULATOR_HOST names (a bare host:port gets http://), None when unset."""
    host = os.environ.get(EMULATOR_VAR, "").strip()
    if host in ("", "default"):  # "default": google-cloud-storage's spelling of "not set"
        return None
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def configure() -> str | None:
    """Points TensorStore and gcsfs at STORAGE_EMULATOR_HOST, with no credentials, when it is set
    (-> its URL); otherwise changes nothing (-> None). Safe to call more than once."""
    url = emulator_url()
    if url is None:
        return None
    os.environ[TENSORSTORE_URL_VAR] = url
    os.environ.setdefault(TENSORSTORE_TOKEN_VAR, PLACEHOLDER_TOKEN)
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # read when gcsfs is imported
    import fsspec

    fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"
    # by name, so that an earlier import of gcsfs (with its layout-probing class) does not count
    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, "gcsfs.core.GCSFileSystem", clobber=True)
    logging.getLogger("gcsfs").addFilter(_no_move_fallback)
    return url


def require(path, option: str) -> None:
    """ConfigError naming `option` when `path` is a bucket URL (gs://...) and this environment
    lacks the packages that reach one (the `gcs` extra); nothing for a local path."""
    if not str(path).startswith(("gs://", "gcs://")):
        return
    import importlib.util

    from train.errors import ConfigError

    missing = [m for m in ("gcsfs", "google.cloud.storage") if not _importable(importlib.util, m)]
    if missing:
        raise ConfigError(
            f"{option}={path}: a Cloud Storage path needs {' and '.join(missing)}, which this "
            "environment lacks: pip install -e '.[gcs]'"
        )


def _importable(util, name: str) -> bool:
    try:
        return util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None
        return False


def _no_move_fallback(record: logging.LogRecord) -> bool:
    """Drops gcsfs's report of the objects.move call an emulator lacks (a 400, logged with its
    traceback, then "Falling back to copy/delete"); the copy and delete that follow still run."""
    text = record.getMessage()
    return not ("moveTo" in text or "couldn't decode, 400" in text)


# sysexits.h EX_UNAVAILABLE: the bucket did not answer; the same command resumes once it does
EXIT_UNREACHABLE = 69


def unreachable(e: BaseException) -> bool:
    """Whether `e`, or an exception it was raised from, is a connection that could not be made or
    was lost (gcsfs's aiohttp, google-cloud-storage's requests, TensorStore's libcurl: each ends
    in one once its retries are spent)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ConnectionError) or type(e).__name__ in _CONNECTION_ERRORS:
            return True
        if any(t in str(e) for t in _CONNECTION_TEXTS):  # TensorStore's, raised as ValueError
            return True
        e = e.__cause__ or e.__context__
    return False


# connection failures of the clients' own types that do not derive from ConnectionError
_CONNECTION_ERRORS = ("ClientConnectorError", "ServerDisconnectedError", "NewConnectionError")
# TensorStore's (libcurl's) words for a server it could not connect to once its retries are spent
_CONNECTION_TEXTS = ("CURL error Could not connect", "Failed to connect to", "curl_code='7'")


def exit_if_unreachable(e: BaseException, run_dir) -> None:
    """Prints the one line of a bucket that stopped answering and exits EXIT_UNREACHABLE when `e`
    is such a failure of a bucket run directory; returns otherwise."""
    if "://" not in str(run_dir) or not unreachable(e):
        return
    from train.errors import one_line

    logging.shutdown()  # every log line out before the last one
    print(
        f"error: cannot reach the bucket of {run_dir} ({one_line(e, limit=300)}); the checkpoints "
        "committed before are kept. Run the same command again once it answers",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    # Nothing more can be written to the bucket. The interpreter's teardown would wait on the
    # gs:// clients' background reads and writes (retrying for minutes) and print their errors
    # after this line: exit now.
    os._exit(EXIT_UNREACHABLE)
