"""Typed records: a source yields a dict of arrays, the cache stores them
behind a small typed header, and a batch hands them back as numpy arrays and
torch tensors with no pickle (``datasetrt.records``, FORMAT.md)."""

from __future__ import annotations

import pickle
import struct
import warnings
from typing import ClassVar

import numpy as np
import pytest

import datasetrt as drt
from datasetrt import CorruptCacheError, InvalidInputError, records


def image(i: int) -> np.ndarray:
    return (np.arange(3 * 8 * 8, dtype=np.uint8).reshape(3, 8, 8) + i).astype(np.uint8)


class Images:
    def __init__(self, n: int = 40, name: str = "images", fields=None):
        self.n, self.name = n, name
        if fields is not None:
            self.fields = fields

    def __iter__(self):
        for i in range(self.n):
            yield drt.CacheInput({"image": image(i), "label": i, "w": np.float32(i / 2)}, {"i": i})


def build(tmp_path, *sources, codec=None):
    return drt.build(tmp_path / "root", list(sources), progress=False, codec=codec)


def expected(sample_ids):
    return np.stack([image(int(s)) for s in sample_ids])


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_batch_of_fixed_shapes_is_one_array_per_field(tmp_path, codec):
    ds = build(tmp_path, Images(), codec=codec)
    seen = set()
    for batch in ds.loader(16, seed=3, sampling="permutation"):
        ids = batch.sample_id
        assert batch.typed
        assert batch.fields == {
            "image": (np.dtype(np.uint8), (3, 8, 8)),
            "label": (np.dtype(np.int64), ()),
            "w": (np.dtype(np.float32), ()),
        }
        images = batch.tensor("image")
        assert images.shape == (len(ids), 3, 8, 8) and images.dtype == np.uint8
        np.testing.assert_array_equal(images, expected(ids))
        np.testing.assert_array_equal(batch.tensor("label"), ids)
        np.testing.assert_array_equal(batch.tensor("w"), np.float32(ids) / 2)
        # a copy is the caller's to change
        images += 1
        np.testing.assert_array_equal(batch.tensor("image"), expected(ids))
        seen.update(ids)
    assert seen == set(range(40))


def test_torch_tensors_and_the_default_torch_batch(tmp_path):
    torch = pytest.importorskip("torch")
    ds = build(tmp_path, Images())
    batch = next(iter(ds.loader(8, seed=1)))
    t = batch.torch("image")
    assert t.dtype == torch.uint8 and tuple(t.shape) == (8, 3, 8, 8)
    np.testing.assert_array_equal(t.numpy(), expected(batch.sample_id))
    t.add_(1)  # writable, and not the cache's bytes
    np.testing.assert_array_equal(batch.torch("image").numpy(), expected(batch.sample_id))
    assert batch.torch("w").dtype == torch.float32

    if not torch.cuda.is_available():  # as DataLoader(pin_memory=True) does there
        with pytest.warns(UserWarning, match="no CUDA device: the tensor is not pinned"):
            unpinned = batch.torch("image", pin_memory=True)
        np.testing.assert_array_equal(unpinned.numpy(), expected(batch.sample_id))
    else:
        assert batch.torch("image", pin_memory=True).is_pinned()

    loader = torch.utils.data.DataLoader(ds.to_torch(8, seed=1), batch_size=None)
    first = next(iter(loader))
    assert set(first) >= {"image", "label", "w", "cache_id", "sample_id", "draw", "epoch"}
    assert "data" not in first
    np.testing.assert_array_equal(first["label"].numpy(), first["sample_id"].numpy())
    np.testing.assert_array_equal(first["image"].numpy(), expected(first["sample_id"].tolist()))


