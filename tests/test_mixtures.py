"""Mixtures and provenance: target shares per group met at every prefix of an
epoch, kept through updates and resume, and `exposures`: what a checkpoint
trained on, recomputed from its state."""

from __future__ import annotations

import collections
import itertools

import polars as pl
import pytest

import datasetrt as drt
from conftest import MIXED_GROUPS as GROUPS
from conftest import source_of

MODES = ["replacement", "permutation", "weighted_without_replacement", "balanced"]


def delivered(ds, mode="replacement", batch_size=8, **kw):
    return [s.sample_id for b in ds.loader(batch_size, seed=3, sampling=mode, **kw) for s in b]


def assert_every_prefix_within_one(ids, shares):
    counts = collections.Counter()
    for k, sid in enumerate(ids, start=1):
        counts[source_of(sid)] += 1
        for group, share in shares.items():
            assert abs(counts[group] - share * k) < 1, (k, group, counts[group], share * k)


@pytest.mark.parametrize("mode", MODES)
def test_every_prefix_of_an_epoch_meets_the_shares_within_one_draw(mixed, mode):
    shares = {"web": 0.2, "code": 0.5, "books": 0.3}
    mixed.set_mixture("source", shares)
    ids = delivered(mixed, mode, epoch_len=400)
    assert len(ids) == 400
    assert_every_prefix_within_one(ids, shares)
    if mode != "permutation":  # within a group, by the rows' own weights
        assert not [i for i in ids if i % 7 == 0]


def test_a_permutation_walks_each_group_before_repeating_it(mixed):
    mixed.update_metadata(mixed.get_metadata().with_columns(pl.lit(1.0).alias("weight")))
    mixed.set_mixture("source", {"web": 1, "code": 1, "books": 2})
    ids = delivered(mixed, "permutation", epoch_len=80)
    books = [i for i in ids if source_of(i) == "books"]  # 40 draws of 10 rows
    for p in range(4):
        assert sorted(books[10 * p : 10 * p + 10]) == list(range(90, 100))
    code = [i for i in ids if source_of(i) == "code"]  # 20 draws of 30 rows
    assert len(set(code)) == 20


def test_the_default_epoch_is_the_rows_of_the_groups_with_a_share(mixed):
    mixed.set_mixture("source", {"web": 0.5, "books": 0.5, "code": 0})
    ids = delivered(mixed, "permutation")
    assert len(ids) == 70
    assert {source_of(i) for i in ids} == {"web", "books"}


def test_ranks_and_resume_split_the_one_sequence(mixed):
    mixed.set_mixture("source", {"web": 0.6, "code": 0.3, "books": 0.1})
    whole = delivered(mixed, epoch_len=200)
    ranks = [delivered(mixed, epoch_len=200, rank=r, world_size=2) for r in range(2)]
    # rank r takes every other batch; both are padded to 13 batches (208 draws)
    interleaved = [
        i for pair in zip(*(list(_batches(r)) for r in ranks), strict=True) for b in pair for i in b
    ]
    assert len(interleaved) == 208
    assert interleaved[:200] == whole
    loader = mixed.loader(8, seed=3, epoch_len=200)
    head = [s.sample_id for b in itertools.islice(loader, 7) for s in b]
    state = loader.state_dict()
    rest = delivered(mixed, epoch_len=200, resume=state)
    assert head + rest == whole


def _batches(ids, size=8):
    for i in range(0, len(ids), size):
        yield ids[i : i + size]


