"""One way to fetch a file for every builder: streamed, with a progress bar, never half-written.

The body goes to a temporary sibling first and is renamed into place only when complete, so a
cut-off download never looks like a finished file. Offline, the error says what to pass instead.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm


class DownloadError(RuntimeError):
    """A download that failed: the URL, why, and what a command-line user passes instead (a
    caller with other options, the trainer's `data.*` keys say, names its own)."""

    def __init__(self, url: str, reason: str, offline_hint: str):
        super().__init__(f"could not download {url} ({reason}); offline? {offline_hint}")
        self.url, self.reason = url, reason


def fetch(
    url: str,
    dest: str | os.PathLike,
    *,
    offline_hint: str,
    progress: bool = True,
    timeout: float = 120,
) -> Path:
    """Download `url` to `dest` atomically; DownloadError naming the URL and `offline_hint` on
    failure."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, "wb") as f:
            total = int(r.headers.get("Content-Length") or 0) or None
            with tqdm(
                total=total, unit="B", unit_scale=True, desc=dest.name, disable=not progress
            ) as bar:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise DownloadError(url, str(e), offline_hint) from e
    os.replace(tmp, dest)
    return dest
