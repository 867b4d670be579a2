"""Does the score-log loop pay? Steps to a uniform run's best held-out
accuracy, and the bookkeeping's share of the training time.

Run by hand (it is not a timed test; it needs torch and scikit-learn)::

    python tests/bench/bench_score_loop.py             # 5 seeds, the full run
    python tests/bench/bench_score_loop.py --quick     # a smoke run, < 60 s

**Task** (fixed up front, not tuned to either arm): scikit-learn's
``make_classification`` (generated offline, no download) with
``random_state=0``: 24,000 samples, 32 features (16 informative, 8
redundant), 8 classes of 2 clusters each, ``class_sep=1.0``, no built-in
label noise; the first 16,000 samples train, the other 8,000 are the
held-out set (clean labels). Features are standardised with the training
mean and deviation. **Label noise:** exactly 10 % of the training labels
(1,600, chosen with ``numpy.random.default_rng(1)``) are replaced by another
class drawn uniformly from the other 7; held-out labels are never flipped
(``--noise 0`` runs the same task without it).

**Cache:** one DatasetRT cache of the 16,000 training samples in a temporary
directory; payload = the sample's 32 float32 features (``ndarray.tobytes()``,
128 bytes, no pickle); metadata = ``label`` (the possibly flipped training
label), ``index`` (its row in the generated array) and ``flipped`` (used
only to report where the weight went, never by training).

**Model:** an MLP 32 -> 64 -> 64 -> 8 (ReLU), Adam (lr 1e-3), batch 128,
cross-entropy, CPU, ``torch.set_num_threads(1)``; model init and draw order
from the seed. 50 epochs (``--epochs``) of 16,000 draws (125 steps each):
chosen from a uniform-only run, as the length at which arm (i) has
plateaued. Held-out accuracy is measured every 25 steps (the clock is
paused while it is).

**Two arms per seed**, both through ``ds.to_torch(...)`` and one
``DataLoader(num_workers=0)``, ``sampling="replacement"``:

- **(i) uniform**: every training sample weight 1, every epoch;
- **(ii) score-log loop**, as ``docs/training.md`` shows: every batch's
  per-sample training losses go to ``ds.score_log("loss", run=...)``
  (``append_batch``); after each epoch ``log.register("scores", run=...)``
  and ``ds.apply_sql("loss_ema_weights", alpha=0.5)`` (the recipe the README
  loop uses; ``--recipe focal_weights`` runs ``focal_weights`` with
  ``gamma=1.0`` instead), and ``follow="head"`` makes the next
  ``set_epoch`` draw by the new weights. Epoch 0 draws uniformly.

**Figures, per seed and the median over seeds** (ratios measured in this
run): arm (i)'s best held-out accuracy and the first step it reached it;
the first step (and training wall-clock) at which arm (ii) reached that
accuracy; their ratio (target <= 0.7); the same ratio for 99 % of that
accuracy (a secondary figure: the best is the maximum of a noisy curve,
often a late lucky evaluation); and the bookkeeping's share of arm
(ii)'s training time: score logging + register + recipe commit + following
the head (``set_epoch``, which builds the new alias table), divided by the
arm's whole training time (target <= 2 %). If arm (ii) does not reach the
uniform best in a seed, that seed's ratio is "not reached" (counted as
infinite in the median), and the script says the loop did not pay. Also
printed: arm (ii)'s training time over arm (i)'s for the same steps, and
where the weight went (the flipped rows' share, the effective sample size).

Arm (i) repeats bit for bit; arm (ii) does not: a recipe's result rows come
out of the SQL join in an order that varies from run to run, the committed
population keeps that order, and draw ``k`` picks a row by position, so the
same seed draws other samples after the first reweight (two ``--quick``
runs here: seed 0's final arm (ii) accuracy 0.658 and 0.653).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.datasets import make_classification
from torch.utils.data import DataLoader

import datasetrt as drt

# -- the task and hyperparameters: chosen once, before any run of arm (ii) ----------
N_SAMPLES, N_TRAIN, N_FEATURES, N_CLASSES = 24_000, 16_000, 32, 8
DATA_SEED, NOISE, NOISE_SEED = 0, 0.10, 1
HIDDEN, BATCH, LR = 64, 128, 1e-3
EVAL_EVERY = 25  # steps
EPOCHS = 50
RECIPES = {"loss_ema_weights": {"alpha": 0.5}, "focal_weights": {"gamma": 1.0}}
STEPS_TARGET, OVERHEAD_TARGET = 0.7, 0.02
NEAR = 0.99  # the secondary target: this share of arm (i)'s best


@dataclass
class Task:
    x_train: np.ndarray
    y_train: np.ndarray  # with the flipped labels
    flipped: np.ndarray
    x_test: torch.Tensor
    y_test: torch.Tensor


def make_task(noise: float = NOISE) -> Task:
    x, y = make_classification(
        n_samples=N_SAMPLES,
        n_features=N_FEATURES,
        n_informative=16,
        n_redundant=8,
        n_classes=N_CLASSES,
        n_clusters_per_class=2,
        class_sep=1.0,
        flip_y=0.0,
        random_state=DATA_SEED,
    )
    x = x.astype(np.float32)
    mean, std = x[:N_TRAIN].mean(0), x[:N_TRAIN].std(0)
    x = (x - mean) / std
    y_train = y[:N_TRAIN].copy()
    rng = np.random.default_rng(NOISE_SEED)
    which = rng.choice(N_TRAIN, size=round(noise * N_TRAIN), replace=False)
    y_train[which] = (y_train[which] + rng.integers(1, N_CLASSES, len(which))) % N_CLASSES
    flipped = np.zeros(N_TRAIN, bool)
    flipped[which] = True
    return Task(
        x_train=x[:N_TRAIN],
        y_train=y_train,
        flipped=flipped,
        x_test=torch.from_numpy(x[N_TRAIN:]),
        y_test=torch.from_numpy(y[N_TRAIN:]),
    )


class TrainSource:
    """The training samples as a DatasetRT source: float32 feature bytes."""

    name = "score-loop-train"

    def __init__(self, task: Task):
        self.task = task

    def __len__(self) -> int:
        return N_TRAIN

    def __iter__(self):
        t = self.task
        for i in range(N_TRAIN):
            yield drt.CacheInput(
                data=t.x_train[i].tobytes(),
                metadata={"label": int(t.y_train[i]), "index": i, "flipped": bool(t.flipped[i])},
            )


def to_tensors(batch: drt.Batch) -> dict[str, torch.Tensor]:
    """A loader batch as features, labels and the identities the score log keys on."""
    x = np.frombuffer(bytearray(b"".join(batch.data)), np.float32).reshape(len(batch), N_FEATURES)
    return {
        "x": torch.from_numpy(x),
        "y": torch.tensor(batch.metadata["label"].to_numpy()),
        "cache_id": torch.tensor(batch.cache_id),
        "sample_id": torch.tensor(batch.sample_id),
        "draw": torch.tensor(batch.draws),
    }


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(N_FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, N_CLASSES),
    )


def accuracy(net: torch.nn.Module, task: Task) -> float:
    with torch.no_grad():
        return float((net(task.x_test).argmax(1) == task.y_test).float().mean())


class Clock:
    """Training wall-clock: runs except while held-out accuracy is measured."""

    def __init__(self) -> None:
        self.total, self.since = 0.0, time.perf_counter()

    def pause(self) -> float:
        self.total += time.perf_counter() - self.since
        return self.total

    def resume(self) -> None:
        self.since = time.perf_counter()


@dataclass
class Run:
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # step, acc, seconds
    seconds: float = 0.0  # training wall-clock, evaluation excluded
    steps: int = 0
    book: dict[str, float] = field(
        default_factory=lambda: {"append": 0.0, "register": 0.0, "recipe": 0.0, "follow": 0.0}
    )
    flipped_share: list[float] = field(default_factory=list)  # weight on flipped rows, per epoch
    ess: list[float] = field(default_factory=list)  # effective sample size / rows, per epoch

    def epoch_ends(self, steps_per_epoch: int) -> list[float]:
        return [a for s, a, _ in self.curve if s % steps_per_epoch == 0]


def train(ds, task, base, seed, epochs, recipe: str | None) -> Run:
    """One arm of one seed: uniform weights (``recipe`` None) or the score-log loop."""
    ds.checkout(base)  # every arm starts from the same population, all weights 1
    net = mlp(seed)
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    loop = recipe is not None
    tds = ds.to_torch(
        batch_size=BATCH, seed=seed, transform=to_tensors, follow="head" if loop else None
    )
    loader = DataLoader(tds, batch_size=None, num_workers=0)
    log = ds.score_log("loss", run=f"seed{seed}") if loop else None
    run, step, versions = Run(), 0, []
    book = run.book
    clock = Clock()
    for epoch in range(epochs):
        t = time.perf_counter()
        tds.set_epoch(epoch)  # with follow="head": the reweighted snapshot, its alias table
        if loop and epoch > 0:
            book["follow"] += time.perf_counter() - t
        for batch in loader:
            losses = torch.nn.functional.cross_entropy(
                net(batch["x"]), batch["y"], reduction="none"
            )
            opt.zero_grad()
            losses.mean().backward()
            opt.step()
            if log is not None:
                t = time.perf_counter()
                log.append_batch(batch, losses.detach(), epoch=epoch)
                book["append"] += time.perf_counter() - t
            step += 1
            if step % EVAL_EVERY == 0:
                seconds = clock.pause()
                run.curve.append((step, accuracy(net, task), seconds))
                clock.resume()
        if log is not None and epoch + 1 < epochs:
            t = time.perf_counter()
            log.register("scores", run=log.run)  # flushes, then reads this run's rows
            t2 = time.perf_counter()
            ds.apply_sql(recipe, **RECIPES[recipe])  # commits; the next set_epoch follows
            book["register"] += t2 - t
            book["recipe"] += time.perf_counter() - t2
            versions.append(ds.version)
    run.seconds = clock.pause()
    run.steps = step
    if log is not None:
        log.close()
    del loader
    for version in versions:  # where the weight went, read after the clock stopped
        ds.checkout(version)
        meta = ds.get_metadata()
        w = meta["weight"].to_numpy()
        run.flipped_share.append(float(w[meta["flipped"].to_numpy()].sum() / w.sum()))
        run.ess.append(float(w.sum() ** 2 / (w**2).sum() / len(w)))
    return run


def first_reaching(run: Run, target: float) -> tuple[int, float] | None:
    """(step, training seconds) of the first evaluation at or above ``target``."""
    for step, acc, seconds in run.curve:
        if acc >= target - 1e-12:
            return step, seconds
    return None


def fmt_ratio(x: float) -> str:
    return "not reached" if math.isinf(x) else f"{x:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1 (default 5)")
    p.add_argument("--epochs", type=int, default=EPOCHS, help=f"per arm (default {EPOCHS})")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="loss_ema_weights")
    p.add_argument(
        "--noise", type=float, default=NOISE, help=f"share of training labels flipped ({NOISE})"
    )
    p.add_argument("--quick", action="store_true", help="2 seeds x 3 epochs: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.epochs = 2, 3
    torch.set_num_threads(1)
    steps_per_epoch = N_TRAIN // BATCH
    params = ", ".join(f"{k}={v}" for k, v in RECIPES[args.recipe].items())

    print(
        f"task: make_classification(random_state={DATA_SEED}), {N_FEATURES} features, "
        f"{N_CLASSES} classes; {N_TRAIN:,} train / {N_SAMPLES - N_TRAIN:,} held out"
    )
    print(
        f"label noise: {args.noise:.0%} of training labels flipped to another class "
        f"(rng seed {NOISE_SEED}); held-out labels clean"
    )
    print(
        f"model: MLP {N_FEATURES}-{HIDDEN}-{HIDDEN}-{N_CLASSES}, Adam lr {LR}, batch {BATCH}, "
        f"1 torch thread; {args.epochs} epochs x {steps_per_epoch} steps; "
        f"eval every {EVAL_EVERY} steps"
    )
    print(
        f"arms: (i) uniform weights; (ii) score log -> {args.recipe}({params}) each epoch, "
        f"follow='head'; sampling='replacement'; seeds 0..{args.seeds - 1}\n"
    )
    task = make_task(args.noise)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        ds = drt.build(tmp, [TrainSource(task)], progress=False)
        meta = ds.get_metadata()
        assert meta["index"].to_list() == list(range(N_TRAIN))
        print(f"cache: {len(ds):,} rows built in {time.perf_counter() - t:.1f} s\n")
        base = ds.version
        for seed in range(args.seeds):
            uniform = train(ds, task, base, seed, args.epochs, None)
            loop = train(ds, task, base, seed, args.epochs, args.recipe)
            best = max(a for _, a, _ in uniform.curve)
            step_u, sec_u = first_reaching(uniform, best)
            reached = first_reaching(loop, best)
            step_l, sec_l = reached if reached else (math.inf, math.inf)
            # secondary, less sensitive to one lucky evaluation: 99 % of that best
            step_u99 = first_reaching(uniform, NEAR * best)[0]
            near = first_reaching(loop, NEAR * best)
            book = sum(loop.book.values())
            row = {
                "seed": seed,
                "best_u": best,
                "step_u": step_u,
                "sec_u": sec_u,
                "best_l": max(a for _, a, _ in loop.curve),
                "step_l": step_l,
                "sec_l": sec_l,
                "steps_ratio": step_l / step_u,
                "wall_ratio": sec_l / sec_u,
                "near_ratio": (near[0] if near else math.inf) / step_u99,
                "overhead": book / loop.seconds,
                "per_step": (loop.seconds / uniform.seconds),
                "final_u": uniform.curve[-1][1],
                "final_l": loop.curve[-1][1],
                "book": {k: v / loop.seconds for k, v in loop.book.items()},
                "step_ms": 1e3 * uniform.seconds / uniform.steps,
                "append_us": 1e6 * loop.book["append"] / loop.steps,
                "reweight_ms": 1e3
                * (loop.book["register"] + loop.book["recipe"] + loop.book["follow"])
                / max(1, len(loop.ess)),
                "flipped": loop.flipped_share[-1] if loop.flipped_share else math.nan,
                "ess": loop.ess[-1] if loop.ess else math.nan,
            }
            rows.append(row)
            ends_u = " ".join(f"{a:.3f}" for a in uniform.epoch_ends(steps_per_epoch))
            ends_l = " ".join(f"{a:.3f}" for a in loop.epoch_ends(steps_per_epoch))
            shares = " ".join(f"{s:.2f}" for s in loop.flipped_share)
            print(f"seed {seed}: held-out accuracy at the end of each epoch")
            print(f"  (i)  uniform: {ends_u}")
            print(f"  (ii) loop:    {ends_l}")
            print(f"  (ii) weight share of the flipped rows after each reweight: {shares}")
            print(
                f"  (ii) steps to {best:.4f}: {step_l} vs {step_u}"
                f" -> {fmt_ratio(row['steps_ratio'])}; training time (ii)/(i) "
                f"for the same steps {row['per_step']:.2f}x; bookkeeping {row['overhead']:.1%}",
                flush=True,
            )

    print("\nper seed (steps and seconds to arm (i)'s best held-out accuracy; eval excluded)")
    head = (
        f"{'seed':>4} {'best (i)':>8} {'step (i)':>8} {'step (ii)':>9} {'steps ii/i':>11} "
        f"{'wall ii/i':>11} {'@99% ii/i':>11} {'best (ii)':>9} {'final i':>7} {'final ii':>8} "
        f"{'time ii/i':>9} {'bookkeeping':>11}"
    )
    print(head)
    for r in rows:
        step_l = "-" if math.isinf(r["step_l"]) else str(r["step_l"])
        print(
            f"{r['seed']:>4} {r['best_u']:>8.4f} {r['step_u']:>8} {step_l:>9} "
            f"{fmt_ratio(r['steps_ratio']):>11} {fmt_ratio(r['wall_ratio']):>11} "
            f"{fmt_ratio(r['near_ratio']):>11} {r['best_l']:>9.4f} "
            f"{r['final_u']:>7.4f} {r['final_l']:>8.4f} "
            f"{r['per_step']:>8.2f}x {r['overhead']:>11.2%}"
        )

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(
        f"{'med':>4} {med('best_u'):>8.4f} {med('step_u'):>8.0f} "
        f"{'':>9} {fmt_ratio(med('steps_ratio')):>11} {fmt_ratio(med('wall_ratio')):>11} "
        f"{fmt_ratio(med('near_ratio')):>11} {med('best_l'):>9.4f} "
        f"{med('final_u'):>7.4f} {med('final_l'):>8.4f} "
        f"{med('per_step'):>8.2f}x {med('overhead'):>11.2%}"
    )
    parts = ", ".join(
        f"{k} {statistics.median(r['book'][k] for r in rows):.2%}" for k in rows[0]["book"]
    )
    print(f"\nbookkeeping of arm (ii), median share of its training time: {parts}")
    print(
        f"  for scale, medians: a uniform step (load + train) {med('step_ms'):.2f} ms; "
        f"append_batch {med('append_us'):.0f} us per batch; register + recipe + follow "
        f"{med('reweight_ms'):.0f} ms per reweight ({args.epochs - 1} reweights of "
        f"{N_TRAIN:,} rows per run)"
    )
    print(
        f"arm (ii) after its last reweight (median): weight on the flipped {args.noise:.0%} "
        f"{med('flipped'):.2f}, effective sample size {med('ess'):.2f} of the rows"
    )
    reached = sum(not math.isinf(r["steps_ratio"]) for r in rows)
    ratio, overhead = med("steps_ratio"), med("overhead")
    print(
        f"\nsteps (ii)/(i), median of {len(rows)} seeds: {fmt_ratio(ratio)} "
        f"(target <= {STEPS_TARGET}: {'met' if ratio <= STEPS_TARGET else 'missed'}); "
        f"arm (ii) reached arm (i)'s best in {reached} of {len(rows)} seeds"
    )
    print(
        f"secondary: steps to {NEAR:.0%} of arm (i)'s best, (ii)/(i), median: "
        f"{fmt_ratio(med('near_ratio'))}"
    )
    print(
        f"bookkeeping share, median: {overhead:.2%} "
        f"(target <= {OVERHEAD_TARGET:.0%}: {'met' if overhead <= OVERHEAD_TARGET else 'missed'})"
    )
    if ratio <= STEPS_TARGET and overhead <= OVERHEAD_TARGET:
        print(f"verdict: the score-log loop ({args.recipe}) paid on this task")
    elif ratio < 1:
        print(
            f"verdict: {args.recipe} needed fewer steps than uniform draws, but not "
            f"enough (or at too high a bookkeeping cost) to meet the targets"
        )
    else:
        print(
            f"verdict: the score-log loop did not pay on this task: {args.recipe} did not "
            f"reach uniform draws' best held-out accuracy in fewer steps"
        )


if __name__ == "__main__":
    main()
