"""The layout tool: rewrite a dataset sorted or grouped, and prove nothing was lost.

- digest.py   an order-independent content digest of a dataset (rows + 128 bits)
- rewrite.py  ``detload layout``: sorted/grouped rewrite through DuckDB, checked by digest
- check.py    ``detload check-layout``: how well any writer's files prune for given columns
- cli.py      the command-line commands digest, layout and check-layout
"""
