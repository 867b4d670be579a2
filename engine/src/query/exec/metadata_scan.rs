//! `MetadataScanExec`: rows of a snapshot (table `metadata`). Each plan
//! partition is one slice of a snapshot partition; its columns are mapped
//! and checked when that plan partition runs, not when the query is
//! planned (an `EXPLAIN`, or a partition a `LIMIT` never reaches, maps
//! nothing). The node is described by a recipe — the snapshot's directory
//! and number, the columns, the slices — so another process (a worker of a
//! distributed query) opens the snapshot itself rather than receiving rows.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, StatisticsArgs,
};
use futures::StreamExt;

use crate::catalog::Snapshot;
use crate::Error;

/// Rows `start .. start + len` of snapshot partition `part` (`len` 0: an
/// empty plan partition, which pads a task's list to its peers' length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub part: usize,
    pub start: usize,
    pub len: usize,
}

impl Slice {
    /// No rows: pads a task's list of slices.
    pub const EMPTY: Slice = Slice {
        part: 0,
        start: 0,
        len: 0,
    };
}

/// The columns `columns` of `slices` of a snapshot, one plan partition per
/// slice.
#[derive(Debug)]
pub struct MetadataScanExec {
    snapshot: Arc<Snapshot>,
    columns: Vec<usize>,
    slices: Vec<Slice>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl MetadataScanExec {
    /// `slices` of `snapshot` (at least one partition: none gives one empty
    /// slice).
    pub fn new(
        snapshot: Arc<Snapshot>,
        columns: Vec<usize>,
        mut slices: Vec<Slice>,
    ) -> DfResult<Self> {
        if slices.is_empty() {
            slices.push(Slice::EMPTY);
        }
        if let Some(bad) = slices.iter().find(|s| {
            s.len > 0
                && (s.part >= snapshot.num_partitions()
                    || s.start + s.len > snapshot.partition_rows(s.part))
        }) {
            return Err(DataFusionError::Plan(format!(
                "slice {bad:?} is not within snapshot {}",
                snapshot.number()
            )));
        }
        let schema = Arc::new(snapshot.schema().project(&columns)?);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(slices.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(MetadataScanExec {
            snapshot,
            columns,
            slices,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The whole of snapshot partitions `parts`, each cut into equal slices
    /// so that there are at least `partitions` plan partitions.
    pub fn slices_of(snapshot: &Snapshot, parts: &[usize], partitions: usize) -> Vec<Slice> {
        let pieces = partitions.max(1).div_ceil(parts.len().max(1));
        let mut slices = Vec::new();
        for &part in parts {
            let rows = snapshot.partition_rows(part);
            let per = rows.div_ceil(pieces).max(1);
            slices.extend((0..rows).step_by(per).map(|start| Slice {
                part,
                start,
                len: per.min(rows - start),
            }));
        }
        slices
    }

    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snapshot
    }

    /// Where the snapshot is: its directory and number.
    pub fn snapshot_at(&self) -> (PathBuf, u64) {
        let dir = self
            .snapshot
            .path()
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default();
        (dir, self.snapshot.number())
    }

    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    pub fn slices(&self) -> &[Slice] {
        &self.slices
    }

    /// The same scan with its slices dealt in turn to `tasks` tasks, each
    /// list padded with empty slices to the longest (the tasks of a stage
    /// have equally many partitions).
    pub fn spread(&self, tasks: usize) -> DfResult<Vec<MetadataScanExec>> {
        let tasks = tasks.max(1);
        let longest = self.slices.len().div_ceil(tasks);
        (0..tasks)
            .map(|t| {
                let mut mine: Vec<Slice> =
                    self.slices.iter().skip(t).step_by(tasks).copied().collect();
                mine.resize(longest, Slice::EMPTY);
                MetadataScanExec::new(self.snapshot.clone(), self.columns.clone(), mine)
            })
            .collect()
    }

    fn rows(&self, partition: Option<usize>) -> usize {
        match partition {
            Some(p) => self.slices.get(p).map_or(0, |s| s.len),
            None => self.slices.iter().map(|s| s.len).sum(),
        }
    }
}

impl DisplayAs for MetadataScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<String> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let mut parts: Vec<usize> = self
            .slices
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| s.part)
            .collect();
        parts.dedup();
        if let DisplayFormatType::TreeRender = t {
            writeln!(f, "snapshot={}", self.snapshot.number())?;
            writeln!(f, "columns=[{}]", names.join(", "))?;
            return writeln!(f, "partitions={}", parts.len());
        }
        write!(
            f,
            "MetadataScanExec: snapshot={}, columns=[{}], partitions={} of {}, slices={}",
            self.snapshot.number(),
            names.join(", "),
            parts.len(),
            self.snapshot.num_partitions(),
            self.slices.len()
        )
    }
}

impl ExecutionPlan for MetadataScanExec {
    fn name(&self) -> &'static str {
        "MetadataScanExec"
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

    /// Exact: the manifest says how many rows each partition holds.
    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        Ok(Arc::new(
            Statistics::new_unknown(&self.schema)
                .with_num_rows(Precision::Exact(self.rows(args.partition()))),
        ))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let Some(&slice) = self.slices.get(partition) else {
            return Err(DataFusionError::Internal(format!(
                "MetadataScanExec has {} partitions, not {}",
                self.slices.len(),
                partition + 1
            )));
        };
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (snapshot, columns, schema) = (
            self.snapshot.clone(),
            self.columns.clone(),
            self.schema.clone(),
        );
        let read = async move {
            let timer = baseline.elapsed_compute().timer();
            // mapping and checking the columns is file I/O: off the async workers
            let arrays = tokio::task::spawn_blocking(move || match slice.len {
                0 => Ok(None),
                _ => snapshot.partition_columns(slice.part, &columns).map(Some),
            })
            .await
            .map_err(|e| {
                DataFusionError::from(Error::internal(format!("metadata scan task failed: {e}")))
            })??;
            timer.done();
            baseline.record_output(arrays.as_ref().map_or(0, |_| slice.len));
            Ok::<_, DataFusionError>(arrays)
        };
        // the slice in batches of the session's size (views of the mapped
        // columns): operators above work a cache-sized batch at a time, and
        // the partitions of a plan take turns on the threads
        let batch_size = context.session_config().batch_size().max(1);
        let out = schema.clone();
        let stream = futures::stream::once(read).flat_map(move |read| {
            let batches: Box<dyn Iterator<Item = DfResult<RecordBatch>> + Send> = match read {
                Err(e) => Box::new(std::iter::once(Err(e))),
                Ok(None) => Box::new(std::iter::empty()),
                Ok(Some(arrays)) => {
                    let out = out.clone();
                    Box::new((0..slice.len).step_by(batch_size).map(move |at| {
                        let len = batch_size.min(slice.len - at);
                        // `count(*)` projects no column: the batch still has the rows
                        let options = RecordBatchOptions::new().with_row_count(Some(len));
                        let views = arrays
                            .iter()
                            .map(|a| a.slice(slice.start + at, len))
                            .collect();
                        let batch =
                            RecordBatch::try_new_with_options(out.clone(), views, &options)?;
                        // SQL's one NaN and one zero (super::floats)
                        super::canonical_batch(batch)
                    }))
                }
            };
            futures::stream::iter(batches)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
