"""Damaged files: every kind of damage to every kind of file a dataset keeps
gives a typed error naming the file, or the right data -- never wrong data, a
panic or a crash.

Each damaged copy is read by a fresh child process: a process verifies each
snapshot column file once per version, so the process that built the template
(or read another copy) would not show what a new reader sees. One child reads
the copies of one kind of file in turn (each copy has its own path, so nothing
it verified for one copy carries over to the next) and prints one JSON line per
copy; a child that dies is restarted after the copy that killed it, which is
recorded as a crash.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import datasetrt as drt
from conftest import Source

TAG = "golden-tag"
N_ALPHA, N_BETA = 48, 24
CHILD_TIMEOUT = 120


def payload(name: str, i: int) -> bytes:
    """Odd samples are incompressible (stored raw), even ones compress (zstd)."""
    seed = hashlib.sha256(f"{name}:{i}".encode()).digest()
    if i % 2:
        return b"".join(hashlib.sha256(seed + bytes([j])).digest() for j in range(6 + i % 5))
    return seed * (4 + i % 7)


# -- the files ------------------------------------------------------------------

#: the files damaged (found in the template by `build_template`); the head is
#: snapshot 2, the tag names snapshot 1
KINDS = [
    "snapshot-manifest",
    "tagged-snapshot-manifest",
    "HEAD",
    "column-cache_id",
    "column-sample_id",
    "column-label",
    "column-weight",
    "column-chunks",
    "tag",
    "alias",
    "cache-MANIFEST",
    "index",
    "index-chunks",
    "shard",
    "attributes",
    "attributes-chunks",
    "parts-record",
]

#: damage -> (kind of damage, offset as a fraction of the length or "rand", xor mask)
DAMAGES: dict[str, tuple[str, Any, int]] = {
    "flip-first": ("flip", 0.0, 0xFF),
    "flip-third": ("flip", 1 / 3, 0x01),
    "flip-middle": ("flip", 0.5, 0x01),
    "flip-two-thirds": ("flip", 2 / 3, 0x10),
    "flip-last": ("flip", 1.0, 0x01),
    "flip-random-a": ("flip", "rand", 0),
    "flip-random-b": ("flip", "rand", 0),
    "truncate-half": ("truncate", 0.5, 0),
    "truncate-one": ("truncate", "minus-one", 0),
    "truncate-empty": ("truncate", 0.0, 0),
    "delete": ("delete", None, 0),
    "garbage": ("garbage", None, 0),
}

#: damage after which open must raise, never fall back to another snapshot: a
#: damaged or missing head record, a missing head snapshot manifest
MUST_FAIL_TO_OPEN = {("HEAD", d) for d in DAMAGES} | {("snapshot-manifest", "delete")}

#: (kind, damage) -> reason: known engine bugs, each an xfail(strict=True)
KNOWN_BUGS: dict[tuple[str, str], str] = {}

#: A deleted tag file removes the tag (a tag is its file): the tag is no
#: longer listed and naming it is an InvalidInputError ("no tag ..."). No
#: population is delivered under its name, so this counts as detected.
TAG_GONE = ("tag", "delete")


def damage_file(path: Path, damage: str, rng: random.Random) -> str:
    """Damage `path` in place; returns what was done (for messages)."""
    how, where, mask = DAMAGES[damage]
    raw = bytearray(path.read_bytes())
    n = len(raw)
    if how == "delete":
        path.unlink()
        return "deleted"
    if how == "garbage":
        path.write_bytes(rng.randbytes(n))
        return f"replaced by {n} random bytes"
    if how == "truncate":
        keep = n - 1 if where == "minus-one" else int(n * where)
        path.write_bytes(bytes(raw[:keep]))
        return f"truncated from {n} to {keep} bytes"
    if where == "rand":
        offset, mask = rng.randrange(n), rng.randrange(1, 256)
    else:
        offset = min(n - 1, int(n * where))
    raw[offset] ^= mask
    path.write_bytes(bytes(raw))
    return f"byte {offset} of {n} xor {mask:#04x}"


@dataclass
class Template:
    root: Path
    files: dict[str, Path]  # kind -> path relative to root
    items: list[tuple[int, int]]  # every stored (cache_id, sample_id)
    expected_items: dict[str, str]  # "cid sid" -> sha256 of the payload


def build_template(root: Path) -> Template:
    sources = [
        Source(
            "alpha-v1",
            N_ALPHA,
            payload=partial(payload, "alpha-v1"),
            meta=lambda i: {"label": i % 7},
        ),
        Source(
            "beta-v1",
            N_BETA,
            payload=partial(payload, "beta-v1"),
            meta=lambda i: {"label": 10 + i % 5},
        ),
    ]
    ds = drt.build(root, sources, shard_bytes=2048, progress=False)
    meta = ds.get_metadata()
    # snapshot 1: a subset with repeats and weights; tagged
    sub = pl.concat(
        [meta.filter(pl.col("sample_id") % 3 != 0), meta.filter(pl.col("sample_id") < 4)]
    ).with_columns((1.0 + (pl.col("sample_id") % 4) * 0.5).alias("weight"))
    assert ds.update_metadata(sub) == 1
    ds.tag(TAG, 1)
    # snapshot 2, the head: reweighted (sums stay exact in binary floating point)
    reweighted = sub.with_columns((pl.col("weight") * 2 + pl.col("label") % 3).alias("weight"))
    assert ds.update_metadata(reweighted) == 2
    for _ in ds.loader(16, seed=1, sampling="replacement"):  # writes the head's alias table
        pass
    # a cache outside the root's own set (discovery skips `_` names): the
    # root's caches and it are a new set, whose first population links the
    # partitions the root's set recorded where its groups are the same
    drt.build(
        root / "_extra", [Source("gamma-v1", 9, meta=lambda i: {"label": 20 + i})], progress=False
    )
    shutil.rmtree(root / "_extra" / "_snapshots")

    manifest = ds.snapshot_path
    snapdir = manifest.parent
    hashes = {}
    for line in manifest.read_text().splitlines():
        if line.startswith("column="):
            hash_, _crc, _len, name = line[len("column=") :].split(" ", 3)
            hashes[name] = hash_
    assert set(hashes) == {"cache_id", "sample_id", "label", "weight"}, hashes
    assert len(set(hashes.values())) == 4, "the four columns must be four distinct files"
    cache = root / "alpha-v1"
    alpha = next(c["cache_id"] for c in ds.caches if c["name"] == "alpha-v1")
    records = (snapdir.parent / "parts").glob("*.parts")
    files = {
        "snapshot-manifest": manifest,
        "tagged-snapshot-manifest": snapdir / "00000001.snapshot",
        "HEAD": snapdir / "HEAD",
        **{f"column-{c}": snapdir / "columns" / f"{h}.arrow" for c, h in hashes.items()},
        # a column's chunk table: damaged, it is not trusted (the column is
        # then checked whole), so it costs time, never a wrong byte
        "column-chunks": snapdir / "columns" / f"{hashes['sample_id']}.arrow.chunks",
        "tag": snapdir / "tags" / TAG,
        # the head's alias table (named by its weights: one partition's
        # weight hash, or a hash over every partition's)
        "alias": next((snapdir / "columns").glob("*.alias")),
        "cache-MANIFEST": cache / "MANIFEST",
        "index": cache / "index.drti",
        # a cache file's chunk table: damaged, the file is checked whole
        "index-chunks": cache / "index.drti.chunks",
        "shard": cache / "shard-00001.drts",
        # read when a dataset's first population is made (see READER)
        "attributes": cache / "attributes.arrow",
        "attributes-chunks": cache / "attributes.arrow.chunks",
        # the record of the partitions of the group of caches alpha is in
        # (derived: a damaged one is not used, the group is built again)
        "parts-record": next(p for p in records if f"cache={alpha}\n" in p.read_text()),
    }
    for kind, path in files.items():
        assert path.is_file(), f"{kind}: {path} is missing from the template"
    assert (cache / "shard-00002.drts").exists(), "the damaged shard should be a middle one"
    items, expected = [], {}
    for c in sorted(ds.caches, key=lambda c: c["name"]):
        for sid in range(c["records"]):
            items.append((c["cache_id"], sid))
            data = payload(c["name"], sid)
            expected[f"{c['cache_id']} {sid}"] = hashlib.sha256(data).hexdigest()
    return Template(root, {k: p.relative_to(root) for k, p in files.items()}, items, expected)


# -- the reader ----------------------------------------------------------------

READER = r"""
import hashlib, json, sys
import datasetrt as drt

