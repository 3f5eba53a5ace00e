"""Row filters: one canonical form, three-valued row-group pruning, exact selection and bloom probes.

- canonical.py  the filter as data (`Filter`), built from tuples or the text syntax, its columns and identity
- scalars.py    literal values typed against a column's Arrow type (and refused when they cannot be)
- text.py       the command-line filter syntax, read with ``ast`` and never evaluated
- prune.py      which row groups can hold a matching row, from footer statistics (true/false/unknown)
- bloom.py      Parquet split-block bloom filters, probed for equality and ``in`` values
- planning.py   the loader's use of a filter: prune, run the selection pass, build the plan's units
- selection.py  one row group's selected rows, compact (runs or uint32 indices) for the workers' configuration
"""