def test_the_mixture_is_versioned_with_the_population(mixed):
    before = mixed.version
    plain = delivered(mixed, epoch_len=50)
    number = mixed.set_mixture("source", {"web": 0.6, "code": 0.3, "books": 0.1})
    assert number == mixed.version == mixed.head
    assert mixed.get_metadata().equals(mixed.get_metadata(before))  # the same rows
    shown = mixed.mixture()
    assert shown.to_dicts() == [
        {"column": "source", "value": "web", "share": 0.6},
        {"column": "source", "value": "code", "share": 0.3},
        {"column": "source", "value": "books", "share": 0.1},
    ]
    assert mixed.sql("SELECT value, share FROM mixture ORDER BY share").rows() == [
        ("books", 0.1),
        ("code", 0.3),
        ("web", 0.6),
    ]
    assert mixed.mixture(before) is None
    # an update that keeps the column keeps the mixture
    mixed.select("SELECT * FROM metadata WHERE sample_id <> 1")
    assert mixed.mixture()["share"].to_list() == [0.6, 0.3, 0.1]
    with pytest.raises(drt.InvalidInputError, match="drops"):
        mixed.select("SELECT * EXCLUDE (source) FROM metadata")
    mixed.set_mixture(None)
    assert mixed.mixture() is None
    assert mixed.sql("SELECT count(*) AS n FROM mixture")["n"].to_list() == [0]
    mixed.checkout(before)
    assert delivered(mixed, epoch_len=50) == plain


def test_a_snapshot_with_a_mixture_has_its_own_fingerprint(mixed):
    plain = mixed.fingerprint
    mixed.set_mixture("source", {"web": 1, "code": 1})
    first = mixed.fingerprint
    mixed.set_mixture("source", {"web": 1, "code": 2})
    assert len({plain, first, mixed.fingerprint}) == 3


@pytest.mark.parametrize(
    ("column", "shares", "says"),
    [
        ("nope", {"a": 1.0}, "does not have"),
        ("source", {"web": 1.0, "nowhere": 1.0}, "'nowhere'|\"nowhere\""),
        ("source", {"web": -1.0}, "non-negative"),
        ("source", {"web": float("nan")}, "finite"),
        ("source", {"web": 0.0}, "positive"),
        ("source", {"web": True}, "must be a number"),
        ("source", {"web": "0.5"}, "must be a number"),
        ("source", {}, "dict of value"),
        ("source", [("web", 1.0)], "dict of value"),
        ("source", {1: 1.0, "1": 1.0}, "twice"),
        ("source", {None: 1.0}, "str or int"),
        ("weight", {"1.0": 1.0}, "column of their own"),
        ("sample_id", {"1": 1.0}, "column of their own"),
    ],
)
def test_a_bad_mixture_is_refused_and_changes_nothing(mixed, column, shares, says):
    before = mixed.version
    with pytest.raises(drt.InvalidInputError, match=says):
        mixed.set_mixture(column, shares)
    assert mixed.version == before == mixed.head


def test_a_group_of_zero_weight_rows_is_refused(mixed):
    meta = mixed.get_metadata()
    mixed.update_metadata(
        meta.with_columns(
            pl.when(pl.col("source") == "books")
            .then(0.0)
            .otherwise(pl.col("weight"))
            .alias("weight")
        )
    )
    with pytest.raises(drt.InvalidInputError, match="all of weight 0"):
        mixed.set_mixture("source", {"web": 1, "books": 1})
    mixed.set_mixture("source", {"web": 1, "books": 0})


def test_an_integer_column_groups_by_its_values(mixed):
    mixed.set_mixture("label", {3: 1, 4: 3})
    ids = delivered(mixed, epoch_len=40)
    labels = [i % 10 for i in ids]
    assert collections.Counter(labels) == {3: 10, 4: 30}


# -- provenance -------------------------------------------------------------------
def exposed(ds, state, **kw):
    frame = ds.exposures(state, **kw)
    return {(c, s): n for c, s, n in frame.iter_rows()}


def counted(batches):
    return collections.Counter(
        (c, s) for b in batches for c, s in zip(b.cache_id, b.sample_id, strict=True)
    )


