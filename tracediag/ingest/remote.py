"""Trace inputs named by URL (``s3://``, ``gs://``, ``az://``, ``abfs://``, ``file://``) through `pyarrow.fs`.

pyarrow is already a dependency and speaks S3, GCS and Azure natively, so no fsspec stack is needed.
The driver lists a URL's prefix and matches its pattern (`expand`), keeping each object's size and
modification time from the listing; each reader opens its own object as a buffered stream where it
runs (`open_stream`), so a trace's bytes never pass through the driver. Credentials come from the
engines' usual environment (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_*``) or from the
same ``--storage-option KEY=VALUE`` the outputs take (polars' key names, mapped by `fs_kwargs`).
`pyarrow.fs` is imported only where a URL is read (it takes 50 ms, paid by every reading worker).
"""

from __future__ import annotations

import fnmatch
import functools
import io
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow.fs as pafs

from tracediag.errors import TracediagError, TraceError, one_line, shown

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_GLOB = re.compile(r"[*?\[]")
STREAM_BUFFER = 8 << 20
"""Bytes fetched per request from an object store (one ranged GET per buffer: 125 per GB)."""

_S3 = ("s3", "s3a")
_GCS = ("gs", "gcs")
_AZURE = ("az", "abfs", "abfss", "adl")

# polars' (object_store's) storage-option names -> pyarrow file system arguments, per store
_OPTION_NAMES: dict[str, dict[str, str]] = {
    "s3": {
        "aws_access_key_id": "access_key",
        "access_key_id": "access_key",
        "aws_secret_access_key": "secret_key",
        "secret_access_key": "secret_key",
        "aws_session_token": "session_token",
        "aws_token": "session_token",
        "session_token": "session_token",
        "token": "session_token",
        "aws_region": "region",
        "aws_default_region": "region",
        "region": "region",
        "aws_endpoint_url": "endpoint_override",
        "aws_endpoint": "endpoint_override",
        "endpoint_url": "endpoint_override",
        "endpoint": "endpoint_override",
        "aws_skip_signature": "anonymous",
        "skip_signature": "anonymous",
        "aws_virtual_hosted_style_request": "force_virtual_addressing",
        "virtual_hosted_style_request": "force_virtual_addressing",
        "aws_allow_http": "",
        "allow_http": "",
    },
    "gcs": {
        "google_skip_signature": "anonymous",
        "skip_signature": "anonymous",
        "google_endpoint": "endpoint_override",
        "endpoint": "endpoint_override",
        "google_project_id": "project_id",
        "project_id": "project_id",
    },
    "azure": {
        "azure_storage_account_name": "account_name",
        "account_name": "account_name",
        "azure_storage_account_key": "account_key",
        "azure_storage_access_key": "account_key",
        "account_key": "account_key",
        "access_key": "account_key",
        "azure_storage_client_id": "client_id",
        "azure_client_id": "client_id",
        "client_id": "client_id",
        "azure_storage_client_secret": "client_secret",
        "azure_client_secret": "client_secret",
        "client_secret": "client_secret",
        "azure_storage_tenant_id": "tenant_id",
        "azure_tenant_id": "tenant_id",
        "tenant_id": "tenant_id",
        "azure_storage_sas_key": "sas_token",
        "azure_storage_sas_token": "sas_token",
        "sas_token": "sas_token",
        "azure_storage_endpoint": "blob_storage_authority",
        "azure_endpoint": "blob_storage_authority",
        "endpoint": "blob_storage_authority",
    },
}
_FAMILY_PREFIX = {"s3": "aws_", "gcs": "google_", "azure": "azure_"}
_WRITE_ONLY = {
    f"aws_{k}"
    for k in (
        "checksum_algorithm", "conditional_put", "copy_if_not_exists", "disable_tagging", "server_side_encryption",
        "sse_kms_key_id", "sse_bucket_key_enabled", "unsigned_payload",
    )
}  # fmt: skip
"""polars' S3 options that concern only writing (the outputs): reading ignores them."""
_BOOLEAN = {"anonymous", "force_virtual_addressing"}


def scheme(source: str | os.PathLike) -> str | None:
    """The URL scheme of `source` in lower case (``s3``, ``file``, ...), or None for a plain path."""
    m = _SCHEME.match(str(source))
    return m.group(1).lower() if m else None


