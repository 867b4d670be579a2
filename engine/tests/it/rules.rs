//! `PayloadJoinRule` tested the way DataFusion tests its own optimizer rules:
//! a plan snapshot per case (the rewrite happens where a user relies on it
//! and nowhere else), and a differential test (random tables, rule on vs
//! off, the same rows).
//!
//! The plans are for two partitions: the session takes its partition count
//! from `DATASETRT_THREADS`, pinned to 2 here so that the snapshots do not
//! depend on the machine's cores.

use std::path::Path;
use std::sync::{Arc, Once};

use arrow::array::{Array, AsArray, Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{JoinType, NullEquality};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::MemTable;
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::{collect, displayable, ExecutionPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use datasetrt::query::exec::{PayloadColumn, PayloadJoinRule, PayloadScanExec};
use datasetrt::query::payloads::PayloadsTable;
use datasetrt::query::{MetadataTable, QuerySession, BATCH_SIZE};
use datasetrt::store::{CacheWriter, Codec, WriterOptions};
use datasetrt::{Dataset, OpenOptions};

use crate::store::{attributes, write_cache};

const PARTITIONS: usize = 2;

/// Pin the session's partition count (see the module doc). Every test here
/// sets the same value, so the order the tests run in does not matter.
fn pin_partitions() {
    static PIN: Once = Once::new();
    PIN.call_once(|| std::env::set_var("DATASETRT_THREADS", PARTITIONS.to_string()));
}

/// Two caches (30 zstd records, 20 raw ones; `crate::store::payload` bytes),
/// snapshot 0 as `metadata`, and `losses`: rows naming stored samples, an
/// unknown cache, a null and a sample past the end.
struct Fixture {
    _dir: tempfile::TempDir,
    session: QuerySession,
}

fn fixture() -> Fixture {
    pin_partitions();
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "alpha", 30, WriterOptions::default());
    let raw = WriterOptions {
        codec: Codec::None,
        ..WriterOptions::default()
    };
    write_cache(dir.path(), "beta", 20, raw);
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let session = QuerySession::new(&ds.snapshot(), ds.cache_set()).unwrap();
    let ids: Vec<i64> = ds.caches().iter().map(|c| c.id()).collect();
    let unknown = ids.iter().max().unwrap().wrapping_add(1);
    let (schema, batch) = losses(&[
        (Some(ids[0]), Some(3), 0.1),
        (Some(ids[1]), Some(4), 0.2),
        (Some(unknown), Some(1), 0.3),
        (None, Some(2), 0.4),
        (Some(ids[1]), Some(99), 0.5),
    ]);
    session.register("losses", schema, vec![batch]).unwrap();
    Fixture { _dir: dir, session }
}

/// A `losses` table: (cache_id, sample_id, loss), identities nullable.
fn losses(rows: &[(Option<i64>, Option<i64>, f64)]) -> (SchemaRef, RecordBatch) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("cache_id", DataType::Int64, true),
        Field::new("sample_id", DataType::Int64, true),
        Field::new("loss", DataType::Float64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(rows.iter().map(|r| r.0).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.1).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.2).collect::<Float64Array>()),
        ],
    )
    .unwrap();
    (schema, batch)
}

/// The physical plan `EXPLAIN` shows, lines right-trimmed.
async fn physical_plan(session: &QuerySession, query: &str) -> String {
    let (_, batches) = session.sql(&format!("EXPLAIN {query}")).await.unwrap();
    let batch = &batches[0];
    let (kinds, plans) = (
        batch.column(0).as_string::<i32>(),
        batch.column(1).as_string::<i32>(),
    );
    let at = (0..batch.num_rows())
        .find(|&i| kinds.value(i) == "physical_plan")
        .expect("EXPLAIN shows a physical plan");
    let lines: Vec<&str> = plans.value(at).lines().map(str::trim_end).collect();
    lines.join("\n")
}

async fn assert_plan(session: &QuerySession, query: &str, expected: &str) {
    let actual = physical_plan(session, query).await;
    let expected: Vec<&str> = expected.trim().lines().map(str::trim_end).collect();
    assert_eq!(
        actual,
        expected.join("\n"),
        "\nquery: {query}\nactual plan:\n{actual}\n"
    );
}

