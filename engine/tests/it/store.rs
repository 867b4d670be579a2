//! The on-disk format as users rely on it: round trips, atomic publish, and
//! corruption that is reported instead of delivered.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
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
        assert_eq!(cache.attributes().num_rows(), 500);
        assert_eq!(cache.attributes().schema().field(0).name(), "sample_id");
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
