//! Snapshots: the population changes, stored payloads never do.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use datasetrt::catalog::read_manifest;
use datasetrt::store::WriterOptions;
use datasetrt::{Dataset, Error, OpenOptions};

use crate::store::write_cache;

fn frame(cache_ids: Vec<i64>, sample_ids: Vec<i64>, weights: Vec<f64>) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::Int64, false),
        Field::new("weight", DataType::Float64, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(cache_ids)),
            Arc::new(Int64Array::from(sample_ids)),
            Arc::new(Float64Array::from(weights)),
        ],
    )
    .unwrap()
}

fn two_caches() -> (tempfile::TempDir, Dataset) {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "a", 10, WriterOptions::default());
    write_cache(dir.path(), "b", 5, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    (dir, ds)
}

#[test]
fn snapshot_zero_is_every_stored_sample_with_unit_weight() {
    let (_dir, ds) = two_caches();
    let snap = ds.snapshot();
    assert_eq!(snap.number(), 0);
    assert_eq!(snap.num_rows(), 15);
    assert!(snap.weights().unwrap().iter().all(|&w| w == 1.0));
    let names: Vec<_> = snap
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["cache_id", "sample_id", "label", "split", "weight"]);
}

#[test]
fn updates_publish_numbered_snapshots_and_reopen_finds_the_newest() {
    let (dir, ds) = two_caches();
    let a = ds.caches()[0].id();
    let batch = frame(vec![a, a, a], vec![1, 1, 2], vec![0.5, 0.5, 2.0]);
    let snap = ds
        .update(&batch.schema(), &[batch], "test", None, false)
        .unwrap();
    assert_eq!(snap.number(), 1);
    assert_eq!(ds.snapshot_numbers().unwrap(), vec![0, 1]);
    let again = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    assert_eq!(again.snapshot().number(), 1);
    assert_eq!(crate::identity_column(&again.snapshot(), 1), vec![1, 1, 2]);
    // the first of duplicated rows answers lookups
    assert_eq!(
        again.snapshot().row_of(again.caches(), 0, 1).unwrap(),
        Some(0)
    );
    assert_eq!(again.snapshot().row_of(again.caches(), 0, 3).unwrap(), None);
}

#[test]
fn rejected_updates_change_nothing() {
    let (_dir, ds) = two_caches();
    let a = ds.caches()[0].id();
    let cases = [
        frame(vec![a], vec![10], vec![1.0]),
        frame(vec![a + 1], vec![0], vec![1.0]),
        frame(vec![a], vec![0], vec![-1.0]),
        frame(vec![a], vec![0], vec![f64::NAN]),
        frame(vec![a, a], vec![0, 1], vec![0.0, 0.0]),
        frame(vec![], vec![], vec![]),
    ];
    for batch in cases {
        let err = ds
            .update(&batch.schema(), &[batch], "test", None, false)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    }
    assert_eq!(ds.snapshot().number(), 0);
    assert_eq!(ds.snapshot_numbers().unwrap(), vec![0]);
}

#[test]
fn narrow_integer_identities_are_widened_and_weight_defaults_to_one() {
    let (_dir, ds) = two_caches();
    let b = ds.caches()[1].id();
    let schema = Arc::new(Schema::new(vec![
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::UInt8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![b, b])),
            Arc::new(arrow::array::UInt8Array::from(vec![4u8, 0])),
        ],
    )
    .unwrap();
    let snap = ds.update(&schema, &[batch], "test", None, false).unwrap();
    let s = crate::whole(&snap).unwrap();
    let s = &s;
    assert_eq!(
        s.column_by_name("sample_id")
            .unwrap()
            .as_primitive::<Int64Type>()
            .values()
            .to_vec(),
        vec![4, 0]
    );
    let w = s
        .column_by_name("weight")
        .unwrap()
        .as_primitive::<Float64Type>();
    assert_eq!(w.values().to_vec(), vec![1.0, 1.0]);
    assert_eq!(w.null_count(), 0);
}

fn reopen(dir: &tempfile::TempDir) -> datasetrt::Result<Dataset> {
    Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default())
}