// ---- plan snapshots -------------------------------------------------------

#[tokio::test]
async fn an_inner_join_reads_only_the_payloads_of_the_rows_that_pass_the_filter() {
    let f = fixture();
    // the filter runs on metadata, the take reads what is left: no hash
    // join, no scan of every payload
    assert_plan(
        &f.session,
        "SELECT m.cache_id, m.sample_id, p.data FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id) WHERE m.label = 1",
        "
ProjectionExec: expr=[cache_id@0 as cache_id, sample_id@1 as sample_id, data@4 as data]
  PayloadTakeExec: caches=2, columns=[cache_id, sample_id, data], unmatched=Drop, concurrency=2, verify_checksums=true
    CoalescePartitionsExec
      FilterExec: label@2 = 1, projection=[cache_id@0, sample_id@1]
        MetadataScanExec: snapshot=0, columns=[cache_id, sample_id, label], partitions=1 of 1, slices=2
",
    )
    .await;
}

#[tokio::test]
async fn payloads_may_come_first_with_the_keys_in_any_order_and_keep_the_select_order() {
    let f = fixture();
    assert_plan(
        &f.session,
        "SELECT p.data, m.sample_id, p.raw_len FROM payloads p JOIN metadata m \
         ON p.sample_id = m.sample_id AND p.cache_id = m.cache_id",
        "
ProjectionExec: expr=[data@5 as data, sample_id@1 as sample_id, raw_len@4 as raw_len]
  PayloadTakeExec: caches=2, columns=[cache_id, sample_id, raw_len, data], unmatched=Drop, concurrency=2, verify_checksums=true
    CooperativeExec
      MetadataScanExec: snapshot=0, columns=[cache_id, sample_id], partitions=1 of 1, slices=2
",
    )
    .await;
}

#[tokio::test]
async fn an_outer_join_keeps_rows_that_name_no_stored_sample_with_null_payloads() {
    let f = fixture();
    assert_plan(
        &f.session,
        "SELECT l.loss, p.raw_len, p.data FROM losses l \
         LEFT JOIN payloads p USING (cache_id, sample_id)",
        "
ProjectionExec: expr=[loss@2 as loss, raw_len@5 as raw_len, data@6 as data]
  PayloadTakeExec: caches=2, columns=[cache_id, sample_id, raw_len, data], unmatched=Null, concurrency=2, verify_checksums=true
    DataSourceExec: partitions=1, partition_sizes=[1]
",
    )
    .await;
    // the same join written the other way round
    assert_plan(
        &f.session,
        "SELECT p.data, l.loss FROM payloads p RIGHT JOIN losses l \
         ON p.cache_id = l.cache_id AND p.sample_id = l.sample_id",
        "
ProjectionExec: expr=[data@5 as data, loss@2 as loss]
  PayloadTakeExec: caches=2, columns=[cache_id, sample_id, data], unmatched=Null, concurrency=2, verify_checksums=true
    DataSourceExec: partitions=1, partition_sizes=[1]
",
    )
    .await;
    let (_, batches) = f
        .session
        .sql("SELECT l.loss, p.data FROM losses l LEFT JOIN payloads p USING (cache_id, sample_id)")
        .await
        .unwrap();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let nulls: usize = batches.iter().map(|b| b.column(1).null_count()).sum();
    assert_eq!(
        (rows, nulls),
        (5, 3),
        "every loss row, three without a sample"
    );
}

#[tokio::test]
async fn a_join_that_keeps_every_stored_sample_stays_a_hash_join() {
    let f = fixture();
    // Unmatched payloads must come out with null losses: only a scan of
    // every stored sample finds them, so the rule must not fire.
    let kept = "
CooperativeExec
  HashJoinExec: mode=CollectLeft, join_type={join}, on=[(cache_id@0, cache_id@0), (sample_id@1, sample_id@1)], projection=[sample_id@4, loss@2]
    DataSourceExec: partitions=1, partition_sizes=[1]
    CooperativeExec
      PayloadScanExec: caches=2, columns=[cache_id, sample_id], partitions=2
";
    for (query, join) in [
        (
            "SELECT p.sample_id, l.loss FROM payloads p LEFT JOIN losses l \
             ON p.cache_id = l.cache_id AND p.sample_id = l.sample_id",
            "Right",
        ),
        (
            "SELECT p.sample_id, l.loss FROM losses l RIGHT JOIN payloads p \
             USING (cache_id, sample_id)",
            "Right",
        ),
        (
            "SELECT p.sample_id, l.loss FROM losses l FULL JOIN payloads p \
             USING (cache_id, sample_id)",
            "Full",
        ),
    ] {
        assert_plan(&f.session, query, &kept.replace("{join}", join)).await;
    }
}

