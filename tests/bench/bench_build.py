"""Building many sources: ``drt.build(root, sources, processes=N)`` against
one process, on sources whose preprocessing is Python work (what a real
pipeline's decode and augment are), measured in the same run, alternating.

Run by hand: ``python tests/bench/bench_build.py`` (``make bench`` runs it).
On this 2-core machine the target is what two cores allow: processes=2
takes about half the time of one process, plus the start of the processes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import datasetrt as drt


class Preprocessed:
    """``n`` samples, each made by ``rounds`` of hashing (about 1 µs each)."""

    def __init__(self, name: str, n: int, rounds: int):
        self.name, self.n, self.rounds = name, n, rounds

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            data = i.to_bytes(8, "little")
            for _ in range(self.rounds):
                data = hashlib.blake2b(data, digest_size=32).digest()
            yield data * 8, {"label": i % 10}


def timed(root: Path, sources: list[Preprocessed], processes: int) -> float:
    t = time.perf_counter()
    ds = drt.build(root, sources, processes=processes, progress=False)
    elapsed = time.perf_counter() - t
    assert len(ds) == sum(s.n for s in sources)
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sources", type=int, default=8)
    p.add_argument("--samples", type=int, default=20_000, help="per source")
    p.add_argument("--rounds", type=int, default=100, help="hashes per sample")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 2)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    one, many = [], []
    with tempfile.TemporaryDirectory(prefix="drt-build-") as tmp:
        for trial in range(args.trials):
            sources = [
                Preprocessed(f"pre-{trial}-{k}", args.samples, args.rounds)
                for k in range(args.sources)
            ]
            one.append(timed(Path(tmp) / f"one-{trial}", sources, 1))
            many.append(timed(Path(tmp) / f"many-{trial}", sources, args.processes))
    a, b = statistics.median(one), statistics.median(many)
    print(
        f"build {args.sources} sources x {args.samples} samples ({args.rounds} hashes each): "
        f"one process {a:.2f} s (runs {', '.join(f'{x:.2f}' for x in one)}), "
        f"processes={args.processes} {b:.2f} s (runs {', '.join(f'{x:.2f}' for x in many)}): "
        f"{b / a:.2f}x"
    )


if __name__ == "__main__":
    main()
