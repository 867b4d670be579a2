"""WebDataset shards are read natively: whatever a tar holds, the samples the
native reader finds are those Python's own tarfile finds (the reader a
compressed shard still goes through), in ustar, GNU and pax layouts, with
long and non-ASCII names, directories, links, hidden and extensionless
files, and one extension twice in a sample; directories and links whose
size field is not zero carry no data. Derandomized in `make test`,
randomized at ten times the count in `make fuzz`."""

from __future__ import annotations

import gzip
import io
import tarfile

import polars as pl
import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import datasetrt as drt
from conftest import HYPOTHESIS_SCALE
from datasetrt.exceptions import InvalidInputError

FOLDERS = ["", "train", "a//b", "d" * 120, "ünï/cödé"]
STEMS = ["s0", "s1", "Ab", "ü"]
EXTS = ["jpg", "JPG", "cls", "seg.png", "txt"]
KINDS = ["file", "file", "file", "file", "dir", "link", "hardlink", "hidden", "plain"]

entries = st.lists(
    st.tuples(
        st.sampled_from(FOLDERS),
        st.sampled_from(STEMS),
        st.sampled_from(EXTS),
        st.integers(0, 1500),
        st.sampled_from(KINDS),
    ),
    max_size=25,
)


def write(path, layout, items) -> None:
    with tarfile.open(path, "w", format=layout) as tar:
        for n, (folder, stem, ext, size, kind) in enumerate(items):
            name = f"{folder}/{stem}.{ext}" if folder else f"{stem}.{ext}"
            if kind == "hidden":
                name = f"{folder}/.{stem}.{ext}" if folder else f".{stem}.{ext}"
            elif kind == "plain":
                name = f"{folder}/{stem}" if folder else stem
            info = tarfile.TarInfo(name)
            if kind == "dir":  # a size field, but no data (as POSIX allows)
                info.type, info.size = tarfile.DIRTYPE, size
                tar.addfile(info)
            elif kind in ("link", "hardlink"):
                info.type = tarfile.SYMTYPE if kind == "link" else tarfile.LNKTYPE
                info.linkname, info.size = "elsewhere/" + "l" * 120, size
                tar.addfile(info)
            else:
                info.size = size
                tar.addfile(info, io.BytesIO(bytes([n % 251]) * size))


@settings(
    max_examples=60 * HYPOTHESIS_SCALE,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    items=entries,
    layout=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    batch_rows=st.integers(1, 6),
)
def test_the_native_tar_reader_finds_what_tarfile_finds(tmp_path, items, layout, batch_rows):
    path = str(tmp_path / "shard.tar")
    try:
        write(path, layout, items)
    except ValueError:  # a name ustar cannot hold: nothing to compare
        return
    src = drt.sources.WebDataset(
        path, name="p", data="jpg", metadata={"cls": bytes, "seg.png": bytes}, batch_rows=batch_rows
    )
    native = list(src._batches(path))
    python = list(src._stream_batches(path, ["jpg", "cls", "seg.png"]))
    assert [len(b) for b in native] == [len(b) for b in python]
    both = [pl.concat(b) if b else None for b in (native, python)]
    if both[0] is None:
        assert both[1] is None
    else:
        assert both[0].equals(both[1])


def test_a_damaged_tar_is_invalid_input_naming_the_shard(tmp_path):
    good = tmp_path / "good.tar"
    write(good, tarfile.GNU_FORMAT, [("", "s0", "jpg", 700, "file")] * 2)
    raw = good.read_bytes()
    latin = {"format": tarfile.GNU_FORMAT, "encoding": "latin-1"}
    with tarfile.open(tmp_path / "l1.tar", "w", **latin) as tar:
        info = tarfile.TarInfo("caf\xe9.jpg")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    latin1 = (tmp_path / "l1.tar").read_bytes()
    with gzip.open(tmp_path / "latin-1.tar.gz", "wb") as gz:  # read through tarfile
        gz.write(latin1)
    src = drt.sources.WebDataset(good, name="d", data="jpg")
    assert [len(b) for b in src._batches(str(good))] == [1]
    cases = {
        "empty.tar": b"",
        "cut-data.tar": raw[:900],
        "cut-header.tar": raw[: 1536 + 100],
        "not-a-tar.tar": b"x" * 2048,
        "bad-size.tar": raw[:124] + b"9" * 11 + raw[135:],
        "latin-1.tar": latin1,
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    for name in [*cases, "latin-1.tar.gz"]:
        src = drt.sources.WebDataset(tmp_path / name, name="d", data="jpg")
        with pytest.raises(InvalidInputError, match=rf"source 'd': cannot read tar shard .*{name}"):
            drt.build(tmp_path / "c", [src], progress=False)