#[tokio::test]
async fn a_condition_on_the_payloads_side_of_an_outer_join_is_left_to_the_hash_join() {
    let f = fixture();
    // `p` is null (not absent) where the condition fails: the take, which
    // drops or nulls only rows that name no stored sample, cannot say that
    assert_plan(
        &f.session,
        "SELECT l.loss, p.data FROM losses l \
         LEFT JOIN (SELECT * FROM payloads WHERE sample_id > 5) p USING (cache_id, sample_id)",
        "
CooperativeExec
  HashJoinExec: mode=CollectLeft, join_type=Left, on=[(cache_id@0, cache_id@0), (sample_id@1, sample_id@1)], projection=[loss@2, data@5]
    DataSourceExec: partitions=1, partition_sizes=[1]
    FilterExec: sample_id@1 > 5
      CooperativeExec
        PayloadScanExec: caches=2, columns=[cache_id, sample_id, data], partitions=2
",
    )
    .await;
}

#[tokio::test]
async fn identity_conditions_run_before_the_read_and_payload_conditions_after_it() {
    let f = fixture();
    // `p.sample_id % 2 = 1` is decided on the ids (on metadata's side, once
    // inferred by DataFusion and once moved there by the rule); conditions
    // on the codec or the bytes filter the taken rows
    assert_plan(
        &f.session,
        "SELECT m.sample_id, p.data FROM metadata m JOIN payloads p USING (cache_id, sample_id) \
         WHERE p.sample_id % 2 = 1 AND p.codec = 'zstd' \
         AND octet_length(CAST(p.data AS VARCHAR)) > 40",
        "
ProjectionExec: expr=[sample_id@1 as sample_id, data@5 as data]
  FilterExec: codec@4 = zstd AND octet_length(CAST(data@5 AS Utf8View)) > 40
    PayloadTakeExec: caches=2, columns=[cache_id, sample_id, codec, data], unmatched=Drop, concurrency=2, verify_checksums=true
      FilterExec: sample_id@1 % 2 = 1
        CoalescePartitionsExec
          FilterExec: sample_id@1 % 2 = 1
            MetadataScanExec: snapshot=0, columns=[cache_id, sample_id], partitions=1 of 1, slices=2
",
    )
    .await;
}

#[tokio::test]
async fn selecting_index_columns_or_counting_reads_no_payload_bytes() {
    let f = fixture();
    // no `data` among the taken columns: only index entries are read
    assert_plan(
        &f.session,
        "SELECT m.sample_id, p.raw_len, p.codec FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id)",
        "
ProjectionExec: expr=[sample_id@1 as sample_id, raw_len@4 as raw_len, codec@5 as codec]
  PayloadTakeExec: caches=2, columns=[cache_id, sample_id, raw_len, codec], unmatched=Drop, concurrency=2, verify_checksums=true
    CoalescePartitionsExec
      MetadataScanExec: snapshot=0, columns=[cache_id, sample_id], partitions=1 of 1, slices=2
",
    )
    .await;
    assert_plan(
        &f.session,
        "SELECT count(*) FROM metadata m JOIN payloads p USING (cache_id, sample_id)",
        "
ProjectionExec: expr=[count(Int64(1))@0 as count(*)]
  AggregateExec: mode=Final, gby=[], aggr=[count(Int64(1))]
    CoalescePartitionsExec
      AggregateExec: mode=Partial, gby=[], aggr=[count(Int64(1))]
        ProjectionExec: expr=[]
          PayloadTakeExec: caches=2, columns=[cache_id, sample_id], unmatched=Drop, concurrency=2, verify_checksums=true
            CoalescePartitionsExec
              MetadataScanExec: snapshot=0, columns=[cache_id, sample_id], partitions=1 of 1, slices=2
",
    )
    .await;
}

