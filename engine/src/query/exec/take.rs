//! `PayloadTakeExec`: rows carrying `(cache_id, sample_id)` come in and leave
//! in input order with payload columns (`data`, or index columns such as
//! `raw_len`) read from the mapped caches. A row that names no stored sample
//! is an error, dropped or given nulls, as its [`Unmatched`] says.
//!
//! Per input batch it sorts the rows by (cache, sample), the order records
//! were written, and reads them in up to `concurrency` groups (index entry,
//! checksum verified, record decoded or referenced in place), then puts them
//! in input order. Partitions split `concurrency` between them (at least one
//! thread each). `execute()` does no I/O; dropping the stream cancels the
//! work that has not started.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::compute::{filter_record_batch, take};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use crate::store::take::binary_view_bytes;
pub use crate::store::take::{PayloadColumn, DATA_COLUMN};
use crate::store::CacheSet;
use crate::{Error, Result};

/// What becomes of an input row whose identity is not a stored sample
/// (an unknown cache, a sample id out of range, or a null).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmatched {
    /// An error naming the row: every row must be a stored sample (the
    /// loader's draws).
    Error,
    /// The row is left out, as an inner join with `payloads` does.
    Drop,
    /// The row stays, its payload columns null, as an outer join does.
    Null,
}

/// The custom DataFusion node that turns identities into payload bytes: rows
/// leave in input order with `columns` appended (see [`Unmatched`] for rows
/// that name no stored sample).
#[derive(Debug)]
pub struct PayloadTakeExec {
    input: Arc<dyn ExecutionPlan>,
    caches: CacheSet,
    /// Positions of the Int64 identity columns in the input.
    identity: (usize, usize),
    columns: Vec<PayloadColumn>,
    unmatched: Unmatched,
    concurrency: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PayloadTakeExec {
    /// Append `data` to an input with Int64 columns `cache_id` and `sample_id`.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        caches: CacheSet,
        concurrency: usize,
    ) -> Result<Self> {
        let schema = input.schema();
        let find = |name: &str| {
            schema.index_of(name).map_err(|_| {
                Error::invalid(format!(
                    "PayloadTakeExec needs a column {name:?} in its input"
                ))
            })
        };
        let identity = (find("cache_id")?, find("sample_id")?);
        Self::with_columns(
            input,
            caches,
            identity,
            vec![PayloadColumn::Data],
            Unmatched::Error,
            concurrency,
        )
    }

