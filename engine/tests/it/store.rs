//! The on-disk format as users rely on it: round trips, atomic publish, and
//! corruption that is reported instead of delivered.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datasetrt::store::{Cache, CacheWriter, Codec, WriterOptions};
use datasetrt::Error;

pub fn payload(i: usize) -> Vec<u8> {
    format!("record {i} ").repeat(1 + i % 50).into_bytes()
}

pub fn attributes(n: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("label", DataType::Int64, false),
        Field::new("split", DataType::Utf8, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| i % 3))),
            Arc::new(StringArray::from_iter_values((0..n).map(|i| {
                if i % 5 == 0 {
                    "val"
                } else {
                    "train"
                }
            }))),
        ],
    )
    .unwrap()
}

pub fn write_cache(root: &Path, name: &str, n: usize, options: WriterOptions) -> Cache {
    let mut w = CacheWriter::create(root, name, options).unwrap();
    for chunk in (0..n).collect::<Vec<_>>().chunks(37) {
        let mut data = Vec::new();
        let mut ends = Vec::new();
        for &i in chunk {
            data.extend_from_slice(&payload(i));
            ends.push(data.len());
        }
        w.add_chunk(data, ends).unwrap();
    }
    let (_, dir) = w.finish(attributes(n)).unwrap();
    Cache::open(&dir).unwrap()
}

fn read(cache: &Cache, i: u64) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    cache.read_into(i, &mut out, true).map(|_| out)
}

#[test]
fn every_codec_round_trips_across_many_shards() {
    for codec in [Codec::Zstd, Codec::Lz4, Codec::None] {
        let dir = tempfile::tempdir().unwrap();
        let options = WriterOptions {
            codec,
            shard_target_bytes: 1024,
            threads: 3,
            ..WriterOptions::default()
        };
        let cache = write_cache(dir.path(), "rt", 500, options);
        assert!(cache.manifest().shard_bytes.len() > 3, "{codec:?}");
        for i in 0..500 {
            assert_eq!(
                read(&cache, i as u64).unwrap(),
                payload(i),
                "{codec:?} record {i}"
            );
        }
        assert_eq!(cache.attributes().unwrap().num_rows(), 500);
        assert_eq!(
            cache.attributes().unwrap().schema().field(0).name(),
            "sample_id"
        );
    }
}

#[test]
fn nothing_is_visible_until_finish_and_an_abandoned_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = CacheWriter::create(dir.path(), "partial", WriterOptions::default()).unwrap();
    w.add_chunk(b"abc".to_vec(), vec![3]).unwrap();
    assert!(!dir.path().join("partial").exists());
    drop(w);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn publishing_twice_under_one_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "once", 3, WriterOptions::default());
    let err = CacheWriter::create(dir.path(), "once", WriterOptions::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("already exists"), "{err}");
}

#[test]
fn a_flipped_byte_is_reported_with_file_shard_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let options = WriterOptions {
        codec: Codec::Zstd,
        ..WriterOptions::default()
    };
    let cache = write_cache(dir.path(), "flip", 20, options);
    let entry = cache.entry(9).unwrap();
    drop(cache);
    let shard = dir.path().join("flip").join("shard-00000.drts");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[entry.offset as usize + 1] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();

    let cache = Cache::open(&dir.path().join("flip")).unwrap();
    assert_eq!(read(&cache, 8).unwrap(), payload(8));
    let err = read(&cache, 9).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("shard-00000.drts") && msg.contains(&format!("offset {}", entry.offset)),
        "{msg}"
    );
}

#[test]
fn out_of_range_samples_are_invalid_input() {
    let dir = tempfile::tempdir().unwrap();
    let cache = write_cache(dir.path(), "small", 4, WriterOptions::default());
    assert!(matches!(
        read(&cache, 4).unwrap_err(),
        Error::InvalidInput { .. }
    ));
}

/// Opening a cache checks its index's header, not its entries: a damaged
/// entry fails the reads that land in its chunk (naming the index and the
/// chunk), and every other record reads as written. A cache without the
/// chunk table (written before there were any) is checked whole when it
/// opens, as before.
#[test]
fn a_damaged_index_chunk_fails_only_the_reads_that_land_in_it() {
    use datasetrt::store::chunks::CHUNK;
    use datasetrt::store::format::{INDEX_ENTRY_LEN, INDEX_HEADER_LEN};
    let dir = tempfile::tempdir().unwrap();
    let per_chunk = CHUNK / INDEX_ENTRY_LEN;
    let n = 3 * per_chunk;
    drop(write_cache(dir.path(), "big", n, WriterOptions::default()));
    let cache_dir = dir.path().join("big");
    let index = cache_dir.join("index.drti");
    let mut bytes = std::fs::read(&index).unwrap();
    let damaged = per_chunk + 5; // in the second chunk of entries
    bytes[INDEX_HEADER_LEN + damaged * INDEX_ENTRY_LEN + 3] ^= 0x10;
    std::fs::write(&index, &bytes).unwrap();

    let cache = Cache::open(&cache_dir).unwrap();
    for s in [0, per_chunk - 1, 2 * per_chunk, n - 1] {
        assert_eq!(read(&cache, s as u64).unwrap(), payload(s), "sample {s}");
    }
    for s in [per_chunk, damaged, 2 * per_chunk - 1] {
        assert_corrupt(
            read(&cache, s as u64).unwrap_err(),
            &["index.drti", "chunk 1"],
        );
    }
    assert!(cache.check_files().is_err());
    drop(cache);

    std::fs::remove_file(cache_dir.join("index.drti.chunks")).unwrap();
    assert_corrupt(Cache::open(&cache_dir).unwrap_err(), &["index.drti"]);
}