#[tokio::test]
async fn a_join_on_part_of_the_identity_or_with_more_conditions_is_not_a_take() {
    let f = fixture();
    // one sample id matches a row of every cache: a many-to-many join
    assert_plan(
        &f.session,
        "SELECT m.sample_id, p.data FROM metadata m JOIN payloads p ON m.sample_id = p.sample_id",
        "
CooperativeExec
  HashJoinExec: mode=CollectLeft, join_type=Inner, on=[(sample_id@0, sample_id@0)], projection=[sample_id@0, data@2]
    CoalescePartitionsExec
      MetadataScanExec: snapshot=0, columns=[sample_id], partitions=1 of 1, slices=2
    CooperativeExec
      PayloadScanExec: caches=2, columns=[sample_id, data], partitions=2
",
    )
    .await;
    // a join filter over both sides is refused (correct, if not the fastest)
    assert_plan(
        &f.session,
        "SELECT m.sample_id, p.data FROM metadata m JOIN payloads p \
         ON m.cache_id = p.cache_id AND m.sample_id = p.sample_id AND p.raw_len > m.label",
        "
CooperativeExec
  HashJoinExec: mode=CollectLeft, join_type=Inner, on=[(cache_id@0, cache_id@0), (sample_id@1, sample_id@1)], filter=raw_len@1 > label@0, projection=[sample_id@1, data@6]
    CoalescePartitionsExec
      MetadataScanExec: snapshot=0, columns=[cache_id, sample_id, label], partitions=1 of 1, slices=2
    CooperativeExec
      PayloadScanExec: caches=2, columns=[cache_id, sample_id, raw_len, data], partitions=2
",
    )
    .await;
    // EXISTS plans to a semi join, which the rule leaves alone
    assert_plan(
        &f.session,
        "SELECT l.loss FROM losses l WHERE EXISTS (SELECT 1 FROM payloads p \
         WHERE p.cache_id = l.cache_id AND p.sample_id = l.sample_id)",
        "
CooperativeExec
  HashJoinExec: mode=CollectLeft, join_type=LeftSemi, on=[(cache_id@0, cache_id@0), (sample_id@1, sample_id@1)], projection=[loss@2]
    DataSourceExec: partitions=1, partition_sizes=[1]
    CooperativeExec
      PayloadScanExec: caches=2, columns=[cache_id, sample_id], partitions=2
",
    )
    .await;
}

#[tokio::test]
async fn a_limit_over_a_payload_join_still_limits_the_rows() {
    let f = fixture();
    let query = "SELECT m.sample_id, p.data FROM metadata m \
                 JOIN payloads p USING (cache_id, sample_id) LIMIT 3";
    assert_plan(
        &f.session,
        query,
        "
CoalescePartitionsExec: fetch=3
  LocalLimitExec: fetch=3
    ProjectionExec: expr=[sample_id@1 as sample_id, data@4 as data]
      PayloadTakeExec: caches=2, columns=[cache_id, sample_id, data], unmatched=Drop, concurrency=2, verify_checksums=true
        CoalescePartitionsExec
          MetadataScanExec: snapshot=0, columns=[cache_id, sample_id], partitions=1 of 1, slices=2
",
    )
    .await;
    let (_, batches) = f.session.sql(query).await.unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
}

// ---- the rule applied to hand-built plans ----------------------------------

