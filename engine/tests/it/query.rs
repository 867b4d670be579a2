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

pub fn column(batches: &[RecordBatch], i: usize) -> Vec<i64> {
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

/// A population of 400 rows in partitions of 37, with numeric columns whose
/// values cluster by row (so partitions' ranges differ) and every value a
/// range must order right: nulls, NaN, -0.0 and 0.0, infinities, u64 past
/// i64.
pub fn ranged(dir: &std::path::Path) -> Dataset {
    use arrow::array::{Float64Array, Int32Array, UInt64Array};
    use arrow::datatypes::{Field, Schema};
    use std::sync::Arc;
    write_cache(dir, "r", 400, WriterOptions::default());
    let options = OpenOptions {
        partition_rows: Some(37),
        ..Default::default()
    };
    let ds = Dataset::open(&[dir.to_path_buf()], options).unwrap();
    let base = crate::whole(&ds.snapshot()).unwrap();
    let n = base.num_rows();
    let x: Int32Array = (0..n as i32)
        .map(|i| (i % 11 != 3).then_some(i / 40 - 3))
        .collect();
    let specials = [f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY];
    let f: Float64Array = (0..n)
        .map(|i| match i % 13 {
            0 => None,
            1 => Some(specials[(i / 13) % 5]),
            _ => Some(i as f64 / 10.0 - 15.0),
        })
        .collect();
    let u: UInt64Array = (0..n as u64).map(|i| u64::MAX - 1000 + i / 5).collect();
    let mut fields: Vec<Field> = base
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns = base.columns().to_vec();
    for (name, column) in [
        ("x", Arc::new(x) as arrow::array::ArrayRef),
        ("f", Arc::new(f)),
        ("u", Arc::new(u)),
    ] {
        fields.push(Field::new(name, column.data_type().clone(), true));
        columns.push(column);
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    ds.update(&schema, &[batch], "ranged", None, false).unwrap();
    assert!(ds.snapshot().num_partitions() > 10);
    ds
}

/// Filters skip the partitions whose recorded ranges no row of which could
/// satisfy them: every filter gives the rows a full scan of the same
/// population (registered as a plain table, which has no ranges) gives.
#[tokio::test]
async fn filters_that_skip_partitions_return_what_a_full_scan_returns() {
    let dir = tempfile::tempdir().unwrap();
    let ds = ranged(dir.path());
    let snapshot = ds.snapshot();
    assert!(snapshot
        .range(0, snapshot.schema().index_of("x").unwrap())
        .is_some());
    let session = QuerySession::new(&snapshot, ds.cache_set()).unwrap();
    let whole = crate::whole(&snapshot).unwrap();
    session
        .register("plain", whole.schema(), vec![whole])
        .unwrap();
    let atoms = [
        "x = 2",
        "x < -2",
        "x <= 0",
        "x > 5",
        "x >= 6",
        "x != 1",
        "x BETWEEN 1 AND 2",
        "x IN (-3, 7)",
        "x IS NULL",
        "x IS NOT NULL",
        "x + 1 > 4",
        "CAST(x AS DOUBLE) < 0.5",
        "f < 0",
        "f <= -0.0",
        "f = 0.0",
        "f = -0.0",
        "f > 1e300",
        "f = CAST('NaN' AS DOUBLE)",
        "f >= CAST('inf' AS DOUBLE)",
        "f < CAST('-inf' AS DOUBLE) OR f IS NULL",
        "f != f",
        "f BETWEEN -14.9 AND -14.0",
        "u > 18446744073709551610",
        "u < 18446744073709550700",
        "u = 18446744073709550620",
        "sample_id < 30",
        "sample_id >= 370",
        "weight > 1",
        "cache_id = 0",
    ];
    let mut filters: Vec<String> = atoms.iter().map(|a| a.to_string()).collect();
    // pairs and negations, picked by a fixed sequence
    let mut state = 0x9e37_79b9_u64;
    let mut next = |n: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize % n
    };
    for _ in 0..120 {
        let (a, b) = (atoms[next(atoms.len())], atoms[next(atoms.len())]);
        filters.push(match next(3) {
            0 => format!("({a}) AND ({b})"),
            1 => format!("({a}) OR ({b})"),
            _ => format!("NOT ({a}) AND ({b})"),
        });
    }
    let mut skipped = 0;
    for filter in &filters {
        let query = |table: &str| {
            format!("SELECT sample_id FROM {table} WHERE {filter} ORDER BY sample_id")
        };
        let (_, got) = session.sql(&query("metadata")).await.unwrap();
        let (_, want) = session.sql(&query("plain")).await.unwrap();
        assert_eq!(column(&got, 0), column(&want, 0), "{filter}");
        let (_, plan) = session
            .sql(&format!("EXPLAIN {}", query("metadata")))
            .await
            .unwrap();
        let plan = arrow::util::pretty::pretty_format_batches(&plan)
            .unwrap()
            .to_string();
        skipped +=
            usize::from(!plan.contains(&format!("partitions={}", snapshot.num_partitions())));
    }
    // the ranges did their work: most atoms alone skip partitions
    assert!(
        skipped > filters.len() / 3,
        "{skipped} of {}",
        filters.len()
    );
}

/// A partition a filter skips is never read: damage there goes unnoticed by
/// that query and is a `Corrupt` error for one that reads it.
#[tokio::test]
async fn a_partition_a_filter_skips_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let ds = ranged(dir.path());
    let snapshot = ds.snapshot();
    let last = snapshot.num_partitions() - 1;
    let manifest = datasetrt::catalog::read_manifest(ds.snapshot_dir(), snapshot.number()).unwrap();
    let x = manifest.partitions[last]
        .columns
        .iter()
        .find(|c| c.name == "x");
    let file = ds
        .snapshot_dir()
        .join("columns")
        .join(format!("{}.arrow", x.unwrap().hash));
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let options = OpenOptions {
        partition_rows: Some(37),
        ..Default::default()
    };
    let reopened = Dataset::open(&[dir.path().to_path_buf()], options).unwrap();
    let session = QuerySession::new(&reopened.snapshot(), reopened.cache_set()).unwrap();
    // x of the last partition (rows 370..) is 6; x < 5 cannot be there
    let (_, batches) = session
        .sql("SELECT count(*) FROM metadata WHERE x < 5")
        .await
        .unwrap();
    assert_eq!(
        column(&batches, 0),
        vec![(0..320).filter(|i| i % 11 != 3).count() as i64]
    );
    let err = session
        .sql("SELECT count(*) FROM metadata WHERE x > 5")
        .await
        .unwrap_err();
    assert!(matches!(err, datasetrt::Error::Corrupt { .. }), "{err}");
    // a query that reads no column of it maps nothing of it either
    let (_, batches) = session
        .sql("SELECT sum(sample_id) FROM metadata")
        .await
        .unwrap();
    assert_eq!(column(&batches, 0), vec![(0..400).sum::<i64>()]);
}