def test_rows_read_in_place_are_a_view_of_the_shard_not_a_copy(tmp_path):
    ds = build(tmp_path, Images(n=4), codec="none")
    # batch_size=1: one record is always one run through its shard
    batch = next(iter(ds.loader(1, seed=0)))
    view = batch.tensor("image")
    assert not view.flags.writeable and not view.flags.owndata
    np.testing.assert_array_equal(view, expected(batch.sample_id))
    copied = batch.tensor("image", copy=True)
    assert copied.flags.writeable and copied.flags.owndata
    # two rows that follow each other in the shard: find a seed whose first
    # batch holds them in order (a pure function of the seed, so fixed)
    for seed in range(64):
        batch = next(iter(ds.loader(2, seed=seed, sampling="permutation")))
        ids = batch.sample_id
        if ids[1] == ids[0] + 1:
            break
    else:
        pytest.fail("no seed of 64 drew two consecutive rows first")
    view = batch.tensor("image")
    assert not view.flags.owndata
    np.testing.assert_array_equal(view, expected(ids))
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0, 0, 0] = 1


def test_variable_shapes_are_declared_and_read_row_by_row(tmp_path):
    class Frames:
        name = "frames"
        fields: ClassVar = {"audio": drt.Field("float32", (None, 4)), "id": ("int32", ())}

        def __iter__(self):
            for i in range(6):
                yield {"audio": np.full((i + 1, 4), i, np.float32), "id": i}, None

    ds = build(tmp_path, Frames())
    batch = next(iter(ds.loader(6, seed=0, sampling="permutation")))
    arrays = batch.arrays("audio")
    for row, sample in enumerate(batch.sample_id):
        assert arrays[row].shape == (sample + 1, 4)
        assert (arrays[row] == sample).all()
    np.testing.assert_array_equal(batch.tensor("id"), batch.sample_id)
    assert batch.tensor("id").dtype == np.int32
    with pytest.raises(InvalidInputError, match=r"batch\.arrays\('audio'\)"):
        batch.tensor("audio")
    # one sample alone stacks
    single = next(iter(ds.loader(1, seed=0)))
    assert single.tensor("audio").shape == (1, single.sample_id[0] + 1, 4)
    # and get_item / iter give the fields of one record
    sample = ds.get_item(batch.cache_id[0], batch.sample_id[0])
    np.testing.assert_array_equal(sample.fields()["audio"], arrays[0])


@pytest.mark.parametrize(
    ("records_", "fields", "match"),
    [
        (
            [{"x": np.zeros(3, np.uint8)}, {"x": np.zeros(4, np.uint8)}],
            None,
            r"record 1.*shape \(4,\)",
        ),
        ([{"x": np.zeros(3, np.uint8)}, {"x": np.zeros(3, np.int8)}], None, "record 1.*dtype int8"),
        ([{"x": 1}, {"y": 1}], None, r"record 1.*missing \['x'\]"),
        ([{"x": 1}, b"raw"], None, "record 1: data is bytes; this source is typed"),
        ([{"x": 1}], {"x": drt.Field("uint8")}, None),
        ([{"x": 300}], {"x": drt.Field("uint8")}, "record 0.*'x'.*uint8"),
        ([{"x": np.zeros((2, 5))}], {"x": drt.Field("float64", (None, 4))}, r"shape \(2, 5\)"),
        ([{"x": "text"}], None, "field 'x'.*not a plain number"),
        ([{"data": 1}], None, "'data' is reserved"),
        ([b"raw", {"x": 1}], None, "record 1: data is dict"),
    ],
)
def test_a_record_unlike_its_fields_is_refused_naming_source_and_record(
    tmp_path, records_, fields, match
):
    class Source:
        name = "bad"

        def __iter__(self):
            return iter([(r, None) for r in records_])

    source = Source()
    if fields is not None:
        source.fields = fields
    if match is None:
        build(tmp_path, source)
        return
    with pytest.raises(InvalidInputError, match=f"source 'bad'.*{match}"):
        build(tmp_path, source)
    assert not (tmp_path / "root" / "bad").exists()


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({}, "non-empty mapping"),
        ({"x": ("uint8", (-1,))}, "each dim is an int >= 0 or None"),
        ({"x": ("float32", (2,), "extra", "more")}, "expected a Field"),
        ({"x": ("U4",)}, "not a plain number"),
        ({"x": (object,)}, "not a plain number"),
        ({"x": ("no such dtype",)}, "not a numpy dtype"),
    ],
)
def test_bad_declared_fields_are_refused_before_any_record_is_read(tmp_path, fields, match):
    class Source:
        name = "bad"

        def __iter__(self):
            raise AssertionError("read")

    with pytest.raises(InvalidInputError, match=match):
        source = Source()
        source.fields = fields
        build(tmp_path, source)


