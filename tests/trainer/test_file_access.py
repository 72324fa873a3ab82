"""Files the trainer may not read: named with their mode, owner and the trainer's ids, never as "No such file"."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from memfit_trainer.file_access import (
    FileAccessError,
    ProcessIds,
    denied_message,
    diagnose,
    explain,
    probe,
    require_folder,
)
from trainer_support import run_as_user

POD = ProcessIds(uid=1000, gid=1000, groups=(1000,))  # runAsUser, runAsGroup and fsGroup 1000
OTHER_UID = 4242  # a user that owns nothing here
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another UID needs root")

MESSAGES = {
    "root's 0600 file, pod not in its group": (
        {"path": "/v/models/tiny-llama/model.safetensors", "blocker": "/v/models/tiny-llama/model.safetensors",
         "need": "read", "mode": 0o600, "uid": 0, "gid": 0, "folder": False},
        ["cannot read file /v/models/tiny-llama/model.safetensors,", "mode 0600", "owner uid:gid 0:0",
         "UID 1000 GID 1000 with supplementary groups 1000",
         "`chgrp 1000 /v/models/tiny-llama/model.safetensors && chmod g+r /v/models/tiny-llama/model.safetensors`",
         "`chmod o+r`", "trainer.fsGroup"],
    ),
    "file of the pod's group without g+r": (
        {"path": "/v/data/train.jsonl", "blocker": "/v/data/train.jsonl", "need": "read", "mode": 0o600,
         "uid": 0, "gid": 1000, "folder": False},
        ["mode 0600", "owner uid:gid 0:1000", "`chmod g+r /v/data/train.jsonl`"],
    ),
    "folder above the file not searchable": (
        {"path": "/v/models/tiny-llama/config.json", "blocker": "/v/models", "need": "search", "mode": 0o700,
         "uid": 0, "gid": 0, "folder": True},
        ["cannot search folder /v/models (above /v/models/tiny-llama/config.json)", "mode 0700",
         "chmod g+x /v/models`"],
    ),
    "checkpoint folder not writable": (
        {"path": "/checkpoints", "blocker": "/checkpoints", "need": "write", "mode": 0o755, "uid": 0, "gid": 0,
         "folder": True},
        ["cannot write folder /checkpoints,", "mode 0755", "chmod g+wx /checkpoints`"],
    ),
}


@pytest.mark.parametrize("case", MESSAGES, ids=list(MESSAGES))
def test_denied_message_names_the_file_its_mode_owner_and_the_fix(case: str) -> None:
    fields, expected = MESSAGES[case]
    message = denied_message(Path(str(fields.pop("path"))), blocker=Path(str(fields.pop("blocker"))),
                             ids=POD, **fields)  # type: ignore[arg-type]
    for words in expected:
        assert words in message, (words, message)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A 0600 weights file, owned by another user where this test may give it away (root)."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"weights")
    path.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID)
    return path


def test_a_permission_error_is_diagnosed_from_the_file_itself(secret_file: Path) -> None:
    """A real PermissionError (what open() raises for the pod's user; root is never refused): the
    diagnosis reads the file's mode and owner from the file system."""
    info = secret_file.stat()
    error = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(secret_file))
    message = diagnose(secret_file, error, ids=POD)
    assert message.startswith(f"permission denied: cannot read file {secret_file},"), message
    assert f"mode 0600, owner uid:gid {info.st_uid}:{info.st_gid};" in message
    assert "the trainer runs as UID 1000 GID 1000 with supplementary groups 1000." in message


def test_a_permission_error_under_a_loaders_error_is_found(secret_file: Path) -> None:
    """transformers re-raises the tokenizer's PermissionError as another OSError: the chain names the file."""
    try:
        try:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(secret_file))
        except PermissionError as inner:
            raise OSError("Can't load tokenizer for '/memfit/volumes/models/tiny-llama'") from inner
    except OSError as outer:
        message = explain(outer)
    assert message is not None and f"cannot read file {secret_file}" in message and "mode 0600" in message


def test_a_file_that_does_not_exist_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "model.safetensors"
    assert isinstance(probe(missing), FileNotFoundError)
    assert diagnose(missing, FileNotFoundError(errno.ENOENT, "No such file or directory", str(missing))) \
        == f"{missing} does not exist"
    # safetensors' own wording: no errno, the path in the text only.
    assert explain(FileNotFoundError(f"No such file or directory: {missing}")) == f"{missing} does not exist"
    assert explain(OSError("Can't load the model from https://hub.example/org/model")) is None


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may search (pytest's tmp_path is 0700 under root)."""
    folder = Path(tempfile.mkdtemp(prefix="memfit-access-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    for path in sorted(folder.rglob("*"), reverse=True):
        path.chmod(0o700)
        path.rmdir() if path.is_dir() else path.unlink()
    folder.rmdir()


@ROOT_ONLY
def test_the_pods_user_is_refused_roots_0600_file(shared_dir: Path, tmp_path: Path) -> None:
    """The reported case, for real: a 0600 file owned by root, read by a process running as another UID.
    safetensors reports it as "No such file or directory: <path>"; the diagnosis says permission denied."""
    weights = shared_dir / "model.safetensors"
    weights.write_bytes(b"weights")
    weights.chmod(0o600)
    hidden = tmp_path / "config.json"  # under pytest's 0700 folder of root
    hidden.write_text("{}")

    def as_pod() -> dict[str, object]:
        try:
            weights.read_bytes()
            opened = "read"
        except PermissionError as error:
            opened = type(error).__name__
        with pytest.raises(FileAccessError) as refused:
            require_folder(shared_dir / "checkpoints", role="checkpoint folder")
        return {"opened": opened, "probe": type(probe(weights)).__name__,
                "safetensors": explain(FileNotFoundError(f"No such file or directory: {weights}")),
                "hidden": diagnose(hidden, PermissionError(errno.EACCES, "Permission denied", str(hidden))),
                "checkpoints": str(refused.value)}

    seen = run_as_user(OTHER_UID, as_pod)
    assert seen["opened"] == "PermissionError" and seen["probe"] == "PermissionError"
    expected = (f"permission denied: cannot read file {weights}, mode 0600, owner uid:gid 0:0; the trainer runs as "
                f"UID {OTHER_UID} GID {OTHER_UID} with supplementary groups {OTHER_UID}. To fix: give one of those "
                f"groups access, e.g. `chgrp {OTHER_UID} {weights} && chmod g+r {weights}` (or `chmod o+r`), or "
                "set the chart value trainer.fsGroup")
    assert seen["safetensors"].startswith(expected), seen["safetensors"]
    blocked = next(p for p in reversed(hidden.parents) if stat.S_IMODE(p.stat().st_mode) & 0o001 == 0)
    assert f"cannot search folder {blocked} (above {hidden})" in seen["hidden"], seen["hidden"]
    assert seen["checkpoints"].startswith(f"checkpoint folder {shared_dir / 'checkpoints'}: permission denied: "
                                          f"cannot write folder {shared_dir}, mode 0755"), seen["checkpoints"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file whatever its mode")
def test_an_unreadable_file_is_refused_and_diagnosed(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("{}\n")
    path.chmod(0o000)
    with pytest.raises(PermissionError) as opened:
        path.read_text()
    error = probe(path)
    assert isinstance(error, PermissionError)
    message = diagnose(path, opened.value)
    assert f"cannot read file {path}, mode 0000, owner uid:gid {os.getuid()}:{os.getgid()}" in message, message
