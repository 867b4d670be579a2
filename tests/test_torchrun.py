"""torchrun, for real: ranks launched by ``torch.distributed.run`` (gloo on CPU),
each with DataLoader worker processes, draw disjoint, equal parts of the one
global sequence, and an elastic restart with another number of ranks delivers
exactly the rest of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import datasetrt as drt
from conftest import Source

pytest.importorskip("torch.distributed")
from datasetrt.torch import whole_loader_state

SCRIPT = Path(__file__).parent / "dist" / "torchrun_script.py"
BS = 20
SEED = 11
TIMEOUT = 120  # seconds per launch; the whole group is killed after it


def torchrun(nproc: int, out: Path, *args: object) -> list[dict]:
    """Launch ``nproc`` ranks of the script; the gathered per-rank results."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        # gloo otherwise binds to whatever the host name resolves to
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(SCRIPT),
        "--out",
        str(out),
        *map(str, args),
    ]
    # A session of its own, so a timeout kills the agent, the ranks and their workers.
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"torchrun with {nproc} ranks ran over {TIMEOUT} s:\n{stderr.decode()[-4000:]}")
    finally:
        try:  # leftover workers of a rank that died
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, stderr.decode()[-4000:]
    return json.loads(out.read_text())


def merge(per_rank: list[list]) -> list:
    """The global batch order: batch i of rank r is global batch i * world_size + r."""
    ws = len(per_rank)
    assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
    return [per_rank[i % ws][i // ws] for i in range(ws * len(per_rank[0]))]


def single(ds: drt.Dataset, sampling: str, resume: dict | None = None) -> list:
    kw = {"resume": resume} if resume else {"seed": SEED, "sampling": sampling}
    return [
        [list(x) for x in zip(b.cache_id, b.sample_id, strict=True)]
        for b in ds.loader(BS, rank=0, world_size=1, **kw)
    ]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("torchrun")
    ds = drt.build(root, [Source("alpha-v1", 500), Source("beta-v1", 300)], progress=False)
    assert len(ds) == 800  # 40 batches of 20: 2, 4 and 8 ranks divide them, 3 does not
    return root


@pytest.mark.parametrize(
    ("sampling", "method", "stateful"),
    [
        ("permutation", "fork", False),
        ("replacement", "spawn", False),
        ("replacement", "fork", True),
    ],
)
def test_torchrun_ranks_with_workers_split_one_sequence_and_resume_elastically(
    root, tmp_path, sampling, method, stateful
):
    ds = drt.open(root)
    expected = single(ds, sampling)
    assert len(expected) == 40
    common = ["--root", root, "--batch-size", BS, "--seed", SEED, "--sampling", sampling]
    common += ["--method", method]  # how the DataLoader starts its workers

    # Two ranks, two DataLoader workers each: one full epoch, then a pass
    # stopped after 7 (read by torchdata's StatefulDataLoader when `stateful`).
    saving = ["--stateful"] if stateful else []
    two = torchrun(2, tmp_path / "two.json", *common, "--workers", 2, "--stop", 7, *saving)
    assert [r["world_size"] for r in two] == [2, 2]
    full = [r["full"] for r in two]
    assert [len(f) for f in full] == [r["len"] for r in two] == [20, 20]
    draws = [[tuple(x) for b in f for x in b] for f in full]
    assert len(draws[0]) == len(draws[1]) == 400
    if sampling == "permutation":  # every row once: the ranks' samples are disjoint
        assert not set(draws[0]) & set(draws[1])
        assert set(draws[0]) | set(draws[1]) == {tuple(x) for b in expected for x in b}
    assert merge(full) == expected

    # Stopped after 7 batches per rank: 14 global batches consumed, every rank agrees.
    states = [r["state"] for r in two]
    if stateful:  # each rank's StatefulDataLoader state, as the global state it stands for
        states = [whole_loader_state(s) for s in states]
    assert states[0] == states[1] and states[0]["position"] == 14 * BS
    assert merge([r["before_stop"] for r in two]) == expected[:14]
    state_file = tmp_path / "state.json"
    # the state as saved (a StatefulDataLoader's, when `stateful`): load_state_dict takes it
    state_file.write_text(json.dumps(two[0]["state"]))
    rest = expected[14:]  # 26 batches
    assert single(ds, sampling, resume=states[0]) == rest

    # Elastic restart with three ranks: 26 batches do not divide by 3, so each
    # rank gets 9 and the last two batches continue past the epoch (padding).
    three = torchrun(3, tmp_path / "three.json", *common, "--resume", state_file)
    resumed = [r["resumed"] for r in three]
    assert [len(b) for b in resumed] == [r["len"] for r in three] == [9, 9, 9]
    assert merge(resumed)[: len(rest)] == rest

    # And with one rank (its two workers still split the batches between them).
    one = torchrun(1, tmp_path / "one.json", *common, "--resume", state_file)
    assert one[0]["len"] == len(rest)
    assert one[0]["resumed"] == rest


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("stop", [0, 5, 13])
def test_len_after_a_resume_is_what_each_rank_delivers(two_caches, drop_last, world_size, stop):
    ds = two_caches[0]  # its own dataset: the module's `root` stays as it was built
    ds.update_metadata(ds.get_metadata().head(790))  # 39.5 batches: a partial last one
    before = ds.to_torch(batch_size=BS, seed=SEED, rank=0, world_size=1, drop_last=drop_last)
    state = before.state_dict(batches_seen=stop)
    for rank in range(world_size):
        tds = ds.to_torch(
            batch_size=BS, seed=SEED, rank=rank, world_size=world_size, drop_last=drop_last
        )
        tds.load_state_dict(state)
        assert len(tds) == sum(1 for _ in tds)
