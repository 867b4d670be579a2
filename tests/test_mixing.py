"""Online data mixing (datasetrt.mixing): the exponentiated-gradient rule alone,
the recipe sql/group_losses.sql, and the controller that reads the score log
and commits the mixture."""

from __future__ import annotations

import collections
import math
import random

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source
from datasetrt.mixing import MixtureController, eg_update, group_losses

SOURCES = ("web", "code", "books")
#: The loss every sample of a group gets in the training stand-in.
LOSS = {"web": 1.0, "code": 2.0, "books": 0.5}


@pytest.fixture
def ds(tmp_path):
    """300 rows: `source` web, code, books in turn; `label` 0-3."""
    src = Source("mixing-v1", 300, meta=lambda i: {"source": SOURCES[i % 3], "label": i % 4})
    return drt.build(tmp_path, [src], progress=False)


# -- the update rule ------------------------------------------------------------
def test_the_group_of_larger_loss_gains_share():
    shares = eg_update({"a": 1, "b": 1, "c": 1}, {"a": 3.0, "b": 2.0, "c": 1.0}, eta=0.5, floor=0)
    assert shares["a"] > 1 / 3 > shares["c"] and shares["a"] > shares["b"] > shares["c"]
    # the rule by hand: shares times exp(eta * loss / mean loss), normalised
    raw = {g: math.exp(0.5 * loss / 2.0) for g, loss in {"a": 3.0, "b": 2.0, "c": 1.0}.items()}
    assert shares == pytest.approx({g: w / sum(raw.values()) for g, w in raw.items()}, rel=1e-12)
    # losses in other units (times 100, plus nothing) move the shares the same way
    scaled = eg_update({"a": 1, "b": 1, "c": 1}, {"a": 300, "b": 200, "c": 100}, eta=0.5, floor=0)
    assert scaled == pytest.approx(shares, rel=1e-12)
    # repeated, the hardest group takes the draws, down to the floor for the others
    for _ in range(200):
        shares = eg_update(shares, {"a": 3.0, "b": 2.0, "c": 1.0}, eta=0.5, floor=0.05)
    assert shares == pytest.approx({"a": 0.9, "b": 0.05, "c": 0.05})


@pytest.mark.parametrize("seed", range(4))
def test_shares_sum_to_one_hold_the_floor_and_move_by_the_losses(seed):
    rng = random.Random(seed)
    for _ in range(500):
        n = rng.randint(1, 7)
        start = {f"g{i}": rng.random() ** 3 for i in range(n)}
        floor = rng.choice([0.0, rng.random() / n, 1 / n, 0.01 / n])
        logged = rng.sample(sorted(start), rng.randint(0, n))
        losses = {g: rng.choice([rng.random() * 5, 1.0, 0.0]) for g in logged}
        eta = rng.choice([0.0, 0.1, 1.0, 30.0, 1e4])
        before = eg_update(start, {}, eta, floor)  # step 1 alone: onto the floor
        after = eg_update(before, losses, eta, floor)
        for shares in (before, after):
            assert list(shares) == list(start)
            assert abs(math.fsum(shares.values()) - 1) < 1e-9
            assert min(shares.values()) >= floor
        for g in start.keys() - losses.keys():  # no loss logged: the share stays
            assert after[g] == pytest.approx(before[g], rel=1e-12, abs=1e-15)
        if losses:
            top, bottom = max(losses.values()), min(losses.values())
            for g, loss in losses.items():
                if loss == top:
                    assert after[g] >= before[g] - 1e-12
                if loss == bottom:
                    assert after[g] <= before[g] + 1e-12