def is_remote(source: str | os.PathLike) -> bool:
    """Whether `source` is a URL read through `pyarrow.fs` (``file://`` included), not a plain path."""
    return scheme(source) is not None


def _store(kind: str) -> str:
    return "s3" if kind in _S3 else "gcs" if kind in _GCS else "azure" if kind in _AZURE else kind


def fs_kwargs(store: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The pyarrow file system arguments for `store` (``s3``, ``gcs``, ``azure``) from storage options.

    Keys of another store are left alone (the same options also configure outputs elsewhere); a key
    of this store's family (``aws_*`` for S3) that pyarrow cannot honour is a `TracediagError`.
    """
    names = _OPTION_NAMES.get(store, {})
    out: dict[str, Any] = {}
    allow_http = False
    for key, value in (storage_options or {}).items():
        low = key.lower()
        if low not in names:
            if low in _WRITE_ONLY:
                continue
            prefix = _FAMILY_PREFIX.get(store)
            if prefix and low.startswith(prefix):
                known = ", ".join(sorted(k for k in names if k.startswith(prefix)))
                msg = f"--storage-option {key}: not supported for reading {store} inputs ({known})"
                raise TracediagError(msg)
            continue
        arg = names[low]
        if arg == "":
            allow_http = str(value).lower() in ("1", "true", "yes")
        elif arg in _BOOLEAN:
            out[arg] = str(value).lower() in ("1", "true", "yes")
        else:
            out[arg] = value
    endpoint = out.get("endpoint_override") or out.get("blob_storage_authority")
    if endpoint:
        m = re.match(r"^(https?)://(.*?)/*$", str(endpoint))
        host_scheme = (m.group(1), m.group(2)) if m else ("http" if allow_http else "https", str(endpoint))
        if store == "azure":
            out["blob_storage_scheme"], out["blob_storage_authority"] = host_scheme
            out["dfs_storage_scheme"], out["dfs_storage_authority"] = host_scheme
        else:
            out["scheme"], out["endpoint_override"] = host_scheme
    return out


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[pafs.FileSystem, str]:
    """The file system holding `url` and the object's path in it. Raises `TracediagError` (one line)."""
    import pyarrow.fs as pafs

    kind = scheme(url)
    if kind is None:
        msg = f"{shown(url)}: not a URL"
        raise TracediagError(msg)
    rest = url[len(kind) + 3 :]
    store = _store(kind)
    try:
        if kind == "file":
            rest = rest.removeprefix("localhost")
            return pafs.LocalFileSystem(), os.path.abspath(rest or "/")
        kw = fs_kwargs(store, storage_options)
        if store == "s3":
            return pafs.S3FileSystem(**_s3_defaults(kw, rest.split("/", 1)[0])), rest
        if store == "gcs":
            return pafs.GcsFileSystem(**kw), rest
        if store == "azure":
            container, _, path = rest.partition("/")
            if "@" in container:  # abfs://container@account.dfs.core.windows.net/path
                container, _, host = container.partition("@")
                kw.setdefault("account_name", host.split(".", 1)[0])
            for arg in ("account_name", "account_key"):
                env = f"AZURE_STORAGE_{arg.upper()}"
                if arg not in kw and os.environ.get(env):
                    kw[arg] = os.environ[env]
            if "account_name" not in kw:
                msg = (
                    f"{shown(url)}: no Azure storage account: set AZURE_STORAGE_ACCOUNT_NAME or "
                    "--storage-option azure_storage_account_name=NAME"
                )
                raise TracediagError(msg)
            return pafs.AzureFileSystem(**kw), f"{container}/{path}".rstrip("/")
        return pafs.FileSystem.from_uri(url)  # hdfs:// and what else this pyarrow knows, without options
    except TracediagError:
        raise
    except (OSError, ValueError, TypeError, ImportError) as e:
        msg = f"{shown(url)}: cannot open its storage ({one_line(str(e))})"
        raise TracediagError(msg) from None


def _s3_defaults(kw: dict[str, Any], bucket: str) -> dict[str, Any]:
    """S3 arguments completed from the AWS SDK's environment that pyarrow does not read itself
    (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``), and the bucket's own region when none is set
    (as `pyarrow.fs.FileSystem.from_uri` does: a request to another region's endpoint fails)."""
    kw = dict(kw)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if "endpoint_override" not in kw and endpoint:
        kw.update(fs_kwargs("s3", {"aws_endpoint_url": endpoint}))
    regional = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if "region" not in kw and "endpoint_override" not in kw and not regional and bucket:
        region = _bucket_region(bucket)
        if region:
            kw["region"] = region
    return kw


@functools.lru_cache(maxsize=64)
def _bucket_region(bucket: str) -> str | None:
    """The AWS region of `bucket` (one anonymous request per bucket and process), None when unknown."""
    import pyarrow.fs as pafs

    try:
        return pafs.resolve_s3_region(bucket)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One object a URL names: its URL, size and modification time as listed, and whether a directory
    (prefix) listing found it."""

    url: str
    size: int | None
    mtime_ns: int | None
    in_directory: bool = False


def storage_error(url: str, e: BaseException) -> Exception:
    """A storage failure as an exception naming the URL: a `TraceError` when retrying cannot help
    (missing object, access denied), else an `OSError` for the engine to retry (a network error)."""
    text = one_line(str(e))
    if isinstance(e, FileNotFoundError) or re.search(r"NoSuchKey|NoSuchBucket|\b404\b|NOT_FOUND", text):
        return TraceError(url, "no such object")
    if isinstance(e, PermissionError) or re.search(
        r"ACCESS_DENIED|AccessDenied|\b40[13]\b|Forbidden|PERMISSION_DENIED|INVALID_ACCESS_KEY_ID|InvalidAccessKeyId|"
        r"SIGNATURE_DOES_NOT_MATCH|SignatureDoesNotMatch|EXPIRED_TOKEN|ExpiredToken|INVALID_CLIENT_TOKEN_ID|"
        r"UNRECOGNIZED_CLIENT|AuthorizationFailure|AuthenticationFailed|Unauthenticated|UNAUTHENTICATED",
        text,
    ):
        return TraceError(url, f"access denied ({text[:200]})")
    return OSError(f"{shown(url)}: cannot read ({text[:300]})")


def _url_of(base_url: str, base_path: str, path: str) -> str:
    """The URL of `path`, found under the listed `base_path` whose URL is `base_url`."""
    rel = path[len(base_path) :].lstrip("/")
    return f"{base_url.rstrip('/')}/{rel}" if rel else base_url


def _info(fs: pafs.FileSystem, path: str, url: str) -> pafs.FileInfo:
    try:
        return fs.get_file_info(path)
    except OSError as e:
        raise storage_error(url, e) from None


def _found(info: pafs.FileInfo, url: str, in_directory: bool) -> RemoteFile:
    return RemoteFile(url, info.size, info.mtime_ns, in_directory)


def expand(
    source: str, storage_options: dict[str, Any] | None = None, *, suffixes: tuple[str, ...] = ()
) -> list[RemoteFile]:
    """The objects `source` names, on the driver: itself; a glob pattern's matches (``*``, ``?``,
    ``[..]`` within one path component, ``**`` across them), sorted; or a prefix ("directory")
    searched recursively for names ending in `suffixes`. A named object that is missing is kept (its
    reader reports it, as for a missing local file); a pattern or prefix that finds nothing, or a
    listing that fails, is a `TracediagError`.
    """
    import pyarrow.fs as pafs

    fs, path = filesystem(source, storage_options)
    if not _GLOB.search(source.split("://", 1)[1]):
        try:
            info = _info(fs, path, source)
        except (TraceError, OSError):  # denied or unreachable: its reader reports it (or retries)
            return [RemoteFile(source, None, None)]
        if info.type != pafs.FileType.Directory:
            return [_found(info, source, False) if info.type == pafs.FileType.File else RemoteFile(source, None, None)]
        found = _list(fs, path, source, recursive=True)
        keep = [_found(i, _url_of(source, path, i.path), True) for i in found if i.base_name.endswith(suffixes)]
        if not keep:
            looked = ", ".join(suffixes)
            msg = f"{shown(source)}: no trace files under this prefix (looked for {looked})"
            raise TracediagError(msg)
        return sorted(keep, key=lambda f: f.url)
    # the URL of the folder above the first component holding a glob character, and the pattern below it
    head, rest = source.split("://", 1)
    parts = rest.split("/")
    first = next(i for i, p in enumerate(parts) if _GLOB.search(p))
    base_url = f"{head}://{'/'.join(parts[:first])}"
    pattern = parts[first:]
    base_fs, base_path = filesystem(base_url, storage_options)
    found = _list(base_fs, base_path, source, recursive=len(pattern) > 1 or "**" in pattern)
    out = []
    for info in found:
        rel = info.path[len(base_path) :].strip("/").split("/")
        if _match(rel, pattern):
            out.append(_found(info, _url_of(base_url, base_path, info.path), False))
    if not out:
        msg = f"{shown(source)}: the pattern matches no object"
        raise TracediagError(msg)
    return sorted(out, key=lambda f: f.url)


def _list(fs: pafs.FileSystem, path: str, url: str, *, recursive: bool) -> list[pafs.FileInfo]:
    """The files (not prefixes) under `path`."""
    import pyarrow.fs as pafs

    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))
    except OSError as e:
        err = storage_error(url, e)
        reason = err.problem if isinstance(err, TraceError) else one_line(str(e))[:300]
        msg = f"{shown(url)}: cannot list ({reason})"
        raise TracediagError(msg) from None
    return [i for i in infos if i.type == pafs.FileType.File]


def _match(parts: list[str], pattern: list[str]) -> bool:
    """Whether path components `parts` match glob components `pattern` (``**``: any number of them)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match(parts[1:], pattern[1:])