#[test]
fn an_update_derived_from_an_older_head_is_a_conflict_that_changes_nothing() {
    let (dir, ds) = two_caches();
    let other = reopen(&dir).unwrap();
    let a = ds.caches()[0].id();
    let batch = frame(vec![a], vec![1], vec![1.0]);
    let update = |ds: &Dataset, note: &str, base: Option<u64>, force: bool| {
        ds.update(
            &batch.schema(),
            std::slice::from_ref(&batch),
            note,
            base,
            force,
        )
    };
    update(&ds, "first", None, false).unwrap();
    let err = update(&other, "second", None, false).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Conflict {
                base: 0,
                head: 1,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(ds.snapshot_numbers().unwrap(), vec![0, 1]);
    assert_eq!(reopen(&dir).unwrap().snapshot().note(), "first");
    // after a refresh the same update lands on top of the first
    assert_eq!(other.refresh().unwrap().number(), 1);
    let snap = update(&other, "second", None, false).unwrap();
    assert_eq!((snap.number(), snap.parent()), (2, Some(1)));
    // force commits whatever the head; an explicit base names the head it read
    let snap = update(&ds, "forced", None, true).unwrap();
    assert_eq!((snap.number(), snap.parent()), (3, Some(2)));
    assert_eq!(update(&other, "based", Some(3), false).unwrap().number(), 4);
}

#[test]
fn the_head_names_the_population_and_its_loss_is_an_error_never_a_fallback() {
    let (dir, ds) = two_caches();
    let a = ds.caches()[0].id();
    let batch = frame(vec![a], vec![1], vec![1.0]);
    ds.update(&batch.schema(), &[batch], "one", None, false)
        .unwrap();
    ds.checkout(0).unwrap();
    // checkout moved the head: a new process opens snapshot 0, not the newest
    assert_eq!(reopen(&dir).unwrap().snapshot().number(), 0);
    ds.checkout(1).unwrap();
    let manifest = ds.snapshot().path().to_path_buf();
    std::fs::rename(&manifest, manifest.with_extension("bak")).unwrap();
    match reopen(&dir).unwrap_err() {
        Error::NotFound { path, .. } => assert_eq!(path, manifest),
        other => panic!("expected NotFound, got {other}"),
    }
    std::fs::rename(manifest.with_extension("bak"), &manifest).unwrap();
    let head = ds.snapshot_dir().join("HEAD");
    std::fs::remove_file(&head).unwrap();
    match reopen(&dir).unwrap_err() {
        Error::Corrupt { path, .. } => assert_eq!(path, head),
        other => panic!("expected Corrupt, got {other}"),
    }
}

#[test]
fn a_damaged_snapshot_column_is_an_error_naming_the_file() {
    let (dir, ds) = two_caches();
    let columns = ds.snapshot_dir().join("columns");
    let mut files: Vec<_> = std::fs::read_dir(&columns)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .collect();
    files.sort();
    assert!(files.len() >= 4);
    for file in files {
        let good = std::fs::read(&file).unwrap();
        for at in [0, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            std::fs::write(&file, &bad).unwrap();
            match reopen(&dir).unwrap_err() {
                Error::Corrupt { path, .. } => assert_eq!(path, file),
                other => panic!("flip at {at} of {}: {other}", file.display()),
            }
        }
        std::fs::write(&file, &good[..good.len() - 8]).unwrap();
        assert!(matches!(reopen(&dir), Err(Error::Corrupt { .. })));
        std::fs::write(&file, &good).unwrap();
        assert_eq!(reopen(&dir).unwrap().snapshot().num_rows(), 15);
    }
}

/// A bounded exhaustive fuzz of the snapshot manifest reader: every single
/// flipped bit and every truncation is refused or reads the same manifest,
/// and none panics.
#[test]
fn every_flip_or_cut_of_a_snapshot_manifest_is_refused_without_a_panic() {
    let (dir, ds) = two_caches();
    let a = ds.caches()[0].id();
    let batch = frame(vec![a, a], vec![1, 2], vec![1.0, 3.0]);
    let note = "line one\nline two % 100%";
    ds.update(&batch.schema(), &[batch], note, None, false)
        .unwrap();
    let snap_dir = ds.snapshot_dir().to_path_buf();
    let path = snap_dir.join(datasetrt::Snapshot::file_name(1));
    let good = std::fs::read(&path).unwrap();
    let expected = datasetrt::catalog::read_manifest(&snap_dir, 1).unwrap();
    assert_eq!(expected.note, note);
    assert_eq!(reopen(&dir).unwrap().snapshot().note(), note);
    let mut refused = 0;
    let mut trials = 0;
    for at in 0..good.len() {
        for bit in [0x01u8, 0x20, 0x80] {
            let mut bad = good.clone();
            bad[at] ^= bit;
            std::fs::write(&path, &bad).unwrap();
            trials += 1;
            match datasetrt::catalog::read_manifest(&snap_dir, 1) {
                Err(_) => refused += 1,
                Ok(m) => assert_eq!(
                    (m.rows, &m.note, m.columns().count()),
                    (expected.rows, &expected.note, expected.columns().count()),
                    "flip {bit:#x} at {at} read a different manifest"
                ),
            }
        }
    }
    for len in 0..good.len() {
        std::fs::write(&path, &good[..len]).unwrap();
        trials += 1;
        match datasetrt::catalog::read_manifest(&snap_dir, 1) {
            Err(_) => refused += 1,
            Ok(m) => assert_eq!(m.note, expected.note, "cut at {len}"),
        }
    }
    // what is read is never a different manifest (checked above); what is
    // refused is nearly everything (a flip of a checksum digit's case, or the
    // cut of the last newline, still reads the same manifest)
    assert!(
        refused * 100 >= trials * 95,
        "{refused} of {trials} refused"
    );
}

#[test]
fn a_commit_never_vouches_for_a_damaged_column_file_it_did_not_write() {
    let (_dir, ds) = two_caches();
    let a = ds.caches()[0].id();
    let batch = frame(vec![a, a], vec![1, 2], vec![0.25, 4.0]);
    let update = || {
        ds.update(
            &batch.schema(),
            std::slice::from_ref(&batch),
            "again",
            None,
            false,
        )
    };
    let one = update().unwrap();
    let weight = read_manifest(ds.snapshot_dir(), one.number())
        .unwrap()
        .columns()
        .find(|c| c.name == "weight")
        .cloned()
        .unwrap();
    let file = ds
        .snapshot_dir()
        .join("columns")
        .join(format!("{}.arrow", weight.hash));
    drop(one);
    ds.checkout(0).unwrap();
    // damage the weight file snapshot 1 wrote (in a new inode, as a disk
    // error would look to a reader), then commit the same population on 0
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 40;
    bytes[at] ^= 0x10;
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, &bytes).unwrap();
    match update().unwrap_err() {
        Error::Corrupt { path, .. } => assert_eq!(path, file),
        other => panic!("expected Corrupt, got {other}"),
    }
    assert_eq!(ds.head().unwrap(), 0);
}

