//! SQL on workers: two workers on 127.0.0.1, started by the test, run the
//! scans of `metadata` and the stages above them; every answer equals the
//! one the same query gives in one process.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use datasetrt::query::{distributed, LiveQuery, QuerySession};

use crate::query::ranged;

/// Two workers serving on loopback, stopped when the test's runtime ends.
async fn workers() -> Vec<String> {
    let mut urls = Vec::new();
    for _ in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        urls.push(format!("http://{}", listener.local_addr().unwrap()));
        tokio::spawn(distributed::serve(listener));
    }
    urls
}

/// Rows as sorted text: the order of a query without ORDER BY is not part
/// of its answer.
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut lines: Vec<String> = text.lines().skip(3).map(str::to_string).collect();
    lines.sort();
    lines
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("a distributed query finishes within two minutes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_by_on_two_workers_equals_the_one_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let ds = ranged(dir.path());
    let snapshot = ds.snapshot();
    let urls = workers().await;
    let here = QuerySession::new(&snapshot, ds.cache_set()).unwrap();
    let there = QuerySession::with_workers(&snapshot, ds.cache_set(), &urls).unwrap();
    for query in [
        "SELECT x, count(*) AS n, sum(weight) AS w, max(sample_id) AS s FROM metadata GROUP BY x",
        "SELECT count(*) AS n, max(u) AS u FROM metadata WHERE sample_id % 3 = 1",
        "SELECT cache_id, sample_id, f FROM metadata WHERE x >= 2 AND f > -10",
        "SELECT drt_uniform(7, cache_id, sample_id) AS r FROM metadata WHERE x = 1",
    ] {
        let (_, want) = here.sql(query).await.unwrap();
        let (_, got) = within(there.sql(query)).await.unwrap();
        assert_eq!(rows(&got), rows(&want), "{query}");
    }
    // the plan did leave the process: the scan's stage runs as two tasks
    let df = there
        .context()
        .sql("SELECT x, count(*) FROM metadata GROUP BY x")
        .await
        .unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let plan = datafusion_distributed::display_plan_ascii(plan.as_ref(), false);
    assert!(plan.contains("tasks=2"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_and_reweight_committed_from_workers_is_the_one_process_commit() {
    let urls = workers().await;
    for query in [
        "SELECT cache_id, sample_id, x, f, u, weight * (1 + x) AS weight \
         FROM metadata WHERE x > 0",
        // after a shuffle: each worker stores the groups it aggregates
        "SELECT cache_id, min(sample_id) AS sample_id, x, sum(weight) AS weight \
         FROM metadata GROUP BY cache_id, x",
    ] {
        let mut committed = Vec::new();
        for workers in [Vec::new(), urls.clone()] {
            let dir = tempfile::tempdir().unwrap();
            let live = Arc::new(LiveQuery::with_workers(
                Arc::new(ranged(dir.path())),
                workers,
            ));
            let number = within(live.clone().select(query.into(), "reweight".into(), false))
                .await
                .unwrap();
            let snapshot = live.dataset().snapshot();
            assert_eq!(snapshot.number(), number);
            let session = QuerySession::new(&snapshot, live.dataset().cache_set()).unwrap();
            // the two datasets' cache ids differ (each names its own cache)
            let (_, batches) = session
                .sql("SELECT * EXCLUDE (cache_id) FROM metadata")
                .await
                .unwrap();
            committed.push(rows(&batches));
        }
        assert!(!committed[0].is_empty());
        assert_eq!(committed[0], committed[1], "{query}");
    }
}

/// The column files in a dataset's snapshot directory.
fn column_files(ds: &datasetrt::Dataset) -> std::collections::BTreeSet<String> {
    let dir = ds.snapshot().path().parent().unwrap().join("columns");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".arrow"))
        .collect()
}

/// A `select` on workers stores its partitions in the stages the workers
/// run: the caller commits their descriptions. A reweight of one partition
/// writes that partition's weights and nothing else, the population keeps
/// its order, and a bad row is the caller's typed error naming the row
/// of the update, with nothing committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_on_workers_stores_its_partitions_on_them_and_commits_one_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let urls = workers().await;
    let live = Arc::new(LiveQuery::with_workers(
        Arc::new(ranged(dir.path())),
        urls.clone(),
    ));
    let ds = live.dataset().clone();
    let base = ds.snapshot();
    let order = crate::identity_column(&base, 1);

    // the write is in the stage the workers run, below the coordinator's
    let there = QuerySession::with_workers(&base, ds.cache_set(), &urls).unwrap();
    let mut state = there.context().state();
    state
        .config_mut()
        .set_extension(Arc::new(datasetrt::query::exec::WriteTo::new(
            ds.stream_recipe(&base),
            base.clone(),
        )));
    let logical = state
        .create_logical_plan("SELECT cache_id, sample_id, weight FROM metadata WHERE x > 0")
        .await
        .unwrap();
    let plan = state.create_physical_plan(&logical).await.unwrap();
    let plan = datafusion_distributed::display_plan_ascii(plan.as_ref(), false);
    let write = plan.find("PopulationWriteExec").expect("a write");
    assert!(write > plan.find("Stage 1").unwrap(), "{plan}");

    // a reweight of the first partition's rows
    let before = column_files(&ds);
    let first = base.partition_rows(0);
    let reweight = format!(
        "SELECT cache_id, sample_id, x, f, u, \
         CASE WHEN sample_id < {} THEN weight * 2 ELSE weight END AS weight FROM metadata",
        order[first - 1] + 1
    );
    within(live.clone().select(reweight, "reweight".into(), false))
        .await
        .unwrap();
    let after = ds.snapshot();
    let new: Vec<_> = column_files(&ds).difference(&before).cloned().collect();
    // the weight file, and the `f` of each partition holding a -0.0 or a
    // negative NaN: SQL reads one zero and one NaN, and stores them so
    // (docs/sql.md); a column without them keeps its file
    let f = float_column(&base, "f");
    let mut at = 0;
    let mut signed = 0;
    for p in 0..base.num_partitions() {
        let rows = base.partition_rows(p);
        let part = f.slice(at, rows);
        signed += usize::from(
            part.iter()
                .flatten()
                .any(|v| v.is_sign_negative() && (v == 0.0 || v.is_nan())),
        );
        at += rows;
    }
    assert!(signed > 0, "the test population stores -0.0");
    assert_eq!(
        new.len(),
        1 + signed,
        "one weight file, and f where canonical: {new:?}"
    );
    assert_eq!(after.num_partitions(), base.num_partitions());
    assert_eq!(crate::identity_column(&after, 1), order);
    let weights = float_column(&after, "weight");
    assert_eq!(weights.value(0), 2.0);
    assert_eq!(weights.value(first), 1.0);

    // a bad weight in a later partition: the update's row, typed
    let bad_row = first + 3;
    let bad = format!(
        "SELECT cache_id, sample_id, \
         CASE WHEN sample_id = {} THEN -1.0 ELSE weight END AS weight FROM metadata",
        order[bad_row]
    );
    let err = within(live.clone().select(bad, "bad".into(), false))
        .await
        .unwrap_err();
    match &err {
        datasetrt::Error::InvalidInput { message, culprit } => {
            assert_eq!(culprit.row, Some(bad_row as u64), "{message}");
            assert_eq!(culprit.column.as_deref(), Some("weight"));
            assert!(message.contains(&format!("row {bad_row} ")), "{message}");
        }
        other => panic!("not an invalid input: {other}"),
    }
    assert_eq!(ds.head().unwrap(), after.number());
    // a result without identities is refused before anything runs
    let err = within(live.clone().select(
        "SELECT sample_id, weight FROM metadata".into(),
        "no ids".into(),
        false,
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(err, datasetrt::Error::InvalidInput { .. }),
        "{err}"
    );
    assert_eq!(ds.head().unwrap(), after.number());
}

/// Payloads are read where the caches are, by the coordinator: the workers
/// scan and filter `metadata`, the coordinator takes the payloads of the
/// rows they return, and the answer is the one-process one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_with_payloads_reads_them_on_the_coordinator_from_rows_the_workers_filtered() {
    let dir = tempfile::tempdir().unwrap();
    let ds = ranged(dir.path());
    let urls = workers().await;
    let here = QuerySession::new(&ds.snapshot(), ds.cache_set()).unwrap();
    let there = QuerySession::with_workers(&ds.snapshot(), ds.cache_set(), &urls).unwrap();
    for query in [
        "SELECT m.sample_id, p.raw_len, p.data FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id) WHERE m.x = 2",
        "SELECT count(*) AS n, sum(raw_len) AS bytes FROM payloads",
        "SELECT sample_id, stored_len FROM payloads WHERE sample_id < 20",
    ] {
        let (_, want) = here.sql(query).await.unwrap();
        let (_, got) = within(there.sql(query)).await.unwrap();
        assert_eq!(rows(&got), rows(&want), "{query}");
    }
    let df = there
        .context()
        .sql(
            "SELECT m.x, p.raw_len FROM metadata m \
             JOIN payloads p USING (cache_id, sample_id) WHERE m.x = 2",
        )
        .await
        .unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let plan = datafusion_distributed::display_plan_ascii(plan.as_ref(), false);
    let take = plan.find("PayloadTakeExec").unwrap();
    assert!(take < plan.find("Stage 1").unwrap(), "{plan}");
    let err = QuerySession::with_workers(&ds.snapshot(), ds.cache_set(), &["not a url".into()])
        .err()
        .unwrap();
    assert!(
        matches!(err, datasetrt::Error::InvalidInput { .. }),
        "{err}"
    );
}

/// Float64 column `name` of the whole of `snapshot`.
fn float_column(snapshot: &datasetrt::Snapshot, name: &str) -> arrow::array::Float64Array {
    let whole = crate::whole(snapshot).unwrap();
    let column = whole.column_by_name(name).unwrap();
    arrow::array::AsArray::as_primitive::<arrow::datatypes::Float64Type>(column).clone()
}
