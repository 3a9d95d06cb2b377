"""Where shards live: a local folder or an ``s3://bucket/prefix`` URL, and the start-up checks that
turn a wrong path, a missing bucket or absent credentials into one clear error.

S3 settings come from the environment as boto3 reads them (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``AWS_DEFAULT_REGION``, and ``AWS_ENDPOINT_URL`` for
S3-compatible servers such as MinIO), or from ``storage_options`` (``endpoint_url``, ``region_name``,
keys), which is passed through to litdata.
"""

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mae.compat.litdata import allow_http_downloads
from mae.errors import InputError, UserError

SCHEMES = ("s3",)


def is_remote(url: str | os.PathLike) -> bool:
    """True for an object-storage URL (``s3://...``), False for a local path."""
    return urlparse(os.fspath(url)).scheme in SCHEMES


def join(url: str, *parts: str) -> str:
    """``url/part/...`` for local paths and URLs alike."""
    if is_remote(url):
        return "/".join([url.rstrip("/"), *parts])
    return str(Path(url, *parts))


def endpoint(storage_options: dict[str, Any] | None) -> str | None:
    """The S3 endpoint in use: ``storage_options['endpoint_url']``, else the environment's."""
    options = storage_options or {}
    return (
        options.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )


def allow_plain_http(storage_options: dict[str, Any] | None) -> None:
    """Let litdata's fast (obstore) download path reach an ``http://`` endpoint, such as a MinIO server
    on a private network or a test server on localhost.

    litdata builds its obstore client with fixed client options that leave out ``allow_http``, so
    obstore refuses plain-HTTP endpoints ("builder error: BadScheme") even with ``AWS_ALLOW_HTTP``
    set. Adding the option changes nothing for https endpoints. Called in the main process before
    loader workers start; forked and spawned workers import this module's caller and call it again.
    """
    url = endpoint(storage_options)
    if url is None or urlparse(url).scheme != "http":
        return
    allow_http_downloads()


def s3_client(storage_options: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    """A boto3 S3 client for start-up checks and small files: the endpoint and keys of
    ``storage_options`` or the environment, one attempt, ``timeout`` seconds to connect and read (a
    wrong endpoint fails in seconds instead of retrying for minutes)."""
    import boto3
    from botocore.config import Config

    options = dict(storage_options or {})
    client_keys = (
        "endpoint_url",
        "region_name",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
    )
    kwargs = {k: options[k] for k in client_keys if k in options}
    config = Config(
        connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1, "mode": "standard"}
    )
    return boto3.session.Session().client(
        "s3", config=config, **kwargs
    )  # a new session reads the environment now


def _bucket_key(url: str) -> tuple[str, str]:
    parsed = urlparse(url)
    return parsed.netloc, parsed.path.lstrip("/")


class StorageError(UserError, RuntimeError):
    """A shard location that cannot be read or written; the message names the URL and the fix."""


