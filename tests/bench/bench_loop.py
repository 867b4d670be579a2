"""Does the hard-example loop pay on real data with label noise? (issue 50)

Fashion-MNIST (Debian's ``dataset-fashion-mnist``). With the fixed data seed
0: a pool of 12,000 training images whose labels are 40 % flipped, each to
one of the 9 other classes uniformly; a disjoint clean holdout of 3,000
training images (only the reference model sees it); the official 10,000
test images, clean. The pool is a DatasetRT cache of typed records
(``image``: 784 uint8) with metadata ``label`` (the noisy label),
``true_label``, ``flipped``, ``index``, and per seed ``il_loss``: the loss of
the reference model (the same MLP trained on the clean holdout, stopped when
its validation loss stops improving) against the pool's label, joined with
``ds.update_metadata``.

Model: MLP 784-256-10, Adam lr 1e-3, batch 128, CPU, 2 torch threads; every
arm draws 12,000 samples an epoch (``ds.loader(128, seed=, epoch=,
epoch_len=12000)``, weighted draws with replacement by the snapshot's
``weight``) for ``EPOCHS`` epochs, chosen once from the uniform arm (its test
accuracy peaks near epoch 12 and falls after as it memorises the noise) and
never retuned per arm. Epoch 0 is uniform in every arm; the weighted arms log
every step's per-sample losses (``log.append_batch``), and after each epoch
flush, register (the log as table ``scores``, or the per-sample
``score_state`` computed with polars from ``log.frame()`` until the engine
keeps that table) and ``ds.apply_sql(recipe)``: the next epoch draws by it.

Arms (seed s: the same initial weights and epoch-0 draws in every arm):

- ``U``  uniform; ``L`` ``loss_ema_weights(alpha=0.5)`` (today's recipe);
- ``R``  ``reducible_loss_weights`` (EMA loss minus the reference loss,
  rank-shaped, floor 0.1 of the mean weight, cap 2x), declared before any
  run of it;
- ``U0``, ``R0``: the same on the pool with its true labels (0 % noise);
- other shapes tried (``--no-shapes`` skips them): ``R-thr`` (threshold:
  EMA loss above the reference loss), ``R-lin`` (linear, floor 0.1, cap 3),
  ``R-raw`` (linear, no floor, cap 100: the collapse case), ``S-rank``
  (``loss_ema_weights_shaped``, rank: the shape without the reference);
- mixture variant (``--no-mixture`` skips it): the pool split by index into
  three ``domain`` s, two with their true labels and one whose every label is
  random; ``M-eq`` fixed equal shares against a ``datasetrt.MixtureController``
  steering by each of its signals: ``M-loss`` the raw loss (the trap),
  ``M-prog`` learning progress, ``M-excess`` loss over the reference model's
  (``il_loss``). The controller's changes land within the epoch, at the
  first block no reader has claimed (in principle a matter of read-ahead;
  the runs measured gave the same figures each time).

It prints, per arm, test accuracy per epoch, steps to U's best, final and
best accuracy, the flipped share of the delivered draws per epoch, and the
bookkeeping (append + flush + register + recipe; with ``--state native``,
the default, the recipe is ``log.reweight``, which folds the new segments
itself) against the whole training loop (evaluation excluded); then the
issue's "pays" criteria as PASS/MISS lines, and writes a JSON of every
figure and a PNG of median test accuracy per epoch (``--out``).
``--quick``: 1 seed, 4 epochs, a smoke run.

Set-up: ``apt-get install dataset-fashion-mnist`` (exit code 2 without it);
``make bench-loop`` builds the release extension and runs this.
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

import datasetrt as drt
from datasetrt.scores import ScoreLog

# -- the task: fixed before any arm ran --------------------------------------------
FMNIST = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
DATA_SEED, POOL, HOLDOUT, CLASSES = 0, 12_000, 3_000, 10
NOISE = 0.40
HIDDEN, BATCH, LR, THREADS = 256, 128, 1e-3, 2
# Chosen once from the uniform arm (seed 0, 30 epochs: test accuracy 0.766 after
# epoch 1, best 0.822 at epoch 12, 0.802 at 20, 0.779 at 30), never per arm.
EPOCHS = 20
REF_VAL, REF_PATIENCE, REF_MAX_EPOCHS = 600, 3, 100  # reference: holdout split, early stop
ALPHA = 0.5  # the moving average over epochs, for every loss-based arm

# -- the arms --------------------------------------------------------------------
# kind: how weights come from the log ("scores": the raw log, "state": score_state)
ARMS: dict[str, dict[str, Any]] = {
    "U": {"pool": "noisy", "recipe": None},
    "L": {"pool": "noisy", "recipe": "loss_ema_weights", "params": {"alpha": ALPHA}},
    "R": {
        "pool": "noisy",
        "recipe": "reducible_loss_weights",
        "params": {"shape": "rank", "floor": 0.1, "cap": 2.0, "anneal": 0.0},
    },
    "U0": {"pool": "clean", "recipe": None},
    "R0": {"pool": "clean", "recipe": "reducible_loss_weights", "params": "R"},
}
SHAPES: dict[str, dict[str, Any]] = {
    "R-thr": {
        "pool": "noisy",
        "recipe": "reducible_loss_weights",
        "params": {"shape": "threshold", "floor": 0.05, "cap": 2.0, "anneal": 0.0},
    },
    "R-lin": {
        "pool": "noisy",
        "recipe": "reducible_loss_weights",
        "params": {"shape": "linear", "floor": 0.1, "cap": 3.0, "anneal": 0.0},
    },
    "R-raw": {
        "pool": "noisy",
        "recipe": "reducible_loss_weights",
        "params": {"shape": "linear", "floor": 0.0, "cap": 100.0, "anneal": 0.0},
    },
    "S-rank": {
        "pool": "noisy",
        "recipe": "loss_ema_weights_shaped",
        "params": {"shape": "rank", "floor": 0.1, "cap": 2.0, "anneal": 0.0},
    },
}
STATE_RECIPES = {"reducible_loss_weights", "loss_ema_weights_shaped"}
MIX_EVERY, MIX_ETA = 20, 0.5  # the controller: an update every 20 steps (~4.7 an epoch)
# the controller's signals (MixtureController(signal=...)), an arm each
MIX_ARMS: dict[str, dict[str, Any]] = {
    "M-loss": {"signal": "loss"},
    "M-prog": {"signal": "progress"},
    "M-excess": {"signal": "excess", "reference": "il_loss"},
}
DOMAINS = ("a", "b", "c")  # by pool index; "c": every label random
RANDOM_DOMAIN = "c"

# -- the issue's criteria --------------------------------------------------------
GAIN_POINTS = 0.010  # R final >= U final + 1.0 point, every seed
STEPS_TARGET = 0.7  # R reaches U's best in <= 0.7 x U's steps (median)
R_NOISY_MAX, L_NOISY_MIN = 0.25, 0.50  # flipped share of the draws
BOOK_MAX = 0.02  # bookkeeping share of the training loop


# -- data ------------------------------------------------------------------------
def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip or not) as a numpy array."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find_fmnist() -> dict[str, Path]:
    """The four IDX files, or exit 2 saying how to install them."""
    found, missing = {}, []
    for key, stem in FILES.items():
        hits = [FMNIST / f"{stem}{ext}" for ext in (".gz", "")]
        hit = next((p for p in hits if p.is_file()), None)
        if hit is None:
            missing.append(stem)
        else:
            found[key] = hit
    if missing:
        print(
            f"Fashion-MNIST is missing ({', '.join(missing)} under {FMNIST}).\n"
            f"Install Debian's package: sudo apt-get install -y dataset-fashion-mnist\n"
            f"(its files: dpkg -L dataset-fashion-mnist)",
            file=sys.stderr,
        )
        sys.exit(2)
    return found


@dataclass
class Data:
    pool_x: np.ndarray  # (POOL, 784) uint8
    pool_true: np.ndarray  # (POOL,) int64
    pool_noisy: np.ndarray
    flipped: np.ndarray  # bool
    pool_random: np.ndarray  # labels of the mixture variant (domain c random)
    domain: np.ndarray  # str
    hold_x: torch.Tensor  # float, [0, 1]
    hold_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def make_data(noise: float) -> Data:
    files = find_fmnist()
    train_x = read_idx(files["train_x"]).reshape(-1, 784)
    train_y = read_idx(files["train_y"]).astype(np.int64)
    rng = np.random.default_rng(DATA_SEED)
    order = rng.permutation(len(train_x))
    pool, hold = order[:POOL], order[POOL : POOL + HOLDOUT]
    true = train_y[pool].copy()
    which = rng.choice(POOL, size=round(noise * POOL), replace=False)
    noisy = true.copy()
    noisy[which] = (true[which] + rng.integers(1, CLASSES, len(which))) % CLASSES
    flipped = np.zeros(POOL, bool)
    flipped[which] = True
    domain = np.array(DOMAINS)[np.arange(POOL) * len(DOMAINS) // POOL]
    random_labels = np.where(domain == RANDOM_DOMAIN, rng.integers(0, CLASSES, POOL), true).astype(
        np.int64
    )
    return Data(
        pool_x=np.ascontiguousarray(train_x[pool]),
        pool_true=true,
        pool_noisy=noisy,
        flipped=flipped,
        pool_random=random_labels,
        domain=domain,
        hold_x=to_float(train_x[hold]),
        hold_y=torch.from_numpy(train_y[hold]),
        test_x=to_float(read_idx(files["test_x"]).reshape(-1, 784)),
        test_y=torch.from_numpy(read_idx(files["test_y"]).astype(np.int64)),
    )


def to_float(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    x = torch.from_numpy(np.array(images)) if isinstance(images, np.ndarray) else images
    return x.to(torch.float32).div_(255.0)


class PoolSource:
    """The pool as typed records: the image's 784 bytes; labels in metadata."""

    fields = {"image": drt.Field("uint8", (784,))}  # noqa: RUF012

    def __init__(self, data: Data, noise: float):
        self.data = data
        self.name = f"fmnist-pool-s{DATA_SEED}-n{round(noise * 100)}"

    def __len__(self) -> int:
        return POOL

    def __iter__(self):
        d = self.data
        for i in range(POOL):
            meta = {
                "index": i,
                "label": int(d.pool_noisy[i]),
                "true_label": int(d.pool_true[i]),
                "flipped": bool(d.flipped[i]),
            }
            yield {"image": d.pool_x[i]}, meta