def test_the_floor():
    start = {"a": 0.98, "b": 0.01, "c": 0.01}
    lifted = eg_update(start, {}, eta=1.0, floor=0.1)
    # raised to the floor, the other scaled down: 0.98 -> 0.8
    assert lifted == pytest.approx({"a": 0.8, "b": 0.1, "c": 0.1})
    assert eg_update(start, {}, eta=1.0, floor=0.0) == pytest.approx(start)
    # the default: 1% of the draws reserved, 0.01 / n each
    assert min(eg_update({"a": 1, "b": 0, "c": 0, "d": 0}, {}, eta=1.0).values()) == 0.0025
    # floor * groups = 1 is the uniform mixture, above 1 is refused
    uniform = eg_update(start, {"a": 5.0, "b": 1.0}, eta=3.0, floor=1 / 3)
    assert uniform == pytest.approx(dict.fromkeys("abc", 1 / 3))
    with pytest.raises(drt.InvalidInputError, match="floor"):
        eg_update(start, {}, eta=1.0, floor=0.34)


def test_nothing_moves_without_two_losses_to_compare():
    start = {"a": 0.5, "b": 0.3, "c": 0.2}
    for losses, eta in [
        ({}, 1.0),
        ({"a": 4.0}, 1.0),  # one group: nothing to compare it with
        ({"a": 0.0, "b": 0.0}, 1.0),  # all 0
        ({"a": 4.0, "b": 1.0}, 0.0),  # eta 0
        ({"a": 2.0, "b": 2.0, "c": 2.0}, 5.0),  # equal losses
    ]:
        assert eg_update(start, losses, eta, floor=0.01) == pytest.approx(start, rel=1e-12)
    # two of three: c keeps its 0.2, a and b share their 0.8
    moved = eg_update(start, {"a": 1.0, "b": 3.0}, eta=1.0, floor=0.01)
    assert moved["c"] == pytest.approx(0.2, rel=1e-12) and moved["b"] > 0.3 and moved["a"] < 0.5


@pytest.mark.parametrize(
    ("shares", "losses", "eta", "floor", "says"),
    [
        ({"a": 1, "b": 1}, {}, -0.1, None, "eta must be >= 0"),
        ({"a": 1, "b": 1}, {}, float("nan"), None, "eta must be finite"),
        ({"a": 1, "b": 1}, {}, float("inf"), None, "eta must be finite"),
        ({"a": 1, "b": 1}, {}, True, None, "eta must be a number"),
        ({"a": 1, "b": 1}, {}, "1", None, "eta must be a number"),
        ({"a": 1, "b": 1}, {}, 1.0, -0.01, "floor must be >= 0"),
        ({"a": 1, "b": 1}, {}, 1.0, float("nan"), "floor must be finite"),
        ({"a": 1, "b": 1}, {}, 1.0, 0.6, "floor \\* groups"),
        ({"a": 1, "b": 1}, {"c": 1.0}, 1.0, None, "group 'c', which has no share"),
        ({"a": 1, "b": 1}, {"a": -1.0}, 1.0, None, "losses must be >= 0"),
        ({"a": 1, "b": 1}, {"a": float("inf")}, 1.0, None, "must be finite"),
        ({"a": 1, "b": 1}, [("a", 1.0)], 1.0, None, "losses must be a dict"),
        ({}, {}, 1.0, None, "non-empty dict"),
        ({"a": -1, "b": 2}, {}, 1.0, None, "must be >= 0"),
        ({"a": 0, "b": 0}, {}, 1.0, None, "positive sum"),
    ],
)
def test_bad_arguments_are_refused(shares, losses, eta, floor, says):
    with pytest.raises(drt.InvalidInputError, match=says):
        eg_update(shares, losses, eta, floor)