@pytest.mark.parametrize("mode", MODES)
def test_exposures_are_the_draws_delivered_up_to_the_state(mixed, mode):
    mixed.set_mixture("source", {"web": 0.6, "code": 0.3, "books": 0.1})
    seen: collections.Counter = collections.Counter()
    for epoch in range(2):
        seen += counted(mixed.loader(8, seed=5, epoch=epoch, sampling=mode))
    loader = mixed.loader(8, seed=5, epoch=2, sampling=mode)
    seen += counted(itertools.islice(loader, 5))
    state = loader.state_dict()
    assert exposed(mixed, state) == dict(seen)
    # the same answer after a later update removes rows that were drawn
    mixed.select("SELECT * FROM metadata WHERE sample_id < 95")
    assert exposed(mixed, state) == dict(seen)
    assert mixed.sql("SELECT sum(count) AS n FROM exposures WHERE sample_id >= 90")[
        "n"
    ].to_list() == [sum(n for (_, s), n in seen.items() if s >= 90)]


def test_exposures_follow_the_snapshot_each_epoch_drew_and_the_ranks(mixed):
    first = mixed.version
    seen = counted(mixed.loader(8, seed=1, epoch=0, world_size=2, rank=0))
    seen += counted(mixed.loader(8, seed=1, epoch=0, world_size=2, rank=1))
    mixed.select("SELECT * FROM metadata WHERE sample_id < 50")
    loaders = [mixed.loader(8, seed=1, epoch=1, world_size=2, rank=r) for r in range(2)]
    seen += counted(loaders[0]) + counted(loaders[1])
    state = loaders[0].state_dict()  # global: both ranks kept pace
    got = exposed(mixed, state, history={0: first}, world_size=2)
    assert got == dict(seen)
    with pytest.raises(drt.InvalidInputError, match="after the state's"):
        mixed.exposures(state, history={5: first})
    with pytest.raises(drt.InvalidInputError, match="loader state"):
        mixed.exposures([1, 2])


def test_exposures_count_earlier_epochs_at_the_loaders_epoch_len(mixed):
    first = mixed.version
    seen = counted(mixed.loader(8, seed=1, epoch=0, epoch_len=48))
    mixed.select("SELECT * FROM metadata WHERE sample_id < 50")
    loader = mixed.loader(8, seed=1, epoch=1, epoch_len=48)
    seen += counted(itertools.islice(loader, 2))
    state = loader.state_dict()
    assert exposed(mixed, state, history={0: first}, epoch_len=48) == dict(seen)
    # without it, epoch 0 is counted at its snapshot's default (100 draws)
    assert sum(exposed(mixed, state, history={0: first}).values()) == 100 + 16


# -- changes during an epoch ------------------------------------------------------
def test_a_change_during_an_epoch_takes_effect_at_one_draw_and_replays(mixed):
    mixed.update_metadata(mixed.get_metadata().with_columns(pl.lit(1.0).alias("weight")))
    mixed.set_mixture("source", {"web": 1, "code": 1})
    before = mixed.version
    loader = mixed.loader(8, seed=3, epoch_len=240, sampling="permutation", run="steer")
    batches = list(itertools.islice(loader, 3))
    after = mixed.set_mixture("source", {"web": 3, "code": 1})
    batches += list(loader)
    ids = [s for b in batches for s in b.sample_id]
    numbers = [n for b in batches for n in b.snapshots]
    assert len(ids) == 240
    change = numbers.index(after)  # the first draw of the new mixture
    assert change % 8 == 0 and change >= 24  # a block boundary past what was delivered
    assert set(numbers[:change]) == {before} and set(numbers[change:]) == {after}
    assert_every_prefix_within_one(ids[:change], {"web": 0.5, "code": 0.5})
    assert_every_prefix_within_one(ids[change:], {"web": 0.75, "code": 0.25})
    # each group continues its own permutation across the change: code's
    # 30 rows all appear once before any repeats
    code = [i for i in ids if source_of(i) == "code"]
    assert sorted(code[:30]) == list(range(60, 90))
    # the metadata of a batch is its snapshot's
    assert batches[-1].metadata["source"].to_list() == [source_of(i) for i in batches[-1].sample_id]
    # the schedule is the run's: a loader of it replays the same draws,
    # whatever the head is now, and so do the exposures of its state
    mixed.set_mixture("source", {"code": 1})
    replay = [
        s
        for b in mixed.loader(8, seed=3, epoch_len=240, sampling="permutation", run="steer")
        for s in b.sample_id
    ]
    assert replay == ids
    assert exposed(mixed, loader.state_dict()) == dict(counted(batches))


