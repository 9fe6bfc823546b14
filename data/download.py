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


def fetch(
    url: str,
    dest: str | os.PathLike,
    *,
    offline_hint: str,
    progress: bool = True,
    timeout: float = 120,
) -> Path:
    """Download `url` to `dest` atomically; RuntimeError naming the URL and `offline_hint` on failure."""
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
        raise RuntimeError(f"could not download {url} ({e}); offline? {offline_hint}") from e
    os.replace(tmp, dest)
    return dest