# -- the model -------------------------------------------------------------------
def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES)
    )


def accuracy(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def row_losses(net: torch.nn.Module, x: torch.Tensor, y: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = torch.nn.functional.cross_entropy(net(x), torch.from_numpy(y), reduction="none")
    return out.double().numpy()


@dataclass
class Reference:
    net: torch.nn.Module
    epochs: int  # the best epoch by validation loss
    test_acc: float
    seconds: float


def train_reference(data: Data, seed: int) -> Reference:
    """The MLP on the clean holdout: its last REF_VAL images validate, the
    rest train; stops REF_PATIENCE epochs after the best validation loss
    and keeps that epoch's weights."""
    t = time.perf_counter()
    x, y = data.hold_x[:-REF_VAL], data.hold_y[:-REF_VAL]
    vx, vy = data.hold_x[-REF_VAL:], data.hold_y[-REF_VAL:]
    net = mlp(seed)
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(seed)
    best, best_epoch, best_state = math.inf, 0, None
    for epoch in range(1, REF_MAX_EPOCHS + 1):
        for idx in torch.randperm(len(x), generator=gen).split(BATCH):
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            val = float(torch.nn.functional.cross_entropy(net(vx), vy))
        if val < best:
            best, best_epoch = val, epoch
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
        elif epoch - best_epoch >= REF_PATIENCE:
            break
    net.load_state_dict(best_state)
    acc = accuracy(net, data.test_x, data.test_y)
    return Reference(net, best_epoch, acc, time.perf_counter() - t)


# -- populations ---------------------------------------------------------------------
def make_bases(ds: drt.Dataset, v0: int, data: Data, ref: Reference) -> dict[str, int]:
    """The snapshots every arm of a seed starts from, all weights 1, with
    ``il_loss``: ``noisy`` (the pool), ``clean`` (true labels, 0 % noise),
    ``mix`` (a ``domain`` column; domain c's labels random)."""
    x = to_float(data.pool_x)
    bases = {}
    for name, labels in (
        ("noisy", data.pool_noisy),
        ("clean", data.pool_true),
        ("mix", data.pool_random),
    ):
        ds.checkout(v0)
        meta = ds.get_metadata()
        index = meta["index"].to_numpy()
        cols = {
            "il_loss": pl.Series(row_losses(ref.net, x, labels)[index]),
            "label": pl.Series(labels[index]),
            "flipped": pl.Series(labels[index] != data.pool_true[index]),
            "weight": pl.lit(1.0),
        }
        if name == "mix":
            cols["domain"] = pl.Series(data.domain[index])
        bases[name] = ds.update_metadata(meta.with_columns(**cols))
    return bases


def score_state(frame: pl.DataFrame, alpha: float) -> pl.DataFrame:
    """One row per sample of a score log (``log.frame()``): ``count`` (rows
    logged), ``first_epoch``, ``last_epoch``, ``last_loss`` (mean loss of its
    newest epoch) and ``ema_loss`` (moving average over its epochs of the
    per-epoch mean loss, newest weighted ``alpha``). A stand-in, in polars,
    for the table the engine will keep (``log.register_state``)."""
    per_epoch = frame.group_by("cache_id", "sample_id", "epoch").agg(
        pl.col("value").mean().alias("loss"), pl.len().alias("rows")
    )
    keys = ["cache_id", "sample_id"]
    age = pl.col("epoch").rank("ordinal", descending=True).over(keys) - 1
    per_epoch = per_epoch.with_columns(age=age.cast(pl.Int64), seen=pl.len().over(keys))
    w = (
        pl.when(pl.col("age") == pl.col("seen") - 1)
        .then(pl.lit(1.0 - alpha).pow(pl.col("age")))
        .otherwise(alpha * pl.lit(1.0 - alpha).pow(pl.col("age")))
    )
    return per_epoch.group_by(keys).agg(
        count=pl.col("rows").sum().cast(pl.UInt64),
        first_epoch=pl.col("epoch").min(),
        last_epoch=pl.col("epoch").max(),
        last_loss=pl.col("loss").sort_by("epoch").last(),
        ema_loss=(pl.col("loss") * w).sum(),
    )


# -- one arm of one seed -----------------------------------------------------------
@dataclass
class Run:
    arm: str
    seed: int
    acc: list[float] = field(default_factory=list)  # clean test accuracy after each epoch
    noisy_draws: list[float] = field(default_factory=list)  # flipped share of the draws
    noisy_weight: list[float] = field(default_factory=list)  # flipped share of the weight
    ess: list[float] = field(default_factory=list)  # effective sample size / rows
    domain_share: list[float] = field(default_factory=list)  # mixture: random domain
    steps: int = 0
    loop: float = 0.0  # the training loop's wall-clock, evaluation excluded
    book: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("append", "flush", "register", "recipe"), 0.0)
    )
    logged: int = 0
    recipes: int = 0
    checked: str = ""


