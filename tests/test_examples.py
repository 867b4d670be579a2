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


def test_mixtures_are_met_steered_replayed_and_answered_for(tmp_path):
    done = subprocess.run(
        [sys.executable, "mixtures.py", "--root", str(tmp_path), "--steps", "80"],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert "every prefix within one draw: True" in out, out
    changes = re.search(r"steered: (\d+) changes .* books' share 0\.10 -> (0\.\d+)", out)
    assert changes and int(changes[1]) >= 2 and float(changes[2]) > 0.1, out
    assert "equals what it delivered: True" in out, out
    assert "exposures of the halfway checkpoint equal its draws: True" in out, out
    gone = re.search(r"the checkpoint saw (\d+) draws of samples no longer", out)
    assert gone and int(gone[1]) > 0, out
