"""Simulate the metadata of 10^8, 10^9 and 10^10 samples from measured per-row costs.

Reads the JSON ``bench_scale.py --json`` writes, takes the per-row costs of
its largest measured size, and prints for each population size two layouts
(docs/scale.md): the single-file snapshot of today and the partitioned one of
the plan. Everything is linear in rows except what the partitioned layout
makes per partition; the assumptions are arguments with defaults, printed
with the table.

    python tests/bench/scale_sim.py /tmp/scale.json
    python tests/bench/scale_sim.py /tmp/scale.json --part-rows 4194304 --nodes 16
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

PAGE = 4096
CHUNK = 64 << 10  # bytes per checked chunk (engine/src/store/chunks.rs)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def human_s(s: float) -> str:
    if s < 1:
        return f"{s * 1e3:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def simulate(cost: dict, rows: int, a: argparse.Namespace) -> dict:
    """Both layouts at ``rows`` from the per-row costs in ``cost``."""
    per_row = cost["snapshot_bytes_per_row"]
    alias_per_row = cost["alias_bytes_per_row"]
    columns = a.columns
    snap = rows * per_row
    alias = rows * alias_per_row
    ranks = a.nodes * a.ranks_per_node
    processes_per_node = a.ranks_per_node * (1 + a.workers_per_rank)
    draws_per_node = rows / a.nodes  # one epoch of weighted draws, as many as rows
    # A weighted draw reads its alias entry (probability and alias), then its
    # row's cache_id and sample_id: the loader's hot set. Today ids are two Int64 columns; the
    # plan stores them per partition as a u16 index into the partition's
    # caches and a u32 sample id (6 bytes).
    hot_single = rows * (alias_per_row + 16)
    hot_parts = rows * (alias_per_row + 6)
    # probability, alias, cache_id, sample_id: four 4 KiB pages when none is cached
    cold_reads = draws_per_node * 4 * PAGE
    single = {
        # a snapshot refuses 2^32 - 1 rows or more (catalog/snapshot/partition.rs): rows are u32
        "stored today": "yes" if rows < 2**32 - 1 else "no: more than 2^32 - 1 rows",
        "files": columns + 1,
        "largest file": human_bytes(rows * 8),
        "on disk (columns + alias)": human_bytes(snap + alias),
        # measured with chunked checks: open + first batch checks the chunks it
        # reads (not linear in rows); a JSON from before them: every process
        # checked every column file whole
        "open / process": human_s(cost["first_batch_s"]) + " (open + first batch)"
        if cost["first_batch_s"] is not None
        else human_s(cost["open_s_per_row"] * rows),
        # chunked: each 64 KiB chunk the node's draws land in (alias,
        # cache_id, sample_id), once per node; before: every file per process
        "verify reads / node": human_bytes(min(draws_per_node * 3 * CHUNK, hot_single))
        if cost["first_batch_s"] is not None
        else human_bytes(snap * processes_per_node),
        "anon / reader": f"{cost['anon_mib']:.0f} MiB",
        "loader hot set / node": human_bytes(hot_single),
        "metadata reads / node / epoch": human_bytes(min(cold_reads, hot_single)),
        "group-by": human_s(cost["groupby_s_per_row"] * rows) + " (1 process)",
        # one thread, into the file's mapping; aliases are u32 (sample/alias.rs)
        "alias build": human_s(cost["alias_table_s_per_row"] * rows) + " (1 thread)"
        if rows <= 2**32
        else "refused: u32 aliases cap a table at 2^32 rows",
        "alias table (mapped)": human_bytes(alias),
        "reweight writes": human_bytes(rows * 8),
        "reweight": human_s(cost["reweight_s_per_row"] * rows),
    }
    parts = max(1, math.ceil(rows / a.part_rows))
    part_rows = min(rows, a.part_rows)
    # one partition's table, built by one thread (measured per row)
    table_s = cost["alias_table_s_per_row"] * part_rows
    cores = a.sql_workers * a.cores_per_worker
    waves = math.ceil(parts / cores)  # a partition is one task
    partitioned = {
        "partitions": parts,
        "files": parts * (columns + 1) + 2,
        "largest file": human_bytes(part_rows * 8),
        "on disk (columns + alias)": human_bytes(snap + alias),
        # measured: open maps partition 0, a first batch the identity columns
        # of each partition its draws land in (at most one per draw); chunks
        # are checked when first read, once per node
        "open / process": human_s(
            cost["part_open_base_s"] + min(parts, a.batch) * cost["part_open_s"]
        )
        + " (open + first batch)",
        "verify reads / node": human_bytes(min(cold_reads, hot_parts)),
        "anon / reader": f"{cost['anon_mib'] + parts * 256 / 2**20:.0f} MiB",
        "loader hot set / node": human_bytes(hot_parts),
        "metadata reads / node / epoch": human_bytes(min(cold_reads, hot_parts)),
        "group-by": f"{human_s(cost['groupby_s_per_row'] * part_rows * waves)} "
        f"({a.sql_workers} x {a.cores_per_worker} cores)",
        # measured: a first batch builds the tables of the partitions its
        # draws land in, on the host's threads (`--threads`); the rest are
        # built when draws first land there, each once per weight column
        "alias build, first batch": f"{human_s(first_batch_tables(parts, a) * table_s)} "
        f"({landed(parts, a.batch):.0f} of {parts} tables on {a.threads} threads)",
        "alias build, first batch after a 1 % reweight": human_s(
            math.ceil(min(parts, math.ceil(rows / 100 / part_rows + 1)) / a.threads) * table_s
        ),
        "alias table (mapped)": human_bytes(part_rows * alias_per_row) + " / partition",
        "reweight writes": human_bytes(rows * 8),
        # measured: a reweight of clustered rows writes their partitions
        # only; the rest is linear (the new weight column is checked and
        # hashed, every other column's hash known by address)
        "reweight 1 % (clustered) writes": human_bytes(
            math.ceil(rows / 100 / part_rows + 1) * part_rows * 8
        ),
        "reweight 1 % (clustered)": human_s(cost["reweight_1pct_s_per_row"] * rows)
        if cost["reweight_1pct_s_per_row"] is not None
        else "not measured",
        # measured: a `select` that reweights on workers, each storing the
        # partitions it computes (core-seconds per row on the measuring
        # machine), a partition a task, in waves over the workers' cores
        "reweight by select on workers": (
            f"{human_s(cost['select_core_s_per_row'] * part_rows * waves)} "
            f"({a.sql_workers} x {a.cores_per_worker} cores)"
        )
        if cost["select_core_s_per_row"] is not None
        else "not measured",
    }
    return {"rows": rows, "ranks": ranks, "single": single, "partitioned": partitioned}


def landed(parts: int, draws: int) -> float:
    """Expected partitions `draws` draws land in (partitions of equal mass)."""
    return parts * (1 - (1 - 1 / parts) ** draws)


def first_batch_tables(parts: int, a: argparse.Namespace) -> int:
    """Rounds of table builds a first batch waits for, on `a.threads` threads."""
    return math.ceil(landed(parts, a.batch) / a.threads)


def costs(path: Path) -> tuple[dict, dict]:
    data = json.loads(path.read_text())
    top = max(data["sizes"], key=lambda r: r["rows"])
    n = top["rows"]
    # a size measured lean (bench_scale.py --lean) has no whole reweight:
    # take its cost per row from the largest size that has one
    whole = max((r for r in data["sizes"] if "reweight_s" in r), key=lambda r: r["rows"])
    return data, {
        "rows": n,
        "snapshot_bytes_per_row": top["snapshot_bytes_per_row"],
        "alias_bytes_per_row": top.get("alias_bytes_per_row", 12),
        "open_s_per_row": top["reader_open_s"] / n,
        "first_batch_s": top.get("reader_first_batch_s"),
        "groupby_s_per_row": top["groupby_s"] / n,
        # tables are built in parallel on the measuring machine's threads
        "alias_table_s_per_row": top["alias_build_s"]
        / math.ceil(top.get("alias_tables_built", 1) / data["cpus"])
        / min(n, 1 << 22)
        if "alias_tables_built" in top
        else top["alias_build_s"] / n,
        "reweight_s_per_row": whole["reweight_s"] / whole["rows"],
        "anon_mib": top["reader_anon_read_mib"],
        "reweight_1pct_s_per_row": (top["reweight_1pct_contiguous_s"] / n)
        if "reweight_1pct_contiguous_s" in top
        else None,
        # the largest size measured on workers (bench_scale.py, not --lean)
        "select_core_s_per_row": max(
            (
                (r["select_two_workers_s"] * data["cpus"] / r["rows"], r["rows"])
                for r in data["sizes"]
                if "select_two_workers_s" in r
            ),
            key=lambda c: c[1],
            default=(None, 0),
        )[0],
        **part_open(data["sizes"]),
    }


def part_open(sizes: list[dict]) -> dict:
    """A later process's open + first batch as a fixed cost plus one per
    partition it maps (the smallest and largest measured sizes)."""
    small = min(sizes, key=lambda r: r["rows"])
    top = max(sizes, key=lambda r: r["rows"])
    base = small["second_reader_first_batch_s"]
    extra = top.get("partitions", 1) - small.get("partitions", 1)
    per = (top["second_reader_first_batch_s"] - base) / extra if extra > 0 else 0.0
    return {"part_open_base_s": base, "part_open_s": max(per, 0.0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("measured", type=Path, help="JSON written by bench_scale.py --json")
    p.add_argument("--rows", type=float, nargs="+", default=[1e8, 1e9, 1e10])
    p.add_argument("--columns", type=int, default=5, help="columns in the snapshot")
    p.add_argument("--part-rows", type=int, default=1 << 22, help="rows per partition")
    p.add_argument("--batch", type=int, default=256, help="draws in a loader's first batch")
    p.add_argument("--threads", type=int, default=2, help="threads that build alias tables")
    p.add_argument("--nodes", type=int, default=16, help="training nodes")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--workers-per-rank", type=int, default=4, help="DataLoader workers")
    p.add_argument("--sql-workers", type=int, default=16, help="datafusion-distributed workers")
    p.add_argument("--cores-per-worker", type=int, default=16)
    p.add_argument("--json", type=Path, help="also write the simulated figures here")
    a = p.parse_args()

    data, cost = costs(a.measured)
    print(
        f"per-row costs measured at {cost['rows']:,} rows (extension profile: "
        f"{data['profile']}, {data['cpus']} CPUs): "
        + ", ".join(f"{k}={v:.3g}" for k, v in cost.items() if k != "rows" and v is not None)
    )
    print(
        f"assumed: {a.nodes} nodes x {a.ranks_per_node} ranks x {a.workers_per_rank} "
        f"workers; partitions of {a.part_rows:,} rows; SQL on {a.sql_workers} workers x "
        f"{a.cores_per_worker} cores; one epoch = as many weighted draws as rows\n"
    )
    out = [simulate(cost, int(r), a) for r in a.rows]
    for layout in ("single", "partitioned"):
        keys = list(out[0][layout])
        print(f"### {layout} layout\n")
        print("| | " + " | ".join(f"{r['rows']:.0e} rows" for r in out) + " |")
        print("|---|" + "---|" * len(out))
        for k in keys:
            print(f"| {k} | " + " | ".join(str(r[layout][k]) for r in out) + " |")
        print()
    if a.json:
        a.json.write_text(json.dumps({"costs": cost, "simulated": out}, indent=1))


if __name__ == "__main__":
    main()