class Clock:
    """The training loop's time: runs except while the run is measured."""

    def __init__(self) -> None:
        self.total, self.since = 0.0, time.perf_counter()

    def pause(self) -> None:
        self.total += time.perf_counter() - self.since

    def resume(self) -> None:
        self.since = time.perf_counter()


def step(net, opt, batch: drt.Batch) -> torch.Tensor:
    """One training step on a loader batch; the per-sample losses."""
    x = batch.torch("image").to(torch.float32).div_(255.0)
    y = torch.from_numpy(batch.metadata["label"].to_numpy(writable=True))
    losses = torch.nn.functional.cross_entropy(net(x), y, reduction="none")
    opt.zero_grad()
    losses.mean().backward()
    opt.step()
    return losses.detach()


def engine_state(log: Any) -> bool:
    """Whether this datasetrt keeps the score state itself (``log.register_state``)."""
    return hasattr(log, "register_state") and hasattr(drt._native, "ScoreState")


def reweight(ds: drt.Dataset, log: Any, spec: dict[str, Any], run: Run, state: str) -> None:
    """Between epochs: flush, register what the recipe reads, apply it."""
    book = run.book
    t0 = time.perf_counter()
    log.flush()
    t1 = time.perf_counter()
    if state == "native" and spec["recipe"] in STATE_RECIPES:
        # the same weights as the recipe, natively: fold, shape, commit
        reference = "il_loss" if spec["recipe"] == "reducible_loss_weights" else None
        log.reweight(reference=reference, alpha=ALPHA, run=log.run, **spec["params"])
        t2 = time.perf_counter()
        book["flush"] += t1 - t0
        book["recipe"] += t2 - t1
        run.recipes += 1
        return
    if spec["recipe"] not in STATE_RECIPES:
        log.register("scores", run=log.run)
    elif state == "engine":
        log.register_state("score_state", alpha=ALPHA, run=log.run)
    else:  # the polars stand-in
        ds.register("score_state", score_state(log.frame(log.run), ALPHA))
    t2 = time.perf_counter()
    ds.apply_sql(spec["recipe"], **spec["params"])
    t3 = time.perf_counter()
    book["flush"] += t1 - t0
    book["register"] += t2 - t1
    book["recipe"] += t3 - t2
    run.recipes += 1


