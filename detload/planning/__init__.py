"""Planning: from a discovered dataset and the options that decide the batches to one frozen
value, before any worker starts.

- stage.py      the stage: `column_specs`, then `plan` -> `Planned` (units with selections and
                groups, the delivered columns, the order identity); the loader runs its result
- order.py      the epoch planner `make_plan`: units + order options + epoch -> `Plan`
                (the windowed order, plan format 2; it hands "mix" to mix.py)
- mix.py        the mixed order's planner (plan format 3): `spread`, partitions, tasks, blocks
- common.py     what both share: cutting units, step counts, a rank's schedule
- groups.py     the group pass of ``group_by`` (each unit's groups, from the key column)
- transform.py  a transform's plan: output schema, rerun check, ``rows="changes"`` counts
- mixing.py     the mixing report (`Loader.plan_stats`): a plan's rows per batch beside an i.i.d. shuffle
The filter's pass lives with the filters (detload._filters.planning); reads go through
detload._read. Nothing here imports the engine (detload._engine), nor it this.
"""

from __future__ import annotations

from .order import make_plan
from .stage import Planned, column_specs, file_refs, plan

__all__ = ["Planned", "column_specs", "file_refs", "make_plan", "plan"]