#[test]
fn a_snapshot_no_head_named_is_uncommitted_and_the_next_commit_removes_it() {
    let (dir, ds) = two_caches();
    let a = ds.caches()[0].id();
    let update = |ds: &Dataset, w: f64| {
        let batch = frame(vec![a, a], vec![1, 2], vec![w, 1.0]);
        ds.update(&batch.schema(), &[batch], "test", None, false)
            .unwrap()
            .number()
    };
    assert_eq!((update(&ds, 1.0), update(&ds, 2.0)), (1, 2));
    // checkout moves the head back: snapshot 2 stays committed
    ds.checkout(1).unwrap();
    assert!(ds.uncommitted().unwrap().is_empty());
    // a writer killed between creating manifest 3 and moving the head
    let snap_dir = ds.snapshot_dir().to_path_buf();
    let name = |n: u64| snap_dir.join(datasetrt::Snapshot::file_name(n));
    std::fs::copy(name(2), name(3)).unwrap();
    let reopened = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    assert_eq!(reopened.snapshot().number(), 1);
    assert_eq!(reopened.uncommitted().unwrap(), vec![3]);
    // the next commit removes it and takes its number; 2 is still there
    assert_eq!(update(&reopened, 3.0), 3);
    assert_eq!(reopened.snapshot_numbers().unwrap(), vec![0, 1, 2, 3]);
    assert!(reopened.uncommitted().unwrap().is_empty());
    assert_eq!(read_manifest(&snap_dir, 3).unwrap().parent, Some(1));
}

/// A dataset of one cache of `records` samples whose snapshots are cut
/// into partitions of `partition_rows` rows.
fn one_cache(records: usize, partition_rows: usize) -> (tempfile::TempDir, Dataset) {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "a", records, WriterOptions::default());
    let options = OpenOptions {
        partition_rows: Some(partition_rows),
        ..Default::default()
    };
    let ds = Dataset::open(&[dir.path().to_path_buf()], options).unwrap();
    (dir, ds)
}

fn column_files(ds: &Dataset) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(ds.snapshot_dir().join("columns"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".arrow"))
        .collect()
}