# -- the recipe -------------------------------------------------------------------
def scores_frame(ds, rows):
    """A score log as `scores`: (run, epoch, position, row of the population or a
    sample id outside it as -id, value)."""
    meta = ds.get_metadata()
    cid = meta["cache_id"][0]
    out = [
        (run, epoch, pos, cid, meta["sample_id"][row] if row >= 0 else 10_000 - row, value)
        for run, epoch, pos, row, value in rows
    ]
    frame = pl.DataFrame(
        out,
        schema={
            "run": pl.String,
            "epoch": pl.UInt64,
            "position": pl.UInt64,
            "cache_id": pl.Int64,
            "sample_id": pl.Int64,
            "value": pl.Float64,
        },
        orient="row",
    ).with_columns(rank=pl.lit(0, pl.UInt32))
    ds.register("scores", frame)
    return frame


def test_group_losses_reads_the_recent_rows_of_one_run(ds):
    rng = random.Random(5)
    rows = [
        (run, epoch, pos, rng.randrange(-3, 300), rng.random() * 4)
        for run in ("r1", "r2")
        for epoch in range(3)
        for pos in range(50)
    ]
    scores_frame(ds, rows)
    meta = ds.get_metadata()

    def expected(since, window):
        kept = sorted(
            (r for r in rows if r[0] == "r1" and (r[1], r[2]) >= since),
            key=lambda r: (r[1], r[2]),
            reverse=True,
        )[:window]
        groups = collections.defaultdict(list)
        for _, _, _, row, value in kept:
            if row >= 0:  # a sample outside the population counts for no group
                groups[meta["source"][row]].append(value)
        newest = (kept[0][1], kept[0][2])
        return {g: (sum(v) / len(v), len(v), *newest) for g, v in sorted(groups.items())}

    for since, window in [((0, 0), None), ((1, 20), None), ((2, 0), 30), ((0, 0), 7)]:
        got = group_losses(ds, "source", run="r1", since=since, window=window)
        assert got.columns == ["value", "loss", "n", "last_epoch", "last_position"]
        want = expected(since, 10**9 if window is None else window)
        assert {r[0]: r[2:] for r in got.iter_rows()} == {g: w[1:] for g, w in want.items()}
        assert dict(got.select("value", "loss").iter_rows()) == pytest.approx(
            {g: w[0] for g, w in want.items()}, rel=1e-12
        )
    assert group_losses(ds, "source", run="r1", since=(3, 0)).height == 0
    assert group_losses(ds, "source", run="other").height == 0
    # an integer column, grouped as text (the way set_mixture matches groups)
    labels = group_losses(ds, "label", run="r2")
    assert labels["value"].to_list() == ["0", "1", "2", "3"]


def test_group_losses_quotes_the_column(ds):
    meta = ds.get_metadata().with_columns(pl.col("source").alias('Odd "name"'))
    ds.update_metadata(meta)
    scores_frame(ds, [("r", 0, k, k, float(k % 3)) for k in range(30)])
    got = group_losses(ds, 'Odd "name"', run="r")
    assert got.select("value", "loss", "n").rows() == [
        ("books", 2.0, 10),
        ("code", 1.0, 10),
        ("web", 0.0, 10),
    ]
    with pytest.raises(drt.InvalidInputError, match="since"):
        group_losses(ds, "source", run="r", since=(1,))
    with pytest.raises(drt.InvalidInputError, match="window"):
        group_losses(ds, "source", run="r", window=0)
    with pytest.raises(drt.InvalidInputError, match="no column 'nope'"):
        group_losses(ds, "nope", run="r")


# -- the controller ---------------------------------------------------------------
def losses_of(batch):
    """The training stand-in: each sample's loss is its group's."""
    return [LOSS[s] for s in batch.metadata["source"]]


def committed(ds):
    frame = ds.mixture()
    return None if frame is None else dict(zip(frame["value"], frame["share"], strict=True))