def open_stream(url: str, storage_options: dict[str, Any] | None = None) -> tuple[BinaryIO, int | None]:
    """The object at `url` as a buffered stream (read front to back, `STREAM_BUFFER` bytes a request)
    and its size. A missing object or a denied access is a `TraceError` naming the URL."""
    import pyarrow.fs as pafs

    try:
        fs, path = filesystem(url, storage_options)
    except TracediagError as e:
        raise TraceError(url, str(e).split(": ", 1)[-1]) from None
    info = _info(fs, path, url)
    if info.type == pafs.FileType.NotFound:
        raise TraceError(url, "no such object")
    if info.type != pafs.FileType.File:
        raise TraceError(url, "not a regular file (a directory or prefix)")
    try:
        stream = fs.open_input_stream(path, compression=None)  # never "detect" by name: gzip is sniffed
    except OSError as e:
        raise storage_error(url, e) from None
    return io.BufferedReader(stream, STREAM_BUFFER), info.size  # type: ignore[arg-type]


def read_prefix(url: str, size: int, storage_options: dict[str, Any] | None = None) -> bytes:
    """The first `size` raw bytes of the object at `url` (one small ranged GET), for a format check."""
    stream, _ = open_stream(url, storage_options)
    with stream:
        try:
            return stream.raw.read(size)  # type: ignore[attr-defined]  # unbuffered: fetch only these bytes
        except OSError as e:
            raise storage_error(url, e) from None


