"""What a notebook user sees: HTML views (escaped, bounded), the %drt_sql
magic, population reports and plots, and progress display."""

from __future__ import annotations

import base64
import io
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import datasetrt as drt
from datasetrt import _html, _progress

NASTY = "<b>&"
ESCAPED = "&lt;b&gt;&amp;"


@pytest.fixture
def nasty(tmp_path, source):
    """A dataset whose metadata has a column named `<b>&` holding `<b>&`."""
    src = source("nasty-v1", 30, meta=lambda i: {"label": i % 3, NASTY: NASTY})
    return drt.build(tmp_path, [src], progress=False)


def assert_escaped(html: str) -> None:
    assert ESCAPED in html
    assert NASTY not in html, "a raw `<b>&` from the data reached the HTML"


def test_every_view_escapes_names_and_values(nasty):
    nasty.select("SELECT * FROM metadata WHERE label >= 1")  # a note with `>`
    html = nasty._repr_html_()
    assert_escaped(html)
    assert "label &gt;= 1" in html and "label >= 1" not in html
    loader = nasty.loader(batch_size=8, seed=1)
    assert "SampleExec" in loader._repr_html_()
    batch = next(loader)
    assert_escaped(batch._repr_html_())
    sample = next(iter(batch))
    assert_escaped(sample._repr_html_())
    # the frame a user names as `by` is escaped too
    assert_escaped(nasty.to_html(by=NASTY))
    bundle = sample._repr_mimebundle_()
    assert bundle["text/plain"] == repr(sample) and bundle["text/html"] == sample.to_html()


def test_the_dataset_view_shows_caches_snapshot_and_class_shares(two_caches):
    ds, _, _ = two_caches
    ds.update_metadata(
        ds.get_metadata().with_columns(
            pl.when(pl.col("label") == 0).then(9.0).otherwise(1.0).alias("weight")
        )
    )
    ds.tag("label-0-heavy")
    html = ds._repr_html_()
    for text in ("alpha-v1", "beta-v1", "800", "label-0-heavy", ds.fingerprint, "quality"):
        assert text in html, text
    # class 0 has 10% of the rows and 9 / (9 + 9) = 50% of the draws
    row = re.search(r"<tr><td>0</td><td>80</td>(.*?)</tr>", html).group(1)
    assert "10.0%" in row and "50.0%" in row


def test_views_stay_small_with_many_caches_and_columns(tmp_path, source):
    sources = [source(f"c{i:03d}-v1", 2) for i in range(100)]
    ds = drt.build(tmp_path, sources, progress=False)
    wide = ds.get_metadata().with_columns([pl.lit(i).alias(f"extra_{i:04d}") for i in range(1000)])
    ds.update_metadata(wide)
    html = ds._repr_html_()
    assert len(html) < 20_000, len(html)
    assert "… 90 more caches" in html
    assert f"… {ds.get_metadata().width - _html.MAX_COLUMNS:,} more columns" in html
    batch = next(ds.loader(batch_size=200, seed=1))
    html = batch._repr_html_()
    assert len(html) < 40_000, len(html)
    assert "more rows" in html and "more columns" in html
    assert len(next(iter(batch))._repr_html_()) < 20_000


def test_a_sample_previews_plain_pickles_but_never_runs_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    payloads = [pickle.dumps({"x": [1, 2]}), pickle.dumps(Evil()), b"\x00raw"]

    class Src:
        name = "mixed-v1"

        def __iter__(self):
            for p in payloads:
                yield drt.CacheInput(p, {"label": 0})

    ds = drt.build(tmp_path, [Src()], progress=False)
    cid = ds.caches[0]["cache_id"]
    plain, evil, raw = (ds.get_item(cid, i)._repr_html_() for i in range(3))
    assert "{&#x27;x&#x27;: [1, 2]}" in plain
    assert "pickle" not in evil.split("payload")[1] and "pwned" not in evil
    assert "00 72 61 77" in raw


def test_population_numbers_match_a_hand_computed_example(tmp_path, source):
    labels, weights = [0, 0, 0, 1, 1, 2], [1.0, 1.0, 2.0, 3.0, 1.0, 0.0]
    ds = drt.build(tmp_path, [source("hand-v1", 6, meta=lambda i: {"label": labels[i]})])
    ds.update_metadata(ds.get_metadata().with_columns(pl.Series("weight", weights)))
    rep = ds.population("label")
    assert rep["label"].to_list() == [0, 1, 2]
    assert rep["rows"].to_list() == [3, 2, 1]
    assert rep["row_share"].to_list() == pytest.approx([0.5, 1 / 3, 1 / 6])
    assert rep["weight_sum"].to_list() == pytest.approx([4.0, 4.0, 0.0])
    assert rep["draw_share"].to_list() == pytest.approx([0.5, 0.5, 0.0])
    assert rep["draws_per_epoch"].to_list() == pytest.approx([3.0, 3.0, 0.0])
    assert rep["ess"].to_list() == pytest.approx([16 / 6, 16 / 10, 0.0])
    assert rep["max_weight_ratio"].to_list() == [pytest.approx(2.0), pytest.approx(3.0), None]
    whole = ds.population().row(0, named=True)
    assert whole["ess"] == pytest.approx(64 / 16) and whole["max_weight_ratio"] == 3.0
    # every row once per epoch: weights do not count
    perm = ds.population("label", sampling="permutation")
    assert perm["draws_per_epoch"].to_list() == pytest.approx([3.0, 2.0, 1.0])
    # the expected draws match what the loader draws in a long run
    drawn = ds.get_metadata()[ds.draws(seed=3, count=60_000)]["label"].value_counts()
    counts = dict(drawn.iter_rows())
    assert counts[0] / 60_000 == pytest.approx(0.5, abs=0.01) and 2 not in counts
    with pytest.raises(drt.InvalidInputError, match="no column 'nope'"):
        ds.population("nope")


