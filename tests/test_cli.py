"""The `datasetrt` command, run as users run it (`python -m datasetrt`):
every subcommand, its exit codes, and JSON that scripts can read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import tomllib

import datasetrt as drt

ROOT = Path(__file__).resolve().parents[1]


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "datasetrt", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def dataset(two_caches):
    """Snapshots 0 (all 800), 1 (train, tagged `train`), 2 (train, label 1 weighted 5)."""
    ds, root, _ = two_caches
    ds.select("SELECT * FROM metadata WHERE split = 'train'")
    ds.tag("train")
    ds.update_metadata(
        ds.get_metadata().with_columns(
            pl.when(pl.col("label") == 1).then(5.0).otherwise(1.0).alias("weight")
        )
    )
    return ds, root


def test_the_command_is_declared_for_pip():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["datasetrt"] == "datasetrt.cli:main"


def test_info_json_names_caches_rows_columns_snapshot_and_tags(dataset):
    ds, root = dataset
    done = run("info", root, "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert sorted(c["name"] for c in info["caches"]) == ["alpha-v1", "beta-v1"]  # by cache_id
    assert info["rows"] == 640 and info["snapshot"] == 2 and info["head"] == 2
    assert info["tags"] == {"train": 1} and info["fingerprint"] == ds.fingerprint
    assert info["columns"]["weight"] == "Float64" and "quality" in info["columns"]
    text = run("info", root)
    assert text.returncode == 0 and "640 rows in snapshot 2" in text.stdout
    assert "train=1" in text.stdout and "alpha-v1" in text.stdout


def test_sql_prints_tables_csv_json_and_writes_parquet(dataset, tmp_path):
    _, root = dataset
    query = "SELECT split, count(*) AS n FROM metadata GROUP BY split ORDER BY split"
    assert "train" in run("sql", root, query).stdout
    csv = run("sql", root, query, "--format", "csv")
    assert csv.returncode == 0 and csv.stdout == "split,n\ntrain,640\n"
    rows = json.loads(run("sql", root, query, "--format", "json").stdout)
    assert rows == [{"split": "train", "n": 640}]
    out = tmp_path / "out.parquet"
    done = run("sql", root, query, "--format", "parquet", "--output", out)
    assert done.returncode == 0 and pl.read_parquet(out).rows() == [("train", 640)]
    # parquet to a terminal is a usage error; a bad query is a runtime error
    assert run("sql", root, query, "--format", "parquet").returncode == 2
    bad = run("sql", root, "SELECT nope FROM metadata")
    assert bad.returncode == 1 and "QueryError" in bad.stderr and "Traceback" not in bad.stderr


def test_history_json_and_diff(dataset):
    _, root = dataset
    done = run("history", root, "--json")
    assert done.returncode == 0
    history = json.loads(done.stdout)
    assert [h["version"] for h in history] == [0, 1, 2]
    assert [h["rows"] for h in history] == [800, 640, 640]
    assert history[1]["tags"] == "train" and history[2]["head"] is True
    diff = run("diff", root, "train", 2)
    assert diff.returncode == 0
    assert diff.stdout.splitlines()[0] == "train -> 2: 80 reweighted"
    removed = run("diff", root, 0, "train")
    assert "160 removed" in removed.stdout


def test_checkout_and_tag_move_the_head_for_everyone(dataset):
    ds, root = dataset
    done = run("checkout", root, "train")
    assert done.returncode == 0 and "head is snapshot 1" in done.stdout
    assert ds.head == 1
    assert run("tag", root, "rollback").returncode == 0
    assert ds.tags()["rollback"] == 1
    assert run("tag", root, "first", "--snapshot", 0).returncode == 0
    assert ds.tags()["first"] == 0
    missing = run("checkout", root, "no-such-tag")
    assert missing.returncode == 1 and "no tag 'no-such-tag'" in missing.stderr


def test_cleanup_is_a_dry_run_unless_applied(dataset):
    ds, root = dataset
    for _ in range(3):
        ds.update_metadata(ds.get_metadata().head(100))
    before = ds.history()["version"].to_list()  # 0..5, head 5, tag train=1
    dry = run("cleanup", root, "--keep", 2)
    assert dry.returncode == 0
    assert "would delete 3 snapshots: 0, 2, 3" in dry.stdout
    assert ds.history()["version"].to_list() == before
    applied = run("cleanup", root, "--keep", 2, "--apply")
    assert applied.returncode == 0 and "deleted 3 snapshots: 0, 2, 3" in applied.stdout
    assert ds.history()["version"].to_list() == [1, 4, 5]
    assert run("cleanup", root).returncode == 2  # --keep is required


def test_export_writes_the_active_population(dataset, tmp_path):
    ds, root = dataset
    out = tmp_path / "population.parquet"
    done = run("export", root, "--to", out)
    assert done.returncode == 0, done.stderr
    assert pl.read_parquet(out).equals(ds.get_metadata())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_usage_errors_exit_2_and_a_missing_dataset_exits_1(tmp_path):
    assert run().returncode == 2
    assert run("frobnicate", tmp_path).returncode == 2
    assert run("diff", tmp_path, 0).returncode == 2
    missing = run("info", tmp_path / "nowhere")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "nowhere" in missing.stderr


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x55
    path.write_bytes(bytes(data))


def test_verify_exits_0_when_intact_and_3_on_a_flipped_byte_or_a_cut_shard(tmp_path, source):
    plain = source("plain-v1", 50, payload=lambda i: bytes([i % 251]) * 4000)
    other = source("other-v1", 50, payload=lambda i: bytes([i % 13]) * 4000)
    ds = drt.build(tmp_path, [plain, other], codec="none", progress=False)
    ok = run("verify", tmp_path, "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"ok": True, "problems": []}
    flipped = next((tmp_path / "plain-v1").glob("shard-*"))
    flip(flipped, 16 + 4000 * 7 + 100)
    done = run("verify", tmp_path, "--json")
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["problems"] == ds.verify().to_dicts()  # the same report as in Python
    (problem,) = report["problems"]
    assert problem["path"] == str(flipped) and "7" in problem["message"]
    # a cut shard: the dataset no longer opens, and verify still reports both files
    cut = next((tmp_path / "other-v1").glob("shard-*"))
    cut.write_bytes(cut.read_bytes()[: 16 + 4000 * 30])
    done = run("verify", tmp_path, "--json")
    assert done.returncode == 3, done.stderr
    paths = [p["path"] for p in json.loads(done.stdout)["problems"]]
    assert sorted(paths) == sorted([str(flipped), str(cut)])
    text = run("verify", tmp_path)
    assert text.returncode == 3 and f"{flipped}" in text.stdout and f"{cut}" in text.stdout
    assert "2 problems" in text.stdout
