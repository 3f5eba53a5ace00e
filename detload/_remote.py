"""Remote sources: an S3 filesystem built from a URI and the usual AWS environment variables.

Retries come from the AWS SDK inside pyarrow (standard mode: bounded exponential
backoff with jitter). pyarrow drops ``retry_strategy`` when an S3FileSystem is
pickled, so process workers would silently lose it; `RetryingS3FileSystem`
pickles its settings and rebuilds the same filesystem in the worker.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

import pyarrow.fs as pafs

from .errors import OptionError

__all__ = ["DEFAULT_MAX_ATTEMPTS", "RetryingS3FileSystem", "describe_attempts", "s3_from_uri"]

#: Attempts per S3 request (the first try included) unless AWS_MAX_ATTEMPTS says otherwise.
DEFAULT_MAX_ATTEMPTS = 5
#: Seconds to wait for a connection / between bytes of a response. The SDK's own
#: defaults (1 s / 3 s) give up on a busy server; no limit at all could hang.
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_REQUEST_TIMEOUT = 60.0

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


def s3_from_uri(uri: str) -> tuple[RetryingS3FileSystem, str]:
    """(filesystem, "bucket/key") for ``s3://bucket/key[?region=..&endpoint_override=..]``.

    The endpoint comes from the URI, else AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL;
    the region from the URI, else AWS_REGION or AWS_DEFAULT_REGION; credentials
    from the AWS SDK's usual chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
    AWS_SESSION_TOKEN, profiles, instance roles); the retry budget from
    AWS_MAX_ATTEMPTS (default 5 attempts per request).
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
    options.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    options.setdefault("request_timeout", DEFAULT_REQUEST_TIMEOUT)
    # Credentials from the environment are made explicit so that process workers get them too:
    # a forkserver started before they were set would not pass them on.
    access, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if access and secret and not options.get("anonymous"):
        options.update(access_key=access, secret_key=secret)
        token = os.environ.get("AWS_SESSION_TOKEN")
        if token:
            options["session_token"] = token
    attempts = _env_int("AWS_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)
    path = (parts.netloc + "/" + parts.path.lstrip("/")).rstrip("/")
    return RetryingS3FileSystem(max_attempts=attempts, **options), path


def describe_attempts(fs: pafs.FileSystem) -> str:
    """How many attempts a request had, for error messages ("" when unknown)."""
    if isinstance(fs, RetryingS3FileSystem):
        return f" after {fs.max_attempts} attempts per request (AWS_MAX_ATTEMPTS)"
    return ""


def object_uri(fs: pafs.FileSystem, location: str) -> str:
    """A URI naming one object, for messages and cache keys: s3://bucket/key, /abs/path, ..."""
    kind = fs.type_name
    if kind == "local":
        return location
    if kind == "s3":
        endpoint = getattr(fs, "options", {}).get("endpoint_override")
        return f"s3://{location}" + (f" (endpoint {endpoint})" if endpoint else "")
    return f"{kind}://{location}"