#[test]
fn a_partitioned_snapshot_reads_as_one_population() {
    let (dir, whole) = two_caches();
    let parted_dir = tempfile::tempdir().unwrap();
    let options = OpenOptions {
        snapshot_dir: Some(parted_dir.path().to_path_buf()),
        partition_rows: Some(4),
        ..Default::default()
    };
    let parted = Dataset::open(&[dir.path().to_path_buf()], options).unwrap();
    let (one, four) = (whole.snapshot(), parted.snapshot());
    assert_eq!((one.num_partitions(), four.num_partitions()), (1, 5));
    // each cache (of half a partition's rows or more) is cut on its own:
    // snapshot 0 never writes a partition that spans two of them
    let manifest = read_manifest(parted.snapshot_dir(), 0).unwrap();
    let rows: Vec<usize> = manifest.partitions.iter().map(|p| p.rows).collect();
    let cut: Vec<usize> = parted
        .caches()
        .iter()
        .flat_map(|c| {
            let n = c.records() as usize;
            (0..n).step_by(4).map(move |at| (n - at).min(4))
        })
        .collect();
    assert_eq!(rows, cut);
    assert_eq!(crate::whole(&one).unwrap(), crate::whole(&four).unwrap());
    // a partition's file holds its rows only (4 of a cache's rows, against
    // all 15 in one file; values are padded to 64 bytes, so 4 and 15 Int64s
    // differ by 64)
    let sample_file = |m: &datasetrt::catalog::SnapshotManifest| {
        m.partitions[0]
            .columns
            .iter()
            .find(|c| c.name == "sample_id")
            .unwrap()
            .len
            .unwrap()
    };
    let single = read_manifest(whole.snapshot_dir(), 0).unwrap();
    assert!(
        sample_file(&manifest) < sample_file(&single),
        "{} vs {}",
        sample_file(&manifest),
        sample_file(&single)
    );
    for row in 0..15 {
        assert_eq!(one.identity(row).unwrap(), four.identity(row).unwrap());
    }
    // lookups name the row in the whole population
    let first = parted.caches()[0].records() as usize;
    assert_eq!(four.row_of(parted.caches(), 1, 2).unwrap(), Some(first + 2));
    // draws are a function of the population, not of how it is stored;
    // weighted and balanced draws find the partition first, so theirs are
    // another sequence with the same law (below)
    for sampling in ["permutation", "weighted_without_replacement"] {
        let sampling = datasetrt::sample::Sampling::parse(sampling).unwrap();
        let (a, b) = (
            one.sampler(sampling, 7, 1, 15).unwrap(),
            four.sampler(sampling, 7, 1, 15).unwrap(),
        );
        let draws = |s: &datasetrt::sample::EpochSampler| {
            (0..40).map(|k| s.row(k).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(draws(&a), draws(&b), "{sampling:?}");
    }
    let replacement = datasetrt::sample::Sampling::Replacement;
    let (n, sampler) = (30_000u64, four.sampler(replacement, 7, 1, 15).unwrap());
    let mut counts = [0u64; 15];
    for k in 0..n {
        counts[sampler.row(k).unwrap() as usize] += 1;
    }
    // every row weighs 1: 2,000 draws each, sd ~43
    assert!(
        counts.iter().all(|&c| c.abs_diff(n / 15) < 5 * 43),
        "{counts:?}"
    );
    // balanced: every row exactly twice in 30 draws
    let balanced = four
        .sampler(datasetrt::sample::Sampling::Balanced, 7, 1, 30)
        .unwrap();
    let mut counts = [0u64; 15];
    for k in 0..30 {
        counts[balanced.row(k).unwrap() as usize] += 1;
    }
    assert_eq!(counts, [2; 15]);
    // partitions of equal content share one file: the three weight columns
    // of four rows are four 1.0s each (the others 2 and 1)
    let weights: std::collections::BTreeSet<_> = manifest
        .partitions
        .iter()
        .map(|p| {
            p.columns
                .iter()
                .find(|c| c.name == "weight")
                .unwrap()
                .hash
                .clone()
        })
        .collect();
    assert_eq!(weights.len(), 3);
}

#[test]
fn a_reweight_writes_only_the_partitions_it_changes() {
    let (_dir, ds) = one_cache(10, 4);
    let before = column_files(&ds);
    let mut weights: Vec<f64> = (0..10).map(|i| 1.0 + i as f64).collect();
    let a = ds.caches()[0].id();
    let batch = frame(vec![a; 10], (0..10).collect(), weights.clone());
    ds.update(&batch.schema(), &[batch], "weights", None, false)
        .unwrap();
    let base = column_files(&ds);
    weights[5] = 100.0; // partition 1 (rows 4..8)
    let batch = frame(vec![a; 10], (0..10).collect(), weights.clone());
    let snap = ds
        .update(&batch.schema(), &[batch], "one row", None, false)
        .unwrap();
    let written: Vec<_> = column_files(&ds).difference(&base).cloned().collect();
    assert_eq!(
        written.len(),
        1,
        "only partition 1's weight column: {written:?}"
    );
    assert_eq!(snap.weights().unwrap().to_vec(), weights);
    assert_eq!(snap.num_partitions(), 3);
    assert!(base.len() > before.len());
}

#[test]
fn a_bad_row_of_a_partitioned_update_is_named_by_its_place_in_the_whole() {
    let (_dir, ds) = one_cache(10, 4);
    let a = ds.caches()[0].id();
    let mut samples: Vec<i64> = (0..10).collect();
    samples[9] = 10; // not stored
    let batch = frame(vec![a; 10], samples, vec![1.0; 10]);
    let err = ds
        .update(&batch.schema(), &[batch], "bad", None, false)
        .unwrap_err();
    assert!(err.to_string().contains("row 9: sample_id 10"), "{err}");
    let mut weights = vec![1.0; 10];
    weights[6] = f64::NAN;
    let batch = frame(vec![a; 10], (0..10).collect(), weights);
    let err = ds
        .update(&batch.schema(), &[batch], "bad", None, false)
        .unwrap_err();
    assert!(err.to_string().contains("row 6"), "{err}");
    assert_eq!(ds.snapshot().number(), 0, "nothing was committed");
}

#[test]
fn a_snapshot_written_before_partitions_still_opens() {
    let (_dir, ds) = two_caches();
    // snapshot 0 as version 2 wrote it: no partition line
    let path = ds.snapshot_dir().join("00000000.snapshot");
    let text = std::fs::read_to_string(&path).unwrap();
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("partition=") && !l.starts_with("checksum="))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .replace("datasetrt-snapshot 4", "datasetrt-snapshot 2");
    std::fs::write(&path, datasetrt::store::checksum::seal_text(&body)).unwrap();
    let old = datasetrt::Snapshot::open(ds.snapshot_dir(), 0).unwrap();
    assert_eq!(old.num_partitions(), 1);
    assert_eq!(
        crate::whole(&old).unwrap(),
        crate::whole(&ds.snapshot()).unwrap()
    );
    assert_eq!(read_manifest(ds.snapshot_dir(), 0).unwrap().version, 2);
}

#[test]
fn the_active_snapshots_own_columns_handed_back_are_stored_as_they_are() {
    let (_dir, ds) = one_cache(10, 4);
    let active = ds.snapshot();
    let mut batches = active.batches().unwrap().to_vec();
    let before = column_files(&ds);
    // unchanged: the same files, the same fingerprint
    let same = ds
        .update(&active.schema(), &batches, "same", None, false)
        .unwrap();
    assert_eq!(same.fingerprint(), active.fingerprint());
    assert_eq!(column_files(&ds), before);
    // one partition's weights changed, every other column the mapped one
    let at = batches[1].schema().index_of("weight").unwrap();
    let mut columns = batches[1].columns().to_vec();
    columns[at] = Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0]));
    batches[1] = RecordBatch::try_new(batches[1].schema(), columns).unwrap();
    let snap = ds
        .update(&active.schema(), &batches, "one partition", None, false)
        .unwrap();
    let written: Vec<_> = column_files(&ds).difference(&before).cloned().collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let mut expected = vec![1.0; 10];
    expected[4..8].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(snap.weights().unwrap().to_vec(), expected);
    assert_eq!(
        crate::identity_column(&snap, 1),
        (0..10).collect::<Vec<_>>()
    );
}