def test_bytes_caches_are_not_typed_and_damaged_headers_are_corrupt(tmp_path):
    class Raw:
        name = "raw"

        def __iter__(self):
            for i in range(4):
                yield pickle.dumps(i), None

    ds = build(tmp_path, Raw())
    batch = next(iter(ds.loader(4, seed=0)))
    assert not batch.typed
    with pytest.raises(InvalidInputError, match=r"not a typed record.*batch\.data"):
        batch.tensor("x")
    good = records.encode({"x": np.arange(4)}, {"x": drt.Field("int64", (4,))}, "t")
    layout = records.parse(good, "t")
    assert layout.fields["x"][2] % records.ALIGN == 0
    for damaged in [
        good[:12],
        good[:8] + (2).to_bytes(4, "little") + good[12:],
        good[:16] + (9).to_bytes(2, "little") + good[18:],
        good[: layout.fields["x"][2]],
    ]:
        with pytest.raises(CorruptCacheError, match="t: damaged typed-record header"):
            records.parse(damaged, "t")


def test_a_pickled_batch_keeps_its_typed_fields(tmp_path):
    ds = build(tmp_path, Images(n=8))
    batch = next(iter(ds.loader(8, seed=2)))
    again = pickle.loads(pickle.dumps(batch))
    np.testing.assert_array_equal(again.tensor("image"), batch.tensor("image"))
    np.testing.assert_array_equal(again.tensor("label"), batch.sample_id)


def test_a_typed_sample_shows_its_fields_in_a_notebook(tmp_path):
    ds = build(tmp_path, Images(n=3))
    html = ds.get_item(ds.get_metadata()["cache_id"][0], 2)._repr_html_()
    assert "image: uint8[3, 8, 8] [2, 3, 4, 5, 6, 7 …]" in html
    assert "label: int64[] [2]" in html


