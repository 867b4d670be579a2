//! Mutation fuzzing of every reader of stored files: the cache MANIFEST, the
//! index, whole caches, snapshot column files, snapshot manifests and the
//! head. Each mutated input must be refused or read as the original
//! content — never a panic, never different data. The one exception is the
//! bare Arrow IPC decoder, which has no checksum of its own: it must not
//! panic and what it decodes must be valid Arrow; the same files read
//! through a snapshot (checksummed) must be refused or the same.
//!
//! Seeded and bounded: `DATASETRT_FUZZ_ITERS` inputs per reader (default
//! 300, so `cargo test` stays fast); `make fuzz` runs many more. Each reader
//! prints what its inputs gave (`--nocapture`): the figures in
//! docs/guarantees.md come from those lines.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, Schema};
use datasetrt::catalog::{commit, read_manifest};
use datasetrt::store::{ipc, Cache, Codec, Manifest, WriterOptions};
use datasetrt::{Dataset, OpenOptions};

use crate::store::write_cache;

fn iterations() -> u64 {
    std::env::var("DATASETRT_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// splitmix64: a small seeded generator, so a failing input can be replayed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random mutation of `good`: bit flips, overwritten bytes, a cut, an
/// insertion, a deletion, a duplicated block, or garbage of the same length.
fn mutate(good: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = good.to_vec();
    let len = b.len().max(1);
    match rng.below(7) {
        0 => {
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(len);
                if at < b.len() {
                    b[at] ^= 1 << rng.below(8);
                }
            }
        }
        1 => {
            let at = rng.below(len);
            if at < b.len() {
                b[at] = rng.next() as u8;
            }
        }
        2 => b.truncate(rng.below(len)),
        3 => {
            let at = rng.below(len + 1).min(b.len());
            let extra: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
            b.splice(at..at, extra);
        }
        4 => {
            let at = rng.below(len).min(b.len());
            let end = (at + 1 + rng.below(32)).min(b.len());
            b.drain(at..end);
        }
        5 => {
            let at = rng.below(len).min(b.len());
            let end = (at + 1 + rng.below(64)).min(b.len());
            let block = b[at..end].to_vec();
            b.splice(at..at, block);
        }
        _ => b.iter_mut().for_each(|x| *x = rng.next() as u8),
    }
    b
}

/// What one mutated input gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Refused with an error.
    Refused,
    /// Read, and equal to the original (checked by the caller).
    Same,
    /// Decoded into valid Arrow, not compared (the bare IPC decoder).
    Decoded,
}

/// Run `check` on `iterations()` mutations of `good`; fail on any panic,
/// naming the seed and the mutated bytes' length; print the tally.
fn fuzz(what: &str, seed: u64, good: &[u8], mut check: impl FnMut(&[u8]) -> Read) {
    let mut rng = Rng(seed);
    let mut tally = [0u64; 3];
    for i in 0..iterations() {
        let input = mutate(good, &mut rng);
        let outcome = catch_unwind(AssertUnwindSafe(|| check(&input)));
        match outcome {
            Ok(read) => tally[read as usize] += 1,
            Err(_) => panic!(
                "{what}: input {i} of seed {seed} ({} bytes) panicked",
                input.len()
            ),
        }
    }
    let decoded = match tally[2] {
        0 => String::new(),
        n => format!(", {n} decoded to valid Arrow (no checksum to compare by)"),
    };
    println!(
        "fuzz {what}: {} inputs, {} refused, {} read the same{decoded}, 0 different, 0 panics",
        iterations(),
        tally[0],
        tally[1]
    );
}

/// `Same` after checking `got` equals `want`, `Refused` on an error.
fn same_or_refused<T: PartialEq + std::fmt::Debug, E>(
    got: Result<T, E>,
    want: &T,
    what: &str,
) -> Read {
    match got {
        Ok(value) => {
            assert_eq!(
                &value, want,
                "{what}: a mutated input read different content"
            );
            Read::Same
        }
        Err(_) => Read::Refused,
    }
}

fn dataset() -> (tempfile::TempDir, Dataset) {
    let dir = tempfile::tempdir().unwrap();
    let options = WriterOptions {
        codec: Codec::Zstd,
        ..WriterOptions::default()
    };
    write_cache(dir.path(), "f", 40, options);
    // three partitions (16, 16 and 8 rows): the mutated manifests and column
    // files are those of a partitioned snapshot
    let options = OpenOptions {
        partition_rows: Some(16),
        ..OpenOptions::default()
    };
    let ds = Dataset::open(&[dir.path().to_path_buf()], options).unwrap();
    (dir, ds)
}

#[test]
fn a_mutated_cache_manifest_is_refused_or_reads_the_same() {
    let (dir, _ds) = dataset();
    let path = dir.path().join("f").join("MANIFEST");
    let good = std::fs::read(&path).unwrap();
    let expected = Manifest::decode(&path, &good).unwrap();
    fuzz("MANIFEST", 1, &good, |input| {
        same_or_refused(Manifest::decode(&path, input), &expected, "MANIFEST")
    });
}