#[test]
fn cleanup_keeps_the_alias_table_of_a_kept_partitioned_snapshot() {
    let (_dir, ds) = one_cache(10, 4);
    let a = ds.caches()[0].id();
    let batch = frame(
        vec![a; 10],
        (0..10).collect(),
        (1..=10).map(f64::from).collect(),
    );
    let snap = ds
        .update(&batch.schema(), &[batch], "weights", None, false)
        .unwrap();
    let replacement = datasetrt::sample::Sampling::parse("replacement").unwrap();
    // stores the alias table of each partition (weights 1-4, 5-8, 9-10)
    let sampler = snap.sampler(replacement, 1, 0, 10).unwrap();
    sampler.prepare(0..1000, 2).unwrap();
    assert_eq!(alias_files(&ds).len(), 3);
    assert_eq!(ds.cleanup(1).unwrap(), vec![0]);
    assert_eq!(
        alias_files(&ds).len(),
        3,
        "cleanup deleted the kept snapshot's alias tables"
    );
}

fn alias_files(ds: &Dataset) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(ds.snapshot_dir().join("columns"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".alias"))
        .collect()
}

#[test]
fn weighted_draws_make_the_alias_tables_of_the_partitions_they_land_in_only() {
    let (_dir, ds) = one_cache(12, 4);
    let a = ds.caches()[0].id();
    // partition 1 (rows 4..8) weighs nothing: no draw lands there
    let mut weights: Vec<f64> = (0..12)
        .map(|i| {
            if (4..8).contains(&i) {
                0.0
            } else {
                1.0 + i as f64
            }
        })
        .collect();
    let batch = frame(vec![a; 12], (0..12).collect(), weights.clone());
    let snap = ds
        .update(&batch.schema(), &[batch], "w", None, false)
        .unwrap();
    let replacement = datasetrt::sample::Sampling::Replacement;
    let draws = |snap: &datasetrt::Snapshot| -> Vec<u64> {
        let sampler = snap.sampler(replacement, 3, 0, 12).unwrap();
        (0..2_000).map(|k| sampler.row(k).unwrap()).collect()
    };
    let before = draws(&snap);
    assert!(before.iter().all(|r| !(4..8).contains(r)), "{before:?}");
    let tables = alias_files(&ds);
    assert_eq!(tables.len(), 2, "partitions 0 and 2 only: {tables:?}");
    // a reopened snapshot maps the stored tables: the same draws
    let again = datasetrt::Snapshot::open(ds.snapshot_dir(), snap.number()).unwrap();
    assert_eq!(draws(&again), before);
    // a reweight of partition 2 builds its table alone
    weights[9] = 50.0;
    let batch = frame(vec![a; 12], (0..12).collect(), weights);
    let next = ds
        .update(&batch.schema(), &[batch], "w2", None, false)
        .unwrap();
    let after = draws(&next);
    let new: Vec<_> = alias_files(&ds).difference(&tables).cloned().collect();
    assert_eq!(new.len(), 1, "{new:?}");
    let share = after.iter().filter(|&&r| r == 9).count() as f64 / after.len() as f64;
    // row 9 now weighs 50 of 1+2+3+4 + 9+50+11+12 = 92
    assert!((share - 50.0 / 92.0).abs() < 0.05, "{share}");
}

#[test]
fn a_manifest_whose_mass_is_not_its_weights_is_refused_at_the_first_draw_there() {
    let (_dir, ds) = one_cache(12, 4);
    let snap_dir = ds.snapshot_dir().to_path_buf();
    let path = snap_dir.join(datasetrt::Snapshot::file_name(0));
    let text = std::fs::read_to_string(&path).unwrap();
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("checksum="))
        .map(|l| match l {
            "partition=4 4.0" => "partition=4 5.0\n".to_string(),
            other => format!("{other}\n"),
        })
        .collect();
    assert_ne!(body, text, "{text}");
    std::fs::write(&path, datasetrt::store::checksum::seal_text(&body)).unwrap();
    let snap = datasetrt::Snapshot::open(&snap_dir, 0).unwrap();
    let sampler = snap
        .sampler(datasetrt::sample::Sampling::Replacement, 1, 0, 12)
        .unwrap();
    let err = sampler.prepare(0..100, 1).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("weights sum to 4.0"), "{err}");
}

#[test]
fn a_partition_holds_the_bytes_of_its_own_strings_only() {
    let (_dir, ds) = one_cache(64, 8);
    let a = ds.caches()[0].id();
    let base = frame(vec![a; 64], (0..64).collect(), vec![1.0; 64]);
    // one batch of long strings (not inlined in their views): every
    // partition cut from it shares its data buffer
    let paths: arrow::array::StringViewArray = (0..64)
        .map(|i| Some(format!("s3://bucket/some/long/prefix/sample-{i:08}.jpg")))
        .collect();
    let mut fields = base.schema().fields().to_vec();
    fields.push(Arc::new(Field::new("path", DataType::Utf8View, false)));
    let mut columns = base.columns().to_vec();
    columns.push(Arc::new(paths));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    let snap = ds
        .update(
            &batch.schema(),
            std::slice::from_ref(&batch),
            "paths",
            None,
            false,
        )
        .unwrap();
    assert_eq!(crate::whole(&snap).unwrap(), batch);
    let manifest = read_manifest(ds.snapshot_dir(), snap.number()).unwrap();
    let lens: Vec<u64> = manifest
        .partitions
        .iter()
        .map(|p| {
            p.columns
                .iter()
                .find(|c| c.name == "path")
                .unwrap()
                .len
                .unwrap()
        })
        .collect();
    let all_strings = 64 * 45;
    assert!(lens.iter().all(|&l| l < all_strings / 2), "{lens:?}");
}

