//! `PayloadScanExec`: every stored sample of the `payloads` table, reading
//! payload bytes only when `data` is selected. The samples are cut into
//! chunks of up to `SCAN_BATCH` records of one cache, dealt to partitions in
//! turn, and each chunk is read on the blocking pool, never on an async worker.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{
    EquivalenceProperties, Partitioning, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, StatisticsArgs,
};
use futures::StreamExt;

use super::take::PayloadColumn;
use crate::store::CacheSet;
use crate::Error;

/// Rows per batch of a full `payloads` scan.
const SCAN_BATCH: usize = 8192;

/// Payload bytes per batch when `data` is read: every partition decodes one
/// chunk at a time, so this bounds the scan's memory per partition.
const SCAN_BYTES: u64 = 64 << 20;

pub(crate) fn schema_of(columns: &[PayloadColumn]) -> SchemaRef {
    Arc::new(Schema::new(
        columns.iter().map(|c| c.field()).collect::<Vec<_>>(),
    ))
}

/// A scan of every stored sample, in partitions of whole chunks.
#[derive(Debug)]
pub struct PayloadScanExec {
    pub(super) caches: CacheSet,
    columns: Vec<PayloadColumn>,
    limit: Option<usize>,
    pub(super) concurrency: usize,
    /// (cache position, first sample, count), in cache and sample order.
    chunks: Arc<[(usize, u64, u64)]>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PayloadScanExec {
    pub fn new(
        caches: CacheSet,
        columns: Vec<PayloadColumn>,
        limit: Option<usize>,
        concurrency: usize,
    ) -> Self {
        let total: u64 = caches.iter().map(|c| c.records()).sum();
        let end = limit.map_or(total, |l| (l as u64).min(total));
        let mut chunks = Vec::new();
        let mut seen = 0u64;
        let reads_data = columns.contains(&PayloadColumn::Data);
        for (pos, cache) in caches.iter().enumerate() {
            // decoded bytes per record: the stored mean, four times that compressed
            let stored = cache.manifest().shard_bytes.iter().sum::<u64>() / cache.records().max(1);
            let decoded = if cache.manifest().codec == crate::store::Codec::None {
                stored
            } else {
                stored * 4
            };
            let per_chunk = match reads_data {
                true => (SCAN_BYTES / decoded.max(1)).clamp(1, SCAN_BATCH as u64),
                false => SCAN_BATCH as u64,
            };
            let mut start = 0u64;
            while start < cache.records() && seen < end {
                let n = (cache.records() - start).min(per_chunk).min(end - seen);
                chunks.push((pos, start, n));
                start += n;
                seen += n;
            }
        }
        // a LIMIT reads its first rows in order, from one partition
        let partitions = match limit {
            Some(_) => 1,
            None => concurrency.min(chunks.len()).max(1),
        };
        // Each partition delivers its chunks in (cache_id, sample_id) order
        // (caches are sorted by id): an ORDER BY on them merges, not sorts.
        let position = |c: PayloadColumn| columns.iter().position(|&x| x == c);
        let ordering: Vec<PhysicalSortExpr> = match position(PayloadColumn::CacheId) {
            Some(cid) => {
                let mut keys = vec![cid];
                keys.extend(position(PayloadColumn::SampleId));
                keys.into_iter()
                    .map(|i| {
                        PhysicalSortExpr::new_default(Arc::new(Column::new(columns[i].name(), i)))
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        let equivalence = match ordering.is_empty() {
            true => EquivalenceProperties::new(schema_of(&columns)),
            false => EquivalenceProperties::new_with_orderings(schema_of(&columns), [ordering]),
        };
        let properties = PlanProperties::new(
            equivalence,
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        PayloadScanExec {
            caches,
            columns,
            limit,
            concurrency,
            chunks: chunks.into(),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    pub fn columns(&self) -> &[PayloadColumn] {
        &self.columns
    }

    fn partitions(&self) -> usize {
        self.properties.output_partitioning().partition_count()
    }

    /// Rows partition `p` (or all partitions) delivers.
    fn rows(&self, partition: Option<usize>) -> u64 {
        let parts = self.partitions();
        self.chunks
            .iter()
            .enumerate()
            .filter(|(i, _)| partition.is_none_or(|p| i % parts == p))
            .map(|(_, &(_, _, n))| n)
            .sum()
    }
}

impl DisplayAs for PayloadScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name()).collect();
        if let DisplayFormatType::TreeRender = t {
            writeln!(f, "caches={}", self.caches.len())?;
            writeln!(f, "columns=[{}]", names.join(", "))?;
            writeln!(f, "partitions={}", self.partitions())?;
            if let Some(l) = self.limit {
                writeln!(f, "limit={l}")?;
            }
            return Ok(());
        }
        write!(
            f,
            "PayloadScanExec: caches={}, columns=[{}], partitions={}",
            self.caches.len(),
            names.join(", "),
            self.partitions()
        )?;
        if let Some(l) = self.limit {
            write!(f, ", limit={l}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for PayloadScanExec {
    fn name(&self) -> &'static str {
        "PayloadScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    /// Exact: the index says how many records each chunk holds.
    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        let rows = usize::try_from(self.rows(args.partition())).unwrap_or(usize::MAX);
        Ok(Arc::new(
            Statistics::new_unknown(&schema_of(&self.columns))
                .with_num_rows(Precision::Exact(rows)),
        ))
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let parts = self.partitions();
        if partition >= parts {
            return Err(DataFusionError::Internal(format!(
                "PayloadScanExec has {parts} partitions, not {}",
                partition + 1
            )));
        }
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let bytes = MetricBuilder::new(&self.metrics).counter("payload_bytes", partition);
        let mine: Vec<(usize, u64, u64)> = self
            .chunks
            .iter()
            .skip(partition)
            .step_by(parts)
            .copied()
            .collect();
        let caches = self.caches.clone();
        let columns: Arc<[PayloadColumn]> = self.columns.clone().into();
        let schema = schema_of(&columns);
        // partitions run at once: they split the read threads
        let concurrency = self.concurrency.div_ceil(parts).max(1);
        let out_schema = schema.clone();
        let stream = futures::stream::iter(mine).then(move |(pos, start, n)| {
            let (caches, columns, schema) = (caches.clone(), columns.clone(), out_schema.clone());
            let (baseline, bytes) = (baseline.clone(), bytes.clone());
            async move {
                let timer = baseline.elapsed_compute().timer();
                let read = tokio::task::spawn_blocking(move || {
                    let id = caches[pos].id();
                    let cache_ids = vec![id; n as usize];
                    let sample_ids: Vec<i64> = (start as i64..(start + n) as i64).collect();
                    caches.payload_columns(&cache_ids, &sample_ids, &columns, concurrency)
                });
                let arrays: Vec<ArrayRef> = read.await.map_err(|e| {
                    DataFusionError::from(Error::internal(format!("payload scan task failed: {e}")))
                })??;
                for a in &arrays {
                    if a.data_type() == &arrow::datatypes::DataType::BinaryView {
                        bytes.add(crate::store::take::binary_view_bytes(a.as_ref()));
                    }
                }
                // `count(*)` projects no column: the batch still has n rows
                let options = RecordBatchOptions::new().with_row_count(Some(n as usize));
                let batch = RecordBatch::try_new_with_options(schema, arrays, &options)?;
                baseline.record_output(batch.num_rows());
                timer.done();
                Ok(batch)
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