def test_resume_is_exact_across_a_thousand_changes_and_other_layouts(mixed):
    import random

    rng = random.Random(20261204)
    mixed.set_mixture("source", {"web": 1, "code": 1, "books": 1})
    epoch_len = 4 * 3 * 1000 + 400  # every step of 1,000 on up to 3 ranks
    delivered_ids: list[int] = []
    changes = 0
    state = None
    layouts = [1, 2, 3]
    while changes < 1000 and len(delivered_ids) < epoch_len:
        world = rng.choice(layouts)
        kw = {"resume": state} if state else {"seed": 9, "epoch_len": epoch_len}
        loaders = [
            mixed.loader(4, run="thousand", rank=r, world_size=world, **kw) for r in range(world)
        ]
        iters = [iter(x) for x in loaders]
        stop_after = rng.randrange(5, 60)
        steps = 0
        for step in itertools.count():
            got = [next(it, None) for it in iters]
            if any(b is None for b in got):
                break
            for b in got:  # the ranks in lockstep: batches in the global order
                delivered_ids += b.sample_id
            shares = {g: rng.choice([0, 1, 2, 5]) for g in GROUPS}
            if sum(shares.values()) == 0:
                shares["web"] = 1
            mixed.set_mixture("source", shares)
            changes += 1
            steps = step + 1
            if steps >= stop_after or changes >= 1000:
                break
        state = loaders[0].state_dict()  # as if killed here: the ranks kept pace
        del loaders, iters
    assert changes == 1000
    position = state["position"]
    delivered_ids = delivered_ids[:position]
    # the run replayed alone, uninterrupted, from its schedule
    replay = mixed.loader(4, seed=9, epoch_len=epoch_len, run="thousand")
    again = [s for b in replay for s in b.sample_id][:position]
    assert again == delivered_ids
    assert sum(exposed(mixed, state).values()) == position


def claims_file(before: set[str], pid: int | None = None) -> str:
    """The run's shared claims (three words: furthest claim, flag, version)
    made since `before` was listed and mapped by process `pid` (this one if
    None): the host's other processes, tests run beside this one among them,
    make claims of their own meanwhile."""
    import glob
    import os

    with open(f"/proc/{pid or os.getpid()}/maps") as f:
        mapped = f.read()
    (path,) = {p for p in set(glob.glob(claims_pattern())) - before if p in mapped}
    return path


def claims_pattern() -> str:
    import os
    import tempfile

    shm = f"/dev/shm/datasetrt-{os.getuid()}/runs"
    if not os.path.isdir("/dev/shm"):
        shm = os.path.join(tempfile.gettempdir(), "datasetrt-runs")
    return os.path.join(shm, "*.claims")


def schedule(ds, run: str, epoch: int = 0) -> list[int]:
    """The draws at which the run's changes of `epoch` take effect."""
    from pathlib import Path

    epoch_dir = Path(ds._native.snapshot_dir) / "runs" / run / f"e{epoch:020}"
    return sorted(int(p.name) for p in epoch_dir.iterdir() if p.name.isdigit())


FIRST_READER = """
import sys
import datasetrt as drt
loader = drt.open(sys.argv[1]).loader(8, seed=3, epoch_len=400, run="boundary",
                                       prefetch_batches=1)
next(loader)
print("ready", flush=True)
change = int(sys.stdin.readline())
while change not in next(loader).snapshots:
    pass
print("placed", flush=True)
"""