#[test]
fn dictionaries_that_outgrow_their_keys_are_an_error_not_a_crash() {
    use arrow::array::{DictionaryArray, Int8Array, StringArray};
    use arrow::datatypes::Int8Type;
    let (_dir, ds) = one_cache(200, 256);
    let a = ds.caches()[0].id();
    let piece = |from: i64| {
        let base = frame(vec![a; 100], (from..from + 100).collect(), vec![1.0; 100]);
        let values: Vec<String> = (from..from + 100).map(|i| format!("v{i}")).collect();
        let keys = Int8Array::from((0..100).map(|i| i as i8).collect::<Vec<_>>());
        let dict = DictionaryArray::<Int8Type>::try_new(keys, Arc::new(StringArray::from(values)))
            .unwrap();
        let mut fields = base.schema().fields().to_vec();
        fields.push(Arc::new(Field::new("tag", dict.data_type().clone(), false)));
        let mut columns = base.columns().to_vec();
        columns.push(Arc::new(dict));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    };
    let (one, two) = (piece(0), piece(100));
    // one partition of 200 rows from both: 200 values do not fit Int8 keys
    match ds.update(&one.schema(), &[one.clone(), two], "tags", None, false) {
        Err(Error::Arrow(_) | Error::InvalidInput { .. }) | Ok(_) => {}
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn a_snapshot_written_before_partition_masses_draws_as_one_with_them() {
    let (_dir, ds) = one_cache(12, 4);
    let a = ds.caches()[0].id();
    let weights: Vec<f64> = (0..12).map(|i| 0.5 + i as f64).collect();
    let batch = frame(vec![a; 12], (0..12).collect(), weights);
    let snap = ds
        .update(&batch.schema(), &[batch], "w", None, false)
        .unwrap();
    let replacement = datasetrt::sample::Sampling::Replacement;
    let draws = |snap: &datasetrt::Snapshot| -> Vec<u64> {
        let sampler = snap.sampler(replacement, 5, 2, 12).unwrap();
        (0..500).map(|k| sampler.row(k).unwrap()).collect()
    };
    let expected = draws(&snap);
    // the same snapshot as version 3 wrote it: `partition=<rows>` alone
    let path = ds.snapshot_dir().join(datasetrt::Snapshot::file_name(1));
    let text = std::fs::read_to_string(&path).unwrap();
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("checksum="))
        .map(|l| match l.strip_prefix("partition=") {
            Some(rest) => format!("partition={}\n", rest.split(' ').next().unwrap()),
            None => format!("{l}\n"),
        })
        .collect::<String>()
        .replace("datasetrt-snapshot 4", "datasetrt-snapshot 3");
    std::fs::write(&path, datasetrt::store::checksum::seal_text(&body)).unwrap();
    let manifest = read_manifest(ds.snapshot_dir(), 1).unwrap();
    assert_eq!(manifest.version, 3);
    assert!(manifest.partitions.iter().all(|p| p.mass.is_none()));
    let old = datasetrt::Snapshot::open(ds.snapshot_dir(), 1).unwrap();
    assert_eq!(draws(&old), expected);
}

/// A population of more than 2^32 rows: one stored partition of 2^20 rows
/// named 4,097 times by a hand-written manifest (4,296,015,872 rows, 24 MB
/// on disk). Weighted draws and permutations reach every partition; the
/// modes that hold a table of every row say they do not go that far.
#[test]
fn a_population_past_two_to_the_32_rows_is_drawn_from() {
    const PART: usize = 1 << 20;
    const COPIES: usize = 4_097;
    let (_dir, ds) = one_cache(16, PART);
    let a = ds.caches()[0].id();
    let samples: Vec<i64> = (0..PART as i64).map(|i| i % 16).collect();
    let weights: Vec<f64> = (0..PART).map(|i| 1.0 + (i % 3) as f64).collect();
    let batch = frame(vec![a; PART], samples, weights);
    let snap = ds
        .update(&batch.schema(), &[batch], "one partition", None, false)
        .unwrap();
    let manifest = read_manifest(ds.snapshot_dir(), snap.number()).unwrap();
    let [part] = manifest.partitions.as_slice() else {
        panic!("one partition")
    };
    let mut body = format!(
        "datasetrt-snapshot 4\nrows={}\ncreated_unix_ms=0\nparent=none\nnote=copies\nfingerprint={}\n",
        PART * COPIES,
        "7".repeat(32)
    );
    for _ in 0..COPIES {
        body.push_str(&format!("partition={PART} {:?}\n", part.mass.unwrap()));
        for c in &part.columns {
            body.push_str(&format!(
                "column={} {:08x} {} {}\n",
                c.hash,
                c.crc.unwrap(),
                c.len.unwrap(),
                c.name
            ));
        }
    }
    let path = ds.snapshot_dir().join(datasetrt::Snapshot::file_name(9));
    std::fs::write(&path, datasetrt::store::checksum::seal_text(&body)).unwrap();
    let big = datasetrt::Snapshot::open(ds.snapshot_dir(), 9).unwrap();
    let rows = big.num_rows() as u64;
    assert!(rows > u64::from(u32::MAX), "{rows}");
    assert_eq!(big.num_partitions(), COPIES);

    use datasetrt::sample::Sampling;
    let weighted = big.sampler(Sampling::Replacement, 1, 0, rows).unwrap();
    // the first draw that lands past 2^32 (in the last partition)
    let (k, row) = (0..200_000u64)
        .map(|k| (k, weighted.row(k).unwrap()))
        .find(|&(_, r)| r >= 1 << 32)
        .expect("one draw in 4,097 lands in the last partition");
    let in_part = (row - (1 << 32)) as usize;
    assert_eq!(
        big.identity(row as usize).unwrap(),
        (a, (in_part % 16) as i64)
    );
    // a fresh reader draws the same row there, mapping only what it lands in
    let fresh = datasetrt::Snapshot::open(ds.snapshot_dir(), 9).unwrap();
    let sampler = fresh.sampler(Sampling::Replacement, 1, 0, rows).unwrap();
    assert_eq!(sampler.row(k).unwrap(), row);
    assert_eq!(fresh.partitioned().unwrap().tables_made(), 1);

    let perm = big.sampler(Sampling::Permutation, 1, 0, rows).unwrap();
    let drawn: std::collections::HashSet<u64> = (0..10_000).map(|k| perm.row(k).unwrap()).collect();
    assert_eq!(drawn.len(), 10_000);
    assert!(drawn.iter().all(|&r| r < rows));
    assert!(drawn.iter().any(|&r| r > u64::from(u32::MAX) / 2));
    // balanced over an epoch of 2 * 4,097 draws: each partition's mass is
    // 2 / 4,097 of the total, so every partition gives two distinct rows
    let balanced = big.sampler(Sampling::Balanced, 1, 0, 2 * 4_097).unwrap();
    let mut per_part = vec![Vec::new(); COPIES];
    for k in 0..2 * 4_097u64 {
        let row = balanced.row(k).unwrap();
        per_part[(row >> 20) as usize].push(row);
    }
    assert!(
        per_part.iter().all(|r| r.len() == 2 && r[0] != r[1]),
        "{:?}",
        &per_part[..5]
    );
    let err = big
        .sampler(Sampling::WeightedWithoutReplacement, 1, 0, rows)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    assert!(err.to_string().contains("at most 2^32 - 1 rows"), "{err}");
}

/// A cache of `n` records whose one metadata column is a Float64 `score`,
/// which the caches of `write_cache` do not have.
fn write_scored_cache(root: &std::path::Path, name: &str, n: usize) {
    let mut w =
        datasetrt::store::CacheWriter::create(root, name, WriterOptions::default()).unwrap();
    let data: Vec<u8> = (0..n).flat_map(crate::store::payload).collect();
    let mut ends = Vec::new();
    let mut end = 0;
    for i in 0..n {
        end += crate::store::payload(i).len();
        ends.push(end);
    }
    w.add_chunk(data, ends).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new(
        "score",
        DataType::Float64,
        false,
    )]));
    let scores = Float64Array::from_iter_values((0..n).map(|i| i as f64 / 2.0));
    w.finish(RecordBatch::try_new(schema, vec![Arc::new(scores)]).unwrap())
        .unwrap();
}