/// `err` is a `Corrupt` error whose message holds each of `names`.
fn assert_corrupt(err: Error, names: &[&str]) {
    let msg = err.to_string();
    assert!(matches!(err, Error::Corrupt { .. }), "{msg}");
    assert!(names.iter().all(|n| msg.contains(n)), "{msg}");
}

/// The attributes are read when a dataset's first population is made, not
/// when a cache opens: damaged, they fail what reads them (naming the file),
/// and records still read. Without their chunk table they are checked whole
/// at open, as before.
#[test]
fn damaged_attributes_fail_what_reads_them_not_the_open() {
    let dir = tempfile::tempdir().unwrap();
    drop(write_cache(
        dir.path(),
        "attrs",
        50,
        WriterOptions::default(),
    ));
    let cache_dir = dir.path().join("attrs");
    let file = cache_dir.join("attributes.arrow");
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();

    let cache = Cache::open(&cache_dir).unwrap();
    assert_eq!(read(&cache, 7).unwrap(), payload(7));
    assert_corrupt(
        cache.attributes().unwrap_err(),
        &["attributes.arrow", "chunk 0"],
    );
    assert!(cache.check_files().is_err());
    drop(cache);

    std::fs::remove_file(cache_dir.join("attributes.arrow.chunks")).unwrap();
    assert_corrupt(Cache::open(&cache_dir).unwrap_err(), &["attributes.arrow"]);
}

/// Records `range` of [`payload`] as cache `name`, with a metadata column
/// `note` of type `note` (Null: every value null, as a part of a source
/// whose values are all `None` there).
fn write_part(
    root: &Path,
    name: &str,
    range: std::ops::Range<usize>,
    note: DataType,
) -> std::path::PathBuf {
    let options = WriterOptions {
        shard_target_bytes: 2048,
        ..WriterOptions::default()
    };
    let mut w = CacheWriter::create(root, name, options).unwrap();
    let (mut data, mut ends) = (Vec::new(), Vec::new());
    for i in range.clone() {
        data.extend_from_slice(&payload(i));
        ends.push(data.len());
    }
    w.add_chunk(data, ends).unwrap();
    let n = range.len();
    let column: arrow::array::ArrayRef = match note {
        DataType::Null => Arc::new(arrow::array::NullArray::new(n)),
        _ => Arc::new(StringArray::from_iter_values(
            range.map(|i| format!("n{i}")),
        )),
    };
    let schema = Arc::new(Schema::new(vec![Field::new(
        "note",
        column.data_type().clone(),
        true,
    )]));
    w.finish(RecordBatch::try_new(schema, vec![column]).unwrap())
        .unwrap()
        .1
}

#[test]
fn parts_written_apart_merge_into_the_cache_one_writer_writes() {
    let dir = tempfile::tempdir().unwrap();
    let parts_root = dir.path().join(".parts");
    let parts = vec![
        write_part(&parts_root, "p0", 0..40, DataType::Null),
        write_part(&parts_root, "p1", 40..41, DataType::Utf8),
        write_part(&parts_root, "p2", 41..120, DataType::Utf8),
    ];
    let shards: usize = parts
        .iter()
        .map(|p| Cache::open(p).unwrap().manifest().shard_bytes.len())
        .sum();
    let (manifest, merged) = datasetrt::store::merge_parts(dir.path(), "whole", &parts).unwrap();
    assert!(parts.iter().all(|p| !p.exists()), "the parts are gone");
    let cache = Cache::open(&merged).unwrap();
    assert_eq!(cache.manifest(), &manifest);
    assert_eq!((cache.records(), manifest.shard_bytes.len()), (120, shards));
    cache.check_files().unwrap();
    for i in 0..120 {
        assert_eq!(read(&cache, i as u64).unwrap(), payload(i), "record {i}");
    }
    let attributes = cache.attributes().unwrap();
    let ids = attributes
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert_eq!(ids.values().to_vec(), (0..120).collect::<Vec<i64>>());
    let notes = attributes
        .column(1)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert_eq!(
        notes.null_count(),
        40,
        "part 0's nulls take the others' type"
    );
    assert_eq!(notes.value(40), "n40");
    assert_eq!(notes.value(119), "n119");

    // parts that disagree: refused, nothing published, the parts removed
    let a = write_part(&parts_root, "q0", 0..3, DataType::Utf8);
    let b = write_cache(&parts_root, "q1", 3, WriterOptions::default())
        .dir()
        .to_path_buf();
    let err =
        datasetrt::store::merge_parts(dir.path(), "mixed", &[a.clone(), b.clone()]).unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    assert!(err.to_string().contains("other metadata columns"), "{err}");
    assert!(!dir.path().join("mixed").exists() && !a.exists() && !b.exists());
}
