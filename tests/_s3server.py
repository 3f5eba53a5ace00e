"""A real S3 server for tests and benchmarks: moto_server on a free loopback port, and a fault proxy.

`MotoServer` starts ``moto_server`` as a subprocess (no in-process mocking of the
S3 client) and stops it. `FaultProxy` is a small threaded HTTP forwarder on
loopback that logs every request and can answer 503, throttle, drop the
connection or stall (read the request, never answer) for a fraction of
requests, or for all of them.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import xxhash

BUCKET = "test-bucket"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _moto_command() -> list[str] | None:
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    return [exe] if os.path.exists(exe) else None


class MotoServer:
    """``moto_server`` on 127.0.0.1:<free port>; use as a context manager."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> MotoServer:
        cmd = _moto_command()
        if cmd is None:
            raise RuntimeError("moto_server not found; install moto[server]")
        self.proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"moto_server did not start on port {self.port}") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def client(self) -> Any:
        """A boto3 client for set-up (plain PUTs; moto and pyarrow's multipart uploads disagree)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def upload_dir(self, local: str | os.PathLike[str], prefix: str, bucket: str = BUCKET) -> str:
        """Copy a local folder to s3://bucket/prefix; returns that URI."""
        c = self.client()
        try:
            c.create_bucket(Bucket=bucket)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        local = os.fspath(local)
        for dirpath, _, names in os.walk(local):
            for name in sorted(names):
                src = os.path.join(dirpath, name)
                rel = os.path.relpath(src, local).replace(os.sep, "/")
                self.put(f"{prefix}/{rel}", Path(src).read_bytes(), bucket)
        return f"s3://{bucket}/{prefix}"

    def put(self, key: str, data: bytes, bucket: str = BUCKET) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int  # 0: connection dropped, -1: stalled
    body_bytes: int


class FaultProxy:
    """Forwards HTTP to ``upstream``; ``mode`` decides faults.

    ``mode``: "ok" (forward everything), "fraction" (``fraction`` of requests get
    a fault, but one request never fails more than ``max_repeats`` times in a
    row, so a retry budget of ``max_repeats + 1`` attempts always gets through),
    "all" (every request gets a fault), "parquet" (every request for a .parquet
    object, so listing works and reading fails). ``faults`` cycles through "503"
    (ServiceUnavailable), "throttle" (503 SlowDown), "drop" (connection reset
    before any response) and "stall" (the request is read and never answered, the
    connection kept open, as a hung server or load balancer would; logged with
    status -1, held until `release` or the proxy stops).
    """

    def __init__(self, upstream_port: int, *, mode: str = "ok", fraction: float = 0.2,
                 faults: tuple[str, ...] = ("503", "drop"), max_repeats: int = 2, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.mode = mode
        self.fraction = fraction
        self.faults = faults
        self.max_repeats = max_repeats
        self.seed = seed
        self.log: list[Request] = []
        self._lock = threading.Lock()
        self._n = 0
        self._repeats: dict[tuple[str, str, str | None], int] = {}
        self._stalls = threading.Event()  # set: the stalled requests are let go
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def release(self) -> None:
        """Let every stalled request go (its connection is closed unanswered); later ones stall anew."""
        with self._lock:
            stalls, self._stalls = self._stalls, threading.Event()
        stalls.set()

    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()

    def gets(self) -> list[Request]:
        with self._lock:
            return [r for r in self.log if r.method == "GET" and r.range is not None]

    def _decide(self, key: tuple[str, str, str | None]) -> str | None:
        with self._lock:
            n = self._n
            self._n += 1
            if self.mode == "ok":
                return None
            kind = self.faults[n % len(self.faults)]
            if self.mode == "all":
                return kind
            if self.mode == "parquet":
                return kind if key[1].split("?")[0].endswith(".parquet") else None
            h = xxhash.xxh3_64_intdigest(struct.pack("<QQ", self.seed, n))
            if (h % 10_000) >= self.fraction * 10_000 or self._repeats.get(key, 0) >= self.max_repeats:
                self._repeats.pop(key, None)
                return None
            self._repeats[key] = self._repeats.get(key, 0) + 1
            return kind

    def _record(self, req: Request) -> None:
        with self._lock:
            self.log.append(req)

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        rng = h.headers.get("Range")
        fault = self._decide((h.command, h.path, rng))
        if fault == "stall":
            self._record(Request(h.command, h.path, rng, -1, 0))
            with self._lock:
                stalls = self._stalls
            stalls.wait()
            h.close_connection = True
            return
        if fault == "drop":
            self._record(Request(h.command, h.path, rng, 0, 0))
            # SO_LINGER 0: close with a TCP reset, as a dying load balancer would.
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.close_connection = True
            return
        if fault in ("503", "throttle"):
            code = "SlowDown" if fault == "throttle" else "ServiceUnavailable"
            payload = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                       f"<Message>fault proxy: {code}</Message></Error>").encode()
            self._record(Request(h.command, h.path, rng, 503, 0))
            h.send_response(503)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(payload) if h.command != "HEAD" else 0))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(payload)
            return
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in ("connection", "proxy-connection")}
            conn.request(h.command, h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self._record(Request(h.command, h.path, rng, resp.status, len(data)))
            h.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() in ("connection", "transfer-encoding", "keep-alive", "server", "date"):
                    continue
                if k.lower() == "content-length" and h.command != "HEAD":
                    continue
                h.send_header(k, v)
            if h.command != "HEAD":
                h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
        finally:
            conn.close()


def s3_env(endpoint: str, **extra: str) -> dict[str, str]:
    """Environment variables that point the AWS SDK (and detload) at ``endpoint``."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true", **extra}



def write_sample_dataset(root: str | os.PathLike[str], files: dict[str, list[int]], *, seed: int = 0,
                         compression: str = "snappy") -> str:
    """Parquet files with fixed, string, list, fixed-size-list and timestamp columns.

    ``files`` maps a relative path to its row-group sizes. Values depend on
    ``seed`` and the path, so rewriting a file with another seed changes its
    content while (with ``compression="none"``) keeping its size.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = os.fspath(root)
    base = 0
    for rel, groups in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rng = np.random.default_rng([seed, xxhash.xxh3_64_intdigest(rel.encode()) & 0xFFFFFFFF])
        n = sum(groups)
        ids = np.arange(base, base + n, dtype=np.int64)
        base += n
        table = pa.table({
            "id": ids,
            "x": rng.random(n).astype(np.float32),
            "label": rng.integers(0, 2, n).astype(np.int8),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 4).astype(np.float32)), 4),
            "s": pa.array([f"r{int(i)}-{int(v):06d}" for i, v in zip(ids, rng.integers(0, 10**6, n))]),
            "hist": pa.array([list(range(int(i) % 4)) for i in ids], pa.list_(pa.int32())),
            "ts": pa.array(ids.astype("datetime64[us]")),
        })
        writer = pq.ParquetWriter(path, table.schema, compression=compression,
                                  use_dictionary=compression != "none", write_statistics=compression != "none")
        at = 0
        for g in groups:
            writer.write_table(table.slice(at, g), row_group_size=max(g, 1))
            at += g
        writer.close()
    return root