def _explain(err: Exception, url: str, storage_options: dict[str, Any] | None) -> StorageError:
    """A ``StorageError`` naming ``url`` and what to change, for a boto3/botocore error."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    where = endpoint(storage_options) or "AWS's default endpoint"
    if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
        return StorageError(
            f"no S3 credentials to read {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE) in the environment, or data.storage_options"
        )
    if isinstance(err, ClientError):
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket",):
            return StorageError(
                f"bucket {_bucket_key(url)[0]!r} (of {url}) does not exist at {where}; create it, or "
                "fix the URL or AWS_ENDPOINT_URL"
            )
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
            return StorageError(
                f"{where} refused the credentials for {url} ({code}): check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY / AWS_PROFILE and the bucket's permissions"
            )
        return StorageError(f"S3 error reading {url} at {where}: {code}: {err}")
    if isinstance(err, EndpointConnectionError) or type(err).__name__ in (
        "ConnectTimeoutError",
        "ReadTimeoutError",
    ):
        return StorageError(
            f"cannot reach the S3 endpoint {where} for {url} ({type(err).__name__}); check "
            "AWS_ENDPOINT_URL (or data.storage_options.endpoint_url) and the network"
        )
    return StorageError(f"cannot read {url} at {where}: {type(err).__name__}: {err}")


def read_text(url: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """The text of a small file (``url`` local or ``s3://``), None when it does not exist.

    Raises:
        StorageError: an unreachable endpoint, a missing bucket or refused credentials, naming ``url``.
    """
    if not is_remote(url):
        path = Path(url)
        return path.read_text() if path.is_file() else None
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(url)
    try:
        return s3_client(storage_options).get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    except ClientError as err:
        if str(err.response.get("Error", {}).get("Code")) in ("NoSuchKey", "404"):
            return None
        raise _explain(err, url, storage_options) from err
    except BotoCoreError as err:
        raise _explain(err, url, storage_options) from err


def write_text(url: str, text: str, storage_options: dict[str, Any] | None = None) -> None:
    """Write a small file whole: a local file is replaced atomically, an S3 object in one PUT."""
    if not is_remote(url):
        from mae.io.atomic import atomic_write

        atomic_write(Path(url), lambda tmp: tmp.write_text(text))
        return
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(url)
    try:
        s3_client(storage_options).put_object(Bucket=bucket, Key=key, Body=text.encode())
    except (ClientError, BotoCoreError) as err:
        raise _explain(err, url, storage_options) from err


def exists_any(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether anything is stored at or under ``url`` (a folder with entries, or an S3 prefix).

    Raises:
        StorageError: as ``read_text``.
    """
    if not is_remote(url):
        path = Path(url)
        return path.is_file() or (path.is_dir() and any(path.iterdir()))
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(url)
    try:
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""  # the whole bucket for s3://bucket
        listing = s3_client(storage_options).list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except (ClientError, BotoCoreError) as err:
        raise _explain(err, url, storage_options) from err
    return listing.get("KeyCount", 0) > 0


def read_json(url: str, storage_options: dict[str, Any] | None = None) -> dict | None:
    """A small JSON file as a dict, None when it does not exist.

    Raises:
        ValueError: the file is not JSON, naming it.
    """
    text = read_text(url, storage_options)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{url} is not valid JSON ({err})") from err


def write_json(url: str, data: dict, storage_options: dict[str, Any] | None = None) -> None:
    """``write_text`` of ``data`` as indented JSON."""
    write_text(url, json.dumps(data, indent=1) + "\n", storage_options)


def delete(url: str, storage_options: dict[str, Any] | None = None) -> None:
    """Remove one file or object if it exists."""
    if not is_remote(url):
        Path(url).unlink(missing_ok=True)
        return
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(url)
    try:
        s3_client(storage_options).delete_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError) as err:
        raise _explain(err, url, storage_options) from err


def list_files(url: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Every file (local: also links and other non-folders, links not followed) or object under
    ``url``, as sorted ``/``-separated paths relative to it; [] when nothing is there.

    Raises:
        StorageError: as ``read_text``.
    """
    if not is_remote(url):
        return sorted(_local_files(Path(url), Path(url)))
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(url)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    try:
        pages = (
            s3_client(storage_options).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(o["Key"][len(prefix) :] for page in pages for o in page.get("Contents", []))
    except (ClientError, BotoCoreError) as err:
        raise _explain(err, url, storage_options) from err


def _local_files(folder: Path, top: Path) -> list[str]:
    """``list_files`` of a local folder (recursive; a missing folder has none)."""
    if not folder.is_dir():
        return []
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                found += _local_files(Path(entry.path), top)
            else:
                found.append(Path(entry.path).relative_to(top).as_posix())
    return found


def delete_files(url: str, paths: list[str], storage_options: dict[str, Any] | None = None) -> None:
    """Remove the files or objects at ``url/<path>`` for ``paths`` relative to ``url`` (as
    ``list_files`` gives them), and local folders below ``url`` that this leaves empty.

    Raises:
        StorageError: as ``read_text``, or an object S3 did not delete, naming it.
    """
    if not is_remote(url):
        folders = set()
        for path in paths:
            target = Path(url, path)
            target.unlink(missing_ok=True)
            folders.update(p for p in target.parents if p.is_relative_to(url) and p != Path(url))
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):  # deepest first
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        return
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(url)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    client = s3_client(storage_options)
    for start in range(0, len(paths), 1000):  # S3's limit per request
        batch = [{"Key": prefix + path} for path in paths[start : start + 1000]]
        try:
            response = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        except (ClientError, BotoCoreError) as err:
            raise _explain(err, url, storage_options) from err
        if response.get("Errors"):
            first = response["Errors"][0]
            raise StorageError(
                f"S3 did not delete {len(response['Errors'])} object(s) under {url}, e.g. "
                f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
            )
