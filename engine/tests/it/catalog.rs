//! Snapshots: the population changes, stored payloads never do.

use std::sync::Arc;

use arrow::array::{Array, AsArray, Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
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
    assert!(snap.weights().values().iter().all(|&w| w == 1.0));
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
    let snap = ds.update(&batch.schema(), &[batch], "test").unwrap();
    assert_eq!(snap.number(), 1);
    assert_eq!(ds.snapshot_numbers().unwrap(), vec![0, 1]);
    let again = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    assert_eq!(again.snapshot().number(), 1);
    assert_eq!(
        again.snapshot().sample_ids().values().to_vec(),
        vec![1, 1, 2]
    );
    // the first of duplicated rows answers lookups
    assert_eq!(again.snapshot().row_of(again.caches(), 0, 1), Some(0));
    assert_eq!(again.snapshot().row_of(again.caches(), 0, 3), None);
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
        let err = ds.update(&batch.schema(), &[batch], "test").unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
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
    let snap = ds.update(&schema, &[batch], "test").unwrap();
    let s = snap.batch();
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
