"""Where a version's checkpoint lives: a local folder, or object storage with the digest it
was published with, uploaded by the learner and fetched-and-checked by every server.

A version's `checkpoint_uri` is `file:///abs/folder` (a shared volume) or
`s3://bucket/prefix/<version>` (any S3-compatible store). Its `checkpoint_digest` is
`sha256:<64 hex>` over every file of the folder (relative names and bytes), taken by the
learner before it publishes. An `s3://` checkpoint is fetched into a local cache and served
only if the fetched files give that digest: anything else is `DigestMismatch`, never loaded.
Endpoint and credentials are boto3's own: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, or an instance role.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from learner.policy.registry import PolicyVersion

S3 = "s3://"
REQUIRED_FILES = {
    "lora": ("adapter_config.json", "adapter_model.safetensors"),
    "full": ("config.json",),
}
"""The files a checkpoint of each kind cannot load without."""
CACHE_FOLDER = "checkpoints"


class CheckpointError(RuntimeError):
    """A registry checkpoint cannot be loaded; the message says which file and why."""


class DigestMismatch(CheckpointError):
    """A fetched checkpoint is not the one the registry recorded: refused, never served."""


class FetchFailed(CheckpointError):
    """Object storage did not give the checkpoint (unreachable, denied, nothing there yet):
    nothing was judged about the version, so a server tries again rather than marking it broken."""


def is_remote(uri: str) -> bool:
    return uri.startswith(S3)


def checkpoint_path(uri: str) -> Path:
    """The absolute folder of a `file://` checkpoint URI (`s3://`: `fetch_checkpoint`)."""
    if is_remote(uri):
        raise CheckpointError(f"{uri} is on object storage: read it with fetch_checkpoint")
    if not uri.startswith("file://"):
        raise CheckpointError(
            f"checkpoint URI {uri!r} is neither 'base:<name>', 'file://<path>' nor 's3://...'"
        )
    path = Path(unquote(urlparse(uri).path))  # as `Path.as_uri()` writes it (%20 for spaces)
    if not path.is_absolute() or urlparse(uri).netloc not in ("", "localhost"):
        raise CheckpointError(f"checkpoint URI {uri!r} must hold an absolute path")
    return path


def folder_digest(folder: Path) -> str:
    """`sha256:<hex>` over every file under `folder`: relative names and bytes, in name order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def version_uri(prefix: str, version: str) -> str:
    """`s3://bucket/prefix/<version>` for the learner's ARLOOP_CHECKPOINT_URI."""
    return prefix.rstrip("/") + "/" + version


def upload_checkpoint(folder: Path, uri: str) -> None:
    """Every file of `folder` to `uri` (`s3://bucket/key-prefix`), each under its relative name."""
    bucket, key = _split(uri)
    s3 = _client()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        s3.upload_file(str(path), bucket, f"{key}/{path.relative_to(folder).as_posix()}")


def fetch_checkpoint(record: PolicyVersion, cache_dir: Path) -> Path:
    """The local folder of a version's checkpoint: its own for `file://`; for `s3://`, a copy
    under `cache_dir/checkpoints/` whose digest is the registry's (DigestMismatch if not)."""
    uri = record.checkpoint_uri
    if not is_remote(uri):
        return checkpoint_path(uri)
    expected = record.checkpoint_digest
    if not expected:
        raise CheckpointError(
            f"{record.version}: {uri} has no digest in the registry, so what is fetched cannot "
            "be checked; republish it with a learner that records one"
        )
    target = Path(cache_dir) / CACHE_FOLDER / f"{record.version}-{expected.split(':')[-1][:16]}"
    got = folder_digest(target) if target.is_dir() else None  # checked on every load
    if got != expected:
        shutil.rmtree(target, ignore_errors=True)  # absent, or a cached copy spoiled since
        try:
            _download(uri, target)
        except FetchFailed:
            raise
        except Exception as exc:  # botocore: no endpoint, denied, no such bucket, ...
            raise FetchFailed(
                f"cannot fetch {record.version} from {uri}: {exc}. Check AWS_ENDPOINT_URL and "
                "the credentials; tried again at the next sync"
            ) from exc
        got = folder_digest(target)
    if got != expected:
        shutil.rmtree(target, ignore_errors=True)  # the next try fetches it again
        raise DigestMismatch(
            f"checkpoint of {record.version} at {uri} has digest {got}, but the registry "
            f"recorded {expected} when it was published: the objects changed (or another "
            "upload overwrote them); refused, not served. Republish the version, or roll back"
        )
    return target


def remote_problem(record: PolicyVersion) -> str | None:
    """Why an `s3://` checkpoint cannot load, from a listing (nothing downloaded); None if whole."""
    if record.checkpoint_kind not in REQUIRED_FILES:
        return f"{record.version}: unknown checkpoint kind {record.checkpoint_kind!r}"
    if not record.checkpoint_digest:
        return f"{record.version}: {record.checkpoint_uri} has no digest in the registry"
    try:
        names = _list(record.checkpoint_uri)
    except Exception as exc:  # noqa: BLE001 - botocore raises many types (no endpoint, denied, ...)
        return f"{record.version}: cannot list {record.checkpoint_uri}: {exc}"
    missing = [n for n in REQUIRED_FILES[record.checkpoint_kind] if n not in names]
    if record.checkpoint_kind == "full" and not any(n.endswith(".safetensors") for n in names):
        missing.append("*.safetensors")
    if missing:
        return f"checkpoint {record.checkpoint_uri} of {record.version} has no {', '.join(missing)}"
    return None


def _download(uri: str, target: Path) -> None:
    bucket, key = _split(uri)
    names = _list(uri)
    if not names:
        raise FetchFailed(f"no objects under {uri}; tried again at the next sync")
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(partial, ignore_errors=True)
    s3 = _client()
    try:
        for name in names:
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, f"{key}/{name}", str(partial / name))
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    publish_once(partial, target, names[0])  # another fetch of the same folder may win


def publish_once(partial: Path, target: Path, marker: str) -> None:
    """Rename the finished folder `partial` to `target` (atomic: a crash mid-write never leaves
    a half folder named); when another thread or process published a complete `target` first
    (it holds `marker`), keep theirs and drop `partial`."""
    try:
        os.replace(partial, target)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (target / marker).exists():
            raise


def _list(uri: str) -> list[str]:
    """The relative names of the objects under `uri`."""
    bucket, key = _split(uri)
    names = []
    pages = _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key + "/")
    for page in pages:
        names += [o["Key"][len(key) + 1 :] for o in page.get("Contents", [])]
    return sorted(names)


def _split(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise CheckpointError(f"checkpoint URI {uri!r} is not s3://bucket/prefix")
    return parsed.netloc, parsed.path.strip("/")


def _client() -> Any:
    """A boto3 S3 client configured the AWS way (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)."""
    try:
        import boto3
    except ImportError as exc:
        raise CheckpointError("s3:// checkpoints need boto3: pip install 'arloop[learn]'") from exc
    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)
