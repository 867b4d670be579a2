//! SQL over the active population.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use datasetrt::query::QuerySession;
use datasetrt::store::WriterOptions;
use datasetrt::{Dataset, OpenOptions};

use crate::store::write_cache;

#[tokio::test]
async fn group_by_over_the_snapshot_and_follow_updates() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "q", 30, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let session = QuerySession::new(&ds.snapshot(), ds.cache_set()).unwrap();
    let (_, batches) = session
        .sql("SELECT label, count(*) AS n FROM metadata GROUP BY label ORDER BY label")
        .await
        .unwrap();
    let counts = column(&batches, 1);
    assert_eq!(counts, vec![10, 10, 10]);

    let (schema, batches) = session
        .sql("SELECT * FROM metadata WHERE split = 'val'")
        .await
        .unwrap();
    let snap = ds.update(&schema, &batches, "test", None, false).unwrap();
    session.set_snapshot(&snap).unwrap();
    let (_, batches) = session.sql("SELECT count(*) FROM metadata").await.unwrap();
    assert_eq!(column(&batches, 0), vec![6]);
}

fn column(batches: &[RecordBatch], i: usize) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(i).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}
