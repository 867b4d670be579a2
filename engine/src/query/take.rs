//! `PayloadTakeExec`: rows carrying `(cache_id, sample_id)` come in, the same
//! rows leave, in the same order, with a `data` column read from the mapped
//! shards.
//!
//! Per input batch it looks up every index entry, sorts the addresses by
//! (cache, shard, offset) for locality, and reads them in up to `concurrency`
//! groups (checksums verified, records decoded) straight into their places in
//! input order. `execute()` does no I/O; dropping the stream cancels
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

use crate::store::{Cache, IndexEntry};
use crate::{Error, Result};

/// Name of the payload column the node appends.
pub const DATA_COLUMN: &str = "data";

/// Splitting a batch over threads only pays off for large reads: every group
/// holds at least this many rows and this many payload bytes.
const MIN_ROWS_PER_GROUP: usize = 32;
const MIN_BYTES_PER_GROUP: usize = 4 << 20;

/// Decoded payloads of a list of `(cache_id, sample_id)`, in input order.
///
/// Index entries are read first, so every payload's size is known: the output
/// buffer is allocated once and each record is decoded straight into its final
/// place. Reads are sorted by (cache, shard, offset) for locality and split
/// into up to `concurrency` groups that run on scoped threads.
pub fn take_payloads(
    caches: &[Arc<Cache>],
    cache_ids: &[i64],
    sample_ids: &[i64],
    concurrency: usize,
) -> Result<LargeBinaryArray> {
    let n = cache_ids.len();
    let mut reads: Vec<Read> = Vec::with_capacity(n);
    let mut offsets: Vec<i64> = Vec::with_capacity(n + 1);
    offsets.push(0);
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
        offsets.push(offsets[i] + entry.raw_len as i64);
        reads.push(Read {
            cache: pos as u32,
            sample,
            entry,
        });
    }
    let total = offsets[n] as usize;
    let mut values = vec![0u8; total];

    // One output slice per row, in input order, then grouped in address order.
    let mut slices: Vec<Option<&mut [u8]>> = Vec::with_capacity(n);
    let mut rest: &mut [u8] = &mut values;
    for r in &reads {
        let (head, tail) = rest.split_at_mut(r.entry.raw_len as usize);
        slices.push(Some(head));
        rest = tail;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by_key(|&i| (reads[i].cache, reads[i].entry.shard, reads[i].entry.offset));
    let groups = concurrency
        .min(n.div_ceil(MIN_ROWS_PER_GROUP))
        .min(total.div_ceil(MIN_BYTES_PER_GROUP))
        .max(1);
    let per = n.div_ceil(groups).max(1);
    let mut work: Vec<Vec<(&Read, &mut [u8])>> = order
        .chunks(per)
        .map(|chunk| {
            chunk
                .iter()
                .map(|&i| (&reads[i], slices[i].take().expect("each row once")))
                .collect()
        })
        .collect();
    let run = |group: Vec<(&Read, &mut [u8])>| -> Result<()> {
        for (r, out) in group {
            caches[r.cache as usize].read_entry(r.sample, &r.entry, out, true)?;
        }
        Ok(())
    };
    if work.len() <= 1 {
        work.pop().map_or(Ok(()), run)?;
    } else {
        std::thread::scope(|scope| {
            let last = work.pop().expect("several groups");
            let handles: Vec<_> = work.into_iter().map(|g| scope.spawn(|| run(g))).collect();
            let mut result = run(last);
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(Error::invalid("payload read thread panicked")));
                result = result.and(r);
            }
            result
        })?;
    }
    Ok(LargeBinaryArray::new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Buffer::from_vec(values),
        None,
    ))
}

/// One record to read: where it is and how it is stored.
struct Read {
    cache: u32,
    sample: u64,
    entry: IndexEntry,
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
    let data = tokio::task::spawn_blocking(move || {
        take_payloads(&caches, &cache_ids, &sample_ids, concurrency)
    })
    .await
    .map_err(|e| DataFusionError::Execution(format!("payload read task failed: {e}")))??;
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