def check_state(log: Any) -> str:
    """The engine's score state against the polars stand-in (equal, or an error)."""
    keys = ["cache_id", "sample_id"]
    ours = score_state(log.frame(log.run), ALPHA).sort(keys)
    theirs = log.state(alpha=ALPHA, run=log.run).sort(keys)
    assert ours["sample_id"].equals(theirs["sample_id"]), "the states hold other samples"
    for col in ("count", "first_epoch", "last_epoch"):
        assert (ours[col].cast(pl.Int64) == theirs[col].cast(pl.Int64)).all(), col
    for col in ("last_loss", "ema_loss"):
        assert np.allclose(ours[col].to_numpy(), theirs[col].to_numpy(), rtol=1e-9), col
    return f"engine score_state equals the polars stand-in ({theirs.height:,} samples)"


def weight_figures(ds: drt.Dataset, run: Run) -> None:
    meta = ds.get_metadata()
    w = meta["weight"].to_numpy()
    run.noisy_weight.append(float(w[meta["flipped"].to_numpy()].sum() / w.sum()))
    run.ess.append(float(w.sum() ** 2 / (w**2).sum() / len(w)))


def train_arm(
    ds: drt.Dataset,
    data: Data,
    base: int,
    arm: str,
    spec: dict,
    seed: int,
    epochs: int,
    state: str = "polars",
) -> Run:
    ds.checkout(base)
    meta = ds.get_metadata().sort("sample_id")
    assert meta["sample_id"].to_list() == list(range(POOL))
    flipped = meta["flipped"].to_numpy()
    net = mlp(seed)
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    run = Run(arm, seed)
    log = ds.score_log("loss", run=f"{arm}-s{seed}") if spec["recipe"] else None
    clock = Clock()
    for epoch in range(epochs):
        drawn = []
        for batch in ds.loader(BATCH, seed=seed, epoch=epoch, epoch_len=POOL):
            losses = step(net, opt, batch)
            if log is not None:
                t = time.perf_counter()
                log.append_batch(batch, losses, epoch=epoch)
                run.book["append"] += time.perf_counter() - t
                run.logged += len(batch)
            drawn.append(batch.sample_id)
            run.steps += 1
        if log is not None and epoch + 1 < epochs:
            reweight(ds, log, spec, run, state)
        clock.pause()
        run.acc.append(accuracy(net, data.test_x, data.test_y))
        run.noisy_draws.append(float(flipped[np.concatenate(drawn)].mean()))
        if log is not None and epoch + 1 < epochs:
            weight_figures(ds, run)
            if epoch == 1 and state != "polars" and spec["recipe"] in STATE_RECIPES:
                run.checked = check_state(log)
        clock.resume()
    clock.pause()
    run.loop = clock.total
    if log is not None:
        log.close()
    return run


