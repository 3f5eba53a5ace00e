"""The engine: executes a plan with a pool of workers and one ordered merger.

Stages, in the order data flows (each module's docstring has the details):

    Loader (loader.py) -- plans a pass, hands its tasks to -->
    pool.py      starts, feeds, watches and stops the workers (threads or processes)
    worker.py    the worker loop: takes a `Task`, builds the block, hands it over
      reader.py  one row group of one file as checked NumPy columns (through the cache)
      block.py   concatenates a block's units and applies its permutation
      heap.py    block memory of thread workers: reused heap slabs
      shm.py     block memory of process workers: reused /dev/shm segments
      spawn.py   how worker processes start (forkserver, never fork) and the ints they share
    merge.py     takes block k from worker k mod W, cuts batches, records manifest lines
    messages.py  every message between them, as named types, and the one bounded-put helper

Messages: the pool sends `Tasks` (a pass number and `Task` list) to each worker;
a worker answers with `BlockReady` (block k of a pass, its `Layout` and
`Timings`) or `WorkerFailed` (the unit it was on and its traceback). Nothing
travels as a tuple read by position.

Pass numbers ("generations"): every pass of the loader (an epoch, or the rest of
one after a resume) has a number. A worker drops a task or block whose number is
older than the pool's current one; a newer one is the next pass, built ahead
while the consumer finishes this one, and is kept. A stop (break, error) makes
the current number stale so workers drop what they hold; close() stops every
worker and releases all block memory.

Memory ownership: a block's bytes belong to the worker until it hands the block
over; then to the consumer's views (batches are zero-copy views of the block).
The last view dropped gives the slab (heap.py) or segment (shm.py) back to its
worker for a later block; a kept batch therefore never changes. Nothing is kept
after close().
"""