/// The index's own check: refused, or the same record count. What records
/// a cache with a mutated index reads is the whole-cache test's oracle.
#[test]
fn a_mutated_index_is_refused_or_counts_the_same_records() {
    let (dir, _ds) = dataset();
    let path = dir.path().join("f").join("index.drti");
    let good = std::fs::read(&path).unwrap();
    let records = datasetrt::store::format::check_index(&path, &good).unwrap();
    fuzz("index", 2, &good, |input| {
        let got = datasetrt::store::format::check_index(&path, input);
        same_or_refused(got, &records, "index")
    });
}

/// Whole caches with one mutated file: open and read every record. What is
/// read must be the original bytes.
#[test]
fn a_cache_with_a_mutated_file_reads_the_original_bytes_or_fails() {
    let (dir, _ds) = dataset();
    let cache_dir = dir.path().join("f");
    let original = Cache::open(&cache_dir).unwrap();
    let mut expected = Vec::new();
    for s in 0..original.records() {
        let mut out = Vec::new();
        original.read_into(s, &mut out, true).unwrap();
        expected.push(out);
    }
    drop(original);
    let files = [
        "MANIFEST",
        "index.drti",
        "shard-00000.drts",
        "attributes.arrow",
    ];
    for (k, name) in files.iter().enumerate() {
        let path = cache_dir.join(name);
        let good = std::fs::read(&path).unwrap();
        let mut rng = Rng(10 + k as u64);
        let mut tally = [0u64; 2]; // records refused, records read the same
        for i in 0..iterations() {
            let input = mutate(&good, &mut rng);
            write_replacing(&path, &input);
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let Ok(cache) = Cache::open(&cache_dir) else {
                    return [expected.len() as u64, 0];
                };
                let mut counts = [0u64; 2];
                for (s, want) in expected.iter().enumerate() {
                    let mut out = Vec::new();
                    let read = cache.read_into(s as u64, &mut out, true).map(|_| out);
                    counts[same_or_refused(read, want, name) as usize] += 1;
                }
                counts
            }));
            match outcome {
                Ok([refused, same]) => {
                    tally[0] += refused;
                    tally[1] += same;
                }
                Err(_) => panic!("{name}: input {i} panicked"),
            }
        }
        write_replacing(&path, &good);
        println!(
            "fuzz cache with a mutated {name}: {} inputs x {} records, {} refused, {} read \
             the same, 0 different, 0 panics",
            iterations(),
            expected.len(),
            tally[0],
            tally[1]
        );
    }
}

/// Replace a file by a new one (never rewrite in place: a mapping of the old
/// one may still be alive in this process).
fn write_replacing(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("fuzz-tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The bare decoder has no checksum (Arrow IPC carries none): a flipped
/// value bit decodes to another value. So the oracle here is only that it
/// never panics and that what it decodes is valid Arrow (every value can be
/// touched); the checksummed readers of these files (snapshot columns) are
/// held to "refused or the same" below.
#[test]
fn a_mutated_arrow_ipc_file_never_panics_the_decoder() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("w", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..50)),
            Arc::new(Float64Array::from_iter(
                (0..50).map(|i| (i % 3 != 0).then_some(i as f64)),
            )),
            Arc::new(StringArray::from_iter(
                (0..50).map(|i| (i % 4 != 0).then(|| format!("v{i}"))),
            )),
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("col.arrow");
    let written = ipc::write_temp(&path, &schema, &[batch]).unwrap();
    let good = std::fs::read(&written.path).unwrap();
    fuzz("arrow ipc (decoder only)", 3, &good, |input| {
        let Ok((_, batches)) = ipc::decode(&path, Buffer::from_vec(input.to_vec())) else {
            return Read::Refused;
        };
        {
            // what decodes must be valid Arrow: touching every value must not panic
            for b in &batches {
                for c in b.columns() {
                    let options = Default::default();
                    if let Ok(f) =
                        arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options)
                    {
                        for i in 0..c.len() {
                            let _ = f.value(i).to_string();
                        }
                    }
                }
            }
        }
        // decoded, valid, but not compared: see the comment above
        Read::Decoded
    });
}

/// Snapshot column files (Arrow IPC under a checksum the manifest holds)
/// and their chunk tables: a snapshot whose column file or chunk table was
/// mutated is refused, or reads the same population.
#[test]
fn a_mutated_snapshot_column_file_is_refused_or_reads_the_same() {
    let (_dir, ds) = dataset();
    let snap_dir = ds.snapshot_dir().to_path_buf();
    let expected = crate::whole(&datasetrt::Snapshot::open(&snap_dir, 0).unwrap()).unwrap();
    let mut columns: Vec<_> = std::fs::read_dir(snap_dir.join("columns"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "arrow" || e == "chunks"))
        .collect();
    assert!(columns
        .iter()
        .any(|p| p.extension().is_some_and(|e| e == "chunks")));
    columns.sort();
    assert!(!columns.is_empty());
    for (k, path) in columns.iter().enumerate() {
        let good = std::fs::read(path).unwrap();
        let what = format!("snapshot column {k}");
        fuzz(&what, 20 + k as u64, &good, |input| {
            write_replacing(path, input);
            let got = datasetrt::Snapshot::open(&snap_dir, 0).and_then(|s| crate::whole(&s));
            same_or_refused(got, &expected, "snapshot column")
        });
        write_replacing(path, &good);
    }
}

