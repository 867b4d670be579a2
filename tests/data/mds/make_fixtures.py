"""Writes the MDS fixtures of tests/test_imports.py with MosaicML Streaming's
own writer (``streaming.MDSWriter``, mosaicml-streaming 0.13.0), so the
tests read files the format's library made, not ours.

mosaicml-streaming is not in the dev extra (it pulls in transformers,
torchvision and cloud SDKs, and pins a huggingface_hub that ``datasets``
refuses), so the fixtures are committed, small, and made again by hand:

    pip install --no-deps --target /tmp/mds mosaicml-streaming catalogue \\
        zstd xxhash python-snappy cramjam Brotli
    PYTHONPATH=/tmp/mds python tests/data/mds/make_fixtures.py

Only the writer's modules are imported (``streaming/__init__`` imports the
torch loader and transformers, which the writer does not use).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
COUNT = 30
COLUMNS = {
    "data": "bytes",
    "label": "int",
    "caption": "str",
    "score": "float32",
    "count": "uint16",
    "meta": "json",
}


def record(i: int) -> dict:
    """Sample ``i`` of every fixture (the tests recompute it)."""
    return {
        "data": f"payload {i}|".encode() * (i % 4 + 1),
        "label": i % 10,
        "caption": f"sample {i}",
        "score": i / 4,
        "count": 3 * i,
        "meta": {"i": i},
    }


def writer() -> type:
    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.submodule_search_locations is None:
        sys.exit("mosaicml-streaming is not importable: see this file's docstring")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, path in [("streaming", root), ("streaming.base", root / "base")]:
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    from streaming.base.format.mds.writer import MDSWriter

    return MDSWriter


def main() -> None:
    mds_writer = writer()
    for name, compression in [("plain", None), ("zstd", "zstd:7"), ("gz", "gz")]:
        out = HERE / name
        shutil.rmtree(out, ignore_errors=True)
        # small shards: several per fixture
        with mds_writer(
            out=str(out), columns=COLUMNS, compression=compression, size_limit=1 << 10
        ) as w:
            for i in range(COUNT):
                w.write(record(i))
        shards = json.loads((out / "index.json").read_text())["shards"]
        print(name, len(shards), "shards", sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
