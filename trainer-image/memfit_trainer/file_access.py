"""Why the trainer cannot use a file or folder: missing, or denied to its UID/GID, with the file's mode and owner."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DENIED = (errno.EACCES, errno.EPERM)
MAX_SCANNED_FILES = 2000  # a model folder has a handful; a wrong mount could hold millions
CHART_VALUE = "trainer.fsGroup"
# An absolute path in an error's text (safetensors reports a denied open as "No such file or directory: <path>"
# with no errno and no filename); not the `//host` of a URL.
_PATH_IN_TEXT = re.compile(r"(?<![\w:/])(/[^\s'\"`]+)")


class FileAccessError(ValueError):
    """A file or folder the trainer needs is missing or denied; the message names it and says how to fix it."""


@dataclass(frozen=True, slots=True)
class ProcessIds:
    """Who this process is to the file system: effective UID and GID and the supplementary groups."""

    uid: int
    gid: int
    groups: tuple[int, ...]

    @staticmethod
    def current() -> ProcessIds:
        """This process's ids (in a pod: runAsUser, runAsGroup, and fsGroup among the groups)."""
        return ProcessIds(uid=os.geteuid(), gid=os.getegid(), groups=tuple(sorted(set(os.getgroups()))))

    def in_group(self, gid: int) -> bool:
        """True when files of group `gid` are accessed with their group bits."""
        return gid == self.gid or gid in self.groups


def probe(path: Path, *, write: bool = False) -> OSError | None:
    """Why this process cannot read (or write) `path`, as the OSError an open would raise; None when it can.

    A folder also needs search (x) permission. `access(2)` with the effective ids, so it is true for root,
    which reads everything."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        return error
    wanted = os.R_OK | (os.W_OK if write else 0) | (os.X_OK if stat.S_ISDIR(mode) else 0)
    if os.access(path, wanted, effective_ids=os.access in os.supports_effective_ids):
        return None
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))


def diagnose(path: Path, error: OSError, *, write: bool = False, ids: ProcessIds | None = None) -> str:
    """What is wrong with `path` given the error using it raised: "<path> does not exist", or permission
    denied naming the file (or the folder above it) that refuses, its mode and owner, this process's
    ids, and how to fix it; else the error's own text."""
    if not denied(error):
        if not os.path.lexists(path):
            return f"{path} does not exist"
        found = probe(path, write=write)
        if found is None or not denied(found):
            return f"cannot {'write' if write else 'read'} {path}: {error.strerror or error}"
    blocker, need = _blocker(path, write=write)
    try:
        info = os.stat(blocker)
    except OSError:
        return f"permission denied: cannot {need} {blocker}; {_who(ids or ProcessIds.current())}"
    return denied_message(path, blocker=blocker, need=need, mode=stat.S_IMODE(info.st_mode), uid=info.st_uid,
                          gid=info.st_gid, folder=stat.S_ISDIR(info.st_mode), ids=ids or ProcessIds.current())


def denied_message(path: Path, *, blocker: Path, need: str, mode: int, uid: int, gid: int, folder: bool,
                   ids: ProcessIds) -> str:
    """The permission-denied text (pure): what refuses, its mode (octal) and owner, who asks, the fix."""
    kind = "folder" if folder else "file"
    where = f"{kind} {blocker}" + (f" (above {path})" if blocker != path else "")
    bits = {"read": "r", "write": "w", "search": "x"}[need] + ("x" if folder and need != "search" else "")
    group_fix = (f"chmod g+{bits} {blocker}" if ids.in_group(gid)
                 else f"chgrp {ids.gid} {blocker} && chmod g+{bits} {blocker}")
    return (f"permission denied: cannot {need} {where}, mode {mode:04o}, owner uid:gid {uid}:{gid}; "
            f"{_who(ids)}. To fix: give one of those groups access, e.g. `{group_fix}` (or `chmod o+{bits}`), "
            f"or set the chart value {CHART_VALUE} (the pod's fsGroup, which Kubernetes adds to the trainer's "
            f"groups) to a group that may {need} it")


def first_problem(paths: Iterable[Path], *, write: bool = False) -> str | None:
    """The diagnosis of the first path this process cannot read (or write), with how many more; None if all can."""
    found = [(path, error) for path in paths if (error := probe(path, write=write)) is not None]
    if not found:
        return None
    path, error = found[0]
    more = f" ({len(found) - 1} more like it)" if len(found) > 1 else ""
    return diagnose(path, error, write=write) + more


def explain(error: BaseException, *, folder: Path | None = None) -> str | None:
    """The diagnosis behind a loader's error, or None when it is no file problem: a permission error
    anywhere in its chain, the path a missing-file error names (also when that file exists but cannot be
    read), else the first file under `folder` this process cannot read."""
    for cause in _chain(error):
        if isinstance(cause, OSError) and denied(cause) and cause.filename:
            return diagnose(Path(os.fsdecode(cause.filename)), cause)
    if isinstance(error, OSError):
        for path in _named_paths(error):
            if not os.path.lexists(path) or probe(path) is not None:
                return diagnose(path, error)
    if folder is not None:
        return first_problem(_files_under(folder))
    return None


def require_folder(path: Path, *, role: str, write: bool = True) -> None:
    """FileAccessError unless this process can use folder `path` (list it and, with `write`, write in it),
    or create it in its nearest existing parent."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    error = probe(existing, write=write)
    if error is not None:
        raise FileAccessError(f"{role} {path}: {diagnose(existing, error, write=write)}")


def denied(error: OSError) -> bool:
    """True for a permission error (EACCES, EPERM)."""
    return isinstance(error, PermissionError) or error.errno in DENIED


def _blocker(path: Path, *, write: bool) -> tuple[Path, str]:
    """The file or folder that refuses access to `path`, and the access it refuses."""
    for parent in reversed(path.parents):  # from the root down: a folder that cannot be searched hides the rest
        if os.path.isdir(parent) and not os.access(parent, os.X_OK):
            return parent, "search"
    if os.path.lexists(path):
        return path, "write" if write else "read"
    existing = path.parent
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    return existing, "write"  # creating `path` needs its parent writable


def _who(ids: ProcessIds) -> str:
    groups = ", ".join(map(str, ids.groups)) or "none"
    return f"the trainer runs as UID {ids.uid} GID {ids.gid} with supplementary groups {groups}"


def _chain(error: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _named_paths(error: OSError) -> list[Path]:
    named = [os.fsdecode(name) for name in (error.filename, error.filename2) if isinstance(name, str | bytes)]
    named += [match.rstrip(".,;:)") for match in _PATH_IN_TEXT.findall(str(error))]
    return [Path(name) for name in dict.fromkeys(named) if name.startswith("/")]


def _files_under(folder: Path) -> list[Path]:
    files: list[Path] = [folder]
    for root, dirs, names in os.walk(folder, onerror=lambda _: None):
        files += [Path(root) / name for name in dirs + names]
        if len(files) > MAX_SCANNED_FILES:
            break
    return files[:MAX_SCANNED_FILES]