/// `SELECT * FROM t JOIN payloads USING (cache_id, sample_id)` as the
/// `HashJoinExec` DataFusion plans for it, over a cache of 30 records: `t`
/// names each of them and one sample past the end. `wrap` goes around the
/// payload scan.
fn hand_built_join(
    wrap: impl Fn(Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan>,
) -> (tempfile::TempDir, Arc<dyn ExecutionPlan>) {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "alpha", 30, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let id = ds.caches()[0].id();
    let records = ds.caches()[0].records() as i64;
    let mut rows: Vec<(Option<i64>, Option<i64>, f64)> = (0..records)
        .map(|s| (Some(id), Some(s), s as f64))
        .collect();
    rows.push((Some(id), Some(records), -1.0));
    let (schema, batch) = losses(&rows);
    let left = MemorySourceConfig::try_new_exec(&[vec![batch]], schema, None).unwrap();
    let columns = vec![
        PayloadColumn::CacheId,
        PayloadColumn::SampleId,
        PayloadColumn::Data,
    ];
    let scan = Arc::new(PayloadScanExec::new(ds.cache_set(), columns, None, 2));
    let key = |name: &str, i: usize| Arc::new(Column::new(name, i)) as _;
    let on = vec![
        (key("cache_id", 0), key("cache_id", 0)),
        (key("sample_id", 1), key("sample_id", 1)),
    ];
    let join = HashJoinExec::try_new(
        left,
        wrap(scan),
        on,
        None,
        &JoinType::Inner,
        None,
        PartitionMode::CollectLeft,
        NullEquality::NullEqualsNothing,
        false,
    )
    .unwrap();
    (dir, Arc::new(join))
}

fn plan_text(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

#[tokio::test]
async fn the_rule_keeps_the_limit_a_join_carries() {
    let (_dir, join) = hand_built_join(|scan| scan);
    // LimitPushdown gives a join a fetch; with one partition nothing above
    // it limits again (`CoalescePartitionsExec: fetch` does with several)
    let join = join.with_fetch(Some(3)).expect("a hash join takes a fetch");
    let ctx = Arc::new(TaskContext::default());
    let plain = collect(join.clone(), ctx.clone()).await.unwrap();
    assert_eq!(plain.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    let rewritten = PayloadJoinRule
        .optimize(join, &ConfigOptions::default())
        .unwrap();
    let text = plan_text(&rewritten);
    assert!(text.contains("PayloadTakeExec"), "{text}");
    let rows: usize = collect(rewritten, ctx)
        .await
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(rows, 3, "the LIMIT was lost:\n{text}");
}

#[tokio::test]
async fn the_rule_sees_a_payload_scan_under_a_cooperative_wrapper() {
    // EnsureCooperative wraps every leaf that is not under a repartition:
    // with one partition (DATASETRT_THREADS=1, a one-core container) that
    // is the payload scan of every join
    let (_dir, join) = hand_built_join(|scan| Arc::new(CooperativeExec::new(scan)));
    let rewritten = PayloadJoinRule
        .optimize(join, &ConfigOptions::default())
        .unwrap();
    let text = plan_text(&rewritten);
    assert!(
        text.contains("PayloadTakeExec") && !text.contains("PayloadScanExec"),
        "every payload is read to join 31 rows:\n{text}"
    );
}

#[tokio::test]
async fn with_one_partition_a_payload_join_is_still_a_take() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "alpha", 30, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    // QuerySession's configuration at DATASETRT_THREADS=1
    let ctx = context(&ds, &ds.snapshot(), 1, true);
    let query = "EXPLAIN SELECT m.sample_id, p.data FROM metadata m \
                 JOIN payloads p USING (cache_id, sample_id) WHERE m.label = 1";
    let batches = ctx.sql(query).await.unwrap().collect().await.unwrap();
    let text = rows(&batches).join("\n");
    assert!(
        text.contains("PayloadTakeExec") && !text.contains("PayloadScanExec"),
        "{text}"
    );
}

#[tokio::test]
async fn a_sort_by_an_expression_sorts_by_a_column_computed_below_it() {
    let f = fixture();
    // DataFusion cannot tell how `sqrt` orders an input it cannot bound, so
    // the merge above a sort by `sqrt(label)` saw no order and the plan was
    // refused; sorted by a column, the merge knows
    assert_plan(
        &f.session,
        "SELECT sample_id FROM metadata ORDER BY sqrt(label) DESC, sample_id LIMIT 3",
        "
ProjectionExec: expr=[sample_id@0 as sample_id]
  SortPreservingMergeExec: [__drt_sort_key_0@1 DESC, sample_id@0 ASC NULLS LAST], fetch=3
    SortExec: TopK(fetch=3), expr=[__drt_sort_key_0@1 DESC, sample_id@0 ASC NULLS LAST], preserve_partitioning=[true]
      ProjectionExec: expr=[sample_id@0 as sample_id, drt_canonical(sqrt(CAST(label@1 AS Float64))) as __drt_sort_key_0]
        MetadataScanExec: snapshot=0, columns=[sample_id, label], partitions=1 of 1, slices=2
",
    )
    .await;
}

#[tokio::test]
async fn union_branches_ordered_for_different_reasons_are_sorted_again() {
    let f = fixture();
    // one branch is ordered by `split` (its two columns are equal), the
    // other by `split` with a constant: each skips the second key, and the
    // union knows neither reason
    assert_plan(
        &f.session,
        "SELECT split AS a, split AS b FROM metadata \
         UNION ALL SELECT split, 'x' FROM metadata ORDER BY 1, 2",
        "
SortPreservingMergeExec: [a@0 ASC NULLS LAST, b@1 ASC NULLS LAST]
  SortExec: expr=[a@0 ASC NULLS LAST, b@1 ASC NULLS LAST], preserve_partitioning=[true]
    UnionExec
      ProjectionExec: expr=[split@0 as a, split@0 as b]
        SortExec: expr=[split@0 ASC NULLS LAST], preserve_partitioning=[true]
          MetadataScanExec: snapshot=0, columns=[split], partitions=1 of 1, slices=2
      SortExec: expr=[a@0 ASC NULLS LAST], preserve_partitioning=[true]
        ProjectionExec: expr=[split@0 as a, CAST(x AS Utf8) as b]
          MetadataScanExec: snapshot=0, columns=[split], partitions=1 of 1, slices=2
",
    )
    .await;
}

// ---- differential: the rule on vs off ---------------------------------------

/// A context over `ds` like `QuerySession`'s, with or without the rule.
fn context(
    ds: &Dataset,
    snapshot: &Arc<datasetrt::Snapshot>,
    partitions: usize,
    rule: bool,
) -> SessionContext {
    let config = SessionConfig::new()
        .with_batch_size(BATCH_SIZE)
        .with_target_partitions(partitions);
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features();
    if rule {
        state = state.with_physical_optimizer_rule(Arc::new(PayloadJoinRule));
    }
    let ctx = SessionContext::new_with_state(state.build());
    let metadata = MetadataTable::new(snapshot.clone(), partitions);
    ctx.register_table("metadata", Arc::new(metadata)).unwrap();
    ctx.register_table(
        "payloads",
        Arc::new(PayloadsTable::new(ds.cache_set(), partitions)),
    )
    .unwrap();
    ctx
}

/// Every row of `batches` as text, one string per row.
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for batch in batches {
        let formatters: Vec<ArrayFormatter> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for i in 0..batch.num_rows() {
            let cells: Vec<String> = formatters.iter().map(|f| f.value(i).to_string()).collect();
            out.push(cells.join(" | "));
        }
    }
    out
}

/// Query templates (`{k}` is a random number per data set) and whether the
/// rule must fire on them (`false`: it must keep the hash join).
const TEMPLATES: &[(&str, bool)] = &[
    (
        "SELECT m.cache_id, m.sample_id, m.label, p.data FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id) WHERE m.label = 1",
        true,
    ),
    (
        "SELECT p.data, p.raw_len, p.codec, m.sample_id FROM payloads p JOIN metadata m \
         ON p.sample_id = m.sample_id AND p.cache_id = m.cache_id",
        true,
    ),
    (
        "SELECT l.cache_id, l.sample_id, l.loss, p.stored_len, p.raw_len, p.codec, p.checksum, \
         p.data FROM losses l LEFT JOIN payloads p USING (cache_id, sample_id)",
        true,
    ),
    (
        "SELECT l.loss, p.data FROM payloads p RIGHT JOIN losses l \
         ON p.cache_id = l.cache_id AND p.sample_id = l.sample_id",
        true,
    ),
    (
        "SELECT * FROM losses l JOIN payloads p USING (cache_id, sample_id)",
        true,
    ),
    (
        "SELECT m.sample_id, p.data FROM metadata m JOIN payloads p USING (cache_id, sample_id) \
         WHERE octet_length(CAST(p.data AS VARCHAR)) > {k}",
        true,
    ),
    (
        "SELECT m.cache_id, m.sample_id, p.codec FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id) WHERE p.codec = 'none' AND p.sample_id % 3 = 1",
        true,
    ),
    (
        "SELECT l.loss, p.raw_len FROM losses l JOIN payloads p USING (cache_id, sample_id) \
         WHERE p.sample_id < {k} AND p.raw_len > 10",
        true,
    ),
    (
        "SELECT count(*) FROM metadata m JOIN payloads p USING (cache_id, sample_id)",
        true,
    ),
    (
        "SELECT m.label, count(*), sum(octet_length(CAST(p.data AS VARCHAR))), sum(p.raw_len) \
         FROM metadata m JOIN payloads p USING (cache_id, sample_id) GROUP BY m.label",
        true,
    ),
    (
        "SELECT p.cache_id, p.sample_id, count(*) FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id) GROUP BY p.cache_id, p.sample_id",
        true,
    ),
    (
        "SELECT l.cache_id, count(p.data), sum(p.raw_len) FROM losses l \
         LEFT JOIN payloads p USING (cache_id, sample_id) GROUP BY l.cache_id",
        true,
    ),
    (
        "SELECT m.sample_id, l.loss, p.data FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id) JOIN losses l USING (cache_id, sample_id)",
        true,
    ),
    (
        "SELECT m.sample_id, p.raw_len, q.codec FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id) JOIN payloads q USING (cache_id, sample_id)",
        true,
    ),
    (
        "SELECT count(*) FROM (SELECT m.sample_id, p.data FROM metadata m \
         JOIN payloads p USING (cache_id, sample_id) LIMIT {k})",
        true,
    ),
    (
        "SELECT u.sample_id, p.raw_len FROM (SELECT cache_id, sample_id FROM metadata \
         WHERE label = 0 UNION ALL SELECT cache_id, sample_id FROM losses) u \
         JOIN payloads p USING (cache_id, sample_id)",
        true,
    ),
    (
        "SELECT p.cache_id, p.sample_id, l.loss FROM payloads p LEFT JOIN losses l \
         ON p.cache_id = l.cache_id AND p.sample_id = l.sample_id",
        false,
    ),
    (
        "SELECT p.cache_id, p.sample_id, l.loss FROM losses l \
         FULL JOIN payloads p USING (cache_id, sample_id)",
        false,
    ),
    (
        "SELECT l.loss, p.data FROM losses l LEFT JOIN \
         (SELECT * FROM payloads WHERE raw_len > {k}) p USING (cache_id, sample_id)",
        false,
    ),
    (
        "SELECT m.sample_id, p.raw_len FROM metadata m JOIN payloads p ON m.sample_id = p.sample_id",
        false,
    ),
    (
        "SELECT l.loss FROM losses l WHERE EXISTS (SELECT 1 FROM payloads p \
         WHERE p.cache_id = l.cache_id AND p.sample_id = l.sample_id)",
        false,
    ),
];

/// A random data set in `root`: 2-3 caches of 1-60 ASCII records (empty
/// ones too; ASCII because `octet_length` takes `data` cast to text) in random codecs over several shards, a population drawn with
/// repeats (and a random `label`), and `losses` naming stored samples,
/// unknown caches, samples past the end, negative and null ids, with
/// repeats. Returns the dataset, `losses` and a threshold `k`.
fn random_data(root: &Path, seed: u64) -> (Dataset, (SchemaRef, RecordBatch), i64) {
    let mut rng = crate::fuzz::Rng(seed);
    let letter = |rng: &mut crate::fuzz::Rng| b'a' + rng.below(26) as u8;
    for c in 0..2 + rng.below(2) {
        let options = WriterOptions {
            codec: [Codec::None, Codec::Zstd, Codec::Lz4][rng.below(3)],
            shard_target_bytes: 4096,
            threads: 1,
            ..WriterOptions::default()
        };
        let n = 1 + rng.below(60);
        let mut w = CacheWriter::create(root, &format!("c{c}"), options).unwrap();
        let (mut data, mut ends) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let len = [0, 1 + rng.below(12), rng.below(200), rng.below(3000)][rng.below(4)];
            let (repeat, first) = (rng.below(2) == 0, letter(&mut rng));
            for j in 0..len {
                data.push(if repeat {
                    b'a' + (first - b'a' + (j % 5) as u8) % 26
                } else {
                    letter(&mut rng)
                });
            }
            ends.push(data.len());
        }
        w.add_chunk(data, ends).unwrap();
        w.finish(attributes(n)).unwrap();
    }
    let ds = Dataset::open(&[root.to_path_buf()], OpenOptions::default()).unwrap();
    let stored: Vec<(i64, i64)> = ds
        .caches()
        .iter()
        .flat_map(|c| (0..c.records() as i64).map(move |s| (c.id(), s)))
        .collect();
    let picks: Vec<(i64, i64)> = (0..1 + rng.below(2 * stored.len()))
        .map(|_| stored[rng.below(stored.len())])
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::Int64, false),
        Field::new("label", DataType::Int64, false),
    ]));
    let population = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(picks.iter().map(|p| p.0))),
            Arc::new(Int64Array::from_iter_values(picks.iter().map(|p| p.1))),
            Arc::new(Int64Array::from_iter_values(
                picks.iter().map(|_| rng.below(3) as i64),
            )),
        ],
    )
    .unwrap();
    ds.update(&schema, &[population], "random population", None, false)
        .unwrap();
    let ids: Vec<i64> = ds.caches().iter().map(|c| c.id()).collect();
    let unknown = ids.iter().max().unwrap().wrapping_add(1);
    let losses: Vec<(Option<i64>, Option<i64>, f64)> = (0..1 + rng.below(40))
        .map(|i| {
            let (c, s) = stored[rng.below(stored.len())];
            let (c, s) = match rng.below(10) {
                0 => (Some(unknown), Some(s)),
                1 => (Some(c), Some(s + 1000)),
                2 => (Some(c), Some(-1 - s)),
                3 => (None, Some(s)),
                4 => (Some(c), None),
                _ => (Some(c), Some(s)),
            };
            (c, s, i as f64 / 4.0)
        })
        .collect();
    (ds, self::losses(&losses), 1 + rng.below(60) as i64)
}

