"""Online data mixing: a controller that moves a mixture's shares toward the
groups the model is still learning, from the score log.

Every ``every`` steps :class:`MixtureController` reads each group's mean loss
from the score log (the SQL recipe ``sql/group_losses.sql``, run with
:meth:`Dataset.sql`), turns it into a signal (excess loss over a reference
by default; learning progress and raw loss are options, and traps when a
group cannot be learned), makes an
exponentiated-gradient step on the group shares (:func:`eg_update`), as
online data mixing does (Albalak et al. 2023,
"Efficient Online Data Mixing For Language Model Pre-Training") and DoReMi
(Xie et al. 2023) on excess losses, and commits the shares with
:meth:`Dataset.set_mixture`. The mixture is part of the population, so every
change is a snapshot: versioned, in the fingerprint, replayed by resume.

>>> from datasetrt.mixing import MixtureController  # doctest: +SKIP
>>> log = ds.score_log("loss", run="exp1")  # doctest: +SKIP
>>> ctl = MixtureController(ds, "source", every=100, eta=0.5, log=log)  # doctest: +SKIP
>>> for step, batch in enumerate(ds.loader(64, seed=7, run="exp1"), 1):  # doctest: +SKIP
...     log.append_batch(batch, train_step(batch), epoch=0)
...     ctl.step(step)  # every 100 steps: read the losses, commit the new shares

The update rule alone, on plain dicts:

>>> shares = eg_update({"web": 0.5, "code": 0.5}, {"web": 1.0, "code": 3.0}, eta=1.0)
>>> shares["code"] > 0.5 > shares["web"], round(sum(shares.values()), 12)
(True, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import polars as pl

from . import recipes
from ._state import U64, check_int, check_text
from .exceptions import InvalidInputError
from .scores import ScoreLog, check_run

if TYPE_CHECKING:
    from .dataset import Dataset

#: Share of the draws the default floor reserves in all: each of ``n``
#: groups gets at least ``DEFAULT_FLOOR_MASS / n``.
DEFAULT_FLOOR_MASS = 0.01

#: ``window`` for "every row since the last update".
_UNBOUNDED = 1 << 62

#: A committed share is stored to the nearest 1/65,536 (``set_mixture``):
#: shares that differ from the committed ones by less are not committed again.
_RESOLUTION = 2.0**-15

#: The columns of :func:`group_losses`.
SCHEMA = {
    "value": pl.String,
    "loss": pl.Float64,
    "n": pl.Int64,
    "last_epoch": pl.UInt64,
    "last_position": pl.UInt64,
}


def _number(value: object, name: str) -> float:
    """``value`` as a finite float (an int or a float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInputError(f"{name} must be finite, got {value}")
    return value


def check_eta(eta: object) -> float:
    """The learning rate: a finite number >= 0 (0 keeps the shares)."""
    eta = _number(eta, "eta")
    if eta < 0:
        raise InvalidInputError(f"eta must be >= 0 (a larger loss gains share), got {eta}")
    return eta


def check_floor(floor: object, groups: int) -> float:
    """The smallest share of each of ``groups`` groups: ``None`` for
    ``DEFAULT_FLOOR_MASS / groups``, else a number in ``[0, 1 / groups]``."""
    if floor is None:
        return DEFAULT_FLOOR_MASS / groups
    floor = _number(floor, "floor")
    if floor < 0:
        raise InvalidInputError(f"floor must be >= 0, got {floor}")
    if floor * groups > 1 + 1e-12:
        raise InvalidInputError(
            f"floor {floor} cannot hold for {groups} groups: floor * groups = "
            f"{floor * groups:g} > 1 (at most {1 / groups:g})"
        )
    return min(floor, 1 / groups)


def _normalized(shares: Mapping[Any, float]) -> dict[Any, float]:
    """``shares`` checked (a non-empty dict of finite numbers >= 0 with a
    positive sum) and divided by their sum."""
    if not isinstance(shares, Mapping) or not shares:
        raise InvalidInputError(
            f"shares must be a non-empty dict of group -> share, not {shares!r}"
        )
    out = {g: _number(s, f"the share of group {g!r}") for g, s in shares.items()}
    if any(s < 0 for s in out.values()):
        bad = next(g for g, s in out.items() if s < 0)
        raise InvalidInputError(f"the share of group {bad!r} must be >= 0, got {out[bad]}")
    total = math.fsum(out.values())
    if total <= 0:
        raise InvalidInputError("the shares must have a positive sum")
    return {g: s / total for g, s in out.items()}


def _lift(shares: dict[Any, float], floor: float, movable: set[Any]) -> dict[Any, float]:
    """Raise the shares below ``floor`` to it and scale the other ``movable``
    groups down by one factor so that the sum is unchanged (repeated while
    that takes one below the floor): the KL projection onto the shares that
    hold the floor, the one that suits a multiplicative update. Nothing
    moves when every share holds the floor."""
    mass = math.fsum(shares[g] for g in movable)
    pinned: set[Any] = set()
    scale = 1.0
    while True:
        low = {g for g in movable - pinned if shares[g] * scale < floor}
        if not low:
            break
        pinned |= low
        rest = math.fsum(shares[g] for g in movable - pinned)
        scale = (mass - len(pinned) * floor) / rest if rest > 0 else 0.0
    if not pinned:
        return dict(shares)
    return {
        g: floor if g in pinned else (s * scale if g in movable else s) for g, s in shares.items()
    }


def eg_update(
    shares: Mapping[Any, float],
    losses: Mapping[Any, float],
    eta: float,
    floor: float | None = None,
) -> dict[Any, float]:
    """One exponentiated-gradient step of group shares toward the groups of
    larger loss; returns the new shares (same keys and order, sum 1, each at
    least ``floor``).

    ``shares``: group -> share (numbers >= 0, normalised here). ``losses``:
    group -> mean loss (finite, >= 0) for the groups that have one; a key
    that is not a group is an :class:`InvalidInputError`. ``eta``: the
    learning rate (>= 0). ``floor``: each group's smallest share (default
    ``0.01 / len(shares)``; ``floor * len(shares) > 1`` is refused).

    The rule:

    1. Shares below the floor are raised to it, the others scaled down by
       one factor (the KL projection onto the shares that hold the floor).
    2. The losses are divided by their mean over the groups that have one,
       so ``eta`` needs no unit, and those groups' shares multiplied by
       ``exp(eta * loss / mean)`` and scaled *among themselves*: together
       they keep their total share. A group with no loss keeps its share;
       with fewer than two losses (or all 0) nothing moves.
    3. Shares that fell below the floor are raised to it as in 1, the mass
       taken from the other groups with a loss.

    So the group of largest loss never loses share, one of smallest loss
    never gains, and groups of equal loss keep their ratio (compared with
    the shares after step 1: every result holds the floor already).

    >>> eg_update({"a": 1, "b": 1, "c": 2}, {"a": 2.0, "b": 1.0}, eta=0.5, floor=0.1)
    ... # doctest: +ELLIPSIS
    {'a': 0.291..., 'b': 0.208..., 'c': 0.5}
    """
    p = _normalized(shares)
    eta = check_eta(eta)
    floor = check_floor(floor, len(p))
    if not isinstance(losses, Mapping):
        raise InvalidInputError(f"losses must be a dict of group -> mean loss, not {losses!r}")
    loss = {}
    for g, value in losses.items():
        if g not in p:
            raise InvalidInputError(f"a loss for group {g!r}, which has no share ({list(p)})")
        loss[g] = _number(value, f"the loss of group {g!r}")
        if loss[g] < 0:
            raise InvalidInputError(
                f"the loss of group {g!r} is {loss[g]}: losses must be >= 0 "
                f"(a loss, not a log-likelihood)"
            )
    p = _lift(p, floor, set(p))
    mean = math.fsum(loss.values()) / len(loss) if loss else 0.0
    if len(loss) < 2 or mean <= 0 or eta == 0:
        return p
    # exp(eta * (l / mean - top)): the largest exponent is 0, so nothing overflows
    top = max(loss.values()) / mean
    weights = {g: p[g] * math.exp(eta * (value / mean - top)) for g, value in loss.items()}
    total = math.fsum(weights.values())
    mass = math.fsum(p[g] for g in loss)
    if total <= 0:  # every group with a loss had share 0 (floor 0)
        return p
    q = {g: (mass * weights[g] / total if g in loss else s) for g, s in p.items()}
    return _lift(q, floor, set(loss))


def _identifier(column: str) -> str:
    """``column`` as a quoted SQL identifier."""
    return '"' + column.replace('"', '""') + '"'


def group_losses(
    dataset: Dataset,
    column: str,
    *,
    run: str = "default",
    since: tuple[int, int] = (0, 0),
    window: int | None = None,
) -> pl.DataFrame:
    """Each group's mean loss over recent rows of the score log: the recipe
    ``sql/group_losses.sql`` rendered and run with :meth:`Dataset.sql`.

    Reads SQL table ``scores`` as it was last registered
    (``log.register("scores")``): the rows of run ``run`` at or after
    ``since`` (``(epoch, draw position)``), and of those the newest
    ``window`` (``None``: all), joined with ``metadata`` on
    ``(cache_id, sample_id)`` and grouped by ``column``. Columns: ``value``
    (the group as text, as :meth:`Dataset.set_mixture` matches it),
    ``loss`` (the mean), ``n`` (rows), ``last_epoch`` and ``last_position``
    (the newest row read). No row: nothing logged there.
    """
    column = _check_column(dataset, column)
    run = check_run(run)
    if not isinstance(since, (tuple, list)) or len(since) != 2:
        raise InvalidInputError(f"since must be (epoch, position), not {since!r}")
    epoch = check_int(since[0], "since's epoch")
    position = check_int(since[1], "since's position")
    window = _UNBOUNDED if window is None else check_int(window, "window", 1, _UNBOUNDED)
    _, text = recipes.load("group_losses")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    query = recipes.render(
        code, {"run": run, "since_epoch": epoch, "since_position": position, "window": window}
    )
    return dataset.sql(query.replace("{column}", _identifier(column))).cast(SCHEMA)


#: The signals a :class:`MixtureController` steers by.
SIGNALS = ("progress", "excess", "loss")


class MixtureController:
    """Online data mixing: every ``every`` steps, group shares by ``column``
    updated from a signal of the groups' mean logged loss and committed as
    the mixture.

    - ``dataset``, ``column``: the mixture's column (a metadata column of
      its own: not ``cache_id``, ``sample_id`` or ``weight``).
    - ``shares``: the starting shares, group value -> share (normalised).
      ``None``: the active snapshot's mixture when it is by ``column`` (so a
      resumed run goes on from the shares it committed), else every group
      of ``column`` with rows of positive weight, in equal shares. The
      groups named are the mixture's groups, for good: rows of any other
      value are not drawn, and their losses are ignored.
    - ``every``: :meth:`step` updates at steps ``every``, ``2 * every``...
    - ``eta``: the learning rate of :func:`eg_update`. Losses are divided
      by their mean, so a group whose mean loss is 10% above the groups'
      average gains a factor ``exp(0.1 * eta)`` on one that is at it.
    - ``floor``: each group's smallest share, so no group stops being drawn
      (and measured): default ``0.01 / n_groups`` (1% of the draws reserved
      in all); ``floor * n_groups > 1`` is refused.
    - ``log``: the :class:`~datasetrt.scores.ScoreLog` the loop appends
      to, or a log name (``run``: its run; default the log's, or
      ``"default"``). Pass the log object itself: each update flushes it,
      so the rows this process buffered count. Other processes' rows count
      once they flush.
    - ``window``: ``None`` (default) reads the rows logged since the
      previous update (after its newest ``(epoch, position)``); an int, the
      newest ``window`` rows of the run, read again by later updates (a
      moving estimate), and an update without a new row changes nothing.
    - ``signal``: what a group's share grows with. Default: ``"excess"``
      when a ``reference`` is given; without one, name the signal (the one
      that pays on real data needs the reference: ``docs/benchmarks.md``).

      - ``"excess"``: excess loss, the group's mean loss minus its
        reference loss (``max(0, loss - reference)``, DoReMi's signal):
        what a model trained on clean data does better on it. The
        reference is ``reference``: a metadata column of per-sample
        reference losses (averaged over the group's rows of positive
        weight, as the controller starts) or a dict group -> loss. On
        Fashion-MNIST with one domain's labels random it kept that domain
        at 1 % of the draws and ended 2.6 points above equal shares.
      - ``"progress"``: learning progress, how much the group's mean loss
        fell since the previous update that read it
        (``max(0, previous - now)``). A group whose loss does not fall
        (learned already, or stalled) gains nothing and is pushed toward
        the floor. A group's first update gives it no signal (it keeps its
        share). A trap when a network can memorise the unlearnable group:
        its loss falls while it memorises random labels, and in the
        benchmark its share swung between the floor and 99 %.
      - ``"loss"``: the raw mean loss. A trap under noise: a group that
        cannot be learned keeps the highest loss, so it attracts draws for
        good (88 % of the draws in the benchmark).

    Each update registers the log as SQL table ``scores`` (replacing a
    table of that name), reads the losses with :func:`group_losses` and
    commits the new shares with :meth:`Dataset.set_mixture` when one moved
    by more than the mixture's resolution (1/32,768): groups with no loss
    logged keep their share, and an update that reads no loss commits
    nothing. Construction commits the starting shares unless the active
    snapshot's mixture already is them. A loader follows the new mixture
    when it is made on the new snapshot, or at once when it follows the
    head within the epoch (``ds.loader(..., run=...)``). A commit raises
    :class:`ConflictError` if another writer moved the head meanwhile.

    With several ranks, run the controller in one of them (rank 0): every
    rank flushes its log before an update step and waits for the others
    (a barrier), so the update reads every rank's rows, and the loaders
    follow the head to draw by the new shares. Each update reads the run's
    whole log (:meth:`ScoreLog.register`), so its cost grows with the rows
    logged; :meth:`state_dict` goes into the checkpoint.
    """

    def __init__(
        self,
        dataset: Dataset,
        column: str,
        shares: Mapping[Any, float] | None = None,
        *,
        every: int = 100,
        eta: float = 0.1,
        floor: float | None = None,
        log: ScoreLog | str = "loss",
        run: str | None = None,
        window: int | None = None,
        signal: str | None = None,
        reference: str | Mapping[Any, float] | None = None,
    ):
        self.dataset = dataset
        self.column = _check_column(dataset, column)
        if signal is None:
            if reference is None:
                raise InvalidInputError(
                    "MixtureController needs reference= (a metadata column of per-sample "
                    "reference losses, or a dict group -> loss) for its default signal, "
                    '"excess", or a signal named: "progress" or "loss" (both traps when a '
                    "group cannot be learned: docs/training.md)"
                )
            signal = "excess"
        if signal not in SIGNALS:
            raise InvalidInputError(f"signal must be one of {SIGNALS}, not {signal!r}")
        self.signal = signal
        self.every = check_int(every, "every", 1)
        self.eta = check_eta(eta)
        self.window = None if window is None else check_int(window, "window", 1, _UNBOUNDED)
        self.log = _score_log(dataset, log, run)
        groups = _groups(dataset, self.column)
        if shares is None:
            start = self._committed() or dict.fromkeys(groups, 1.0)
        else:
            if not isinstance(shares, Mapping) or not shares:
                raise InvalidInputError(
                    f"shares must be a non-empty dict of group -> share, or None, not {shares!r}"
                )
            start = {}
            for value, share in shares.items():
                if isinstance(value, bool) or not isinstance(value, (str, int)):
                    raise InvalidInputError(
                        f"a group is a str or int value of {self.column!r}, not {value!r}"
                    )
                group = check_text(str(value), "a group")
                if group in start:
                    raise InvalidInputError(f"the shares name group {group!r} twice")
                start[group] = share
            unknown = sorted(set(start) - set(groups))
            if unknown:
                raise InvalidInputError(
                    f"column {self.column!r} has no row of positive weight with value(s) "
                    f"{unknown}; its groups: {groups}"
                )
        self.floor = check_floor(floor, len(start))
        #: Each group's reference loss (``signal="excess"``), else None.
        self.reference = _reference(dataset, self.column, list(start), signal, reference)
        #: Each group's mean loss at the last update that read it.
        self.previous: dict[str, float] = {}
        #: The shares held now (committed when they moved, see the class).
        self.shares: dict[str, float] = eg_update(start, {}, self.eta, self.floor)
        #: The newest (epoch, position) an update read, or None.
        self.newest: tuple[int, int] | None = None
        #: What the last update read (:func:`group_losses`), or None.
        self.losses: pl.DataFrame | None = None
        self._sync()

    def __repr__(self) -> str:
        shares = ", ".join(f"{g}: {s:.4f}" for g, s in self.shares.items())
        return f"<datasetrt.mixing.MixtureController {self.column!r} {{{shares}}}>"

    @property
    def run(self) -> str:
        """The run of the score log read."""
        return self.log.run

    def step(self, step: int) -> dict[str, float] | None:
        """:meth:`update` at steps ``every``, ``2 * every``...: its shares
        there, ``None`` at other steps (and at step 0)."""
        step = check_int(step, "step")
        if step == 0 or step % self.every:
            return None
        return self.update()

    def update(self) -> dict[str, float]:
        """Read the losses logged (see the class), make one
        :func:`eg_update` step, commit the shares if they moved; returns the
        shares held now (a copy)."""
        self.log.register("scores", run=self.run)
        since = (0, 0) if self.window is not None else _after(self.newest)
        frame = group_losses(
            self.dataset, self.column, run=self.run, since=since, window=self.window
        )
        if frame.height == 0:
            return dict(self.shares)
        newest = (int(frame["last_epoch"][0]), int(frame["last_position"][0]))
        if self.window is not None and newest == self.newest:
            return dict(self.shares)  # no new row: the same losses again
        self.newest, self.losses = newest, frame
        losses = {
            g: v for g, v in zip(frame["value"], frame["loss"], strict=True) if g in self.shares
        }
        self.shares = eg_update(self.shares, self._signal(losses), self.eta, self.floor)
        self._sync()
        return dict(self.shares)

    def _signal(self, losses: dict[str, float]) -> dict[str, float]:
        """The groups' signal from their mean losses now (see the class)."""
        if self.signal == "loss":
            return losses
        if self.signal == "excess":
            assert self.reference is not None
            return {g: max(0.0, v - self.reference[g]) for g, v in losses.items()}
        progress = {
            g: max(0.0, self.previous[g] - v) for g, v in losses.items() if g in self.previous
        }
        self.previous.update(losses)
        return progress

    def state_dict(self) -> dict[str, Any]:
        """The controller's state, for a checkpoint: the shares (exact; the
        committed ones are rounded), the newest row read and the groups'
        previous losses (``signal="progress"``)."""
        return {
            "column": self.column,
            "shares": dict(self.shares),
            "newest": None if self.newest is None else list(self.newest),
            "previous": dict(self.previous),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (commits its shares if the
        active mixture is not them)."""
        if not isinstance(state, Mapping) or state.get("column") != self.column:
            raise InvalidInputError(
                f"not a state of a controller of column {self.column!r}: {state!r}"
            )
        given = state.get("shares")
        shares = eg_update(given, {}, self.eta, self.floor)  # checked, normalised
        if all(abs(shares[g] - given[g]) <= 1e-12 for g in shares):
            shares = {g: float(given[g]) for g in shares}  # exactly as saved
        newest = state.get("newest")
        if newest is not None:
            if not isinstance(newest, (tuple, list)) or len(newest) != 2:
                raise InvalidInputError(f"the state's newest must be [epoch, position]: {newest!r}")
            newest = (check_int(newest[0], "newest epoch"), check_int(newest[1], "newest position"))
        previous = state.get("previous") or {}
        if not isinstance(previous, Mapping) or not all(
            g in self.shares and isinstance(v, (int, float)) and math.isfinite(v)
            for g, v in previous.items()
        ):
            raise InvalidInputError(
                f"the state's previous losses are not group -> loss: {previous!r}"
            )
        self.shares, self.newest = shares, newest
        self.previous = {g: float(v) for g, v in previous.items()}
        self._sync()

    # -- the committed mixture ------------------------------------------------------
    def _committed(self) -> dict[str, float] | None:
        """The active snapshot's mixture, if it is by this column."""
        frame = self.dataset.mixture()
        if frame is None or frame["column"][0] != self.column:
            return None
        return dict(zip(frame["value"], frame["share"], strict=True))

    def _sync(self) -> None:
        """Commit the shares unless the active mixture already is them."""
        committed = self._committed()
        if (
            committed is not None
            and committed.keys() == self.shares.keys()
            and all(abs(committed[g] - s) <= _RESOLUTION for g, s in self.shares.items())
        ):
            return
        self.dataset.set_mixture(self.column, self.shares)


def _after(key: tuple[int, int] | None) -> tuple[int, int]:
    """The first (epoch, position) after ``key``."""
    if key is None:
        return (0, 0)
    epoch, position = key
    return (epoch + 1, 0) if position == U64 - 1 else (epoch, position + 1)


def _check_column(dataset: Dataset, column: object) -> str:
    """``column`` if the active population has it and a mixture may group by it."""
    column = check_text(column, "the mixture's column")
    columns = dataset.get_metadata().columns
    if column in ("cache_id", "sample_id", "weight"):
        raise InvalidInputError(f"a mixture groups rows by a column of their own, not {column!r}")
    if column not in columns:
        raise InvalidInputError(f"the population has no column {column!r}; its columns: {columns}")
    return column


def _groups(dataset: Dataset, column: str) -> list[str]:
    """The values of ``column`` (as text) that have rows of positive weight."""
    name = _identifier(column)
    frame = dataset.sql(
        f"SELECT CAST({name} AS VARCHAR) AS value FROM metadata "
        f"WHERE {name} IS NOT NULL GROUP BY 1 HAVING sum(weight) > 0 ORDER BY 1"
    )
    if frame.height == 0:
        raise InvalidInputError(f"column {column!r} has no value with rows of positive weight")
    return frame["value"].to_list()


def _reference(
    dataset: Dataset, column: str, groups: list[str], signal: str, reference: object
) -> dict[str, float] | None:
    """Each group's reference loss for ``signal="excess"`` (None for the
    others, which take no reference): a dict's, or a column's mean over the
    group's rows of positive weight."""
    if signal != "excess":
        if reference is not None:
            raise InvalidInputError(f'reference is for signal="excess", not {signal!r}')
        return None
    if isinstance(reference, Mapping):
        got = {str(g): v for g, v in reference.items()}
        missing = sorted(set(groups) - set(got))
        if missing:
            raise InvalidInputError(f"reference has no loss for group(s) {missing}")
        bad = {g: v for g, v in got.items() if g in groups and not _finite_number(v)}
        if bad:
            raise InvalidInputError(f"reference losses must be finite numbers: {bad}")
        return {g: float(got[g]) for g in groups}
    if not isinstance(reference, str):
        raise InvalidInputError(
            'signal="excess" needs reference: a metadata column of reference losses, '
            f"or a dict group -> loss; got {reference!r}"
        )
    columns = dataset.get_metadata().columns
    if reference not in columns:
        raise InvalidInputError(
            f"the population has no column {reference!r}; its columns: {columns}"
        )
    group, ref = _identifier(column), _identifier(reference)
    frame = dataset.sql(
        f"SELECT CAST({group} AS VARCHAR) AS value, avg(CAST({ref} AS DOUBLE)) AS loss, "
        f"count({ref}) AS n FROM metadata WHERE weight > 0 GROUP BY 1"
    )
    found = {v: loss for v, loss, n in frame.iter_rows() if n > 0}
    missing = sorted(g for g in groups if g not in found or not _finite_number(found[g]))
    if missing:
        raise InvalidInputError(
            f"column {reference!r} has no finite reference loss for group(s) {missing}"
        )
    return {g: float(found[g]) for g in groups}


def _finite_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _score_log(dataset: Dataset, log: object, run: str | None) -> ScoreLog:
    """The score log to read: ``log`` itself, or the log of that name."""
    if isinstance(log, ScoreLog):
        if log.dataset is not dataset:
            raise InvalidInputError("the score log is of another Dataset object")
        if run is not None and check_run(run) != log.run:
            raise InvalidInputError(f"run {run!r} differs from the log's run {log.run!r}")
        return log
    if not isinstance(log, str):
        raise InvalidInputError(f"log must be a ScoreLog or a log name, not {log!r}")
    return dataset.score_log(log, run)
