"""Exact resume: a tiny state continues the same global sequence, whatever the
number of workers or ranks, at a cost that does not depend on the position."""

from __future__ import annotations

import json

import pytest

import datasetrt as drt

BS = 20
MODES = ["replacement", "permutation", "weighted_without_replacement", "balanced"]


def ids(batch) -> list[tuple[int, int]]:
    return list(zip(batch.cache_id, batch.sample_id, strict=True))


def sequence(ds, **kw) -> list[list[tuple[int, int]]]:
    return [ids(b) for b in ds.loader(BS, seed=5, epoch=2, **kw)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stop", [0, 1, 3, 39])
def test_resuming_after_any_batch_continues_the_sequence(two_caches, mode, stop):
    ds, _, _ = two_caches
    full = sequence(ds, sampling=mode)
    loader = ds.loader(BS, seed=5, epoch=2, sampling=mode)
    for _ in range(stop):
        next(loader)
    state = json.loads(json.dumps(loader.state_dict()))  # JSON round trip: it is plain data
    assert state["position"] == stop * BS and state["sampling"] == mode
    resumed = [ids(b) for b in ds.loader(BS, resume=state)]
    assert resumed == full[stop:]


def test_resuming_with_more_workers(two_caches):
    ds, _, _ = two_caches
    full = sequence(ds)
    loader = ds.loader(BS, seed=5, epoch=2)
    for _ in range(7):
        next(loader)
    state = loader.state_dict()
    parts = [
        [
            ids(b)
            for b in drt.Loader(
                ds,
                drt._native.LoaderSpec(
                    batch_size=BS,
                    prefetch_bytes=1 << 20,
                    prefetch_batches=2,
                    worker=w,
                    num_workers=3,
                    resume=state,
                ),
            )
        ]
        for w in range(3)
    ]
    merged = [parts[i % 3][i // 3] for i in range(sum(map(len, parts)))]
    assert merged == full[7:]


def test_elastic_resume_from_one_rank_to_two_to_four(two_caches):
    ds, _, _ = two_caches  # 800 rows: 40 batches of 20
    full = [x for b in sequence(ds) for x in b]

    one = ds.loader(BS, seed=5, epoch=2, rank=0, world_size=1)
    got = [x for _ in range(6) for x in ids(next(one))]
    state = one.state_dict()

    twos = [ds.loader(BS, resume=state, rank=r, world_size=2) for r in range(2)]
    for _ in range(5):  # both ranks in lockstep
        for r in range(2):
            got += ids(next(twos[r]))
    states = [t.state_dict() for t in twos]
    assert states[0] == states[1]

    fours = [ds.loader(BS, resume=states[0], rank=r, world_size=4) for r in range(4)]
    rest = [[ids(b) for b in f] for f in fours]
    assert len({len(r) for r in rest}) == 1  # equal counts per rank
    for i in range(len(rest[0])):
        for r in range(4):
            got += rest[r][i]
    assert got[: len(full)] == full  # padding only extends past the epoch


def test_resume_cost_does_not_depend_on_the_position(two_caches):
    ds, _, _ = two_caches
    loader = ds.loader(BS, seed=5)
    for _ in range(38):
        next(loader)
    resumed = ds.loader(BS, resume=loader.state_dict())
    assert sum(len(b) for b in resumed) == 2 * BS
    # the plan started at block 38: it drew and read nothing before it
    assert "start_block=38" in resumed.explain()
    assert "output_rows=40" in resumed.metrics()


def test_a_state_names_its_snapshot_and_survives_later_updates(two_caches):
    ds, _, _ = two_caches
    ds.update_metadata(ds.get_metadata().head(200))
    loader = ds.loader(BS, seed=5)
    next(loader)
    state = loader.state_dict()
    expected = [ids(b) for b in loader]
    ds.update_metadata(ds.get_metadata().head(10))  # a new population for new runs
    assert [ids(b) for b in ds.loader(BS, resume=state)] == expected


def test_a_state_that_no_longer_matches_is_refused(two_caches):
    ds, _, _ = two_caches
    state = ds.loader(BS, seed=5).state_dict()
    with pytest.raises(drt.InvalidInputError, match="fingerprint"):
        ds.loader(BS, resume={**state, "fingerprint": "0" * 32})
    with pytest.raises(drt.InvalidInputError, match="snapshot 99"):
        ds.loader(BS, resume={**state, "snapshot": 99})
    with pytest.raises(drt.InvalidInputError, match="multiple of batch_size"):
        ds.loader(7, resume={**state, "position": 20})
    with pytest.raises(drt.InvalidInputError, match="state_dict"):
        ds.loader(BS, resume={"position": 3})


def test_rank_and_world_size_default_from_the_environment(two_caches, monkeypatch):
    ds, _, _ = two_caches
    full = sequence(ds, rank=0, world_size=1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank1 = [ids(b) for b in ds.loader(BS, seed=5, epoch=2)]
    assert rank1 == full[1::2]
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(drt.InvalidInputError, match="rank 2"):
        ds.loader(BS, seed=5)


def test_torch_dataset_state_resumes_with_other_worker_counts(two_caches):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    ds, _, _ = two_caches
    tds = ds.to_torch(batch_size=BS, seed=5, epoch=2, sampling="permutation")

    def run(workers):
        loader = DataLoader(
            tds,
            batch_size=None,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
        )
        return [
            list(zip(b["cache_id"].tolist(), b["sample_id"].tolist(), strict=True)) for b in loader
        ]

    full = run(0)
    assert len(full) == len(tds) == 40
    state = tds.state_dict(batches_seen=9)
    tds.load_state_dict(json.loads(json.dumps(state)))
    assert run(2) == full[9:]
