//! `PayloadTakeExec`: rows carrying `(cache_id, sample_id)` come in, the same
//! rows leave, in the same order, with a `data` column read from the mapped
//! shards.
//!
//! Per input batch it looks up every index entry, sorts the addresses by
//! (cache, shard, offset) for locality, reads them in up to `concurrency`
//! groups on the blocking pool (checksums verified, records decoded), and
//! restores input order. `execute()` does no I/O; dropping the stream cancels
//! the work that has not started.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, LargeBinaryArray, RecordBatch};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::StreamExt;

use crate::store::Cache;
use crate::{Error, Result};

/// Name of the payload column the node appends.
pub const DATA_COLUMN: &str = "data";

/// Rows below which a batch is read in one group (splitting costs more).
const MIN_ROWS_PER_GROUP: usize = 32;

/// Decoded payloads of a list of `(cache_id, sample_id)`, in input order.
pub fn take_payloads(
    caches: &[Arc<Cache>],
    cache_ids: &[i64],
    sample_ids: &[i64],
    concurrency: usize,
) -> Result<LargeBinaryArray> {
    let groups = plan_groups(caches, cache_ids, sample_ids, concurrency)?;
    let parts = groups
        .into_iter()
        .map(|g| read_group(caches, g))
        .collect::<Result<Vec<_>>>()?;
    Ok(assemble(cache_ids.len(), parts))
}

/// One group of reads: (input position, cache position, sample id), sorted by address.
type Group = Vec<(u32, u32, u64)>;

/// One group's output: the decoded bytes and, per read, (input position, start, end).
struct GroupOutput {
    bytes: Vec<u8>,
    spans: Vec<(u32, usize, usize)>,
}

fn plan_groups(
    caches: &[Arc<Cache>],
    cache_ids: &[i64],
    sample_ids: &[i64],
    concurrency: usize,
) -> Result<Vec<Group>> {
    let mut addrs: Vec<(u32, u32, u64, u64)> = Vec::with_capacity(cache_ids.len());
    let mut pos = 0usize;
    for (i, (&cid, &sid)) in cache_ids.iter().zip(sample_ids).enumerate() {
        if caches.get(pos).map(|c| c.id()) != Some(cid) {
            pos = caches.binary_search_by_key(&cid, |c| c.id()).map_err(|_| {
                Error::invalid(format!(
                    "row {i}: cache_id {cid} is not a cache of this dataset"
                ))
            })?;
        }
        let sample = u64::try_from(sid)
            .map_err(|_| Error::invalid(format!("row {i}: sample_id {sid} is negative")))?;
        let entry = caches[pos].entry(sample)?;
        addrs.push((pos as u32, entry.shard, entry.offset, sample));
    }
    let mut order: Vec<u32> = (0..addrs.len() as u32).collect();
    order.sort_unstable_by_key(|&i| {
        let (c, s, o, _) = addrs[i as usize];
        (c, s, o)
    });
    let n = order.len();
    let groups = concurrency
        .max(1)
        .min(n.div_ceil(MIN_ROWS_PER_GROUP))
        .max(1);
    let per = n.div_ceil(groups).max(1);
    Ok(order
        .chunks(per)
        .map(|chunk| {
            chunk
                .iter()
                .map(|&i| (i, addrs[i as usize].0, addrs[i as usize].3))
                .collect()
        })
        .collect())
}

fn read_group(caches: &[Arc<Cache>], group: Group) -> Result<GroupOutput> {
    let mut out = GroupOutput {
        bytes: Vec::new(),
        spans: Vec::with_capacity(group.len()),
    };
    for (input, cache, sample) in group {
        let start = out.bytes.len();
        caches[cache as usize].read_into(sample, &mut out.bytes, true)?;
        out.spans.push((input, start, out.bytes.len()));
    }
    Ok(out)
}