def test_a_reused_buffer_is_filled_in_place_and_a_wrong_one_refused(tmp_path):
    """out=: one staging array or tensor for every batch, filled in place
    (the batch's rows, not the last batch's), and one of another shape,
    dtype or layout is InvalidInputError before anything is written."""
    torch = pytest.importorskip("torch")
    ds = build(tmp_path, Images(n=40), codec="zstd")
    staging = np.zeros((8, 3, 8, 8), np.uint8)
    pinned = torch.zeros((8, 3, 8, 8), dtype=torch.uint8)
    for batch in ds.loader(8, seed=5, sampling="permutation"):
        assert batch.tensor("image", out=staging) is staging
        np.testing.assert_array_equal(staging, expected(batch.sample_id))
        assert batch.torch("image", out=pinned) is pinned
        np.testing.assert_array_equal(pinned.numpy(), expected(batch.sample_id))
    batch = next(iter(ds.loader(8, seed=5)))
    for wrong in (
        np.zeros((7, 3, 8, 8), np.uint8),
        np.zeros((8, 3, 8, 8), np.int8),
        np.zeros((8, 8, 8, 3), np.uint8).transpose(0, 3, 1, 2),
        np.zeros((8, 3, 8, 16), np.uint8)[..., :8],
        b"not an array",
    ):
        with pytest.raises(InvalidInputError, match=r"out= for field 'image' must be"):
            batch.tensor("image", out=wrong)
    read_only = np.zeros((8, 3, 8, 8), np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(InvalidInputError, match="writable C-contiguous"):
        batch.tensor("image", out=read_only)
    for wrong in (
        torch.zeros((8, 3, 8, 8), dtype=torch.int16),
        torch.zeros((7, 3, 8, 8), dtype=torch.uint8),
        torch.zeros((8, 3, 8, 16), dtype=torch.uint8)[..., :8],
        torch.empty((8, 3, 8, 8), dtype=torch.uint8, device="meta"),  # not memory of this CPU
        staging,
    ):
        with pytest.raises(InvalidInputError, match=r"out= for field 'image' must be a contiguous"):
            batch.torch("image", out=wrong)


def test_a_header_that_encode_never_writes_is_corrupt_not_a_crash(tmp_path):
    """Review finding: a bytes payload that happens to start like a typed
    record and declares an object field (numpy would read its bytes as
    pointers) is CorruptCacheError, in a copy and in a view alike."""
    entry = struct.pack("<B1sB2sB", 1, b"x", 2, b"|O", 1) + struct.pack("<Q", 2)
    fixed = struct.pack("<8sIIH", records.MAGIC, 1, 64, 1)  # magic, version, H, fields
    head = fixed + entry + struct.pack("<QQ", 64, 16)
    record = head.ljust(64, b"\0") + struct.pack("<QQ", 0x4141414141414141, 0x10)

    class Raw:
        name = "raw"

        def __iter__(self):
            return iter([(record, None)] * 4)

    batch = next(iter(build(tmp_path, Raw(), codec="none").loader(4, seed=0)))
    for read in (lambda: batch.tensor("x", copy=True), lambda: batch.tensor("x")):
        with pytest.raises(CorruptCacheError, match=r"dtype '\|O', not a little-endian number"):
            read()


def test_rows_of_two_caches_with_one_field_name_and_two_dtypes_are_refused(tmp_path):
    """Review finding: a batch drawn from two caches whose field `x` differs
    in dtype is InvalidInputError, not silently promoted or truncated."""

    class Source:
        def __init__(self, name, dtype):
            self.name, self.dtype = name, dtype

        def __iter__(self):
            for i in range(8):
                yield {"x": np.array([i], self.dtype)}, None

    ds = build(tmp_path, Source("a", np.uint8), Source("b", np.float32))
    mixed = next(
        batch
        for seed in range(64)
        for batch in [next(iter(ds.loader(16, seed=seed)))]
        if len(set(batch.cache_id)) == 2
    )
    with pytest.raises(InvalidInputError, match="field 'x' has 2 dtypes in this batch"):
        mixed.tensor("x")
    with pytest.raises(InvalidInputError, match="field 'x' has 2 dtypes in this batch"):
        mixed.tensor("x", out=np.zeros((16, 1), mixed.fields["x"][0]))  # row 0's dtype
    assert {a.dtype for a in mixed.arrays("x")} == {np.dtype(np.uint8), np.dtype(np.float32)}


def test_out_over_a_read_only_view_of_a_shard_is_refused_not_a_crash(tmp_path):
    """Review finding: torch cannot mark a tensor read-only, so a tensor made
    from batch.tensor's view of a mapped shard and passed as out= is refused
    by the native copy (the kernel is asked whether it may be written)."""
    torch = pytest.importorskip("torch")
    ds = build(tmp_path, Images(n=4), codec="none")
    view = next(iter(ds.loader(1, seed=0))).tensor("image")
    assert not view.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns of the read-only array
        staging = torch.from_numpy(view)
    batch = next(iter(ds.loader(1, seed=1)))
    with pytest.raises(InvalidInputError, match="out= is not writable memory"):
        batch.torch("image", out=staging)
    # the copy into memory of its own still works
    np.testing.assert_array_equal(batch.torch("image").numpy(), expected(batch.sample_id))
