"""The row-group cache: converted NumPy arrays of one row group per file, memory-mapped on read,
and derived entries (small per-row-group results) beside them.

One cache serves both purposes: a local copy of remote data and a cache of the
Arrow→NumPy conversion, so a warm epoch neither fetches nor decodes. Entries
are stored before the block permutation, so warm and cold runs yield the same
bytes. Policy and the entry format are described in docs/remote.md.

On disk::

    <Cache.dir>/DETLOAD_CACHE      marker: a detload cache (``clear`` refuses other folders)
    <Cache.dir>/v1/                entry format version (CACHE_FORMAT)
        lock                       fcntl lock: the usage counter, reservations, recounts
        usage                      bytes of entries and in-flight temp files (decimal text)
        tmp/<host>-<pid>-<rand>.tmp   entries being written; warning markers
        objects/<uri hash>/<version hash>/rg000007-<columns hash>.dlc   a row group's columns
        objects/<uri hash>/<version hash>/rg000007-d<identity hash>.dlc  a derived result

The folder ``<uri hash>/<version hash>`` (`object_key`) holds the entries of one
version of one file, row-group and derived alike (one format, one counter, one
limit); a replaced file's folders go when a loader opens the cache.

Modules, in the order they build on each other:

- ``format``: the entry bytes: prefix (magic, header length, xxh3-128), JSON header,
  aligned arrays; laying out, checksumming and parsing, no filesystem.
- ``sizes``: size options ("20GiB") and the memory this process may use (cgroups).
- ``keys``: `object_key` (a file's version) and entry names (`specs_key`).
- ``store``: `_Store`, one directory's folders and locked counter; reserving room for
  an entry, discarding one, the recount, evicting replaced files.
- ``config``: `open_cache` checks the options into a `CacheConfig`; `CacheWarning`
  and the once-per-loader warnings.
- ``write``: `_Writer`, the atomic write of any entry (reserve, one ``pwritev``, link).
- ``mapping``: libc mmap of an entry file, holding no descriptor.
- ``entry``: a mapped row-group entry parsed into column views; `PendingCheck`.
- ``kept``: `KeptMappings`, entries kept mapped from one pass to the next.
- ``rowgroups``: `RowGroupCache`, one worker's get/settle/put of row groups.
- ``derived``: `DerivedStore`, get/put of small per-row-group results keyed by the
  file version and the identity of what derived them (``rg000007-d<identity hash>.dlc``
  beside the row group's entries), read whole and verified, never mapped.
- ``admin``: `cache_info` and `clear_cache` (the ``detload cache`` commands).

Who owns which memory: a derived hit is a private copy of its small file. A
row-group hit hands out read-only views of the entry's
mapping; the mapping lives as long as any view of it (or its `KeptMappings` slot)
does and is unmapped by the last one to go. A `KeptMappings` table belongs to one
process (thread workers share their loader's; each worker process has its own)
and keeps at most its byte budget and, with every table of the process,
a quarter of vm.max_map_count mappings. Deleting an entry file never invalidates a
mapping (POSIX unlink); its disk space is freed when the last mapping goes.

Locking: the ``lock`` file's flock guards only the ``usage`` counter and what
must agree with it: reserving (check the limit, create and fallocate the temp
file, count it), releasing, discarding a damaged entry, the recount and eviction
at open, and ``clear``. Entry files are never written in place: a writer fills its
temp file without the lock, then links it to the entry's name (atomic; a second
writer's link fails and its bytes are released), so readers need no lock and a
reader of an entry being deleted keeps its mapping. Checksums are verified on
every read; a damaged entry is discarded and read again from the source.
"""

from .admin import cache_info, clear_cache
from .config import CacheConfig, CacheWarning, open_cache
from .derived import DerivedStore
from .format import CACHE_FORMAT, CONVERTER_VERSION
from .kept import KeptMappings
from .keys import object_key
from .rowgroups import RowGroupCache
from .sizes import parse_size

__all__ = [
    "CACHE_FORMAT",
    "CONVERTER_VERSION",
    "CacheConfig",
    "KeptMappings",
    "CacheWarning",
    "DerivedStore",
    "RowGroupCache",
    "cache_info",
    "clear_cache",
    "object_key",
    "open_cache",
    "parse_size",
]
