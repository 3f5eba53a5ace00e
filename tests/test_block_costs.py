"""experiments/bench/block_costs.py and mapped_reads.py run on a small dataset and measure what
they say: both permutations agree, every assemble variant is timed, and the mapped and plain
loaders report rates, read times and memory."""

from __future__ import annotations


def test_block_costs_measure_both_permutations_and_every_gather_variant(bench_script, tmp_path):
    costs = bench_script("block_costs")
    import datagen

    data = str(datagen.make_ctr(tmp_path / "ctr", rows=70_000))
    perm = costs.permutation_costs(n=8192)  # asserts the two orders are equal
    assert set(perm) == {"two stable passes", "one packed sort"} and all(v > 0 for v in perm.values())
    asm = costs.assemble_costs(data, blocks=6)
    assert len(asm) == 4 and all(v > 0 for v in asm.values())
    import numpy as np

    assert np.take.__module__ == "numpy"  # the variants' stand-in for np.take is put back


def test_mapped_reads_one_run_each_way(bench_script, tmp_path):
    mapped = bench_script("mapped_reads")
    import datagen

    data = str(datagen.make_ctr(tmp_path / "ctr", rows=40_000))
    for on in (False, True):
        r = mapped.one(data, on)
        assert r["rows_per_s"] > 0 and r["read_s"] > 0 and r["peak_pss"] > 0
