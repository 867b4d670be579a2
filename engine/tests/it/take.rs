//! `CacheSet::take`, the read under every payload query and the loader: the
//! bytes written, in input order, whatever mix of codecs, shards, caches,
//! sizes and read groups a batch touches.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, BinaryViewArray};
use datasetrt::store::{Cache, CacheSet, CacheWriter, Codec, WriterOptions};

use crate::store::attributes;

/// Record `i` of cache `k`: 5 bytes (held inside its view) up to 96 KiB;
/// every third one random, so a zstd cache stores it raw, the rest repetitive
/// (compressed).
fn record(k: u64, i: u64) -> Vec<u8> {
    let len = [5, 700, 16 << 10, 96 << 10][(i % 4) as usize];
    let mut state = k * 1_000_003 + i + 1;
    (0..len)
        .map(|j| {
            if i.is_multiple_of(3) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            } else {
                (j % 251) as u8 ^ i as u8
            }
        })
        .collect()
}

fn write(root: &Path, k: u64, codec: Codec, n: u64) -> Arc<Cache> {
    let options = WriterOptions {
        codec,
        shard_target_bytes: 256 << 10, // several shards
        threads: 2,
        ..WriterOptions::default()
    };
    let mut w = CacheWriter::create(root, &format!("take-{k}"), options).unwrap();
    let (mut data, mut ends) = (Vec::new(), Vec::new());
    for i in 0..n {
        data.extend_from_slice(&record(k, i));
        ends.push(data.len());
    }
    w.add_chunk(data, ends).unwrap();
    let (_, dir) = w.finish(attributes(n as usize)).unwrap();
    Arc::new(Cache::open(&dir).unwrap())
}

#[test]
fn every_record_comes_back_in_input_order_for_any_mix_and_any_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let n = 240;
    let mut caches = vec![
        (0, write(dir.path(), 0, Codec::Zstd, n)),
        (1, write(dir.path(), 1, Codec::None, n)),
    ];
    caches.sort_by_key(|(_, c)| c.id()); // the set keeps its caches sorted by id
    let (ks, caches): (Vec<u64>, Vec<Arc<Cache>>) = caches.into_iter().unzip();
    let caches = CacheSet::new(caches).unwrap();
    for c in &caches {
        assert!(c.manifest().shard_bytes.len() > 3);
    }
    // both caches interleaved, out of order, with repeats: ~10 MiB
    let rows: Vec<(usize, u64)> = (0..600u64)
        .map(|r| ((r % 2) as usize, (r * 37 + r / 7) % n))
        .collect();
    let cache_ids: Vec<i64> = rows.iter().map(|&(c, _)| caches[c].id()).collect();
    let sample_ids: Vec<i64> = rows.iter().map(|&(_, s)| s as i64).collect();
    let shards: usize = caches.iter().map(|c| c.manifest().shard_bytes.len()).sum();
    for concurrency in [1, 2, 4] {
        let array: BinaryViewArray = caches.take(&cache_ids, &sample_ids, concurrency).unwrap();
        assert_eq!(array.len(), rows.len());
        for (at, &(c, s)) in rows.iter().enumerate() {
            assert_eq!(
                array.value(at),
                record(ks[c], s),
                "row {at}, concurrency {concurrency}"
            );
        }
        // shards are referenced, not copied: one buffer per shard touched,
        // plus one per read group for decoded records
        assert!(array.data_buffers().len() <= shards + concurrency);
    }
    let none = caches.take(&[], &[], 4).unwrap();
    assert_eq!(none.len(), 0);
}

#[test]
fn a_bad_identity_names_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let caches = CacheSet::new(vec![write(dir.path(), 0, Codec::None, 10)]).unwrap();
    let id = caches[0].id();
    let err = caches.take(&[id, id + 1], &[0, 0], 1).unwrap_err();
    assert!(err.to_string().contains("row 1"), "{err}");
    let err = caches.take(&[id, id], &[0, -3], 1).unwrap_err();
    assert!(
        err.to_string().contains("row 1") && err.to_string().contains("-3"),
        "{err}"
    );
    let err = caches.take(&[id], &[10], 1).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
}
