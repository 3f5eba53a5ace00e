"""Remote sources: an S3 filesystem built from a URI and the usual AWS environment variables,
and how a source string maps onto a filesystem the user passed (``path_on``).

Retries come from the AWS SDK inside pyarrow (standard mode: bounded exponential
backoff with jitter). pyarrow drops ``retry_strategy`` when an S3FileSystem is
pickled, so process workers would silently lose it; `RetryingS3FileSystem`
pickles its settings and rebuilds the same filesystem in the worker.

A thread cannot be interrupted in a read, and pyarrow's exit-time S3 finalizer
waits for every request still in flight: a read stuck when the loader gave up
(WorkerStalledError) would hold the interpreter's exit for as long as its
attempts last. So a loader's filesystem gets timeouts that end a request, all its
attempts included, within about ``stall_timeout`` (`s3_timeouts`).
"""

from __future__ import annotations

import math
import os
import re
import urllib.parse
from typing import Any

import pyarrow.fs as pafs

from .errors import OptionError

__all__ = ["DEFAULT_MAX_ATTEMPTS", "RetryingS3FileSystem", "describe_attempts", "display_uri", "object_uri",
           "path_on", "s3_from_uri", "s3_timeouts"]

#: Attempts per S3 request (the first try included) unless AWS_MAX_ATTEMPTS says otherwise.
DEFAULT_MAX_ATTEMPTS = 5
#: Seconds to wait for a connection / between bytes of a response. The SDK's own
#: defaults (1 s / 3 s) give up on a busy server; no limit at all could hang.
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_REQUEST_TIMEOUT = 60.0
#: The shortest timeouts set: the SDK (curl) counts the request timeout in whole seconds, and 0 is none at all.
MIN_TIMEOUT = 1.0

# Query parameters of an s3:// URI that become S3FileSystem options (pyarrow's spelling).
_URI_OPTIONS = {"region": str, "endpoint_override": str, "scheme": str, "connect_timeout": float,
                "request_timeout": float, "anonymous": lambda v: v.lower() in ("1", "true", "yes")}


class RetryingS3FileSystem(pafs.S3FileSystem):
    """An S3FileSystem that keeps its retry budget when pickled to a worker process."""

    def __init__(self, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS, **options: Any) -> None:
        super().__init__(retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=max_attempts), **options)
        self.max_attempts = max_attempts
        self.options = dict(options)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.options, self.max_attempts))


def _rebuild(options: dict[str, Any], max_attempts: int) -> RetryingS3FileSystem:
    return RetryingS3FileSystem(max_attempts=max_attempts, **options)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise OptionError(f"{name} must be >= 1, got {value}")
    return value


def s3_timeouts(stall_timeout: float | None, attempts: int) -> tuple[float, float]:
    """(connect, request) timeouts per attempt with which a request of ``attempts`` attempts
    gives up within about ``stall_timeout`` seconds (None: the defaults, 10 s and 60 s).

    Each is ``stall_timeout / attempts``, at most its default and at least `MIN_TIMEOUT`;
    the request timeout (the longest wait for the next byte of a response) in whole
    seconds, as the SDK counts it. A request that gets no answer then gives up after
    ``attempts x request`` seconds (about ``stall_timeout``, at least ``attempts`` seconds)
    plus the SDK's backoff between attempts, a random share of 1, 2, 4, 8, ... s (at
    most 15 s over 5 attempts). The retry budget itself stays the user's: a 503 is retried
    as often whatever the stall timeout. The defaults (300 s, 5 attempts) give the defaults.
    """
    if stall_timeout is None:
        return DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT
    share = stall_timeout / attempts
    connect = min(DEFAULT_CONNECT_TIMEOUT, max(MIN_TIMEOUT, share))
    request = min(DEFAULT_REQUEST_TIMEOUT, max(MIN_TIMEOUT, float(math.floor(share))))
    return connect, request