def controller_options(arm: str) -> dict[str, Any]:
    """``MIX_ARMS[arm]``; none for a datasetrt whose controller has no
    ``signal=`` (it steers by the raw loss)."""
    if "signal" in inspect.signature(drt.MixtureController).parameters:
        return MIX_ARMS[arm]
    return {}


def train_mixture(ds: drt.Dataset, data: Data, base: int, arm: str, seed: int, epochs: int) -> Run:
    """The mixture variant: equal shares of the three domains (``M-eq``) or
    shares moved by a MixtureController on the score log (``MIX_ARMS``)."""
    from datasetrt.mixing import MixtureController

    ds.checkout(base)
    equal = dict.fromkeys(DOMAINS, 1.0 / len(DOMAINS))
    ds.set_mixture("domain", equal)
    meta = ds.get_metadata().sort("sample_id")
    assert meta["sample_id"].to_list() == list(range(POOL))
    domains, flipped = meta["domain"].to_numpy(), meta["flipped"].to_numpy()
    net = mlp(seed)
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    run, name = Run(arm, seed), f"{arm}-s{seed}"
    log, ctl = None, None
    if arm in MIX_ARMS:
        log = ds.score_log("loss", run=name)
        ctl = MixtureController(
            ds, "domain", equal, every=MIX_EVERY, eta=MIX_ETA, log=log, **controller_options(arm)
        )
    clock = Clock()
    for epoch in range(epochs):
        drawn = []
        loader = ds.loader(BATCH, seed=seed, epoch=epoch, epoch_len=POOL, run=name)
        for batch in loader:
            losses = step(net, opt, batch)
            run.steps += 1
            if log is not None:
                t = time.perf_counter()
                log.append_batch(batch, losses, epoch=epoch)
                t1 = time.perf_counter()
                if ctl.step(run.steps) is not None:
                    run.recipes += 1
                run.book["append"] += t1 - t
                run.book["recipe"] += time.perf_counter() - t1
                run.logged += len(batch)
            drawn.append(batch.sample_id)
        clock.pause()
        run.acc.append(accuracy(net, data.test_x, data.test_y))
        ids = np.concatenate(drawn)
        run.domain_share.append(float((domains[ids] == RANDOM_DOMAIN).mean()))
        run.noisy_draws.append(float(flipped[ids].mean()))
        clock.resume()
    clock.pause()
    run.loop = clock.total
    if log is not None:
        log.close()
    return run


# -- figures -----------------------------------------------------------------------
def first_reaching(acc: list[float], target: float, steps_per_epoch: int) -> float:
    """Steps to the first epoch end at or above ``target`` (inf: never)."""
    for e, a in enumerate(acc):
        if a >= target - 1e-12:
            return (e + 1) * steps_per_epoch
    return math.inf


def summarize(run: Run, u_best: float, steps_per_epoch: int) -> dict[str, Any]:
    book = sum(run.book.values())
    reweighted = run.noisy_draws[1:] or run.noisy_draws
    return {
        "final": run.acc[-1],
        "best": max(run.acc),
        "best_epoch": int(np.argmax(run.acc)) + 1,
        "steps_to_u_best": first_reaching(run.acc, u_best, steps_per_epoch),
        "noisy_draws_mean": float(np.mean(reweighted)),  # epochs 1.. (0 is uniform)
        "noisy_draws_last": run.noisy_draws[-1],
        "book_share": book / run.loop if run.loop else 0.0,
        "book_share_no_register": (book - run.book["register"]) / run.loop if run.loop else 0.0,
        "us_per_logged": 1e6 * run.book["append"] / run.logged if run.logged else None,
        "ms_per_recipe": 1e3 * run.book["recipe"] / run.recipes if run.recipes else None,
        "ms_per_register": 1e3 * run.book["register"] / run.recipes if run.recipes else None,
        "ms_per_flush": 1e3 * run.book["flush"] / run.recipes if run.recipes else None,
        "ms_per_step": 1e3 * run.loop / run.steps,
    }


def med(values: list[float]) -> float:
    return statistics.median(values)


