"""A query bigger than memory (issue 51 section 4): under an address-space
limit, sorts and grouped aggregates past the SQL memory limit spill and
answer right, and what cannot fit raises QueryError; the process never dies
of a signal, and the dataset answers afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import datasetrt as drt
from conftest import Source

# The child: a SQL memory limit of 64 MiB and queries over a table of
# ~180 MB. The answers to check against are computed with polars first; then
# the address space is capped 6 GiB above what the process maps by then (a
# small container, or a ulimit: an engine that ignored its limit would need
# hundreds of GiB here) and the resident high-water mark is reset, so the
# child can report what the queries themselves held. The cap counts virtual
# reservations (allocator arenas, thread stacks), not memory in use, which is
# why it sits above the setup and is not a fixed 4 GiB: under a fixed cap the
# polars reference and the allocators' reservations decided the outcome.
# Each query prints one JSON line: what it answered, or the error.
CHILD = r"""
import json, resource, sys
import numpy as np, polars as pl
import datasetrt as drt

def status(key):
    with open("/proc/self/status") as f:
        return int(f.read().split(key + ":")[1].split()[0]) << 10

ds = drt.open(sys.argv[1], memory_limit=sys.argv[2])
n = 3_000_000
rng = np.random.default_rng(0)
big = pl.DataFrame({
    "x": np.arange(n, dtype=np.int64),
    "y": rng.integers(0, 1 << 40, n),
    "s": pl.Series(rng.integers(0, 1 << 60, n)).cast(pl.String) + "-padding-to-forty-bytes",
})
ds.register("big", big)
ds.register("small", big.head(100_000))
order = big.sort("y", "x", descending=[True, False])["x"]
weighed = int((order.to_numpy() * (np.arange(n) % 1009)).sum())
groups = big.group_by("s").agg(pl.col("x").max())

cap = status("VmSize") + (6 << 30)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
resident = status("VmRSS")

def run(name, query, check):
    try:
        got = ds.sql(query)
        out = {"name": name, "ok": bool(check(got))}
    except drt.QueryError as exc:
        out = {"name": name, "error": "QueryError", "message": str(exc)}
    print(json.dumps(out), flush=True)

# a sort of 48 MB of keys: spilled, and checked by a sum that weighs every
# row by its place; the sorted rows handed back whole too, or refused
run(
    "sort",
    "SELECT sum(x * ((r - 1) % 1009)) AS t FROM "
    "(SELECT x, row_number() OVER (ORDER BY y DESC, x) AS r FROM big)",
    lambda f: f["t"][0] == weighed,
)
run("sorted rows", "SELECT x FROM big ORDER BY y DESC, x", lambda f: f["x"].equals(order))
# three million groups of 40-byte keys: the hash table outgrows the limit
run(
    "aggregate",
    "SELECT count(*) AS n, sum(top) AS total FROM (SELECT s, max(x) AS top FROM big GROUP BY s)",
    lambda f: f["n"][0] == groups.height and f["total"][0] == groups["x"].sum(),
)
run(
    "join",
    "SELECT count(*) AS n FROM big a JOIN big b ON a.y = b.y AND a.s = b.s",
    lambda f: f["n"][0] == n,
)
run("cross join", "SELECT * FROM small a CROSS JOIN small b", lambda f: False)
run(
    "cross join sorted",
    "SELECT a.x, b.x FROM small a CROSS JOIN small b ORDER BY a.y DESC, b.x",
    lambda f: False,
)
run("after", "SELECT count(*) AS n FROM metadata", lambda f: f["n"][0] == len(ds))
print(json.dumps({"name": "held", "bytes": status("VmHWM") - resident}), flush=True)

# an errored query's tasks end (and drop their spill files) just after it
# returns: the files must go while the process lives, within seconds
import glob, os, time
left = glob.glob(os.path.join(os.environ["TMPDIR"], "*", "*"))
for _ in range(100):
    if not left:
        break
    time.sleep(0.1)
    left = glob.glob(os.path.join(os.environ["TMPDIR"], "*", "*"))
print(json.dumps({"name": "spill files left", "files": len(left)}), flush=True)
"""


@pytest.mark.timeout(600)
def test_queries_past_the_memory_limit_spill_or_raise_never_a_signal(tmp_path):
    drt.build(tmp_path / "root", [Source("memory-v1", 50)], progress=False)
    env = {
        **os.environ,
        "DATASETRT_THREADS": "2",
        "DATASETRT_SPILL_LIMIT": "1G",
        "TMPDIR": str(tmp_path / "spill"),  # where DataFusion spills
        # glibc's per-thread arenas reserve 64 MiB of address space each
        "MALLOC_ARENA_MAX": "2",
        # a backtrace printed after a failed allocation can wait forever on
        # a lock the failing thread holds: an abort must end the child
        "RUST_BACKTRACE": "0",
    }
    (tmp_path / "spill").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "root"), "64M"],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    results = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert results["spill files left"]["files"] == 0, "spilled files outlived the queries"
    # sorts and grouped aggregates spill, and answer right
    assert results["sort"] == {"name": "sort", "ok": True}
    assert results["aggregate"] == {"name": "aggregate", "ok": True}
    # a join's build side cannot spill, nor can a result be handed back in
    # part, and DataFusion's merge of spilled runs may need more than the
    # limit: right, or the typed error saying so
    for name in ("join", "sorted rows"):
        got = results[name]
        assert got.get("ok") is True or "DATASETRT_MEMORY_LIMIT" in got["message"], got
    # ten billion rows fit nowhere (the sorted ones not on 1 GiB of disk
    # either): the typed error, saying what to raise
    for name, limit in (("cross join", "MEMORY"), ("cross join sorted", "SPILL")):
        assert results[name]["error"] == "QueryError", results[name]
        assert f"DATASETRT_{limit}_LIMIT" in results[name]["message"], results[name]
    assert results["after"] == {"name": "after", "ok": True}
    # what the queries held resident beyond the setup: the 64 MiB pool, the
    # sorted rows handed back (24 MB), DataFusion's untracked buffers: 38-86 MB
    # measured over 12 runs
    assert results["held"]["bytes"] < 256 << 20, results["held"]


def test_memory_limit_is_checked_and_kept_by_pickles(tmp_path):
    root = tmp_path / "root"
    drt.build(root, [Source("memory-v2", 20)], progress=False)
    for bad in ("lots", "1.5G", "100", -5, 2.5, True):
        with pytest.raises(drt.InvalidInputError, match="memory_limit"):
            drt.open(root, memory_limit=bad)
    import pickle

    ds = drt.open(root, memory_limit="256M")
    assert pickle.loads(pickle.dumps(ds))._memory_limit == "256M"
    assert ds.sql("SELECT count(*) AS n FROM metadata")["n"][0] == 20