    /// Append `columns` to `input`, whose identity is in the Int64 columns at
    /// positions `identity = (cache_id, sample_id)`; rows that name no stored
    /// sample are treated as `unmatched` says.
    pub fn with_columns(
        input: Arc<dyn ExecutionPlan>,
        caches: CacheSet,
        identity: (usize, usize),
        columns: Vec<PayloadColumn>,
        unmatched: Unmatched,
        concurrency: usize,
    ) -> Result<Self> {
        let in_schema = input.schema();
        for i in [identity.0, identity.1] {
            match in_schema.fields().get(i) {
                Some(f) if *f.data_type() == DataType::Int64 => {}
                other => {
                    return Err(Error::invalid(format!(
                        "PayloadTakeExec needs Int64 identity columns, found {:?}",
                        other.map(|f| (f.name(), f.data_type()))
                    )))
                }
            }
        }
        let mut fields: Vec<Arc<Field>> = in_schema.fields().iter().cloned().collect();
        let nullable = unmatched == Unmatched::Null;
        fields.extend(
            columns
                .iter()
                .map(|c| Arc::new(c.field().with_nullable(nullable))),
        );
        let schema = Arc::new(Schema::new(fields));
        // Rows leave in input order, some dropped, none added, and the input's
        // columns keep their positions: what the input declares of them
        // (orderings, equal columns, constants, unique keys) still holds.
        // Of the appended columns, the payload's identity equals the input's
        // where unmatched rows are dropped (a NULL in its place is not equal):
        // an order by `p.cache_id` is an order by the input's `cache_id`.
        let mut equivalence = EquivalenceProperties::new(schema.clone())
            .extend(input.equivalence_properties().clone())?;
        if !nullable {
            for (at, column) in columns.iter().enumerate() {
                let of_input = match column {
                    PayloadColumn::CacheId => identity.0,
                    PayloadColumn::SampleId => identity.1,
                    _ => continue,
                };
                let appended = in_schema.fields().len() + at;
                equivalence.add_equal_conditions(
                    Arc::new(Column::new(schema.field(of_input).name(), of_input)),
                    Arc::new(Column::new(schema.field(appended).name(), appended)),
                )?;
            }
        }
        let properties = PlanProperties::new(
            equivalence,
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(PayloadTakeExec {
            input,
            caches,
            identity,
            columns,
            unmatched,
            concurrency: concurrency.max(1),
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    pub fn concurrency(&self) -> usize {
        self.concurrency
    }
}

impl DisplayAs for PayloadTakeExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name()).collect();
        if let DisplayFormatType::TreeRender = t {
            writeln!(f, "caches={}", self.caches.len())?;
            writeln!(f, "columns=[{}]", names.join(", "))?;
            writeln!(f, "unmatched={:?}", self.unmatched)?;
            return writeln!(f, "concurrency={}", self.concurrency);
        }
        write!(
            f,
            "PayloadTakeExec: caches={}, columns=[{}], unmatched={:?}, concurrency={}, \
             verify_checksums=true",
            self.caches.len(),
            names.join(", "),
            self.unmatched,
            self.concurrency
        )
    }
}

/// What every batch of one partition's stream needs.
struct PartitionTake {
    caches: CacheSet,
    identity: (usize, usize),
    columns: Arc<[PayloadColumn]>,
    unmatched: Unmatched,
    concurrency: usize,
    schema: SchemaRef,
    baseline: BaselineMetrics,
    bytes: Count,
    read_time: Time,
}

impl PartitionTake {
    async fn batch(self: Arc<Self>, batch: RecordBatch) -> DfResult<RecordBatch> {
        let compute = self.baseline.elapsed_compute().timer();
        let timer = self.read_time.timer();
        // Under a join, rows naming no stored sample are left out first; an
        // outer join puts them back below with null payload columns.
        let stored = match self.unmatched {
            Unmatched::Error => None,
            Unmatched::Drop | Unmatched::Null => {
                Some(stored_mask(&batch, self.identity, &self.caches))
            }
        };
        let matched = match &stored {
            Some(mask) if mask.true_count() < batch.num_rows() => {
                filter_record_batch(&batch, mask)?
            }
            _ => batch.clone(),
        };
        let cache_ids = column_i64(&matched, self.identity.0)?;
        let sample_ids = column_i64(&matched, self.identity.1)?;
        let this = self.clone();
        let mut added = tokio::task::spawn_blocking(move || {
            this.caches
                .payload_columns(&cache_ids, &sample_ids, &this.columns, this.concurrency)
        })
        .await
        .map_err(|e| {
            DataFusionError::from(Error::internal(format!("payload read task failed: {e}")))
        })??;
        for (c, a) in self.columns.iter().zip(&added) {
            if *c == PayloadColumn::Data {
                self.bytes.add(binary_view_bytes(a.as_ref()));
            }
        }
        let base = match (self.unmatched, &stored) {
            (Unmatched::Null, Some(mask)) if mask.true_count() < batch.num_rows() => {
                // row i takes added row k (its rank among the stored), or null
                let mut k = 0u32;
                let at: UInt32Array = mask
                    .iter()
                    .map(|stored| {
                        stored.unwrap_or(false).then(|| {
                            k += 1;
                            k - 1
                        })
                    })
                    .collect();
                added = added
                    .iter()
                    .map(|a| take(a.as_ref(), &at, None))
                    .collect::<std::result::Result<_, _>>()?;
                batch
            }
            _ => matched,
        };
        self.baseline.record_output(base.num_rows());
        timer.done();
        let mut all: Vec<ArrayRef> = base.columns().to_vec();
        all.extend(added);
        let out = RecordBatch::try_new(self.schema.clone(), all)?;
        compute.done();
        Ok(out)
    }
}

/// Which rows name a stored sample: both identity values present, a cache
/// of this dataset, a sample id in its range.
fn stored_mask(batch: &RecordBatch, identity: (usize, usize), caches: &CacheSet) -> BooleanArray {
    let cache_ids = batch.column(identity.0).as_primitive::<Int64Type>();
    let sample_ids = batch.column(identity.1).as_primitive::<Int64Type>();
    let mut hint = 0usize;
    cache_ids
        .iter()
        .zip(sample_ids.iter())
        .map(|(cid, sid)| match (cid, sid) {
            (Some(cid), Some(sid)) => Some(caches.holds(cid, sid, &mut hint)),
            _ => Some(false),
        })
        .collect()
}

fn column_i64(batch: &RecordBatch, index: usize) -> DfResult<Arc<[i64]>> {
    let col = batch.column(index);
    if col.null_count() > 0 {
        let name = batch.schema().field(index).name().clone();
        return Err(Error::invalid(format!(
            "column {name:?} has nulls; every row needs an identity"
        ))
        .into());
    }
    Ok(col.as_primitive::<Int64Type>().values().to_vec().into())
}

impl ExecutionPlan for PayloadTakeExec {
    fn name(&self) -> &'static str {
        "PayloadTakeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    /// The default `replace_children` calls this, whatever its options.
    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "PayloadTakeExec takes one child".into(),
            ));
        }
        Ok(Arc::new(PayloadTakeExec::with_columns(
            children.swap_remove(0),
            self.caches.clone(),
            self.identity,
            self.columns.clone(),
            self.unmatched,
            self.concurrency,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        // Partitions run at once: they split `concurrency`, one thread at least.
        let partitions = self.properties.output_partitioning().partition_count();
        let take = Arc::new(PartitionTake {
            caches: self.caches.clone(),
            identity: self.identity,
            columns: self.columns.clone().into(),
            unmatched: self.unmatched,
            concurrency: self.concurrency.div_ceil(partitions.max(1)).max(1),
            schema: self.schema.clone(),
            baseline: BaselineMetrics::new(&self.metrics, partition),
            bytes: MetricBuilder::new(&self.metrics).counter("payload_bytes", partition),
            read_time: MetricBuilder::new(&self.metrics).subset_time("read_time", partition),
        });
        let stream = input.then(move |batch| {
            let take = take.clone();
            async move { take.batch(batch?).await }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    /// The input's row count: exact unless unmatched rows are dropped.
    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        let rows = match (input_stats.first(), self.unmatched) {
            (None, _) => Precision::Absent,
            (Some(input), Unmatched::Error | Unmatched::Null) => input.num_rows,
            (Some(input), Unmatched::Drop) => input.num_rows.to_inexact(),
        };
        Ok(Arc::new(
            Statistics::new_unknown(&self.schema).with_num_rows(rows),
        ))
    }
}