/// The inode of column file `hash` in `ds`'s snapshot directory.
fn column_inode(ds: &Dataset, hash: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let file = ds
        .snapshot_dir()
        .join("columns")
        .join(format!("{hash}.arrow"));
    std::fs::metadata(file).unwrap().ino()
}

/// The root `dir` opened with partitions of 4 rows, checked against the
/// same set of caches opened under a snapshot base of its own (no group
/// records there: every group built from its caches); `rows` in all.
fn open_checked(dir: &std::path::Path, rows: usize) -> Dataset {
    let options = |base: Option<&std::path::Path>| OpenOptions {
        snapshot_dir: base.map(|b| b.to_path_buf()),
        partition_rows: Some(4),
        ..Default::default()
    };
    let ds = Dataset::open(&[dir.to_path_buf()], options(None)).unwrap();
    let base = tempfile::tempdir().unwrap();
    let fresh = Dataset::open(&[dir.to_path_buf()], options(Some(base.path()))).unwrap();
    let (got, want) = (ds.snapshot(), fresh.snapshot());
    assert_eq!(crate::whole(&got).unwrap(), crate::whole(&want).unwrap());
    assert_eq!(got.fingerprint(), want.fingerprint());
    assert_eq!(got.num_rows(), rows);
    ds
}

#[test]
fn a_root_that_gains_a_cache_links_the_partitions_of_the_others() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "a", 10, WriterOptions::default());
    write_cache(dir.path(), "b", 5, WriterOptions::default());
    let first = open_checked(dir.path(), 15);
    let before = read_manifest(first.snapshot_dir(), 0).unwrap();

    // a new source, with a metadata column the others do not have
    write_scored_cache(dir.path(), "c", 6);
    let grown = open_checked(dir.path(), 21);
    assert_ne!(grown.snapshot_dir(), first.snapshot_dir());
    // every column of a's and b's partitions but the new one is the first
    // set's file, linked (the same inode): not read, not written again;
    // unless the new cache's partitions hold an equal column (its first
    // sample ids, its weights), stored first by whichever group came first
    let after = read_manifest(grown.snapshot_dir(), 0).unwrap();
    let old: HashSet<&str> = before.columns().map(|c| c.hash.as_str()).collect();
    let ids: HashSet<i64> = first.caches().iter().map(|c| c.id()).collect();
    let cache_of = |ds: &Dataset, i: usize| {
        ds.snapshot().partition_columns(i, &[0]).unwrap()[0]
            .as_primitive::<Int64Type>()
            .value(0)
    };
    let of_c: HashSet<&str> = after
        .partitions
        .iter()
        .enumerate()
        .filter(|&(i, _)| !ids.contains(&cache_of(&grown, i)))
        .flat_map(|(_, p)| p.columns.iter().map(|c| c.hash.as_str()))
        .collect();
    let mut linked_ids = 0;
    for (i, part) in after.partitions.iter().enumerate() {
        let ours = ids.contains(&cache_of(&grown, i));
        for column in &part.columns {
            let from_first = ours && column.name != "score";
            if column.name == "cache_id" || column.name == "score" {
                assert_eq!(old.contains(column.hash.as_str()), from_first);
            }
            if from_first {
                assert!(old.contains(column.hash.as_str()), "{}", column.name);
                let same = column_inode(&grown, &column.hash) == column_inode(&first, &column.hash);
                assert!(
                    same || of_c.contains(column.hash.as_str()),
                    "{}",
                    column.name
                );
                linked_ids += usize::from(column.name == "cache_id" && same);
            }
        }
    }
    assert_eq!(linked_ids, 5, "a's and b's 5 partitions' cache ids, linked");

    // a damaged record is not used: its group is built again (new files),
    // the others are linked from the set that recorded them last
    write_cache(dir.path(), "d", 3, WriterOptions::default());
    let records = dir.path().join("_snapshots").join("parts");
    let (a, b) = (first.caches()[0].id(), first.caches()[1].id());
    let mut damaged = 0;
    for record in std::fs::read_dir(&records).unwrap() {
        let path = record.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        if text.contains(&format!("cache={a}\n")) {
            let mut bytes = text.into_bytes();
            let last = bytes.len() - 2;
            bytes[last] ^= 1;
            std::fs::write(&path, bytes).unwrap();
            damaged += 1;
        }
    }
    assert_eq!(damaged, 1, "one record names cache a");
    let again = open_checked(dir.path(), 24);
    let manifest = read_manifest(again.snapshot_dir(), 0).unwrap();
    for (i, part) in manifest.partitions.iter().enumerate() {
        let cache = cache_of(&again, i);
        if cache == a || cache == b {
            let ids = &part.columns[0].hash;
            let same = column_inode(&again, ids) == column_inode(&grown, ids);
            assert_eq!(
                same,
                cache == b,
                "cache {cache}: linked only where its record is whole"
            );
        }
    }

    // the files the records name are gone: every group is built again
    for ds in [&first, &grown, &again] {
        std::fs::remove_dir_all(ds.snapshot_dir()).unwrap();
    }
    write_cache(dir.path(), "e", 2, WriterOptions::default());
    let again = open_checked(dir.path(), 26);
    let problems = again.verify(&|_, _| {});
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn processes_opening_a_new_set_at_once_make_one_first_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    for (name, n) in [("a", 9), ("b", 5), ("c", 2)] {
        write_cache(dir.path(), name, n, WriterOptions::default());
    }
    let open = || {
        let options = OpenOptions {
            partition_rows: Some(4),
            ..Default::default()
        };
        Dataset::open(&[dir.path().to_path_buf()], options).unwrap()
    };
    let barrier = std::sync::Barrier::new(4);
    let opened: Vec<Dataset> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    open()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let first = opened[0].snapshot();
    for ds in &opened {
        assert_eq!(ds.snapshot().number(), 0);
        assert_eq!(ds.snapshot().fingerprint(), first.fingerprint());
    }
    assert_eq!(opened[0].snapshot_numbers().unwrap(), vec![0]);
    assert_eq!(first.num_rows(), 16);
    // nothing half-written is left beside the columns
    let columns = opened[0].snapshot_dir().join("columns");
    let leftovers: Vec<_> = std::fs::read_dir(&columns)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The `.arrow` files of `dir` with their inodes and link counts.