SPARE_BYTES = 1 << 30
"""Room left free on the temporary folder's disk by a local copy."""


@contextmanager
def local_copy(url: str, storage_options: dict[str, Any] | None = None, *, name: str = "") -> Iterator[Path]:
    """The object at `url` copied to a temporary file on this machine (an SQLite export or a
    ``.nsys-rep`` report cannot be read as a stream), removed on exit. Refused when the copy would
    leave less than `SPARE_BYTES` free."""
    stream, size = open_stream(url, storage_options)
    with stream, tempfile.TemporaryDirectory(prefix="tracediag-url-") as tmp:
        free = shutil.disk_usage(tmp).free - SPARE_BYTES
        if size is not None and size > free:
            raise TraceError(url, f"{size / 1e6:,.0f} MB do not fit in the temporary folder {shown(tmp)}")
        dest = Path(tmp) / (name or url.rstrip("/").rsplit("/", 1)[-1] or "object")
        try:
            with dest.open("wb") as out:
                shutil.copyfileobj(stream, out, STREAM_BUFFER)
        except OSError as e:
            raise storage_error(url, e) from None
        yield dest


def location_key(source: str) -> str:
    """`source` as a key that is equal for two names of one object: a local path (``file://`` too)
    resolved, a URL with its scheme's aliases unified and trailing slashes dropped."""
    kind = scheme(source)
    if kind is None or kind == "file":
        path = source[7:].removeprefix("localhost") if kind else source
        return os.path.realpath(path or "/")
    rest = source[len(kind) + 3 :].rstrip("/")
    return f"{_store(kind)}://{rest}"