/// A stored alias table (derived: rebuilt when its header or chunk table is
/// damaged): weighted draws through a mutated table are refused, or are the
/// same draws.
#[test]
fn a_mutated_alias_table_draws_the_same_or_is_refused() {
    use datasetrt::sample::Sampling;
    let (_dir, ds) = dataset();
    let snap_dir = ds.snapshot_dir().to_path_buf();
    let draws = |snapshot: &datasetrt::Snapshot| -> datasetrt::Result<Vec<u64>> {
        let sampler = snapshot.sampler(Sampling::Replacement, 7, 0, 200)?;
        (0..200).map(|k| sampler.row(k)).collect()
    };
    let expected = draws(&datasetrt::Snapshot::open(&snap_dir, 0).unwrap()).unwrap();
    let path = std::fs::read_dir(snap_dir.join("columns"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "alias"))
        .expect("the draws stored an alias table");
    let good = std::fs::read(&path).unwrap();
    fuzz("alias table", 30, &good, |input| {
        write_replacing(&path, input);
        let got = datasetrt::Snapshot::open(&snap_dir, 0).and_then(|s| draws(&s));
        same_or_refused(got, &expected, "alias table")
    });
    write_replacing(&path, &good);
}

#[test]
fn a_mutated_snapshot_manifest_or_head_is_refused_or_reads_the_same() {
    let (_dir, ds) = dataset();
    let snap_dir = ds.snapshot_dir().to_path_buf();
    let manifest_path = snap_dir.join(datasetrt::Snapshot::file_name(0));
    let good = std::fs::read(&manifest_path).unwrap();
    let expected = read_manifest(&snap_dir, 0).unwrap();
    let want = (
        expected.rows,
        expected.note.clone(),
        expected.fingerprint.clone(),
    );
    fuzz("snapshot manifest", 4, &good, |input| {
        write_replacing(&manifest_path, input);
        // opening the snapshot must not panic either
        let _ = datasetrt::Snapshot::open(&snap_dir, 0);
        let got = read_manifest(&snap_dir, 0).map(|m| (m.rows, m.note, m.fingerprint));
        same_or_refused(got, &want, "snapshot manifest")
    });
    write_replacing(&manifest_path, &good);
    let head_path = snap_dir.join(commit::HEAD_FILE);
    let head = std::fs::read(&head_path).unwrap();
    fuzz("HEAD", 5, &head, |input| {
        write_replacing(&head_path, input);
        match commit::read_head(&snap_dir) {
            // a head cut to nothing reads as "no head yet": refused by open
            Ok(None) | Err(_) => Read::Refused,
            Ok(Some(n)) => {
                assert_eq!(n, 0, "HEAD: a mutated head named another snapshot");
                Read::Same
            }
        }
    });
}

/// A ustar member header for `name` of `size` bytes (type `kind`).
fn tar_header(name: &str, size: usize, kind: u8) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// WebDataset tar shards (foreign files, no checksum of ours): a mutated
/// shard is refused as invalid input or read into valid batches of whole
/// samples, never a panic and never an allocation its file cannot fill.
#[test]
fn a_mutated_tar_shard_never_panics_the_reader() {
    use datasetrt::imports::tar::TarSamples;
    let mut good = Vec::new();
    for i in 0..6 {
        for (ext, size) in [("jpg", 700 + i * 37), ("cls", 1), ("txt", 20)] {
            good.extend_from_slice(&tar_header(&format!("d/s{i}.{ext}"), size, b'0'));
            good.extend((0..size).map(|b| b as u8));
            good.resize(good.len().div_ceil(512) * 512, 0);
        }
    }
    good.extend_from_slice(&tar_header("d/sub", 0, b'5'));
    good.extend_from_slice(&[0u8; 1024]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shard.tar");
    std::fs::write(&path, &good).unwrap();
    let read = |path: &Path| -> datasetrt::Result<u64> {
        let wanted = vec!["jpg".to_string(), "cls".to_string()];
        let mut samples = TarSamples::open(path, wanted, 4, 1 << 20)?;
        let mut n = 0;
        while let Some(batch) = samples.next_batch()? {
            assert_eq!(batch.num_columns(), 4);
            n += batch.num_rows() as u64;
        }
        Ok(n)
    };
    assert_eq!(read(&path).unwrap(), 6);
    fuzz("tar shard (no checksum)", 11, &good, |input| {
        std::fs::write(&path, input).unwrap();
        match read(&path) {
            Ok(_) => Read::Decoded,
            Err(datasetrt::Error::InvalidInput { .. }) => Read::Refused,
            Err(e) => panic!("a mutated tar gave {e}, not invalid input"),
        }
    });
}