def test_the_controller_moves_the_mixture_to_the_larger_losses(ds):
    log = ds.score_log("loss", run="exp1")
    ctl = MixtureController(ds, "source", every=2, eta=1.0, log=log, signal="loss")
    start = ds.version  # construction committed the uniform mixture
    assert committed(ds) == pytest.approx(dict.fromkeys(["books", "code", "web"], 1 / 3), abs=1e-4)
    results, versions, rows = {}, {}, {}
    for step, batch in enumerate(ds.loader(30, seed=1, epoch_len=180), 1):
        log.append_batch(batch, losses_of(batch), epoch=0)
        results[step] = ctl.step(step)
        versions[step] = ds.version
        rows[step] = None if ctl.losses is None else ctl.losses.select("value", "loss", "n").rows()
    assert results[1] is results[3] is results[5] is None
    assert versions[1] == start and versions[2] == start + 1 and versions[6] == start + 3
    # each update reads the rows logged since the one before: 2 batches of 30
    assert (
        rows[2] == rows[4] == rows[6] == [("books", 0.5, 20), ("code", 2.0, 20), ("web", 1.0, 20)]
    )
    assert ctl.newest == (0, 179)
    first, last = results[2], results[6]
    assert first["code"] > 1 / 3 > first["web"] > first["books"]
    assert last["code"] > first["code"] and last["books"] < first["books"]
    assert committed(ds) == pytest.approx(last, abs=2**-15)
    assert ds.history()["note"][-1].startswith("set_mixture source")
    # a loader made now draws by it: each group within one draw at every prefix
    final = committed(ds)
    counts = collections.Counter()
    batches = ds.loader(10, seed=3, epoch_len=200)
    for k, sample in enumerate((s for b in batches for s in b), start=1):
        counts[SOURCES[sample.sample_id % 3]] += 1
        assert all(abs(counts[g] - final[g] * k) < 1 + 1e-9 for g in final), (k, counts)
    assert counts["code"] > counts["web"] > counts["books"] > 0


def test_a_controller_without_scores_changes_nothing(ds):
    ds.set_mixture("source", {"web": 0.5, "code": 0.3, "books": 0.2})
    version = ds.version
    ctl = MixtureController(
        ds, "source", every=3, signal="progress"
    )  # shares None: the active mixture
    assert ds.version == version
    assert ctl.shares == pytest.approx({"web": 0.5, "code": 0.3, "books": 0.2})
    for step in range(1, 10):
        ctl.step(step)
    assert ctl.update() == pytest.approx({"web": 0.5, "code": 0.3, "books": 0.2})
    assert ds.version == version and ctl.losses is None and ctl.newest is None
    # rows of another run are not this controller's
    other = ds.score_log("loss", run="other")
    meta = ds.get_metadata()[:3]
    other.append(meta["cache_id"], meta["sample_id"], [5.0, 1.0, 1.0], epoch=0, position=0)
    other.flush()
    ctl.update()
    assert ds.version == version


def test_a_fresh_controller_starts_uniform_and_commits_once(ds):
    ds.update_metadata(
        ds.get_metadata().with_columns(
            pl.when(pl.col("source") == "books").then(0.0).otherwise(1.0).alias("weight")
        )
    )
    version = ds.version
    ctl = MixtureController(ds, "source", eta=1.0, floor=0.1, signal="progress")
    assert ctl.shares == {"code": 0.5, "web": 0.5}  # books has no row of positive weight
    assert ds.version == version + 1
    ctl.update()
    MixtureController(ds, "source", signal="progress")  # the active mixture: no commit
    assert ds.version == version + 1


def test_a_restored_controller_continues_exactly(ds):
    log = ds.score_log("loss", run="exp1")
    ctl = MixtureController(
        ds,
        "source",
        {"web": 2, "code": 1, "books": 1},
        every=2,
        eta=0.7,
        log=log,
        signal="progress",
    )
    loader = ds.loader(30, seed=1, epoch_len=120)
    states = {}
    for step, batch in enumerate(loader, 1):
        log.append_batch(batch, losses_of(batch), epoch=0)
        ctl.step(step)
        states[step] = ctl.state_dict()
    restored = MixtureController(ds, "source", every=2, eta=0.7, log=log, signal="progress")
    restored.load_state_dict(states[2])  # as if the run stopped after step 2
    assert restored.newest == (0, 59)
    restored.update()  # steps 3 and 4
    assert restored.state_dict() == states[4]
    with pytest.raises(drt.InvalidInputError, match="column 'source'"):
        restored.load_state_dict({**states[2], "column": "label"})