fn assemble(rows: usize, parts: Vec<GroupOutput>) -> LargeBinaryArray {
    let mut where_: Vec<(u32, u32)> = vec![(0, 0); rows]; // (part, span index)
    let mut total = 0usize;
    for (p, part) in parts.iter().enumerate() {
        for (k, &(input, start, end)) in part.spans.iter().enumerate() {
            where_[input as usize] = (p as u32, k as u32);
            total += end - start;
        }
    }
    let mut values = Vec::with_capacity(total);
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0i64);
    for &(p, k) in &where_ {
        let part = &parts[p as usize];
        let (_, start, end) = part.spans[k as usize];
        values.extend_from_slice(&part.bytes[start..end]);
        offsets.push(values.len() as i64);
    }
    LargeBinaryArray::new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Buffer::from_vec(values),
        None,
    )
}

/// Output schema: the input's fields plus a non-null `data` column.
pub fn take_schema(input: &Schema) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = input.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(
        DATA_COLUMN,
        DataType::LargeBinary,
        false,
    )));
    Arc::new(Schema::new(fields))
}

/// The custom DataFusion node that turns identities into payload bytes.
#[derive(Debug)]
pub struct PayloadTakeExec {
    input: Arc<dyn ExecutionPlan>,
    caches: Arc<[Arc<Cache>]>,
    concurrency: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PayloadTakeExec {
    /// `input` must have Int64 columns `cache_id` and `sample_id`; `caches`
    /// sorted by id.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        caches: Arc<[Arc<Cache>]>,
        concurrency: usize,
    ) -> Result<Self> {
        let in_schema = input.schema();
        for name in ["cache_id", "sample_id"] {
            match in_schema.field_with_name(name) {
                Ok(f) if *f.data_type() == DataType::Int64 => {}
                _ => {
                    return Err(Error::invalid(format!(
                        "PayloadTakeExec needs an Int64 column {name:?} in its input"
                    )))
                }
            }
        }
        let schema = take_schema(&in_schema);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(PayloadTakeExec {
            input,
            caches,
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
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "PayloadTakeExec: caches={}, concurrency={}, verify_checksums=true",
            self.caches.len(),
            self.concurrency
        )
    }
}

struct TakeMetrics {
    rows: Count,
    bytes: Count,
    read_time: Time,
}

async fn take_batch(
    batch: RecordBatch,
    caches: Arc<[Arc<Cache>]>,
    concurrency: usize,
    metrics: &TakeMetrics,
) -> DfResult<RecordBatch> {
    let timer = metrics.read_time.timer();
    let cache_ids = column_i64(&batch, "cache_id")?;
    let sample_ids = column_i64(&batch, "sample_id")?;
    let groups = plan_groups(&caches, &cache_ids, &sample_ids, concurrency)?;
    let handles: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let caches = caches.clone();
            tokio::task::spawn_blocking(move || read_group(&caches, g))
        })
        .collect();
    let mut parts = Vec::with_capacity(handles.len());
    for h in handles {
        let part = h
            .await
            .map_err(|e| DataFusionError::Execution(format!("payload read task failed: {e}")))??;
        parts.push(part);
    }
    let data = assemble(batch.num_rows(), parts);
    metrics.rows.add(batch.num_rows());
    metrics.bytes.add(data.values().len());
    timer.done();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(data));
    Ok(RecordBatch::try_new(take_schema(&batch.schema()), columns)?)
}

fn column_i64(batch: &RecordBatch, name: &str) -> DfResult<Arc<[i64]>> {
    let col = batch.column_by_name(name).ok_or_else(|| {
        DataFusionError::Execution(format!("PayloadTakeExec input lost column {name:?}"))
    })?;
    if col.null_count() > 0 {
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

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "PayloadTakeExec takes one child".into(),
            ));
        }
        Ok(Arc::new(PayloadTakeExec::try_new(
            children.swap_remove(0),
            self.caches.clone(),
            self.concurrency,
        )?))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let metrics = Arc::new(TakeMetrics {
            rows: MetricBuilder::new(&self.metrics).output_rows(partition),
            bytes: MetricBuilder::new(&self.metrics).counter("payload_bytes", partition),
            read_time: MetricBuilder::new(&self.metrics).subset_time("read_time", partition),
        });
        let caches = self.caches.clone();
        let concurrency = self.concurrency;
        let stream = input.then(move |batch| {
            let caches = caches.clone();
            let metrics = metrics.clone();
            async move { take_batch(batch?, caches, concurrency, &metrics).await }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