def s3_from_uri(uri: str, stall_timeout: float | None = None) -> tuple[RetryingS3FileSystem, str]:
    """(filesystem, "bucket/key") for ``s3://bucket/key[?region=..&endpoint_override=..]``.

    The endpoint comes from the URI, else AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL;
    the region from the URI, else AWS_REGION or AWS_DEFAULT_REGION; credentials
    from the AWS SDK's usual chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
    AWS_SESSION_TOKEN, profiles, instance roles); the retry budget from
    AWS_MAX_ATTEMPTS (default 5 attempts per request); the timeouts from the URI,
    else from the loader's ``stall_timeout`` (`s3_timeouts`).
    """
    parts = urllib.parse.urlsplit(uri)
    if not parts.netloc:
        raise OptionError(f"{uri!r} names no bucket; expected s3://bucket/prefix")
    options: dict[str, Any] = {}
    for key, values in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items():
        if key not in _URI_OPTIONS:
            raise OptionError(f"unknown option {key!r} in {uri!r}; known: {sorted(_URI_OPTIONS)}")
        try:
            options[key] = _URI_OPTIONS[key](values[-1])  # type: ignore[operator]
        except ValueError:
            raise OptionError(f"bad value {values[-1]!r} for {key!r} in {uri!r}") from None
    endpoint = options.pop("endpoint_override", None) or os.environ.get("AWS_ENDPOINT_URL_S3") \
        or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        if "://" in endpoint:
            scheme, _, endpoint = endpoint.partition("://")
            options.setdefault("scheme", scheme)
        options["endpoint_override"] = endpoint.rstrip("/")
    region = options.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    elif endpoint:
        # A custom endpoint (MinIO, a local server) has no region to look up.
        options["region"] = "us-east-1"
    attempts = _env_int("AWS_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)
    connect, request = s3_timeouts(stall_timeout, attempts)
    options.setdefault("connect_timeout", connect)
    options.setdefault("request_timeout", request)
    # Credentials from the environment are made explicit so that process workers get them too:
    # a forkserver started before they were set would not pass them on.
    access, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if access and secret and not options.get("anonymous"):
        options.update(access_key=access, secret_key=secret)
        token = os.environ.get("AWS_SESSION_TOKEN")
        if token:
            options["session_token"] = token
    path = (parts.netloc + "/" + parts.path.lstrip("/")).rstrip("/")
    return RetryingS3FileSystem(max_attempts=attempts, **options), path


#: URI schemes a pyarrow filesystem (by ``type_name``) takes, the first one canonical. Only
#: these two forms are rewritten: "scheme://bucket/key" is "bucket/key" on the filesystem.
#: Other types (HDFS's host in the URI, Azure's container@account) take paths only.
_BUCKET_SCHEMES = {"s3": ("s3", "s3a"), "gcs": ("gs", "gcs")}
#: Object stores, whose paths are "bucket/key" and never start with a separator.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"})
_URI_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _fsspec(fs: pafs.FileSystem) -> Any:
    """The fsspec filesystem inside a ``PyFileSystem(FSSpecHandler(...))``, else None."""
    handler = getattr(fs, "handler", None) if isinstance(fs, pafs.PyFileSystem) else None
    return getattr(handler, "fs", None)


def _schemes(fs: pafs.FileSystem) -> tuple[str, ...]:
    inner = _fsspec(fs)
    if inner is not None:
        protocol = inner.protocol
        protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
        # Aliases of one store: an fsspec filesystem may list only one of them.
        for aliases in _BUCKET_SCHEMES.values():
            if set(aliases) & set(protocols):
                protocols += tuple(a for a in aliases if a not in protocols)
        return protocols
    if fs.type_name == "local":
        return ("file",)
    return _BUCKET_SCHEMES.get(fs.type_name, ())


def _describe(fs: pafs.FileSystem) -> str:
    inner = _fsspec(fs)
    if inner is not None:
        return f"the fsspec filesystem {type(inner).__name__} ({'/'.join(_schemes(fs))})"
    return f"a pyarrow {type(fs).__name__}"


def _forms(fs: pafs.FileSystem) -> str:
    """The source forms ``fs`` takes, for messages."""
    schemes = _schemes(fs)
    if "file" in schemes:
        return "a local path (or file:// URI)"
    if _OBJECT_STORES.intersection(schemes):
        return f"'bucket/prefix' or '{schemes[0]}://bucket/prefix'"
    if schemes:
        return f"a path on it or a {schemes[0]}:// URI"
    return "a path on it (no URI)"


def path_on(fs: pafs.FileSystem, source: str) -> str:
    """``source`` (a path, a glob or a URI) as a path on the filesystem the user passed.

    A URI is accepted when its scheme is the filesystem's: ``s3://bucket/key`` on an
    S3 filesystem is ``bucket/key``. OptionError when the two do not fit together, naming
    the form to pass (pyarrow would say "got a URI" or "Path cannot start with a separator").
    """
    schemes = _schemes(fs)
    local = "file" in schemes
    m = _URI_RE.match(source)
    if m is not None:
        scheme = m.group(1).lower()
        if scheme not in schemes:
            raise OptionError(
                f"source {source!r} is a URI ({scheme}://), but Storage.filesystem is {_describe(fs)}, which takes "
                f"{_forms(fs)}: pass that form, or leave the filesystem out"
                + (" (detload opens s3:// URIs itself)" if scheme in ("s3", "s3a") else "")
            )
        rest = source[m.end():]
        if "?" in rest and not local:
            raise OptionError(
                f"source {source!r} carries URI options, which apply only when detload opens the URI "
                "itself: with Storage.filesystem, set them on the filesystem and pass the URI without them"
            )
        inner = _fsspec(fs)
        if inner is not None:
            return str(inner._strip_protocol(source))
        if local:
            return os.path.abspath(rest)
        return rest.rstrip("/")
    if source.startswith(("/", os.sep)) and _OBJECT_STORES.intersection(schemes):
        raise OptionError(
            f"source {source!r} is an absolute local path, but Storage.filesystem is {_describe(fs)}, which takes "
            f"{_forms(fs)}: pass that form, or leave the filesystem out to read local files"
        )
    inner = _fsspec(fs)
    if inner is not None:
        return str(inner._strip_protocol(source))
    return os.path.abspath(source) if local else source


def display_uri(fs: pafs.FileSystem, location: str) -> str:
    """``location`` on ``fs`` as the user would write it, for messages and reprs: s3://bucket/key, /abs/path."""
    kind = fs.type_name
    if kind == "local":
        return location
    inner = _fsspec(fs)
    if inner is not None:
        try:
            return str(inner.unstrip_protocol(location))
        except Exception:  # noqa: BLE001 - a message must not fail on an odd filesystem
            return location
    schemes = _BUCKET_SCHEMES.get(kind)
    return f"{schemes[0]}://{location}" if schemes else f"{kind}://{location}"


def describe_attempts(fs: pafs.FileSystem) -> str:
    """How many attempts a request had, for error messages ("" when unknown)."""
    if isinstance(fs, RetryingS3FileSystem):
        return f" after {fs.max_attempts} attempts per request (AWS_MAX_ATTEMPTS)"
    return ""


def object_uri(fs: pafs.FileSystem, location: str) -> str:
    """A URI naming one object, for messages and cache keys: s3://bucket/key (endpoint ...), /abs/path, ...

    Cache keys hash it: its output for a given filesystem must not change.
    """
    kind = fs.type_name
    if kind == "local":
        return location
    if kind == "s3":
        endpoint = getattr(fs, "options", {}).get("endpoint_override")
        return f"s3://{location}" + (f" (endpoint {endpoint})" if endpoint else "")
    return f"{kind}://{location}"