def fmt(x: float | None, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    return "never" if isinstance(x, float) and math.isinf(x) else format(x, spec)


def finite(x: Any) -> Any:
    """``x`` with every infinite float as None (JSON has no infinity)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def criteria(sums: dict[str, list[dict]], seeds: int) -> list[tuple[bool, str]]:
    """The issue's "pays" criteria, over the paired seeds."""
    out = []
    u, r = sums["U"], sums.get("R")
    if r is None:
        return out
    gains = [b["final"] - a["final"] for a, b in zip(u, r, strict=True)]
    out.append(
        (
            all(g >= GAIN_POINTS - 1e-12 for g in gains),
            f"R final >= U final + {100 * GAIN_POINTS:.1f} point in every seed "
            f"({seeds} paired): gains {', '.join(f'{100 * g:+.1f}' for g in gains)} points",
        )
    )
    vs_best = [b["final"] - a["best"] for a, b in zip(u, r, strict=True)]
    out.append(
        (
            med(vs_best) >= -1e-12,
            f"R final >= U's best-epoch accuracy in the median: R final - U best "
            f"median {100 * med(vs_best):+.2f} points (R final {med([x['final'] for x in r]):.4f},"
            f" U best {med([x['best'] for x in u]):.4f})",
        )
    )
    ratios = [b["steps_to_u_best"] / a["steps_to_u_best"] for a, b in zip(u, r, strict=True)]
    out.append(
        (
            med(ratios) <= STEPS_TARGET,
            f"R reaches U's best in <= {STEPS_TARGET} x U's steps (median): "
            f"{fmt(med(ratios), '.2f')} (per seed {', '.join(fmt(x, '.2f') for x in ratios)})",
        )
    )
    r_noisy = med([x["noisy_draws_mean"] for x in r])
    out.append(
        (
            r_noisy <= R_NOISY_MAX,
            f"R's flipped share of the draws <= {R_NOISY_MAX:.0%} (median, epochs 1..): "
            f"{r_noisy:.1%}",
        )
    )
    if "L" in sums:
        l_noisy = med([x["noisy_draws_mean"] for x in sums["L"]])
        out.append(
            (
                l_noisy >= L_NOISY_MIN,
                f"L's flipped share of the draws >= {L_NOISY_MIN:.0%} (median, epochs 1..): "
                f"{l_noisy:.1%}",
            )
        )
    book = med([x["book_share"] for x in r])
    out.append(
        (
            book <= BOOK_MAX,
            f"R's bookkeeping <= {BOOK_MAX:.0%} of the training loop (median): {book:.1%} "
            f"(without registering its table: "
            f"{med([x['book_share_no_register'] for x in r]):.1%})",
        )
    )
    return out


def print_arm(arm: str, runs: list[Run], sums: list[dict], n_seeds: int) -> None:
    def series(label: str, key: str, spec: str) -> None:
        values = [getattr(r, key) for r in runs]
        if values[0]:
            medians = [med([v[e] for v in values]) for e in range(len(values[0]))]
            print(f"{arm:>6}  {label:<32} {' '.join(format(x, spec) for x in medians)}")

    series("test accuracy per epoch", "acc", ".3f")
    series("flipped share of the draws", "noisy_draws", ".2f")
    series("random domain's share of draws", "domain_share", ".2f")
    series("flipped share of the weight", "noisy_weight", ".2f")
    series("ESS / rows after each reweight", "ess", ".2f")

    def m(key: str) -> float | None:
        vals = [s[key] for s in sums if s[key] is not None]
        return med(vals) if vals else None

    print(
        f"{arm:>6}  final {m('final'):.4f}, best {m('best'):.4f} (epoch "
        f"{m('best_epoch'):.0f}), steps to U's best {fmt(m('steps_to_u_best'), '.0f')}; "
        f"bookkeeping {m('book_share'):.1%} of the loop ({m('ms_per_step'):.2f} ms a step), "
        f"{fmt(m('us_per_logged'), '.2f')} us per logged sample, "
        f"{fmt(m('ms_per_recipe'), '.1f')} ms per recipe, "
        f"{fmt(m('ms_per_register'), '.1f')} ms per register, "
        f"{fmt(m('ms_per_flush'), '.1f')} ms per flush  [median of {n_seeds}]"
    )


def plot(path: Path, runs: dict[str, list[Run]], epochs: int, noise: float) -> None:
    """Median clean test accuracy and flipped share of the draws per epoch
    per arm; for the mixture variant, its accuracy and the random domain's
    share of the draws."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixed = {a: rs for a, rs in runs.items() if rs[0].domain_share}
    plain = {a: rs for a, rs in runs.items() if a not in mixed}
    panels = 4 if mixed else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.5))
    colors = plt.get_cmap("tab10").colors
    x = np.arange(1, epochs + 1)

    def line(ax, arm: str, i: int, key: str) -> None:
        rs = runs[arm]
        curve = [med([getattr(r, key)[e] for r in rs]) for e in range(epochs)]
        style = "--" if arm.endswith("0") else ":" if "-" in arm else "-"
        ax.plot(x, curve, style, marker=".", color=colors[i % len(colors)], label=arm)

    for i, arm in enumerate(plain):
        line(axes[0], arm, i, "acc")
        if not arm.endswith("0"):
            line(axes[1], arm, i, "noisy_draws")
    n = len(next(iter(runs.values())))
    axes[0].set(xlabel="epoch", ylabel="clean test accuracy", title=f"median of {n} seeds")
    axes[1].set(xlabel="epoch", ylabel="share of draws", title="flipped labels' share of the draws")
    if mixed:
        for i, arm in enumerate(mixed):
            line(axes[2], arm, i, "acc")
            line(axes[3], arm, i, "domain_share")
        axes[2].set(
            xlabel="epoch", ylabel="clean test accuracy", title="mixture: 1 of 3 domains random"
        )
        axes[3].set(xlabel="epoch", ylabel="share of draws", title="the random domain's share")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Fashion-MNIST, a pool of {POOL:,} with {noise:.0%} of labels flipped")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main --------------------------------------------------------------------------
def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="paired seeds 0 .. N-1 (default 5)")
    p.add_argument("--epochs", type=int, default=EPOCHS, help=f"(default {EPOCHS}; fixed)")
    p.add_argument("--quick", action="store_true", help="1 seed, 4 epochs: a smoke run")
    p.add_argument("--noise", type=float, default=NOISE, help=f"flipped share ({NOISE})")
    p.add_argument("--no-shapes", action="store_true", help="skip the other shapes tried")
    p.add_argument("--no-mixture", action="store_true", help="skip the mixture variant")
    p.add_argument("--arms", help="comma-separated arms to run (default: all)")
    p.add_argument(
        "--state",
        choices=("auto", "native", "engine", "polars"),
        default="auto",
        help="the shaped recipes' weights: log.reweight (native: no SQL), or the SQL "
        "recipe over score_state from log.register_state (engine) or from log.frame() "
        "with polars (auto: the newest this datasetrt has)",
    )
    p.add_argument("--root", help="cache directory (default: a temporary one)")
    p.add_argument(
        "--out",
        default=str(Path(tempfile.gettempdir()) / "datasetrt-bench-loop"),
        help="where bench_loop.json and bench_loop.png go",
    )
    args = p.parse_args()
    if args.quick:
        args.seeds, args.epochs = 1, 4
    native = hasattr(ScoreLog, "reweight")
    if args.state == "auto":
        args.state = "native" if native else "engine" if engine_state(ScoreLog) else "polars"
    elif args.state == "native" and not native:
        p.error("this datasetrt has no log.reweight: use --state engine")
    elif args.state == "engine" and not engine_state(ScoreLog):
        p.error("this datasetrt has no log.register_state: use --state polars")
    return args


def arms_to_run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    arms = dict(ARMS)
    if not args.no_shapes:
        arms.update(SHAPES)
    if not args.no_mixture:
        arms["M-eq"] = {"pool": "mix", "recipe": None}
        for arm, options in MIX_ARMS.items():
            arms[arm] = {
                "pool": "mix",
                "recipe": "MixtureController",
                "params": {"every": MIX_EVERY, "eta": MIX_ETA, **options},
            }
        if not controller_options("M-prog"):  # no signals: the raw loss only
            arms = {a: spec for a, spec in arms.items() if a not in ("M-prog", "M-excess")}
    for spec in arms.values():
        if isinstance(spec.get("params"), str):
            spec["params"] = arms[spec["params"]]["params"]
    if args.arms:
        wanted = args.arms.split(",")
        unknown = sorted(set(wanted) - set(arms))
        if unknown:
            sys.exit(f"unknown arms {unknown}; known: {sorted(arms)}")
        arms = {a: arms[a] for a in wanted if a in arms}
    if "U" not in arms:
        arms = {"U": ARMS["U"], **arms}  # the figures are against U
    return arms


def main() -> None:
    args = parse()
    torch.set_num_threads(THREADS)
    arms = arms_to_run(args)
    steps_per_epoch = math.ceil(POOL / BATCH)
    data = make_data(args.noise)
    print(
        f"Fashion-MNIST: pool {POOL:,} (labels {args.noise:.0%} flipped, data seed {DATA_SEED}), "
        f"clean holdout {HOLDOUT:,} (reference model only), test {len(data.test_y):,}"
    )
    print(
        f"MLP 784-{HIDDEN}-{CLASSES}, Adam {LR}, batch {BATCH}, {THREADS} torch threads; "
        f"{args.epochs} epochs x {steps_per_epoch} steps ({POOL:,} weighted draws with "
        f"replacement an epoch), seeds 0..{args.seeds - 1}; arms {', '.join(arms)}"
    )
    for arm, spec in arms.items():
        print(
            f"  {arm}: {spec['pool']} pool, {spec['recipe'] or 'uniform'} {spec.get('params', '')}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root or tmp)
        t = time.perf_counter()
        ds = drt.build(root, [PoolSource(data, args.noise)], codec="none", progress=False)
        assert ds.get_metadata()["index"].to_list() == list(range(POOL))
        print(
            f"cache: {len(ds):,} typed records, built/opened in {time.perf_counter() - t:.1f} s\n"
        )
        v0 = ds.version
        runs: dict[str, list[Run]] = {a: [] for a in arms}
        refs = []
        for seed in range(args.seeds):
            ref = train_reference(data, seed)
            refs.append(ref)
            bases = make_bases(ds, v0, data, ref)
            print(
                f"seed {seed}: reference model {ref.epochs} epochs on {HOLDOUT - REF_VAL:,} clean "
                f"images, test accuracy {ref.test_acc:.4f} ({ref.seconds:.1f} s)"
            )
            for arm, spec in arms.items():
                t = time.perf_counter()
                if spec["pool"] == "mix":
                    run = train_mixture(ds, data, bases["mix"], arm, seed, args.epochs)
                else:
                    run = train_arm(
                        ds, data, bases[spec["pool"]], arm, spec, seed, args.epochs, args.state
                    )
                    if run.checked:
                        print(f"  ({run.checked})")
                runs[arm].append(run)
                print(
                    f"  {arm:>6}: {' '.join(f'{a:.3f}' for a in run.acc)}  "
                    f"flipped {' '.join(f'{s:.2f}' for s in run.noisy_draws)}  "
                    f"({time.perf_counter() - t:.0f} s)",
                    flush=True,
                )
    report(args, arms, runs, refs, steps_per_epoch, out)


def report(args, arms, runs, refs, steps_per_epoch: int, out: Path) -> None:
    sums: dict[str, list[dict]] = {}
    for arm, rs in runs.items():
        sums[arm] = []
        for r, u in zip(rs, runs["U"], strict=True):
            base = runs["U0"][r.seed] if arm.endswith("0") and "U0" in runs else u
            sums[arm].append(summarize(r, max(base.acc), steps_per_epoch))
    print(f"\n== per arm (median of {args.seeds} seeds; U0/R0 against U0's best) ==")
    for arm in runs:
        print_arm(arm, runs[arm], sums[arm], args.seeds)
    print("\n== per seed: final / best test accuracy ==")
    print("seed " + " ".join(f"{a:>13}" for a in runs))
    for s in range(args.seeds):
        cells = [f"{sums[a][s]['final']:.4f}/{sums[a][s]['best']:.4f}" for a in runs]
        print(f"{s:>4} " + " ".join(f"{c:>13}" for c in cells))
    print(
        f"reference models: test accuracy {', '.join(f'{r.test_acc:.4f}' for r in refs)} "
        f"(epochs {', '.join(str(r.epochs) for r in refs)})"
    )
    print(f"\n== the issue's criteria (R = {arms.get('R', {}).get('params')}) ==")
    lines = criteria(sums, args.seeds)
    for ok, text in lines:
        print(f"{verdict(ok)}  {text}")
    if "R0" in sums and "U0" in sums:
        gap = [b["final"] - a["final"] for a, b in zip(sums["U0"], sums["R0"], strict=True)]
        print(
            f"info  0 % noise control: R0 final - U0 final, median "
            f"{100 * med(gap):+.2f} points (per seed {', '.join(f'{100 * g:+.1f}' for g in gap)})"
        )
    for arm in runs:
        if runs[arm][0].domain_share:
            share = [float(np.mean(r.domain_share[1:] or r.domain_share)) for r in runs[arm]]
            last = [r.domain_share[-1] for r in runs[arm]]
            final = [r.acc[-1] for r in runs[arm]]
            print(
                f"info  mixture {arm}: the random domain's share of the draws, median "
                f"{med(share):.2f} over epochs 1.. and {med(last):.2f} in the last "
                f"(equal shares: {1 / len(DOMAINS):.2f}); final test accuracy {med(final):.4f}"
            )
    if args.quick:
        print("(--quick: 1 seed and 4 epochs, a smoke run; the criteria need the full run)")
    figures = {
        "config": {
            "seeds": args.seeds,
            "epochs": args.epochs,
            "noise": args.noise,
            "pool": POOL,
            "holdout": HOLDOUT,
            "batch": BATCH,
            "lr": LR,
            "hidden": HIDDEN,
            "alpha": ALPHA,
            "score_state": args.state,
            "arms": {a: dict(s) for a, s in arms.items()},
            "mixture": {"every": MIX_EVERY, "eta": MIX_ETA, "arms": MIX_ARMS},
            "datasetrt": drt.__version__,
        },
        "reference": [{"test_acc": r.test_acc, "epochs": r.epochs} for r in refs],
        "runs": {a: [vars(r) for r in rs] for a, rs in runs.items()},
        "summary": sums,
        "criteria": [{"pass": ok, "text": text} for ok, text in lines],
    }
    path = out / "bench_loop.json"
    path.write_text(json.dumps(finite(figures), indent=1, default=str))
    plot(out / "bench_loop.png", runs, args.epochs, args.noise)
    print(f"\nfigures: {path}\nplot:    {out / 'bench_loop.png'}")


if __name__ == "__main__":
    main()
