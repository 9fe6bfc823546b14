"""How a data set folder was built: the record every builder's command writes into it
(`built_by.json`), and whether a run may read, rebuild or must leave a folder.

    rec = record("data.sudoku_easy", ["train=200", ...], {"test_csv": None})
    write(root, rec, files)                 # after the build: what it wrote, by top-level name
    decide(root, rec, complete) -> ("build" | "use" | "rebuild" | "unrecorded", why)

A record holds the builder (its module), its arguments (the output folder left out), each input's
identity (a file's SHA-256 and size, a folder's hash of its files, or the URL it was downloaded
from) and FORMAT. A folder is only ever replaced when its record says a builder wrote it and every
entry in it is one the builder wrote (`decide`); a user's file beside a data set, a folder with no
record and a split gone missing are refused with one line (`NotReplaced`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

log = logging.getLogger(__name__)

RECORD = "built_by.json"
# The builders' output for the same arguments and inputs: bump it when a builder changes what it
# writes, so that a data set built before is rebuilt rather than read as the new one.
FORMAT = 1


class NotReplaced(ValueError):
    """A folder a build would replace holds something no builder recorded writing; one line naming
    the folder and what is there."""


def record(builder: str, args, inputs: dict) -> dict:
    """The record of `builder` run with `args`; `inputs`: name -> a file or folder path (hashed),
    a URL (kept as such) or None (no such input)."""
    return {
        "builder": builder,
        "args": [str(a) for a in args],
        "inputs": {k: identity(v) for k, v in inputs.items() if v},
        "format": FORMAT,
    }


def command_args(argv, outputs=("--output-dir", "--out-dir"), neutral=()) -> list[str]:
    """A builder command's arguments as its record keeps them: without the output folder (an
    option in `outputs` and its value) and the `neutral` ones (options that change how it runs,
    not what it writes: --overwrite, --no-progress, --workers N)."""
    out, skip = [], False
    for a in argv or []:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in outputs or name in neutral:
            skip = "=" not in a and name not in _FLAGS
            continue
        out.append(a)
    return out


# options of the builders that take no value
_FLAGS = ("--overwrite", "--no-progress")


def identity(source: str) -> dict:
    """What an input is: {"url"} for a download, {"sha256", "bytes"} of a file's contents, or the
    hash of a folder's files (names and contents). OSError when a path cannot be read."""
    source = os.fspath(source)
    if "://" in source:
        return {"url": source}
    if not os.path.exists(source):  # a prefix of files (ARC's --input-file-prefix)
        return {"path": source}
    if os.path.isdir(source):
        digest = hashlib.sha256()
        for folder, dirs, files in sorted(os.walk(source)):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, source).encode() + b"\0")
                digest.update(_file_sha256(path).encode())
        return {"sha256": digest.hexdigest(), "folder": True}
    return {"sha256": _file_sha256(source), "bytes": os.path.getsize(source)}


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write(root, rec: dict, files) -> None:
    """Writes `rec` with the top-level names the build wrote into root/built_by.json (atomic)."""
    path = os.path.join(os.fspath(root), RECORD)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({**rec, "files": sorted({*files, RECORD})}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def read(root) -> dict | None:
    """root's record, None without one; NotReplaced when it is not one (damaged, hand-written)."""
    path = os.path.join(os.fspath(root), RECORD)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise NotReplaced(f"{path}: not a build record ({e})") from e
    keys = ("builder", "args", "inputs", "format", "files")
    if not isinstance(rec, dict) or any(k not in rec for k in keys):
        raise NotReplaced(f"{path}: not a build record (expected the keys {', '.join(keys)})")
    return rec


def differences(saved: dict, wanted: dict) -> list[str]:
    """What the record `saved` says was built differently from `wanted`, one phrase each."""
    out = []
    for key in ("builder", "args", "format"):
        if saved.get(key) != wanted.get(key):
            out.append(f"{key} {_short(saved.get(key))} (this run: {_short(wanted.get(key))})")
    inputs, theirs = wanted.get("inputs", {}), saved.get("inputs", {})
    for name in sorted(set(inputs) | set(theirs)):
        want, have = inputs.get(name), theirs.get(name) or {}
        if want is None:
            out.append(f"{name} {_describe(have)} (this run: none)")
        elif any(have.get(k) != v for k, v in want.items() if k in ("url", "sha256", "path")):
            out.append(f"{name} {_describe(have)} (this run: {_describe(want)})")
    return out


def _describe(ident: dict) -> str:
    if not ident:
        return "none"
    if "path" in ident:
        return ident["path"]
    if "url" in ident and "sha256" not in ident:
        return f"downloaded from {ident['url']}"
    what = "downloaded from " + ident["url"] if "url" in ident else "a file"
    return f"{what} of SHA-256 {ident.get('sha256', '?')[:12]}"


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


def decide(root, wanted: dict | None, complete) -> tuple[str, str]:
    """What a run whose config builds `wanted` into `root` does with it:

    - "build": root does not exist or is empty;
    - "use": its record is `wanted` and everything it lists is there;
    - "rebuild": its record says a builder wrote it, with other settings (`why` names them), and
      it holds nothing but what that build wrote: the builder may replace it;
    - "unrecorded": a complete data set (`complete(root)`) with no record: read as it is.

    NotReplaced (one line naming root) for anything else: a file, entries no build recorded (a
    user's), a recorded entry gone missing, a data set that is neither recorded nor complete.
    `wanted` None: the builder records nothing to compare; a complete data set is read as it is."""
    root = os.fspath(root)
    if not os.path.lexists(root):
        return "build", ""
    if not os.path.isdir(root):
        raise NotReplaced(f"{root} is a file, not a data set folder: not replaced")
    entries = set(os.listdir(root))
    if not entries:
        return "build", ""
    rec = read(root)
    if rec is None:
        if complete(root):
            return "unrecorded", f"no {RECORD} says how it was built: read as it is, not checked"
        raise NotReplaced(
            f"{root} holds {_names(entries)} but no complete data set and no {RECORD} saying a "
            "builder wrote it: not replaced; move those out, or choose another data.path"
        )
    listed = set(rec["files"])
    foreign, missing = sorted(entries - listed), sorted(listed - entries)
    if foreign:
        raise NotReplaced(
            f"{root} holds {_names(foreign)}, which its build did not write ({RECORD}): not "
            "replaced; move them out, or choose another data.path"
        )
    if missing:
        raise NotReplaced(
            f"{root} lacks {_names(missing)}, which its build wrote ({RECORD}): not replaced "
            "(someone changed it); delete the folder to rebuild it, or choose another data.path"
        )
    if wanted is None:
        return "use", ""
    changed = differences(rec, wanted)
    if not changed:
        return "use", ""
    return "rebuild", f"built with {'; '.join(changed)}"


def _names(names) -> str:
    names = sorted(names)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return shown


def prepare(root, what: str, wanted: dict | None, complete, build) -> None:
    """Builds the data set a run's config asks for into `root` unless it is there (`decide`):
    `what` is the config's words for the build (data.build=...), `build()` runs it. A rebuild
    and an unrecorded data set are each one warning line; NotReplaced for a folder that is not
    the build's to replace."""
    action, why = decide(root, wanted, complete)
    if action == "use":
        return
    if action == "unrecorded":
        log.warning("data.path=%s: %s against %s", root, why, what)
        return
    if action == "rebuild":
        log.warning("data.path=%s: %s; rebuilding it as %s", root, why, what)
    else:
        log.info("building %s into %s", what, root)
    build()
