"""The training-loop example runs end to end at a small size, and what it
prints is what it claims: one snapshot per reweight, shares that move."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_hard_examples_reweights_between_epochs_with_one_dataloader(tmp_path):
    done = subprocess.run(
        [sys.executable, "hard_examples.py", "--root", str(tmp_path), "--epochs", "3"],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    # the hard run's epochs drew from a new snapshot each (follow="head")
    snapshots = [int(v) for v in re.findall(r"epoch \d: snapshot (\d+)", out)]
    assert len(snapshots) == 3 and snapshots[0] < snapshots[1] < snapshots[2], out
    ess = [int(v) for v in re.findall(r"effective sample size (\d+)", out)]
    assert ess[0] > ess[-1], out  # the weights moved away from uniform
    assert re.search(r"hardest \[\d, \d, \d\]: uniform 0\.\d+  hard 0\.\d+", out), out
