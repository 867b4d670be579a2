//! `PayloadScanExec`: every stored sample of the `payloads` table, cache by
//! cache, reading payload bytes only when `data` is selected.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;

use super::take::PayloadColumn;
use crate::store::CacheSet;

/// Rows per batch of a full `payloads` scan.
const SCAN_BATCH: usize = 8192;

pub(crate) fn schema_of(columns: &[PayloadColumn]) -> SchemaRef {
    Arc::new(Schema::new(
        columns.iter().map(|c| c.field()).collect::<Vec<_>>(),
    ))
}

/// A scan of every stored sample (one partition, cache by cache).
#[derive(Debug)]
pub struct PayloadScanExec {
    pub(super) caches: CacheSet,
    columns: Vec<PayloadColumn>,
    limit: Option<usize>,
    pub(super) concurrency: usize,
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
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema_of(&columns)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        PayloadScanExec {
            caches,
            columns,
            limit,
            concurrency,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    pub fn columns(&self) -> &[PayloadColumn] {
        &self.columns
    }
}

impl DisplayAs for PayloadScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name()).collect();
        write!(
            f,
            "PayloadScanExec: caches={}, columns=[{}]",
            self.caches.len(),
            names.join(", ")
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

    fn replace_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "PayloadScanExec has one partition, not {partition}"
            )));
        }
        let rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let bytes = MetricBuilder::new(&self.metrics).counter("payload_bytes", partition);
        let total: usize = self.caches.iter().map(|c| c.records() as usize).sum();
        let end = self.limit.map_or(total, |l| l.min(total));
        let mut chunks = Vec::new(); // (cache position, first sample, count)
        let mut seen = 0usize;
        for (pos, cache) in self.caches.iter().enumerate() {
            let mut start = 0u64;
            while start < cache.records() && seen < end {
                let n = (cache.records() - start)
                    .min(SCAN_BATCH as u64)
                    .min((end - seen) as u64);
                chunks.push((pos, start, n));
                start += n;
                seen += n as usize;
            }
        }
        let caches = self.caches.clone();
        let columns = self.columns.clone();
        let schema = schema_of(&columns);
        let concurrency = self.concurrency;
        let out_schema = schema.clone();
        let stream = futures::stream::iter(chunks).map(move |(pos, start, n)| {
            let id = caches[pos].id();
            let cache_ids = vec![id; n as usize];
            let sample_ids: Vec<i64> = (start as i64..(start + n) as i64).collect();
            let arrays: Vec<ArrayRef> =
                caches.payload_columns(&cache_ids, &sample_ids, &columns, concurrency)?;
            rows.add(n as usize);
            for (c, a) in columns.iter().zip(&arrays) {
                if *c == PayloadColumn::Data {
                    bytes.add(crate::store::take::binary_view_bytes(a.as_ref()));
                }
            }
            // `count(*)` projects no column: the batch still has n rows
            let options = RecordBatchOptions::new().with_row_count(Some(n as usize));
            Ok(RecordBatch::try_new_with_options(
                out_schema.clone(),
                arrays,
                &options,
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