def test_a_window_reads_the_newest_rows_and_waits_for_new_ones(ds):
    log = ds.score_log("loss", run="w")
    ctl = MixtureController(ds, "source", every=1, eta=1.0, log=log, window=45, signal="loss")
    meta = ds.get_metadata()[:90]
    losses = [LOSS[s] for s in meta["source"]]
    log.append(meta["cache_id"], meta["sample_id"], losses, epoch=0, position=0)
    ctl.update()
    assert ctl.losses["n"].sum() == 45 and ctl.newest == (0, 89)
    version, shares = ds.version, dict(ctl.shares)
    assert ctl.update() == shares and ds.version == version  # no new row: no new step
    log.append(meta["cache_id"][:1], meta["sample_id"][:1], [2.0], epoch=1, position=0)
    ctl.update()
    assert ctl.newest == (1, 0) and ctl.shares != shares


def test_the_groups_named_are_the_mixture(ds):
    log = ds.score_log("loss", run="exp1")
    ctl = MixtureController(ds, "label", {0: 1, 1: 1}, every=1, eta=1.0, log=log, signal="loss")
    assert committed(ds) == {"0": 0.5, "1": 0.5}
    meta = ds.get_metadata()
    # losses of labels 0-3; labels 2 and 3 have no share and are ignored
    meta = meta[:8]
    log.append(meta["cache_id"], meta["sample_id"], [1.0, 2.0, 9.0, 9.0] * 2, epoch=0, position=0)
    shares = ctl.update()
    assert set(shares) == {"0", "1"} and shares["1"] > 0.5 > shares["0"]


def unlearnable_run(ds, signal, **kw):
    """Twelve updates of a controller over three groups: web's loss falls
    from 2.0 to 0.9, books' from 1.0 to 0.45, code's stays 2.5 (its labels
    are random: it cannot be learned, and its raw loss is the highest).
    The shares after each update."""
    log = ds.score_log("loss", run=f"unlearnable-{signal}")
    ctl = MixtureController(
        ds, "source", every=1, eta=2.0, floor=0.02, log=log, signal=signal, **kw
    )
    meta = ds.get_metadata()
    shares = []
    for t in range(12):
        loss = {"web": 2.0 - 0.1 * t, "code": 2.5, "books": 1.0 - 0.05 * t}
        values = [loss[g] for g in meta["source"]]
        log.append(meta["cache_id"], meta["sample_id"], values, epoch=t, position=0)
        shares.append(ctl.update())
    return ctl, shares


def test_raw_loss_steers_toward_a_group_that_cannot_be_learned(ds):
    """The trap: raw loss gives the unlearnable group ever more draws."""
    _, shares = unlearnable_run(ds, "loss")
    assert shares[-1]["code"] > 0.9 and shares[-1]["code"] > shares[0]["code"]


def test_learning_progress_pushes_a_group_that_cannot_be_learned_to_the_floor(ds):
    ctl, shares = unlearnable_run(ds, "progress")
    assert shares[0] == pytest.approx(
        {"web": 1 / 3, "code": 1 / 3, "books": 1 / 3}
    )  # no history yet
    assert shares[-1]["code"] == pytest.approx(0.02, abs=1e-9)  # the floor
    # progress 0.1 (web) against 0.05 (books) a step: web leads, books above code
    assert shares[1]["web"] > shares[1]["books"] > shares[1]["code"]
    assert shares[-1]["web"] == max(shares[-1].values())
    # a restored controller continues from the same previous losses
    state = ctl.state_dict()
    assert state["previous"] == pytest.approx({"web": 0.9, "code": 2.5, "books": 0.45})
    again = MixtureController(
        ds, "source", every=1, eta=2.0, floor=0.02, log=ctl.log, signal="progress"
    )
    again.load_state_dict(state)
    assert again.previous == ctl.previous and again.shares == ctl.shares


