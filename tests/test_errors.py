"""Every bad input raises a typed error naming the culprit, and changes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source, payload_digest
from datasetrt import (
    CacheNotFoundError,
    CorruptCacheError,
    DatasetRTError,
    InvalidInputError,
    UnsupportedFormatError,
)


def assert_unchanged(ds, version, meta):
    assert ds.version == version
    assert ds.get_metadata().equals(meta)
    assert drt.open(ds.caches[0]["path"].parent).version == version


@pytest.fixture
def ds(two_caches):
    return two_caches[0]


def rejected_update(ds, frame, *needles):
    version, meta = ds.version, ds.get_metadata()
    with pytest.raises(InvalidInputError) as err:
        ds.update_metadata(frame)
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    assert_unchanged(ds, version, meta)
    assert isinstance(err.value, ValueError) and isinstance(err.value, DatasetRTError)
    return err.value


def test_unknown_sample_in_update_names_row_and_ids(ds):
    meta = ds.get_metadata().head(5)
    bad = meta.with_columns(
        pl.when(pl.int_range(pl.len()) == 3)
        .then(10_000)
        .otherwise(pl.col("sample_id"))
        .alias("sample_id")
    )
    err = rejected_update(ds, bad, "row 3", "sample_id 10000")
    assert (err.row, err.column, err.value) == (3, "sample_id", "10000")
    bad = meta.with_columns(pl.lit(123, dtype=pl.Int64).alias("cache_id"))
    err = rejected_update(ds, bad, "row 0", "cache_id 123")
    assert (err.row, err.column, err.value) == (0, "cache_id", "123")


def test_unknown_sample_in_get_item(ds):
    cid = ds.caches[0]["cache_id"]
    with pytest.raises(InvalidInputError, match="sample_id 99999"):
        ds.get_item(cid, 99999)
    with pytest.raises(InvalidInputError, match="cache_id 5"):
        ds.get_item(5, 0)
    with pytest.raises(InvalidInputError, match="negative"):
        ds.get_item(cid, -1)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_negative_nan_and_infinite_weights(ds, value):
    meta = ds.get_metadata()
    bad = meta.with_columns(
        pl.when(pl.int_range(pl.len()) == 11)
        .then(value)
        .otherwise(pl.col("weight"))
        .alias("weight")
    )
    rejected_update(
        ds, bad, "row 11", f"weight {value}".replace("nan", "NaN").replace("inf", "inf")
    )


def test_all_zero_weights(ds):
    rejected_update(ds, ds.get_metadata().with_columns(pl.lit(0.0).alias("weight")), "sum to 0")


def test_missing_and_wrongly_typed_identity_columns(ds):
    meta = ds.get_metadata()
    rejected_update(ds, meta.drop("cache_id"), '"cache_id"')
    rejected_update(ds, meta.drop("sample_id"), '"sample_id"')
    rejected_update(
        ds, meta.with_columns(pl.col("sample_id").cast(pl.String)), '"sample_id"', "integer"
    )
    rejected_update(
        ds, meta.with_columns(pl.col("cache_id").cast(pl.Float64)), '"cache_id"', "integer"
    )
    rejected_update(ds, meta.with_columns(pl.col("weight").cast(pl.String)), '"weight"')


def test_null_identity_or_weight(ds):
    meta = ds.get_metadata().head(4)
    nulls = pl.when(pl.int_range(pl.len()) == 2).then(None)
    rejected_update(
        ds,
        meta.with_columns(nulls.otherwise(pl.col("sample_id")).alias("sample_id")),
        "null at row 2",
    )
    rejected_update(
        ds, meta.with_columns(nulls.otherwise(pl.col("weight")).alias("weight")), "null at row 2"
    )


def test_empty_update(ds):
    rejected_update(ds, ds.get_metadata().head(0), "empty")


def test_update_of_a_non_table(ds):
    with pytest.raises(InvalidInputError, match="list"):
        ds.update_metadata([1, 2, 3])


def test_bad_sql_is_a_query_error(ds):
    with pytest.raises(drt.QueryError, match="nope"):
        ds.sql("SELECT nope FROM metadata")
    version = ds.version
    with pytest.raises(drt.QueryError):
        ds.select("SELECT * FROM missing_table")
    assert ds.version == version


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE metadata",
        "DROP TABLE payloads",
        "CREATE OR REPLACE TABLE metadata AS SELECT * FROM metadata WHERE label = 1",
    ],
)
def test_sql_cannot_drop_or_replace_the_population_or_the_payloads(ds, statement):
    with pytest.raises(drt.QueryError, match=r"table (metadata|payloads) is"):
        ds.sql(statement)
    assert ds.sql("SELECT count(*) AS n FROM metadata")["n"][0] == 800
    assert ds.sql("SELECT count(*) AS n FROM payloads")["n"][0] == 800
    # other tables come and go as SQL says
    ds.sql("CREATE TABLE val AS SELECT * FROM metadata WHERE split = 'val'")
    assert ds.sql("SELECT count(*) AS n FROM val")["n"][0] == 160
    ds.sql("DROP TABLE val")
    with pytest.raises(drt.QueryError, match="val"):
        ds.sql("SELECT * FROM val")


def test_ctrl_c_stops_a_long_query_and_the_dataset_stays_usable(ds):
    # 800^4 = 4e11 joined rows: minutes of work on every core unless cancelled
    endless = (
        "SELECT sum(a.quality * b.quality * c.quality * d.quality) AS s "
        "FROM metadata a, metadata b, metadata c, metadata d"
    )
    # A real SIGINT, as Ctrl-C sends, with Python's own handler installed for
    # this test: an interrupt that some earlier code left ignored (SIG_IGN or
    # SIG_DFL make interrupt_main() a no-op) would let the query run on.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            ds.sql(endless)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    # Uncancelled, the query runs for many minutes on every core; 60 s is
    # far from both that and the ~1 s it takes, so load cannot decide it.
    assert time.monotonic() - started < 60
    # The query is cancelled, not left running in the background: this
    # process's own CPU time (which other processes' load does not raise)
    # falls to idle within a few one-second windows.
    for _ in range(10):
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(1.0)
        busy = (time.process_time() - cpu) / (time.monotonic() - wall)
        if busy < 0.5:
            break
    assert busy < 0.5, f"{busy:.1f} cores still busy 10 s after the interrupt"
    assert ds.sql("SELECT count(*) AS n FROM metadata")["n"][0] == 800


def test_the_suite_passes_when_started_with_sigint_ignored():
    """A script that starts `make test` in the background starts it with
    SIGINT ignored; the suite installs the handler it needs (conftest) and
    the Ctrl-C test above still passes."""
    here = Path(__file__).parent
    test = f"{here / 'test_errors.py'}::test_ctrl_c_stops_a_long_query_and_the_dataset_stays_usable"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", test],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        cwd=here.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_seed_is_required_and_checked(ds):
    with pytest.raises(TypeError):
        ds.iter()  # type: ignore[call-arg]
    with pytest.raises(InvalidInputError, match="seed"):
        ds.iter(seed=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="seed"):
        ds.iter(seed=-1)


@pytest.mark.parametrize("key", ["cache_id", "sample_id", "weight"])
def test_reserved_metadata_keys(tmp_path, key):
    src = Source("reserved-v1", 3, meta=lambda i: {key: i})
    with pytest.raises(InvalidInputError, match=f"'{key}' is reserved"):
        drt.build(tmp_path, [src], progress=False)
    assert not (tmp_path / "reserved-v1").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_metadata_keys_that_differ_between_records(tmp_path):
    src = Source("keys-v1", 10, meta=lambda i: {"a": 1} if i != 6 else {"a": 1, "b": 2})
    with pytest.raises(InvalidInputError, match="record 6 has metadata keys"):
        drt.build(tmp_path, [src], progress=False)
    assert list(tmp_path.iterdir()) == []


def test_metadata_types_that_differ_between_records(tmp_path):
    src = Source("types-v1", 10, meta=lambda i: {"label": 1 if i != 8 else "one"})
    with pytest.raises(InvalidInputError, match=r"'label' is int in record 0 but str in record 8"):
        drt.build(tmp_path, [src], progress=False)
    assert list(tmp_path.iterdir()) == []


def test_unsupported_metadata_value_type(tmp_path):
    src = Source("objs-v1", 3, meta=lambda i: {"box": [i]})
    with pytest.raises(InvalidInputError, match=r"record 0: metadata key 'box' .* list"):
        drt.build(tmp_path, [src], progress=False)


def test_data_that_is_not_bytes_like(tmp_path):
    src = Source("str-v1", 5, payload=lambda i: "text" if i == 2 else b"ok")
    with pytest.raises(InvalidInputError, match="record 2: data is str"):
        drt.build(tmp_path, [src], progress=False)
    assert list(tmp_path.iterdir()) == []


def test_items_that_are_not_pairs(tmp_path):
    class Odd:
        name = "odd-v1"

        def __iter__(self):
            yield 42

    with pytest.raises(InvalidInputError, match="record 0 is a int"):
        drt.build(tmp_path, [Odd()], progress=False)


def test_empty_source(tmp_path):
    with pytest.raises(InvalidInputError, match="'empty-v1' yielded no samples"):
        drt.build(tmp_path, [Source("empty-v1", 0)], progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"codec": "gzip"}, "codec"),
        ({"codec": 3}, "codec must be a str"),
        ({"level": 99}, "zstd level 99 is outside"),
        ({"level": 2.5}, "level must be an int"),
        ({"level": True}, "level must be an int"),
        ({"shard_bytes": 0}, "shard_bytes must be positive"),
        ({"shard_bytes": -1}, "shard_bytes must be in"),
        ({"threads": 0}, "threads must be positive"),
    ],
)
def test_bad_writer_options_are_refused_before_a_source_is_read(tmp_path, options, needle):
    """build's writer options are one engine-side spec, checked as a whole
    before the first record is read: nothing is written or iterated."""
    src = Source("opts-v1", 3)
    with pytest.raises(InvalidInputError, match=needle):
        drt.build(tmp_path, [src], progress=False, **options)
    assert src.iterations == 0
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_the_writer_spec_holds_the_defaults_and_travels_whole():
    """One owner of the defaults (the engine's WriterOptions); a spec pickles
    to the same spec, as build's processes and Ray's tasks receive it."""
    import pickle

    spec = drt._native.WriterSpec()
    assert (spec.codec, spec.level, spec.shard_bytes) == ("zstd", 3, 256 << 20)
    assert drt._native.WriterSpec(level=None) == spec  # None keeps the default
    lz4 = drt._native.WriterSpec(codec="lz4", shard_bytes=1 << 20)
    assert pickle.loads(pickle.dumps(lz4)) == lz4 != spec
    assert (lz4.codec, lz4.shard_bytes) == ("lz4", 1 << 20)
    with pytest.raises(InvalidInputError, match='unknown writer option "shard_size"'):
        drt._native.WriterSpec(shard_size=1)
    # the level is checked for zstd only: other codecs ignore it
    assert drt._native.WriterSpec(codec="none", level=99).level == 99


def test_two_sources_with_one_name(tmp_path):
    with pytest.raises(InvalidInputError, match="two sources are named 'twin-v1'"):
        drt.build(tmp_path, [Source("twin-v1", 3), Source("twin-v1", 4)], progress=False)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_bad_source_names(tmp_path):
    class Nameless:
        def __iter__(self):
            yield b"x", {}

    with pytest.raises(InvalidInputError, match="string attribute `name`"):
        drt.build(tmp_path, [Nameless()], progress=False)
    with pytest.raises(InvalidInputError, match="invalid source name"):
        drt.build(tmp_path, [Source("../escape", 2)], progress=False)


def test_a_failing_source_leaves_nothing_behind(tmp_path):
    def payload(i):
        if i == 5000:
            raise RuntimeError("preprocessing failed")
        return b"x" * 10

    with pytest.raises(RuntimeError, match="preprocessing failed"):
        drt.build(tmp_path, [Source("crash-v1", 6000, payload=payload)], progress=False)
    assert list(tmp_path.iterdir()) == []


def test_missing_paths(tmp_path):
    with pytest.raises(CacheNotFoundError) as err:
        drt.open(tmp_path / "nowhere")
    assert isinstance(err.value, FileNotFoundError)
    assert "nowhere" in str(err.value)
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(CacheNotFoundError, match="emptydir"):
        drt.open(tmp_path / "emptydir")


def _one_cache(tmp_path: Path, n: int = 40):
    src = Source("victim-v1", n, payload=lambda i: bytes([i % 256]) * 300)
    ds = drt.build(tmp_path, [src], codec="none", progress=False)
    return ds, tmp_path / "victim-v1", src


def test_missing_shard(tmp_path):
    _, cache, _ = _one_cache(tmp_path)
    (cache / "shard-00000.drts").unlink()
    with pytest.raises(CacheNotFoundError, match=r"shard-00000\.drts"):
        drt.open(tmp_path)


def test_truncated_shard(tmp_path):
    _, cache, _ = _one_cache(tmp_path)
    shard = cache / "shard-00000.drts"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(CorruptCacheError, match=r"shard-00000.drts.*manifest says"):
        drt.open(tmp_path)


def test_a_flipped_payload_byte_is_never_delivered(tmp_path):
    ds, cache, _ = _one_cache(tmp_path)
    shard = cache / "shard-00000.drts"
    raw = bytearray(shard.read_bytes())
    offset = 16 + 300 * 17 + 5  # inside sample 17
    raw[offset] ^= 0x01
    shard.write_bytes(bytes(raw))
    ds = drt.open(tmp_path)
    cid = ds.caches[0]["cache_id"]
    assert ds.get_item(cid, 16).data == bytes([16]) * 300
    with pytest.raises(CorruptCacheError) as err:
        ds.get_item(cid, 17)
    msg = str(err.value)
    assert "shard-00000.drts" in msg and "sample 17" in msg and f"offset {16 + 300 * 17}" in msg
    # the culprit as data: nobody needs to parse the message
    assert Path(err.value.path) == shard
    assert (err.value.record, err.value.shard, err.value.offset) == (17, 0, 16 + 300 * 17)
    with pytest.raises(CorruptCacheError, match="sample 17"):
        for _ in ds.iter(seed=0):
            pass


def test_corrupted_index(tmp_path):
    """The index's entries are checked a chunk at a time when a read first
    lands there (once per host), not at open: the damaged entry's chunk
    fails the reads that use it, naming the file and the chunk."""
    ds, cache, _ = _one_cache(tmp_path)
    cache_id = ds.caches[0]["cache_id"]
    index = cache / "index.drti"
    raw = bytearray(index.read_bytes())
    raw[32 + 32 * 3] ^= 0xFF
    index.write_bytes(bytes(raw))
    again = drt.open(tmp_path)
    with pytest.raises(CorruptCacheError, match=r"chunk 0 .*checksum") as caught:
        again.get_item(cache_id, 3)
    assert caught.value.path.name == "index.drti"
    assert any("index.drti" in p for p in again.verify()["path"].to_list())


def test_corrupted_manifest(tmp_path):
    _, cache, _ = _one_cache(tmp_path)
    manifest = cache / "MANIFEST"
    manifest.write_text(manifest.read_text().replace("records=40", "records=41"))
    with pytest.raises(CorruptCacheError, match=r"MANIFEST.*checksum mismatch"):
        drt.open(tmp_path)


def test_corrupted_attributes(tmp_path):
    """The attributes are read to make a dataset's first population: damaged,
    that fails naming the file; a dataset that has its population opens."""
    _, cache, _ = _one_cache(tmp_path)
    attrs = cache / "attributes.arrow"
    raw = bytearray(attrs.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    attrs.write_bytes(bytes(raw))
    ds = drt.open(tmp_path)
    assert len(ds) == 40
    with pytest.raises(CorruptCacheError, match=r"attributes\.arrow"):
        drt.open(tmp_path, snapshot_dir=tmp_path / "fresh")
    assert any("attributes.arrow" in p for p in ds.verify()["path"].to_list())


def test_unsupported_format_version(tmp_path):
    _, cache, _ = _one_cache(tmp_path)
    manifest = cache / "MANIFEST"
    body = (
        manifest.read_text().split("checksum=")[0].replace("datasetrt-cache 1", "datasetrt-cache 7")
    )
    crc = _crc32c(body.encode())
    manifest.write_text(f"{body}checksum={crc:08x}\n")
    with pytest.raises(UnsupportedFormatError, match=r"version 7 .*MANIFEST"):
        drt.open(tmp_path)


def _crc32c(data: bytes) -> int:
    """Bitwise CRC-32C (Castagnoli), to forge a valid manifest in a test."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc_helper_is_crc32c_not_zlib_crc32():
    assert _crc32c(b"123456789") == 0xE3069283 != zlib.crc32(b"123456789")


def test_a_corrupted_snapshot_is_reported(two_caches):
    ds, root, _ = two_caches
    before = payload_digest(root)
    path = ds.snapshot_path
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptCacheError, match=path.name):
        drt.open(root)
    assert payload_digest(root) == before  # the caches are untouched


