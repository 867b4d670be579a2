"""Property test of `update_metadata`: for any frame a user may pass, the
update either lands exactly as given or raises InvalidInputError and changes
nothing — never another exception, never a partial or altered population."""

from __future__ import annotations

import math

import polars as pl
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import datasetrt as drt  # noqa: E402
from conftest import HYPOTHESIS_SCALE  # noqa: E402

EXAMPLES = 80 * HYPOTHESIS_SCALE

ID_TYPES = [pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64]
NAMES = st.one_of(
    st.sampled_from(["label", "split", "loss", "data", "codec", "x y", "ünï", "a\nb", ""]),
    st.text(min_size=0, max_size=6),
)


@st.composite
def frames(draw, cache_ids: list[int], sizes: dict[int, int]):
    n = draw(st.integers(0, 12))
    good = draw(st.booleans())
    cids, sids = [], []
    for _ in range(n):
        cid = (
            draw(st.sampled_from(cache_ids)) if good else draw(st.sampled_from([*cache_ids, 0, -1]))
        )
        limit = sizes.get(cid, 5)
        sid = draw(st.integers(0, limit - 1)) if good else draw(st.integers(-2, limit + 2))
        cids.append(cid)
        sids.append(sid)
    columns: dict[str, pl.Series] = {}
    if draw(st.integers(0, 9)) > 0:
        columns["cache_id"] = pl.Series("cache_id", cids, dtype=pl.Int64)
    if draw(st.integers(0, 9)) > 0:
        dtype = draw(st.sampled_from(ID_TYPES))
        try:
            columns["sample_id"] = pl.Series("sample_id", sids, dtype=dtype, strict=True)
        except Exception:  # a negative id in an unsigned type: keep Int64
            columns["sample_id"] = pl.Series("sample_id", sids, dtype=pl.Int64)
    if draw(st.booleans()):
        finite = st.floats(0, 10, allow_nan=False)
        weights = st.one_of(finite, st.just(-1.0), st.just(math.nan), st.just(math.inf))
        values = [draw(weights if not good else finite) for _ in range(n)]
        columns["weight"] = pl.Series("weight", values, dtype=pl.Float64)
    for _ in range(draw(st.integers(0, 2))):
        name = draw(NAMES)
        if name in columns:
            continue
        values = draw(st.lists(st.one_of(st.none(), st.integers(-5, 5)), min_size=n, max_size=n))
        columns[name] = pl.Series(name, values, dtype=pl.Int64)
    return pl.DataFrame(list(columns.values())) if columns else pl.DataFrame()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from conftest import Source

    root = tmp_path_factory.mktemp("props")
    return drt.build(root, [Source("p-v1", 6), Source("q-v1", 4)], progress=False)


def test_any_frame_lands_exactly_or_is_refused_and_changes_nothing(dataset):
    cache_ids = [c["cache_id"] for c in dataset.caches]
    sizes = {c["cache_id"]: c["records"] for c in dataset.caches}
    by_name = {c["name"]: c["cache_id"] for c in dataset.caches}
    outcomes = {"accepted": 0, "refused": 0}

    def valid_frame(name: str) -> pl.DataFrame:
        """Stored samples of both caches, with a column called ``name``."""
        p, q = by_name["p-v1"], by_name["q-v1"]
        return pl.DataFrame(
            {
                "cache_id": [p, p, q],
                "sample_id": [0, 5, 3],
                "weight": [0.5, 1.0, 2.0],
                name: [1, 2, 3],
            }
        )

    @settings(
        max_examples=EXAMPLES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(frame=frames(cache_ids, sizes))
    # What hypothesis has found: each once aborted the process or was misread.
    @example(frame=valid_frame("a\x00b"))  # polars' Arrow export panics on a NUL
    @example(frame=valid_frame("\x00"))
    @example(frame=valid_frame("a\nb"))
    @example(frame=valid_frame("ünï"))  # accepted: a valid name of any script
    def check(frame: pl.DataFrame):
        before_version, before = dataset.version, dataset.get_metadata()
        try:
            version = dataset.update_metadata(frame)
        except drt.InvalidInputError:
            outcomes["refused"] += 1
            assert dataset.version == before_version
            assert dataset.get_metadata().equals(before)
            assert drt.open(dataset.caches[0]["path"].parent).version == before_version
            return
        outcomes["accepted"] += 1
        assert version == dataset.version == before_version + 1
        got = dataset.get_metadata()
        # the round trip is exact: the frame's columns in its order (weight
        # added at the end when absent), its values, identity as Int64
        expected = frame.with_columns(pl.col("sample_id").cast(pl.Int64))
        if "weight" not in frame.columns:
            expected = expected.with_columns(pl.lit(1.0).alias("weight"))
        assert got.columns == expected.columns
        assert got.equals(expected), (got, expected)
        assert drt.open(dataset.caches[0]["path"].parent).get_metadata().equals(got)

    check()
    # a test that refused everything would pass the checks above: valid
    # frames are about half of what `frames` draws, and must land
    assert outcomes["accepted"] >= EXAMPLES // 5, outcomes
    assert outcomes["refused"] >= EXAMPLES // 5, outcomes