#[tokio::test]
async fn the_rule_changes_no_result_on_random_tables() {
    pin_partitions();
    for seed in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let (ds, (schema, losses), k) = random_data(dir.path(), seed);
        let snapshot = ds.snapshot();
        let on = QuerySession::new(&snapshot, ds.cache_set()).unwrap();
        on.register("losses", schema.clone(), vec![losses.clone()])
            .unwrap();
        let off = context(&ds, &snapshot, PARTITIONS, false);
        let table = MemTable::try_new(schema, vec![vec![losses]]).unwrap();
        off.register_table("losses", Arc::new(table)).unwrap();
        // small tables plan collect-left joins; large ones partitioned
        // joins, forced here by a zero threshold
        for partitioned in [false, true] {
            if partitioned {
                let state = on.context().state_ref();
                let mut state = state.write();
                let optimizer = &mut state.config_mut().options_mut().optimizer;
                optimizer.hash_join_single_partition_threshold = 0;
                optimizer.hash_join_single_partition_threshold_rows = 0;
            }
            for (template, fires) in TEMPLATES {
                let query = template.replace("{k}", &k.to_string());
                let case = format!("seed {seed}, partitioned {partitioned}: {query}");
                let plan = physical_plan(&on, &query).await;
                if *fires {
                    assert!(
                        plan.contains("PayloadTakeExec") && !plan.contains("PayloadScanExec"),
                        "the rule did not fire ({case}):\n{plan}"
                    );
                } else {
                    assert!(
                        plan.contains("PayloadScanExec") && !plan.contains("PayloadTakeExec"),
                        "the rule fired where it must not ({case}):\n{plan}"
                    );
                    let mode = if partitioned {
                        "Partitioned"
                    } else {
                        "CollectLeft"
                    };
                    assert!(plan.contains(&format!("mode={mode}")), "{case}\n{plan}");
                }
                let (_, got) = on.sql(&query).await.unwrap();
                let expected = off.sql(&query).await.unwrap().collect().await.unwrap();
                let (mut got, mut expected) = (rows(&got), rows(&expected));
                got.sort();
                expected.sort();
                assert_eq!(got, expected, "{case}\n{plan}");
            }
        }
    }
}