def test_errors_name_their_culprit_as_attributes_or_none(ds):
    """Every InvalidInputError and CorruptCacheError has the culprit
    attributes: set where known, None where not (never missing)."""
    with pytest.raises(InvalidInputError) as err:
        ds.loader(8, seed=-1)
    assert (err.value.row, err.value.column, err.value.value) == (None, None, None)
    with pytest.raises(InvalidInputError) as err:
        ds.update_metadata(ds.get_metadata().with_columns(pl.lit(1).alias("data")))
    assert err.value.column == "data" and err.value.row is None
    assert drt.CorruptCacheError("x").record is None


def test_internal_and_arrow_errors_have_their_own_classes():
    assert issubclass(drt.InternalError, drt.DatasetRTError)
    assert issubclass(drt.InternalError, RuntimeError)
    assert not issubclass(drt.InternalError, ValueError)  # never the caller's fault
    assert issubclass(drt.ArrowError, drt.DatasetRTError)


@pytest.mark.parametrize("place", ["task", "verify"])
def test_a_panic_inside_is_an_internal_error_and_the_dataset_stays_usable(ds, monkeypatch, place):
    """README: a panicked worker is InternalError (a RuntimeError), never a
    plain RuntimeError or an InvalidInputError blaming the caller."""
    monkeypatch.setenv("DATASETRT_TEST_PANIC", place)
    with pytest.raises(drt.InternalError, match="panicked") as info:
        if place == "verify":
            ds.verify()
        else:
            ds.sql("SELECT count(*) AS n FROM metadata")
    assert not isinstance(info.value, ValueError)
    monkeypatch.delenv("DATASETRT_TEST_PANIC")
    assert ds.sql("SELECT count(*) AS n FROM metadata")["n"][0] == 800
    assert ds.verify().is_empty()


@pytest.mark.parametrize("value", [2**63, 2**70, -(2**63) - 1])
def test_metadata_ints_past_64_bits_name_key_and_record(tmp_path, value):
    src = Source("big-v1", 5, meta=lambda i: {"n": value if i == 3 else i})
    with pytest.raises(InvalidInputError, match="outside the 64-bit") as info:
        drt.build(tmp_path, [src], progress=False)
    assert (info.value.row, info.value.column, info.value.value) == (3, "n", str(value))
    assert not (tmp_path / "big-v1").exists()
