//! SQL over the active population.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use datasetrt::query::{LiveQuery, QuerySession};
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

/// A dataset's session follows every change made through `LiveQuery`, and
/// `select` runs again on a head another writer moved instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_query_follows_commits_and_select_retries_on_a_moved_head() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "q", 30, WriterOptions::default());
    let open = || Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let live = std::sync::Arc::new(LiveQuery::new(std::sync::Arc::new(open())));
    let count = |live: &LiveQuery| {
        let session = live.session().unwrap();
        async move {
            let (_, b) = session.sql("SELECT count(*) FROM metadata").await.unwrap();
            column(&b, 0)[0]
        }
    };
    let query = |live: &LiveQuery, sql: &'static str| {
        let session = live.session().unwrap();
        async move { session.sql(sql).await.unwrap() }
    };
    assert_eq!(count(&live).await, 30);
    let (schema, batches) = query(&live, "SELECT * FROM metadata WHERE split = 'val'").await;
    live.update(&schema, &batches, "val only", None, false)
        .unwrap();
    assert_eq!(count(&live).await, 6, "the session follows a commit");

    // another writer moves the head: select runs again on it and commits
    let other = open();
    let (schema, batches) = query(&live, "SELECT * FROM metadata LIMIT 4").await;
    let moved = other
        .update(&schema, &batches, "another writer", None, false)
        .unwrap();
    let number = live
        .clone()
        .select(
            "SELECT * FROM metadata LIMIT 2".into(),
            "select".into(),
            false,
        )
        .await
        .unwrap();
    assert_eq!(number, moved.number() + 1);
    assert_eq!(count(&live).await, 2, "the session follows select");
    assert_eq!(live.dataset().snapshot().number(), number);

    live.pin(moved.number()).unwrap();
    assert_eq!(count(&live).await, 4, "the session follows a pin");
}

fn column(batches: &[RecordBatch], i: usize) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(i).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

/// The nodes report what they know: `count(*)` over `payloads` is answered
/// from the scan's exact row count without reading anything, the tree
/// rendering names the take's settings, and EXPLAIN ANALYZE shows each
/// node's rows and time.
#[tokio::test]
async fn nodes_report_exact_statistics_tree_renderings_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "q", 30, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let session = QuerySession::new(&ds.snapshot(), ds.cache_set()).unwrap();
    let text = |batches: &[RecordBatch]| -> String {
        batches
            .iter()
            .flat_map(|b| {
                let plans = b.column(1).as_string::<i32>();
                (0..b.num_rows())
                    .map(|i| plans.value(i).to_string())
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (_, plan) = session
        .sql("EXPLAIN SELECT count(*) FROM payloads")
        .await
        .unwrap();
    let plan = text(&plan);
    assert!(!plan.contains("PayloadScanExec"), "{plan}");
    let (_, n) = session.sql("SELECT count(*) FROM payloads").await.unwrap();
    assert_eq!(column(&n, 0), vec![30]);

    let join =
        "SELECT m.sample_id, p.data FROM metadata m JOIN payloads p USING (cache_id, sample_id)";
    let (_, tree) = session
        .sql(&format!("EXPLAIN FORMAT TREE {join}"))
        .await
        .unwrap();
    let tree = text(&tree);
    assert!(
        tree.contains("PayloadTakeExec") && tree.contains("unmatched: Drop"),
        "{tree}"
    );
    let (_, analyzed) = session
        .sql(&format!("EXPLAIN ANALYZE {join}"))
        .await
        .unwrap();
    let analyzed = text(&analyzed);
    let take = analyzed
        .lines()
        .find(|l| l.contains("PayloadTakeExec"))
        .unwrap();
    assert!(
        take.contains("output_rows=30") && take.contains("elapsed_compute="),
        "{take}"
    );
}

/// The payloads scan runs in partitions, each in (cache_id, sample_id)
/// order: without ORDER BY the rows come in no fixed order, and an ORDER BY
/// on the identity merges the partitions instead of sorting every row.
#[tokio::test]
async fn ordering_the_payloads_scan_by_identity_merges_its_partitions() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "o1", 300, WriterOptions::default());
    write_cache(dir.path(), "o2", 200, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let session = QuerySession::new(&ds.snapshot(), ds.cache_set()).unwrap();
    let query = "SELECT cache_id, sample_id, raw_len FROM payloads ORDER BY cache_id, sample_id";
    let (_, plan) = session.sql(&format!("EXPLAIN {query}")).await.unwrap();
    let plan: String = plan
        .iter()
        .flat_map(|b| {
            let text = b.column(1).as_string::<i32>();
            (0..b.num_rows())
                .map(|i| text.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!plan.contains("SortExec"), "{plan}");
    let (_, rows) = session.sql(query).await.unwrap();
    let (cids, sids) = (column(&rows, 0), column(&rows, 1));
    let mut expected: Vec<(i64, i64)> = ds
        .caches()
        .iter()
        .flat_map(|c| (0..c.records() as i64).map(move |s| (c.id(), s)))
        .collect();
    expected.sort_unstable();
    assert_eq!(cids.into_iter().zip(sids).collect::<Vec<_>>(), expected);
}
