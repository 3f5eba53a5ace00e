"""The engine: executes a plan with a pool of workers and one ordered merger.

Stages, in the order data flows (each module's docstring has the details):

    Loader (loader.py) -- plans a pass, hands its tasks to -->
    pool.py      starts, feeds, watches and stops the workers (threads or processes)
    worker.py    the worker loop: takes a `Task`, runs each of its row groups through the
                 row-group steps chosen once per configuration (read, verify, select,
                 transform, group rows), assembles the block, hands it over
      config.py  what a worker is configured with (plain picklable data; its kind,
                 "thread" or "process", is a field; test hooks in one field, ``hooks``)
      reader.py  one row group of one file as checked NumPy columns (through the cache)
      mapping.py which local files are read through a memory map, and that map
      block.py   concatenates a block's units and applies its permutation
      spill.py   a large mixed-order window written to a file, its blocks read back per chunk
      mapped.py  a window process workers share, packed in one file they all map (/dev/shm)
      share.py   windows shared by the workers (claims, scratch entries, shared files)
      groups.py  group_by: blocks of whole groups, their group columns once per group
      heap.py    block memory of thread workers: reused heap slabs
      shm.py     block memory of process workers: reused /dev/shm segments
      (../_fdless.py: memory maps that keep no file descriptor; the out-of-descriptors error)
      spawn.py   how worker processes start (forkserver, never fork) and the ints they share
    merge.py     takes block k from worker k mod W, cuts steps, records manifest lines
      cut.py     how a step is cut (`StepCutter`): `FlatCutter`, or `PackedCutter` (group_by)
      watch.py   the stall/death watch: a dead or stalled worker while the merger waits
    memory.py    who is told of the consumer-side buffers blocks live in
    passes.py    the pass-number rules: what is stale, what a stop cancels, what close does
    messages.py  every message between them, as named types, and the one bounded-put helper

Messages: the pool sends `Tasks` (a pass number and `Task` list) to each worker;
a worker answers with `BlockReady` (block k of a pass, its `Layout` and
`Timings`) or `WorkerFailed` (the unit it was on and its traceback). The merger
hands the consumer lists of `StepCut` (a step's batch, number, manifest line and
rows), then `END` or a `Failure`. Nothing travels as a tuple read by position.

Pass numbers ("generations"): every pass of the loader (an epoch, or the rest of
one after a resume) has a number, and one object, the pool's `Passes`
(passes.py), holds the rules. It keeps the oldest number still wanted; work of
an older pass is stale (`is_stale`) and dropped, work of a newer one is the next
pass, built ahead (`ahead`: the running pass's number plus one) while the
consumer finishes this one, and is kept. A pass not built ahead gets a number
newer than any handed out (`fresh`), so what was built for a pass that did not
come is freed. A stop (break, error) cancels the pass, and also the one built
ahead unless the merger had taken every block of the pass (`stop`); the number
only ever grows. close() makes every number stale (`close`), then stops every
worker and releases all block memory. Process workers read the same number
through a slot of shared ints (spawn.py), wrapped in a `Passes` of their own.

Memory ownership: a block's bytes belong to the worker until it hands the block
over; then to the consumer's views (batches are zero-copy views of the block).
The last view dropped gives the slab (heap.py) or segment (shm.py) back to its
worker for a later block; a kept batch therefore never changes. A mixed-order
window belongs to the worker (or workers, shared) that read it, in memory, in
a spill file (spill.py) or in a file process workers map (mapped.py), until its
task's last block, or the next pass's window
when the worker keeps it. Nothing is kept after close().
"""