def test_plot_population_compares_two_snapshots(two_caches):
    pytest.importorskip("matplotlib")
    ds, _, _ = two_caches
    ds.tag("all")
    ds.update_metadata(ds.get_metadata().filter(pl.col("label") < 5))
    fig = ds.plot_population(by="label", compare="all")
    bars, hist = fig.axes
    labels = [t.get_text() for t in bars.get_legend().get_texts()]
    assert labels == ["snapshot 0 (all): share of draws", "snapshot 1: share of draws"]
    heights = [p.get_height() for p in bars.patches]
    assert heights[:10] == pytest.approx([0.1] * 10)  # snapshot 0: ten equal classes
    assert heights[10:15] == pytest.approx([0.2] * 5) and heights[15:] == [0.0] * 5
    assert "ESS 400 of 400 rows" in hist.get_title()  # equal weights: every row counts
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue().startswith(b"\x89PNG")


def test_the_sql_magic_runs_stores_and_reports_errors_briefly(two_caches, capsys):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    ds, _, _ = two_caches
    shell = InteractiveShell.instance()
    try:
        shell.user_ns["ds"] = ds
        shell.run_line_magic("load_ext", "datasetrt")
        line = shell.run_cell("%drt_sql ds SELECT count(*) AS n FROM metadata")
        assert line.success and line.result.rows() == [(800,)]
        cell = shell.run_cell(
            "%%drt_sql ds -o per_split\nSELECT split, count(*) AS n FROM metadata\n"
            "GROUP BY split ORDER BY split"
        )
        assert cell.success
        assert shell.user_ns["per_split"].rows() == [("train", 640), ("val", 160)]
        capsys.readouterr()
        bad = shell.run_cell("%drt_sql ds SELECT nope FROM metadata")
        err = capsys.readouterr()
        assert not bad.success
        assert "QueryError" in err.err and "nope" in err.err
        assert "Traceback" not in err.out + err.err
        missing = shell.run_cell("%drt_sql nothing SELECT 1")
        assert (
            not missing.success
            and "'nothing' is not a datasetrt Dataset" in capsys.readouterr().err
        )
    finally:
        InteractiveShell.clear_instance()


def test_progress_is_silent_off_a_terminal_and_text_without_tqdm(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    quiet = io.StringIO()
    with _progress.Progress("work", 10, stream=quiet) as p:
        p.update(10)
    assert quiet.getvalue() == ""
    monkeypatch.setattr(_progress, "_tqdm", lambda: None)
    monkeypatch.setattr(_progress, "TEXT_EVERY", 0.0)
    shown = Tty()
    with _progress.Progress("work", 10, stream=shown) as p:
        p.set(4, 10)
    assert "work: 4 of 10" in shown.getvalue()
    off = Tty()
    with _progress.Progress("work", 10, stream=off, enabled=False) as p:
        p.update(10)
    assert off.getvalue() == ""


def test_progress_uses_tqdm_on_a_terminal():
    pytest.importorskip("tqdm")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    shown = Tty()
    with _progress.Progress("verifying", stream=shown) as p:
        p.set(3, 7)
    assert "verifying" in shown.getvalue() and "3/7" in shown.getvalue()


def test_the_example_notebook_runs_and_shows_escaped_tables_and_a_plot(tmp_path):
    pytest.importorskip("nbclient")
    import nbformat

    root = Path(__file__).resolve().parents[1]
    executed = tmp_path / "explore.ipynb"
    done = subprocess.run(
        [
            sys.executable,
            str(root / "examples" / "run_notebook.py"),
            "--executed",
            str(executed),
            "--timeout",
            "120",
        ],
        env={**os.environ, "DATASETRT_EXAMPLE_ROOT": str(tmp_path / "caches")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    outputs = [o for c in nbformat.read(executed, as_version=4).cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert not [o for o in outputs if "Traceback" in o.get("text", "")]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    views = [h for h in html if "datasetrt.Dataset" in h]
    # the note of the selected snapshot holds its query, `quality >= 0.5`, escaped
    assert any("<table>" in h and "quality &gt;= 0.5" in h for h in views), views
    assert not any("quality >= 0.5" in h for h in html)
    assert any("datasetrt.Sample" in h and "fields" in h for h in html)  # typed preview
    pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG")