FILE_ERRORS = (drt.CorruptCacheError, drt.CacheNotFoundError, drt.UnsupportedFormatError,
               drt.StorageError)


def digest(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()


def frame_digest(frame):
    return digest([str(frame.schema), frame.rows()])


def outcome(fn, *args):
    try:
        return {"ok": json.loads(json.dumps(fn(*args), default=repr))}
    except BaseException as exc:  # a pyo3 PanicException is a BaseException
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {
            "error": type(exc).__name__,
            "typed": isinstance(exc, FILE_ERRORS),
            "message": str(exc)[:3000],
            "path": None if getattr(exc, "path", None) is None else str(exc.path),
        }


def item(ds, cid, sid):
    s = ds.get_item(cid, sid)
    return [hashlib.sha256(s.data).hexdigest(), s.metadata]


def epoch(ds, sampling):
    out = []
    for b in ds.loader(16, seed=5, sampling=sampling):
        shas = [hashlib.sha256(d).hexdigest() for d in b.data]
        out.append([b.rows, b.cache_id, b.sample_id, shas])
    return digest(out)


def read(case):
    ops, opened = {}, []

    def open_():
        ds = drt.open(case["root"])
        opened.append(ds)
        return {"version": ds.version, "fingerprint": ds.fingerprint, "rows": len(ds)}

    ops["open"] = outcome(open_)
    if not opened:
        return ops
    ds = opened[0]
    ops["get_metadata"] = outcome(lambda: frame_digest(ds.get_metadata()))
    ops["sql"] = outcome(
        lambda: ds.sql("SELECT sum(label) AS l, sum(weight) AS w FROM metadata").rows()
    )
    for cid, sid in case["items"]:
        ops[f"get_item {cid} {sid}"] = outcome(item, ds, cid, sid)
    ops["loader replacement"] = outcome(epoch, ds, "replacement")
    ops["loader permutation"] = outcome(epoch, ds, "permutation")
    ops["tags"] = outcome(ds.tags)
    # a new snapshot directory: the caches' attributes make its first population
    ops["first population"] = outcome(
        lambda: frame_digest(
            drt.open(case["root"], snapshot_dir=case["root"] + ".fresh").get_metadata()
        )
    )
    # a new set of caches: the root's and one more, its snapshots beside the
    # root's (where the records of the root's groups are)
    ops["new set"] = outcome(
        lambda: frame_digest(
            drt.open(
                [case["root"], case["root"] + "/_extra/gamma-v1"],
                snapshot_dir=case["root"] + "/_snapshots",
            ).get_metadata()
        )
    )
    ops["tagged population"] = outcome(lambda: frame_digest(ds.diff(case["tag"], ds.version)))
    return ops


cases = json.loads(open(sys.argv[1]).read())
for case in cases:
    print(json.dumps({"id": case["id"], "ops": read(case)}), flush=True)
"""


@dataclass
class Case:
    id: str
    kind: str
    damage: str
    root: Path
    file_name: str  # the damaged file's name, which an error must carry
    done: str = ""  # what the damage was


def read_in_children(
    cases: list[Case], spec_dir: Path, items: list[tuple[int, int]]
) -> dict[str, dict[str, Any]]:
    """The reader's output per case; a case whose child died or hung is
    {"crash": why}. The cases after it run in a new child."""
    results: dict[str, dict[str, Any]] = {}
    remaining = list(cases)
    while remaining:
        spec = spec_dir / f"spec-{remaining[0].id}.json"
        spec.write_text(
            json.dumps(
                [{"id": c.id, "root": str(c.root), "items": items, "tag": TAG} for c in remaining]
            )
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", READER, str(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=CHILD_TIMEOUT)
            why = f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            why = f"no answer within {CHILD_TIMEOUT} s"
        for line in out.splitlines():
            record = json.loads(line)
            results[record["id"]] = record["ops"]
        finished = [c for c in remaining if c.id in results]
        remaining = remaining[len(finished) :]
        if remaining:
            assert proc.returncode != 0 or why.startswith("no answer"), (out, err)
            results[remaining[0].id] = {"crash": f"{why}; stderr: {err[-3000:]}"}
            remaining = remaining[1:]
    return results


def classify(case: Case, ops: dict[str, Any], baseline: dict[str, Any]) -> tuple[str, list[str]]:
    """One of crash, panic, wrong, misreported, detected, correct, and why."""
    if "crash" in ops:
        return "crash", [ops["crash"]]
    found: set[str] = set()
    notes = []
    for name, result in ops.items():
        verdict, note = op_verdict(case, name, result, baseline)
        if verdict is not None:
            found.add(verdict)
        if note is not None:
            notes.append(note)
    if (case.kind, case.damage) in MUST_FAIL_TO_OPEN and "ok" in ops["open"]:
        found.add("wrong")
        notes.append(f"open: opened {ops['open']['ok']} instead of raising")
    for verdict in ("panic", "wrong", "misreported", "detected"):
        if verdict in found:
            return verdict, notes
    return "correct", notes


def op_verdict(
    case: Case, name: str, result: dict[str, Any], baseline: dict[str, Any]
) -> tuple[str | None, str | None]:
    """What operation `name`'s result says of `case`: panic, wrong,
    misreported or detected (``None`` for the right data), and why."""
    if (case.kind, case.damage) == TAG_GONE and (
        (name == "tags" and result.get("ok") == {})
        or (name == "tagged population" and result.get("error") == "InvalidInputError")
    ):
        return "detected", None
    if "ok" in result:
        if result["ok"] != baseline[name]["ok"]:
            return "wrong", f"{name}: WRONG DATA {result['ok']!r} != {baseline[name]['ok']!r}"
        return None, None
    if result["error"] == "PanicException":
        return "panic", f"{name}: PANIC {result['message']}"
    if (
        not result["typed"]
        or case.file_name not in result["message"]
        or Path(result["path"] or "").name != case.file_name
    ):
        return "misreported", (
            f"{name}: {result['error']} (path={result['path']}) does not name "
            f"{case.file_name} as a typed file error: {result['message']}"
        )
    return "detected", None


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[str, list[str], Case]]:
    base = tmp_path_factory.mktemp("damage")
    template = build_template(base / "template")
    rng = random.Random(20240611)
    pristine = Case("pristine", "none", "none", base / "pristine", "")
    shutil.copytree(template.root, pristine.root)
    batches: list[list[Case]] = [[pristine]]
    for kind in KINDS:
        batch = []
        for damage in DAMAGES:
            case = Case(
                f"{kind}-{damage}",
                kind,
                damage,
                base / f"{kind}-{damage}",
                template.files[kind].name,
            )
            shutil.copytree(template.root, case.root)
            case.done = damage_file(case.root / template.files[kind], damage, rng)
            batch.append(case)
        batches.append(batch)
    with ThreadPoolExecutor(max_workers=2) as pool:
        parts = list(pool.map(lambda b: read_in_children(b, base, template.items), batches))
    results = {k: v for part in parts for k, v in part.items()}

    baseline = results.pop("pristine")
    assert "crash" not in baseline, baseline
    # with partitions of a few rows every cache is a group of its own, and
    # the new set links the root's (what a damaged record must not change);
    # with the default, all of them are one group, which the new cache
    # changes: the record is then read by nothing
    if int(os.environ.get("DATASETRT_PARTITION_ROWS", 1 << 22)) < N_BETA // 2:
        new_set = [
            d
            for d in (pristine.root / "_snapshots").iterdir()
            if d.name != "parts" and not (template.root / "_snapshots" / d.name).exists()
        ]
        assert len(new_set) == 1, new_set
        columns = list((new_set[0] / "columns").glob("*.arrow"))
        assert any(p.stat().st_nlink > 1 for p in columns), "nothing was linked"
    errors = {k: v for k, v in baseline.items() if "ok" not in v}
    assert not errors, f"the undamaged copy fails: {errors}"
    for key, sha in template.expected_items.items():  # the baseline itself is right
        assert baseline[f"get_item {key}"]["ok"][0] == sha, key
    assert baseline["tags"]["ok"] == {TAG: 1}
    assert baseline["open"]["ok"]["version"] == 2

    out = {}
    for batch in batches[1:]:
        for case in batch:
            verdict, notes = classify(case, results[case.id], baseline)
            out[case.id] = (verdict, notes, case)
    return out


@pytest.mark.parametrize(
    "kind,damage",
    [
        pytest.param(
            k,
            d,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[(k, d)])]
            if (k, d) in KNOWN_BUGS
            else [],
        )
        for k in KINDS
        for d in DAMAGES
    ],
)
def test_damaged_file_is_an_error_naming_it_or_the_right_data(outcomes, kind, damage):
    verdict, notes, case = outcomes[f"{kind}-{damage}"]
    assert verdict in ("detected", "correct"), (
        f"{kind} ({case.file_name}) {case.done}: {verdict}\n" + "\n".join(notes[:10])
    )


def test_outcome_counts(outcomes):
    """Faults injected, detected, read correctly, wrong data, panics, crashes."""
    counts = Counter(verdict for verdict, _, _ in outcomes.values())
    by_kind = {
        kind: Counter(v for v, _, c in outcomes.values() if c.kind == kind) for kind in KINDS
    }
    report = "\n".join(f"  {k:26} {dict(c)}" for k, c in by_kind.items())
    print(f"\ndamage outcomes: {dict(counts)}\n{report}")
    assert sum(counts.values()) == len(KINDS) * len(DAMAGES)
    known = {f"{k}-{d}" for k, d in KNOWN_BUGS}
    bad = {
        case_id: verdict
        for case_id, (verdict, _, _) in outcomes.items()
        if verdict not in ("detected", "correct") and case_id not in known
    }
    assert not bad, bad
    # the damage is seen: every file but the derived alias table and chunk
    # tables (each rebuilt or replaced by a whole check) is checked
    for kind in KINDS:
        derived = ("alias", "tag", "column-chunks", "index-chunks", "attributes-chunks")
        if kind not in (*derived, "parts-record"):
            assert by_kind[kind]["detected"] >= len(DAMAGES) // 2, (kind, by_kind[kind])
    # a damaged record of partitions is never used: every read is right
    assert by_kind["parts-record"]["correct"] == len(DAMAGES), by_kind["parts-record"]


def run_child(code: str, root: Path) -> str:
    """What `code` prints, run by a fresh process on dataset `root`."""
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


OPEN_CHILD = r"""
import sys
import datasetrt as drt
try:
    ds = drt.open(sys.argv[1])
    ds.get_metadata()  # reads every chunk of every partition
    print(len(ds))
except drt.CorruptCacheError as e:
    print("corrupt", e.path)
"""


def test_column_files_are_checked_once_per_host_and_again_after_any_change(tmp_path):
    """The first process of a host that reads a chunk of a snapshot's column
    file checks it and records that in shared memory
    (`/dev/shm/datasetrt-<uid>/verified`, a bitmap of checked chunks per
    version of the file, never in the dataset); the next processes skip the
    read. A column file changed after that, even at the same length with its
    modification time put back, is checked again."""

    def open_in_child() -> str:
        return run_child(OPEN_CHILD, root)

    def listed() -> set[str]:
        return {p.name for p in records.iterdir()} if records.is_dir() else set()

    def recorded(column: Path) -> list[str]:
        # made since the build began: a record of an earlier test's file,
        # whose freed inode number this one reuses, has the same name (same
        # content) and inode number
        st = column.stat()
        pattern = f"{column.name}.{st.st_dev}.{st.st_ino}-*.{st.st_size}.*"
        return [p.name for p in records.glob(pattern) if p.name not in earlier]

    records = Path(f"/dev/shm/datasetrt-{os.getuid()}/verified")
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this machine: checks stay per process")
    earlier = listed()
    root = tmp_path / "ds"
    source = Source("once-v1", 50, payload=lambda i: bytes([i]) * 8, meta=lambda i: {"x": i})
    ds = drt.build(root, [source], progress=False)
    columns = sorted((ds.snapshot_path.parent / "columns").glob("*.arrow"))
    before = list(root.rglob("*"))
    assert open_in_child() == "50"
    assert all(len(recorded(c)) == 1 for c in columns), [recorded(c) for c in columns]
    assert list(root.rglob("*")) == before, "checking wrote into the dataset"
    assert open_in_child() == "50"

    victim = max(columns, key=lambda p: p.stat().st_size)
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert victim.stat().st_size == st.st_size
    assert open_in_child() == f"corrupt {victim}"


LAZY_CHILD = r"""
import json, sys
import datasetrt as drt

ds = drt.open(sys.argv[1])
out = {"rows": len(ds)}


def attempt(name, fn):
    try:
        out[name] = fn()
    except drt.CorruptCacheError as e:
        out[name] = {"corrupt": str(e.path), "message": str(e)}


def pairs(sampling, epoch_len=None):
    loader = ds.loader(64, seed=1, sampling=sampling, epoch_len=epoch_len)
    return [[r, s] for b in loader for r, s in zip(b.rows, b.sample_id)]


attempt("replacement", lambda: pairs("replacement", 3000))
attempt("get_metadata", lambda: ds.get_metadata().height)
attempt("permutation", lambda: len(pairs("permutation")))
print(json.dumps(out))
"""


def test_a_damaged_chunk_fails_only_the_reads_that_need_it(tmp_path, monkeypatch):
    """A snapshot column file is checked 64 KiB at a time as it is read:
    opening a snapshot and loading draws that never land in a damaged part
    of it works and gives the right samples; reading the column whole
    (get_metadata, SQL) or drawing a row in the damaged part raises a
    CorruptCacheError naming the file and the chunk."""
    monkeypatch.setenv("DATASETRT_PARTITION_ROWS", str(1 << 22))  # one file per column
    root = tmp_path / "ds"
    source = Source("lazy-v1", 1000, payload=lambda i: i.to_bytes(4, "little"))
    ds = drt.build(root, [source], progress=False)
    rows, drawn = 40_000, 10_000
    frame = pl.concat([ds.get_metadata()] * (rows // 1000)).with_columns(
        pl.when(pl.int_range(pl.len()) < drawn).then(1.0).otherwise(0.0).alias("weight")
    )
    ds.update_metadata(frame)
    name = {
        line.split()[-1]: line.split()[0].removeprefix("column=")
        for line in ds.snapshot_path.read_text().splitlines()
        if line.startswith("column=")
    }
    victim = ds.snapshot_path.parent / "columns" / f"{name['sample_id']}.arrow"
    assert (victim.parent / f"{victim.name}.chunks").is_file(), "no chunk table"
    chunk = 64 << 10
    assert victim.stat().st_size > 4 * chunk, "the column should span five chunks"
    data = bytearray(victim.read_bytes())
    data[3 * chunk + 100] ^= 0x01  # in chunk 3: rows near 24,500, never drawn
    # a new file in its place: this process recorded the written one as
    # checked, and a change in place within the same clock tick would keep
    # its times (the once-per-host test above changes one in place)
    damaged = victim.with_name(victim.name + ".damaged")
    damaged.write_bytes(bytes(data))
    os.replace(damaged, victim)

    result = json.loads(run_child(LAZY_CHILD, root))
    assert result["rows"] == rows
    sample_ids = frame["sample_id"].to_list()
    drawn_pairs = result["replacement"]
    assert isinstance(drawn_pairs, list), drawn_pairs
    assert len(drawn_pairs) == 3000
    assert all(r < drawn and s == sample_ids[r] for r, s in drawn_pairs)
    for whole in ("get_metadata", "permutation"):
        assert result[whole]["corrupt"] == str(victim), result[whole]
        assert "chunk 3 " in result[whole]["message"], result[whole]