fn arrow_files(dir: &std::path::Path) -> std::collections::BTreeMap<String, (u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".arrow"))
                .map(|e| {
                    let m = e.metadata().unwrap();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        (m.ino(), m.nlink()),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_cache_partitioned_when_built_is_linked_by_the_first_open() {
    use datasetrt::catalog::prepare_partitions;
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "big", 10, WriterOptions::default());
    write_cache(dir.path(), "small", 1, WriterOptions::default());
    let (big, small) = (dir.path().join("big"), dir.path().join("small"));
    // half a partition or more: a group of its own in every set
    assert!(prepare_partitions(&big, None, Some(4)).unwrap());
    assert!(!prepare_partitions(&small, None, Some(4)).unwrap());
    let parts = dir.path().join("_snapshots").join("parts").join("columns");
    let prepared = arrow_files(&parts);
    assert!(prepared.len() >= 5, "{prepared:?}");
    // prepared once: a second call writes nothing
    assert!(prepare_partitions(&big, None, Some(4)).unwrap());
    assert_eq!(arrow_files(&parts), prepared);

    let ds = open_checked(dir.path(), 11);
    // every prepared file is in the snapshot, linked: the open wrote none
    let linked = arrow_files(&ds.snapshot_dir().join("columns"));
    for (name, (inode, _)) in &prepared {
        assert_eq!(linked.get(name).map(|f| f.0), Some(*inode), "{name}");
    }

    // cleanup removes the prepared files no snapshot directory links
    let (ids, samples): (Vec<i64>, Vec<i64>) = ds
        .snapshot()
        .identities()
        .unwrap()
        .iter()
        .flat_map(|(c, s)| c.iter().copied().zip(s.iter().copied()))
        .unzip();
    let n = ids.len();
    let batch = frame(ids, samples, vec![2.0; n]);
    ds.update(&batch.schema(), &[batch], "reweight", None, false)
        .unwrap();
    ds.cleanup(1).unwrap();
    let left = arrow_files(&parts);
    assert!(left.len() < prepared.len(), "{left:?}");
    assert!(left.values().all(|&(_, links)| links >= 2), "{left:?}");
}