def test_excess_loss_over_a_reference_column_pushes_an_unlearnable_group_down(ds):
    """The reference model fails on code too (random labels): its excess
    loss is small, while web's and books' is what is left to learn."""
    reference = {"web": 0.3, "code": 2.45, "books": 0.1}
    ds.update_metadata(
        ds.get_metadata().with_columns(
            pl.col("source").replace_strict(reference, return_dtype=pl.Float64).alias("il_loss")
        )
    )
    by_column, shares = unlearnable_run(ds, None, reference="il_loss")  # the default signal
    assert by_column.signal == "excess"
    assert by_column.reference == pytest.approx(reference)
    assert shares[-1]["code"] == pytest.approx(0.02, abs=1e-3)
    assert shares[-1]["web"] > 0.5
    _, by_dict = unlearnable_run(ds, "excess", reference=reference)
    assert by_dict[-1] == pytest.approx(shares[-1])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"signal": "gradient"}, "signal must be one of"),
        ({"signal": "excess"}, "needs reference"),
        ({}, "needs reference="),  # the default, excess, needs one; no other is guessed
        ({"signal": "excess", "reference": "nope"}, "no column 'nope'"),
        ({"signal": "excess", "reference": {"web": 1.0}}, "no loss for group"),
        (
            {"signal": "excess", "reference": {"web": 1.0, "code": float("nan"), "books": 0}},
            "finite",
        ),
        ({"signal": "loss", "reference": "label"}, "reference is for"),
    ],
)
def test_bad_signals_and_references_are_refused(ds, kw, match):
    with pytest.raises(drt.InvalidInputError, match=match):
        MixtureController(ds, "source", **kw)


BAD_CONTROLLERS = [
    (("nope",), {}, "no column 'nope'"),
    (("weight",), {}, "a column of their own"),
    (("sample_id",), {}, "a column of their own"),
    ((3,), {}, "must be a str"),
    (("source",), {"eta": -1.0}, "eta must be >= 0"),
    (("source",), {"eta": float("nan")}, "eta must be finite"),
    (("source",), {"floor": 0.5}, "floor \\* groups"),
    (("source",), {"floor": -0.1}, "floor must be >= 0"),
    (("source",), {"every": 0}, "every must be in"),
    (("source",), {"every": 2.5}, "every must be an int"),
    (("source",), {"every": True}, "every must be an int"),
    (("source",), {"window": 0}, "window must be in"),
    (("source", {"web": 1, "mars": 1}), {}, "'mars'"),
    (("source", {"web": -1, "code": 1}), {}, "must be >= 0"),
    (("source", {}), {}, "non-empty dict"),
    (("source", {None: 1}), {}, "str or int"),
    (("label", {1: 1, "1": 1}), {}, "twice"),
    (("source",), {"log": 5}, "ScoreLog or a log name"),
    (("source",), {"run": "bad run"}, "run's name"),
]


def test_a_bad_controller_is_refused_and_commits_nothing(ds):
    version = ds.version
    for args, kwargs, says in BAD_CONTROLLERS:
        with pytest.raises(drt.InvalidInputError, match=says):
            MixtureController(ds, *args, signal="progress", **kwargs)
        assert ds.version == version == ds.head
    with pytest.raises(drt.InvalidInputError, match="differs from the log's run"):
        MixtureController(
            ds, "source", log=ds.score_log("loss", run="a"), run="b", signal="progress"
        )
    assert ds.version == version
    ctl = MixtureController(ds, "source", signal="progress")
    with pytest.raises(drt.InvalidInputError, match="step must be"):
        ctl.step(-1)
