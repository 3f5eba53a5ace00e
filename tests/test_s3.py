"""S3 sources against a real moto_server on loopback, through a fault proxy that logs every request.

Checks: the same manifest as the local copy (cold and warm cache, several
worker counts, both pools); ranged reads of only the requested columns; no
source reads in warm epochs; transient faults retried; a clear error within
the retry budget when everything fails; a replaced object never served stale;
a process whose loader met a server that stopped answering exits soon after close().
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import subprocess
import sys
import threading

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _s3server import BUCKET, CREDENTIALS, FaultProxy, MotoServer, s3_env, write_sample_dataset  # noqa: E402
from leaks import wait_until  # noqa: E402

import detload
from detload import (  # noqa: E402
    DataError,
    DatasetError,
    EmptyDatasetError,
    Loader,
    OptionError,
    SkippedFilesWarning,
    SourceError,
    WorkerError,
    WorkerStalledError,
)
from detload._cache import cache_info  # noqa: E402
from detload._storage import RetryingS3FileSystem, s3_from_uri, s3_timeouts  # noqa: E402
from detload.cli import main as cli  # noqa: E402
from detload.verify import verify  # noqa: E402

FILES = {"a.parquet": [300, 200, 157], "b.parquet": [250, 250], "sub/c.parquet": [211]}
OPTS = dict(batch_size=128, seed=7, order="windowed", shuffle_window=2)

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """(moto server, proxy in front of it, local dataset, its s3:// URI, local reference manifest)."""
    base = tmp_path_factory.mktemp("s3")
    local = write_sample_dataset(base / "data", FILES)
    with MotoServer() as moto, FaultProxy(moto.port) as proxy, pytest.MonkeyPatch.context() as mp:
        for k, v in s3_env(proxy.endpoint, AWS_MAX_ATTEMPTS="3").items():
            mp.setenv(k, v)
        uri = moto.upload_dir(local, "ds")
        ref = base / "ref.jsonl"
        run(local, ref)
        yield moto, proxy, local, uri, ref


@pytest.fixture
def proxy(s3):
    p = s3[1]
    p.mode, p.fraction, p.faults = "ok", 0.2, ("503", "drop")
    p.reset_log()
    yield p
    p.mode = "ok"
    p.release()


def run(source, manifest, *, epochs=2, **kw):
    with Loader(source, manifest=str(manifest), **{**OPTS, **kw}) as loader:
        for e in range(epochs):
            loader.set_epoch(e)
            for _ in loader:
                pass


def same(a, b):
    res = verify(str(a), str(b))
    assert res.identical, res.message


@pytest.mark.parametrize("pool,workers", [("thread", 1), ("thread", 3), ("process", 2)])
def test_s3_cold_and_warm_match_the_local_copy(s3, proxy, tmp_path, pool, workers):
    _, _, _, uri, ref = s3
    run(uri, tmp_path / "plain.jsonl", pool=pool, workers=workers)
    cache = tmp_path / "cache"
    run(uri, tmp_path / "cold.jsonl", pool=pool, workers=workers, cache=cache)
    with Loader(uri, cache=cache, pool=pool, workers=workers % 3 + 1,
                manifest=str(tmp_path / "warm.jsonl"), **OPTS) as loader:
        proxy.reset_log()  # discovery (listing, footers) is done; iteration must fetch nothing
        for e in range(2):
            loader.set_epoch(e)
            for _ in loader:
                pass
    assert proxy.log == []
    for name in ("plain", "cold", "warm"):
        same(ref, tmp_path / f"{name}.jsonl")
    assert cache_info(cache, verify=True)["corrupt"] == []


def test_reads_fetch_only_the_requested_columns(s3, proxy, tmp_path):
    moto, _, _, _, _ = s3
    local = write_sample_dataset(tmp_path / "wide", {"w.parquet": [4000, 4000]}, compression="none")
    uri = moto.upload_dir(local, "wide")
    md = pq.ParquetFile(os.path.join(local, "w.parquet")).metadata
    size = os.path.getsize(os.path.join(local, "w.parquet"))
    col = md.schema.to_arrow_schema().get_field_index("x")
    x_bytes = sum(md.row_group(g).column(col).total_compressed_size for g in range(md.num_row_groups))
    with Loader(uri, columns=["x"], batch_size=1000, seed=1, workers=1) as loader:
        proxy.reset_log()
        for _ in loader:
            pass
    gets = proxy.gets()
    footer = [r for r in gets if r.range and r.range.endswith(f"-{size - 1}")]
    data = [r for r in gets if r not in footer]
    fetched = sum(r.body_bytes for r in data)
    assert 1 <= len(data) <= md.num_row_groups  # pre-buffered: one coalesced request per row group
    assert x_bytes <= fetched <= x_bytes + 1024, (fetched, x_bytes)
    assert fetched < size / 10  # x is a small slice of the file
    assert all(r.method in ("GET", "HEAD") for r in proxy.log)


def test_transient_faults_are_retried_and_change_nothing(s3, proxy, tmp_path, pool):
    _, _, _, uri, ref = s3
    proxy.mode, proxy.fraction, proxy.faults = "fraction", 0.5, ("503", "drop", "throttle")
    run(uri, tmp_path / "faulty.jsonl", pool=pool, workers=2, cache=tmp_path / "cache")
    faults = [r for r in proxy.log if r.status in (0, 503)]
    assert len(faults) >= 5, "the proxy injected too few faults for the test to mean anything"
    same(ref, tmp_path / "faulty.jsonl")


def test_every_request_failing_gives_a_clear_error_within_the_budget(s3, proxy, monkeypatch, pool):
    _, _, _, uri, _ = s3
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    # stall_timeout turns a hang into WorkerStalledError, which must not be what we get.
    loader = Loader(uri, pool=detload.Pool(kind=pool, stall_timeout=60), workers=2, **OPTS)
    proxy.reset_log()
    proxy.mode, proxy.faults = "all", ("503",)
    try:
        with pytest.raises(WorkerError) as info:
            for _ in loader:
                pass
    finally:
        loader.close()
    assert not isinstance(info.value, WorkerStalledError)
    msg = str(info.value)
    assert f"s3://{BUCKET}/ds/" in msg and "row group" in msg
    assert "after 2 attempts per request" in msg and "503" in msg
    assert proxy.log and all(r.status == 503 for r in proxy.log)


# Meets a stall mid-epoch and closes; the parent times its exit. Each report is one line on stdout.
_STALLED_CHILD = r"""
import sys
import detload

loader = detload.Loader(sys.argv[1], batch_size=100, seed=1, order="windowed", shuffle_window=1, workers=1,
                        pool=detload.Pool(kind=sys.argv[2], stall_timeout=2, prefetch=1))
batches = iter(loader)
next(batches)
print("first batch", flush=True)
sys.stdin.readline()  # the proxy stops answering now
try:
    for _ in batches:
        pass
    print("no error", flush=True)
except detload.DetloadError as exc:
    print(type(exc).__name__ + ": " + " ".join(str(exc).split()), flush=True)
loader.close()
print("closed", flush=True)
"""
#: Seconds the child may take to exit after close(). pyarrow finalizes S3 at exit and waits for
#: the requests still in flight: unbounded by the stall timeout, that was ~5 min (5 attempts x 60 s).
EXIT_BUDGET = 20.0


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_exit_soon_after_close_when_the_server_stops_answering(s3, proxy, tmp_path, pool):
    """A thread worker cannot be interrupted in a read: the S3 filesystem detload opens gives each
    request timeouts tied to stall_timeout, so the read stuck at the WorkerStalledError ends soon
    after it and nothing holds the interpreter's exit. A worker process is killed at close()."""
    moto = s3[0]
    # Many small row groups, one worker, prefetch 1: most reads are still to come after the first batch.
    local = write_sample_dataset(tmp_path / "many", {"a.parquet": [100] * 20, "b.parquet": [100] * 20})
    uri = moto.upload_dir(local, f"stall-{pool}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, **s3_env(proxy.endpoint), "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    env.pop("AWS_MAX_ATTEMPTS")  # the default retry budget (5 attempts), as a user has it
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", _STALLED_CHILD, uri, pool], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        assert lines.get(timeout=120) == "first batch", (tmp_path / "stderr").read_text()
        proxy.reset_log()
        proxy.mode, proxy.faults = "all", ("stall",)
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        error = lines.get(timeout=120)
        assert lines.get(timeout=60) == "closed", (tmp_path / "stderr").read_text()
        try:
            proc.wait(timeout=EXIT_BUDGET)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process did not exit within {EXIT_BUDGET:g} s of close() after: {error}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proxy.release()
    assert error is not None and error.startswith("WorkerStalledError: worker 0 made no progress for 2 s "), error
    assert proc.returncode == 0, (tmp_path / "stderr").read_text()
    assert any(r.status == -1 for r in proxy.log)  # a request really went unanswered


def test_every_request_failing_at_discovery(s3, proxy, monkeypatch, capsys, tmp_path):
    _, _, _, uri, _ = s3
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    proxy.mode, proxy.faults = "all", ("drop",)
    with pytest.raises(SourceError) as info:
        Loader(uri, **OPTS)
    assert isinstance(info.value, OSError)  # what a caller catching I/O errors expects
    msg = str(info.value)
    assert msg.startswith(f"cannot list s3://{BUCKET}/ds (endpoint ") and "NETWORK_CONNECTION" in msg
    assert "after 2 attempts per request (AWS_MAX_ATTEMPTS)" in msg
    # The command line prints it as one line, no traceback.
    assert cli(["run", uri, "--batch-size", "100", "--seed", "1", "--manifest", str(tmp_path / "m.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"detload run: error: cannot list s3://{BUCKET}/ds") and "Traceback" not in err


def test_every_footer_read_failing_at_discovery(s3, proxy, monkeypatch):
    _, _, _, uri, _ = s3
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    proxy.mode, proxy.faults = "parquet", ("503",)
    with pytest.raises(SourceError) as info:
        Loader(uri, **OPTS)
    msg = str(info.value)
    assert msg.startswith(f"cannot read the footer of s3://{BUCKET}/ds/") and "503" in msg
    assert "after 2 attempts per request" in msg and "complete Parquet file" not in msg


def test_replaced_object_is_not_served_stale(s3, proxy, tmp_path):
    moto, _, _, _, _ = s3
    files = {"a.parquet": [200, 100], "b.parquet": [150]}
    v1 = write_sample_dataset(tmp_path / "v1", files, compression="none")
    v2 = write_sample_dataset(tmp_path / "v2", files, seed=5, compression="none")
    uri = moto.upload_dir(v1, "replaced")
    cache = tmp_path / "cache"
    run(uri, tmp_path / "s3-v1.jsonl", cache=cache)
    assert cache_info(cache)["entries"] == 3
    a2 = (tmp_path / "v2" / "a.parquet").read_bytes()
    assert len(a2) == os.path.getsize(os.path.join(v1, "a.parquet"))  # same size, new content
    moto.put("replaced/a.parquet", a2)
    os.replace(os.path.join(v2, "a.parquet"), os.path.join(v1, "a.parquet"))
    run(v1, tmp_path / "local-v2.jsonl")
    run(uri, tmp_path / "s3-v2.jsonl", cache=cache)
    same(tmp_path / "local-v2.jsonl", tmp_path / "s3-v2.jsonl")
    assert not verify(str(tmp_path / "s3-v1.jsonl"), str(tmp_path / "s3-v2.jsonl")).identical
    assert cache_info(cache)["entries"] == 3  # the old version's entries were evicted


@pytest.mark.parametrize("same_size", [True, False])
def test_object_replaced_while_a_loader_runs(s3, proxy, tmp_path, same_size):
    """Uncached, the next pass refuses the new version (never a mix, never a Parquet
    decoding error); with the cache, the planned version keeps being served."""
    moto, _, _, _, _ = s3
    files = {"a.parquet": [200, 100], "b.parquet": [150]}
    v1 = write_sample_dataset(tmp_path / "v1", files, compression="none")
    v2 = write_sample_dataset(tmp_path / "v2", files if same_size else {"a.parquet": [120], "b.parquet": [150]},
                              seed=5, compression="none")
    with open(os.path.join(v2, "a.parquet"), "rb") as f:
        a2 = f.read()
    prefix = f"live-{same_size}"
    uri = moto.upload_dir(v1, prefix)
    assert (len(a2) == os.path.getsize(os.path.join(v1, "a.parquet"))) == same_size
    run(v1, tmp_path / "ref.jsonl")  # two epochs of the old version
    with Loader(uri, workers=2, **OPTS) as plain, \
         Loader(uri, workers=2, cache=tmp_path / "cache", manifest=str(tmp_path / "cached.jsonl"), **OPTS) as cached:
        for ld in (plain, cached):
            for _ in ld:
                pass
        moto.put(f"{prefix}/a.parquet", a2)
        for ld in (plain, cached):
            ld.set_epoch(1)
        with pytest.raises(DataError) as info:
            for _ in plain:
                pass
        for _ in cached:
            pass
    msg = str(info.value)
    assert msg.startswith("a.parquet row group ") and "the file changed after the loader planned the epoch" in msg
    assert ("its ETag is" if same_size else "its row groups hold [120] rows, the plan has [200, 100]") in msg
    assert "thrift" not in msg.lower()
    same(tmp_path / "ref.jsonl", tmp_path / "cached.jsonl")


def test_object_replaced_after_the_next_pass_was_started_ahead(s3, proxy, tmp_path):
    """In the set_epoch loop the worker builds the next pass's first block before the
    replacement, opening the object; the rest of that pass reads the same object and
    must refuse the new version rather than read it through the handle it kept."""
    moto, _, _, _, _ = s3
    files = {"a.parquet": [100, 100, 100], "b.parquet": [150]}
    v1 = write_sample_dataset(tmp_path / "v1", files, compression="none")
    v2 = write_sample_dataset(tmp_path / "v2", files, seed=5, compression="none")
    with open(os.path.join(v2, "a.parquet"), "rb") as f:
        a2 = f.read()
    assert len(a2) == os.path.getsize(os.path.join(v1, "a.parquet"))
    uri = moto.upload_dir(v1, "ahead")
    # No shuffle: blocks [a#0, a#1] and [a#2, b#0]; one worker, prefetch 1: the first is built ahead.
    with Loader(uri, workers=1, pool=detload.Pool(prefetch=1), shuffle=False, **OPTS) as ld:
        for epoch in (0, 1):
            ld.set_epoch(epoch)
            for _ in ld:
                pass
        # The block built ahead (it opens a.parquet) must be done before the replacement.
        wait_until(lambda: ld._pool.outboxes[0].qsize() >= 1, 30.0)
        moto.put("ahead/a.parquet", a2)
        ld.set_epoch(2)
        with pytest.raises(DataError, match=r"^a\.parquet row group 2: the file changed after the loader "
                                            r"planned the epoch: its ETag is"):
            for _ in ld:
                pass
        assert ld.ahead_used >= 1


def test_explicit_filesystem(s3, proxy, tmp_path):
    _, _, _, _, ref = s3
    fs = pafs.S3FileSystem(endpoint_override=proxy.endpoint.split("://")[1], scheme="http", region="us-east-1",
                           access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    run(f"{BUCKET}/ds", tmp_path / "explicit.jsonl", storage=fs, pool="process", workers=2)
    same(ref, tmp_path / "explicit.jsonl")


def _explicit_s3(endpoint):
    return pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1",
                             access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                             secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


@pytest.mark.parametrize("kind", ["pyarrow", "fsspec"])
def test_explicit_filesystem_takes_the_uri_its_scheme_names(s3, proxy, tmp_path, kind):
    """s3://bucket/prefix with storage=<filesystem>: as a folder, a list of objects and a glob, the
    same batches as the local copy (pyarrow said "Expected an S3 object path ... got a URI")."""
    _, _, _, uri, ref = s3
    fs = _explicit_s3(proxy.endpoint)
    if kind == "fsspec":  # an fsspec filesystem whose protocol is s3 (s3fs is not needed for this)
        from fsspec.implementations.arrow import ArrowFSWrapper
        fs = ArrowFSWrapper(fs)
    files = [f"{uri}/{name}" for name in FILES]
    for name, source in [("folder", uri), ("list", files), ("glob", f"{uri}/*.parquet"), ("s3a", uri.replace("s3:", "s3a:"))]:
        run(source, tmp_path / f"{name}.jsonl", storage=fs)
        same(ref, tmp_path / f"{name}.jsonl")
    with Loader(uri, storage=fs, **OPTS) as loader:
        assert repr(loader).startswith(f"Loader('s3://{BUCKET}/ds', files=3,")


def test_real_s3fs_takes_the_uri(s3, proxy, tmp_path):
    s3fs = pytest.importorskip("s3fs")
    _, _, _, uri, ref = s3
    fs = s3fs.S3FileSystem(key=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                           client_kwargs={"endpoint_url": proxy.endpoint, "region_name": "us-east-1"})
    run(uri, tmp_path / "s3fs.jsonl", storage=fs)
    same(ref, tmp_path / "s3fs.jsonl")


def test_the_scheme_stays_in_the_repr_and_in_not_found_messages(s3, proxy):
    _, _, _, uri, _ = s3
    with Loader(uri, **OPTS) as loader:
        assert repr(loader).startswith(f"Loader('s3://{BUCKET}/ds', files=3, rows=1368,")
    fs = _explicit_s3(proxy.endpoint)
    for filesystem in (None, fs):
        with pytest.raises(FileNotFoundError, match=rf"^dataset path 's3://{BUCKET}/missing' does not exist$"):
            Loader(f"s3://{BUCKET}/missing", storage=filesystem, **OPTS)
        with pytest.raises(FileNotFoundError, match=rf"^the glob 's3://{BUCKET}/ds/\*\.csv' matches no file$"):
            Loader(f"s3://{BUCKET}/ds/*.csv", storage=filesystem, **OPTS)
    with pytest.raises(FileNotFoundError, match=rf"^dataset path 's3://{BUCKET}/missing' does not exist$"):
        Loader(f"{BUCKET}/missing", storage=fs, **OPTS)


def test_inspect_and_discovery_messages_keep_the_scheme(s3, proxy, tmp_path, capsys):
    moto, _, _, uri, _ = s3
    assert cli(["inspect", uri]) == 0
    assert capsys.readouterr().out.startswith(f"dataset s3://{BUCKET}/ds\n")
    assert cli(["inspect", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["root"] == f"s3://{BUCKET}/ds"
    side = write_sample_dataset(tmp_path / "side", {"a.parquet": [100]})
    with open(os.path.join(side, "a.parquet"), "rb") as f:
        data = f.read()
    moto.put("side/a.parquet.bak", data)  # a backup copy: starts with PAR1 but is skipped
    moto.put("side/notes.csv", b"a,b\n")
    side_uri = moto.upload_dir(side, "side")
    with pytest.warns(SkippedFilesWarning, match=rf"^2 files skipped: 1 \.bak, 1 \.csv in s3://{BUCKET}/side: they "
                                                 r"are not Parquet .*, e\.g\. a\.parquet\.bak\. "):
        loader = Loader(side_uri, **OPTS)
    assert loader.dataset.rows == 100
    loader.close()
    with pytest.raises(OptionError, match=rf"^source\[0\] and source\[1\] both name the file "
                                          rf"'s3://{BUCKET}/side/a\.parquet': "):
        Loader([side_uri, f"{side_uri}/a.parquet"], **OPTS)
    moto.put("bad/a.parquet", b"not parquet at all")
    with pytest.raises(DatasetError, match=rf"^cannot read the Parquet footer of 's3://{BUCKET}/bad/a\.parquet': "):
        Loader(f"s3://{BUCKET}/bad", **OPTS)
    empty = write_sample_dataset(tmp_path / "empty", {"a.parquet": [], "b.parquet": []})
    with pytest.raises(EmptyDatasetError, match=rf"^the dataset at 's3://{BUCKET}/empty' has no rows"):
        Loader(moto.upload_dir(empty, "empty"), **OPTS)


def test_layout_messages_keep_the_scheme(s3, proxy):
    _, _, _, uri, _ = s3
    with pytest.raises(DatasetError, match=rf"^sort key 'nope' is not a column of s3://{BUCKET}/ds; the columns are "):
        detload.layout.check(uri, sort_by=["nope"])
    with pytest.raises(DatasetError, match=rf"^unknown column\(s\) \['nope'\] for the digest; 's3://{BUCKET}/ds' has "):
        detload.layout.digest(uri, columns=["nope"])


def test_a_source_that_does_not_fit_the_filesystem_names_the_form_to_pass(tmp_path):
    from fsspec.implementations.memory import MemoryFileSystem

    s3fs = _explicit_s3("http://127.0.0.1:9")  # never contacted: the forms are refused first
    cases = [
        (s3fs, str(tmp_path / "data"),
         rf"^source '{tmp_path}/data' is an absolute local path, but Storage.filesystem is a pyarrow S3FileSystem, "
         r"which takes 'bucket/prefix' or 's3://bucket/prefix': pass that form, or leave the filesystem out to "
         r"read local files$"),
        (s3fs, "gs://bucket/data",
         r"^source 'gs://bucket/data' is a URI \(gs://\), but Storage.filesystem is a pyarrow S3FileSystem, which takes "
         r"'bucket/prefix' or 's3://bucket/prefix': pass that form, or leave the filesystem out$"),
        (s3fs, "s3://bucket/data?region=eu-west-1",
         r"^source 's3://bucket/data\?region=eu-west-1' carries URI options, which apply only when detload "
         r"opens the URI itself: with Storage.filesystem, set them on the filesystem and pass the URI without them$"),
        (pafs.LocalFileSystem(), "s3://bucket/data",
         r"^source 's3://bucket/data' is a URI \(s3://\), but Storage.filesystem is a pyarrow LocalFileSystem, which "
         r"takes a local path \(or file:// URI\): pass that form, or leave the filesystem out \(detload opens "
         r"s3:// URIs itself\)$"),
        (MemoryFileSystem(), "s3://bucket/data",
         r"^source 's3://bucket/data' is a URI \(s3://\), but Storage.filesystem is the fsspec filesystem MemoryFileSystem "
         r"\(memory\), which takes a path on it or a memory:// URI: pass that form, or leave the filesystem out"),
    ]
    for fs, source, message in cases:
        for src in (source, [source]):
            with pytest.raises(OptionError, match=message):
                Loader(src, storage=fs, **OPTS)


def test_s3_uri_options_and_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "4")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    fs, path = s3_from_uri("s3://bucket/some/prefix/")
    assert path == "bucket/some/prefix"
    assert fs.options["endpoint_override"] == "127.0.0.1:9" and fs.options["scheme"] == "http"
    assert fs.options["region"] == "us-east-1" and fs.max_attempts == 4
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    fs, _ = s3_from_uri("s3://bucket/p")
    assert pickle.loads(pickle.dumps(fs)).options["access_key"] == "k"  # reaches process workers
    fs, _ = s3_from_uri("s3://bucket/p?endpoint_override=localhost:1&region=eu-west-1&scheme=http")
    assert fs.options["endpoint_override"] == "localhost:1" and fs.options["region"] == "eu-west-1"
    with pytest.raises(OptionError, match="unknown option 'colour'"):
        s3_from_uri("s3://bucket/p?colour=red")
    with pytest.raises(OptionError, match="names no bucket"):
        s3_from_uri("s3:///p")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "many")
    with pytest.raises(OptionError, match="AWS_MAX_ATTEMPTS='many' is not an integer"):
        s3_from_uri("s3://bucket/p")


def test_s3_timeouts_follow_the_stall_timeout(monkeypatch):
    assert s3_timeouts(None, 5) == (10.0, 60.0) == s3_timeouts(300, 5)  # the defaults stay the defaults
    assert s3_timeouts(1e9, 1) == (10.0, 60.0)
    assert s3_timeouts(30, 5) == (6.0, 6.0)
    assert s3_timeouts(12, 5) == (2.4, 2.0)  # the SDK counts the request timeout in whole seconds
    assert s3_timeouts(2, 5) == (1.0, 1.0)  # never below 1 s (0 would be no timeout at all)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    fs, _ = s3_from_uri("s3://bucket/p", stall_timeout=30)
    assert (fs.options["connect_timeout"], fs.options["request_timeout"]) == (10.0, 10.0)
    assert pickle.loads(pickle.dumps(fs)).options["request_timeout"] == 10.0  # process workers get them
    fs, _ = s3_from_uri("s3://bucket/p?request_timeout=45", stall_timeout=30)  # the URI's own win
    assert (fs.options["connect_timeout"], fs.options["request_timeout"]) == (10.0, 45.0)


def test_a_loader_gives_its_s3_filesystem_the_stall_timeout(s3, proxy):
    uri = s3[3]
    with Loader(uri, pool=detload.Pool(stall_timeout=12), **OPTS) as loader:  # AWS_MAX_ATTEMPTS=3 here
        assert loader.dataset.filesystem.options["request_timeout"] == 4.0
    with Loader(uri, pool=detload.Pool(stall_timeout=None), **OPTS) as loader:
        assert loader.dataset.filesystem.options["request_timeout"] == 60.0


def test_retry_budget_survives_pickling():
    fs = RetryingS3FileSystem(max_attempts=7, endpoint_override="127.0.0.1:9", scheme="http", region="us-east-1")
    again = pickle.loads(pickle.dumps(fs))
    assert isinstance(again, RetryingS3FileSystem) and again.max_attempts == 7
    assert again.options == fs.options