def test_a_change_placed_before_anyone_claims_past_the_last_lands_on_a_boundary(mixed):
    """Two changes with no claim between them (another rank behind the
    furthest claim sees the second): the second goes to the next block
    boundary, not one draw past the first."""
    import fcntl
    import glob
    import mmap
    import os
    import subprocess
    import sys

    mixed.set_mixture("source", {"web": 1, "code": 1})
    before = set(glob.glob(claims_pattern()))
    root = os.path.dirname(mixed.paths[0])
    # the first reader places change x and ends: no claim of its lingers
    first = subprocess.Popen(
        [sys.executable, "-c", FIRST_READER, root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout.readline().strip() == "ready"
        claims = claims_file(before, first.pid)
        f = open(claims, "r+b")  # held across the whole test
        fcntl.flock(f, fcntl.LOCK_SH)  # a reader of the run lives on: not swept
        x = mixed.set_mixture("source", {"web": 3, "code": 1})
        out, _ = first.communicate(f"{x}\n", timeout=120)
        assert out.strip() == "placed"
    finally:
        first.kill()
    with f:
        (_, at) = schedule(mixed, "boundary")
        # epoch 0, nobody claimed past `at` (also not as the ended reader recorded it)
        for recorded in glob.glob(
            os.path.join(mixed._native.snapshot_dir, "runs", "boundary", "claimed-*")
        ):
            os.unlink(recorded)
        with mmap.mmap(f.fileno(), 24) as words:
            words[0:8] = at.to_bytes(8, "little")
        y = mixed.set_mixture("source", {"web": 1, "code": 3})
        behind = mixed.loader(8, seed=3, epoch_len=400, run="boundary", prefetch_batches=1)
        numbers = [n for b in behind for n in b.snapshots]
    changes = schedule(mixed, "boundary")
    assert len(changes) == 3 and all(d % 8 == 0 for d in changes), changes
    assert changes[2] == at + 8 and numbers.index(y) == at + 8


def test_the_claims_of_a_run_whose_readers_ended_are_swept(mixed):
    """The host's shared claims of a run stay while a reader holds them
    and are removed by the next reader of any run once none does."""
    import gc
    import glob
    import os
    import time

    before = set(glob.glob(claims_pattern()))
    ended = mixed.loader(8, seed=3, epoch_len=80, run="ends", prefetch_batches=1)
    next(ended)
    ended_claims = claims_file(before)
    live = mixed.loader(8, seed=3, epoch_len=80, run="lives", prefetch_batches=1)
    next(live)
    live_claims = claims_file(before | {ended_claims})
    del ended
    gc.collect()
    # the next reader of any run sweeps it (once the ended loader's read-ahead,
    # which holds it too, has stopped)
    deadline = time.monotonic() + 60
    while os.path.exists(ended_claims):
        assert time.monotonic() < deadline, "the claims of an ended run were never swept"
        next(mixed.loader(8, seed=3, epoch_len=80, run="another", prefetch_batches=1))
        time.sleep(0.05)
    assert os.path.exists(live_claims)  # held by `live`
    assert len(list(live)) == 9  # and still shared: the run reads on


RANK_SCRIPT = """
import sys, time
import datasetrt as drt
ds = drt.open(sys.argv[1])
rank, run = int(sys.argv[2]), sys.argv[3]
loader = ds.loader(10, seed=5, epoch_len=2000, run=run, rank=rank, world_size=2,
                   prefetch_batches=1)
for i, batch in enumerate(loader):
    assert len(set(batch.snapshots)) == 1, batch.snapshots  # one snapshot a block
    if i == 0:
        print("ready", flush=True)
    time.sleep(0.01 * (1 + rank))
print("done")
"""


@pytest.mark.timeout(240)
def test_racing_rank_processes_place_every_change_on_a_block_boundary(mixed):
    """Two rank processes read a run at different paces while this one
    commits changes: every change of the schedule is at a block boundary
    and every block is drawn from one snapshot."""
    import os
    import subprocess
    import sys
    import time

    mixed.set_mixture("source", {"web": 1, "code": 1})
    root = os.path.dirname(mixed.paths[0])
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, root, str(r), "racing"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        for p in ranks:  # both read: the changes below land during the epoch
            assert p.stdout.readline().strip() == "ready"
        shares = [{"web": 1, "code": 2}, {"web": 2, "code": 1}, {"books": 1, "code": 1}]
        for i in range(40):
            if any(p.poll() is not None for p in ranks):
                break
            mixed.set_mixture("source", shares[i % 3])
            time.sleep(0.02)
        outs = [p.communicate(timeout=180) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    for p, (out, err) in zip(ranks, outs, strict=True):
        assert p.returncode == 0 and out.strip() == "done", err
    changes = schedule(mixed, "racing")
    assert len(changes) > 1
    assert all(d % 10 == 0 for d in changes), changes


def test_a_writer_that_died_placing_a_change_does_not_stop_the_run(mixed):
    """A reader killed with the run's shared flag up (between raising it and
    writing the change) leaves it up: the next readers see the run's lock
    free and go on, instead of waiting for it forever."""
    import glob
    import mmap
    import os

    before = set(glob.glob(claims_pattern()))
    loader = mixed.loader(8, seed=3, epoch_len=400, run="stale-flag", prefetch_batches=1)
    next(loader)
    claims = claims_file(before)
    with open(claims, "r+b") as f, mmap.mmap(f.fileno(), 24) as words:
        words[8:16] = (1).to_bytes(8, "little")  # the flag, as a dead writer left it
    number = mixed.set_mixture("source", {"web": 1, "books": 1})
    snapshots = [n for b in loader for n in b.snapshots]
    assert number in snapshots
    with open(claims, "rb") as f:
        assert int.from_bytes(f.read(24)[8:16], "little") == 0
    os.unlink(claims)


def test_a_mixture_cleared_during_a_run_draws_the_rows_by_their_weights(mixed):
    mixed.set_mixture("source", {"web": 1, "books": 1})
    loader = mixed.loader(8, seed=3, epoch_len=160, run="clear")
    batches = list(itertools.islice(loader, 3))
    cleared = mixed.set_mixture(None)
    batches += list(loader)
    ids = [s for b in batches for s in b.sample_id]
    change = [n for b in batches for n in b.snapshots].index(cleared)
    # from the change on, draw k is the plain population's draw k (the
    # snapshots share their rows, not their way of drawing them)
    plain = delivered(mixed, epoch_len=160)
    assert ids[change:] == plain[change:]
    assert any(source_of(i) == "code" for i in ids[change:])


def test_cleanup_keeps_what_a_run_drew_until_the_run_is_removed(mixed):
    import shutil
    from pathlib import Path

    mixed.set_mixture("source", {"web": 1, "code": 1})
    loader = mixed.loader(8, seed=3, epoch_len=80, run="kept")
    batches = list(itertools.islice(loader, 2))
    drawn = {n for b in batches for n in b.snapshots}
    for weight in (2.0, 3.0):  # later snapshots the run never drew
        mixed.update_metadata(mixed.get_metadata().with_columns(pl.lit(weight).alias("weight")))
    state = loader.state_dict()
    delivered = dict(counted(batches))
    del loader, batches  # a batch keeps its snapshot open (its metadata)
    seen = exposed(mixed, state)
    removed = mixed.cleanup(keep=0)
    assert removed and drawn.isdisjoint(removed)
    assert exposed(mixed, state) == seen == delivered
    shutil.rmtree(Path(mixed._native.snapshot_dir) / "runs" / "kept")
    assert drawn <= set(mixed.cleanup(keep=0))


def test_an_update_that_empties_a_group_of_the_mixture_is_refused(mixed):
    mixed.set_mixture("source", {"web": 1, "books": 1})
    version = mixed.version
    with pytest.raises(drt.InvalidInputError, match="books"):
        mixed.select("SELECT * FROM metadata WHERE source <> 'books'")
    assert mixed.version == version and mixed.head == version
    # a group of share 0 may go
    mixed.set_mixture("source", {"web": 1, "books": 1, "code": 0})
    mixed.select("SELECT * FROM metadata WHERE source <> 'code'")


def test_a_mixture_is_set_from_the_result_of_sql(mixed):
    # equal shares per group, whatever their sizes: from a query
    shares = mixed.sql("SELECT source AS value, 1.0 AS share FROM metadata GROUP BY source")
    mixed.set_mixture("source", shares)
    shown = dict(mixed.sql("SELECT value, share FROM mixture").rows())
    assert shown == pytest.approx(dict.fromkeys(["web", "code", "books"], 1 / 3), abs=2e-5)
    # Tijdeman's bound for 3 groups: within 3/4 of a draw of 30 each
    ids = delivered(mixed, epoch_len=90)
    assert collections.Counter(source_of(i) for i in ids) == {"web": 30, "code": 30, "books": 30}
    for bad, says in [
        (pl.DataFrame({"value": ["web"]}), "lacks \\['share'\\]"),
        (pl.DataFrame({"value": ["web", "web"], "share": [1, 2]}), "twice"),
        (pl.DataFrame({"value": [None], "share": [1.0]}), "null value"),
    ]:
        with pytest.raises(drt.InvalidInputError, match=says):
            mixed.set_mixture("source", bad)


def test_exposures_refuse_a_position_past_what_the_epoch_holds(mixed):
    """A position past the epoch's draws (with its last batches' padding
    for the run's ranks) is no loader's: refused at once, never counted."""
    loader = mixed.loader(8, seed=3, epoch_len=100)
    next(loader)
    state = loader.state_dict()
    for position in (101, 10 * 100, 10**12):
        with pytest.raises(drt.InvalidInputError, match="past what epoch 0 holds"):
            mixed.exposures({**state, "position": position})
    # 13 blocks of 8 padded to 15 for 3 ranks: 120 draws, all counted
    assert mixed.exposures({**state, "position": 120}, world_size=3)["count"].sum() == 120
    with pytest.raises(drt.InvalidInputError, match="world_size"):
        mixed.exposures({**state, "position": 121}, world_size=3)
    assert mixed.exposures({**state, "position": 100})["count"].sum() == 100


def test_balanced_draws_in_a_group_give_each_row_its_floor_or_ceiling_per_epoch(tmp_path):
    """Inside a mixture group, balanced draws round each row's count over
    the group's draws in the epoch (3,000 over 995 rows of weights 3 and 1),
    not pass by pass over its rows: as without a mixture."""
    import math

    from conftest import Source

    ds = drt.build(
        tmp_path,
        [Source("bal-v1", 1000, meta=lambda i: {"g": "a" if i < 995 else "b"})],
        progress=False,
    )
    ds.update_metadata(
        ds.get_metadata().with_columns(
            pl.when(pl.col("sample_id") % 2 == 0).then(3.0).otherwise(1.0).alias("weight")
        )
    )
    ds.set_mixture("g", {"a": 1, "b": 1})
    ids = [
        s for b in ds.loader(100, seed=5, sampling="balanced", epoch_len=6000) for s in b.sample_id
    ]
    counts = collections.Counter(i for i in ids if i < 995)
    assert sum(counts.values()) == 3000
    total = sum(3.0 if i % 2 == 0 else 1.0 for i in range(995))
    for row in range(995):
        expected = 3000 * (3.0 if row % 2 == 0 else 1.0) / total
        assert math.floor(expected) <= counts[row] <= math.ceil(expected), (row, counts[row])
