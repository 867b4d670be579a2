//! `SampleExec`: the source node of the loader plan. It emits, batch by batch,
//! the draws of one epoch that belong to this reader (rank and worker), as
//! rows `(draw, row, cache_id, sample_id)` of the pinned snapshot.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::StatisticsArgs;
use futures::StreamExt;

use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use std::collections::BTreeMap;

use crate::catalog::schedule::{Schedule, Segments};
use crate::catalog::Snapshot;
use crate::sample::{DrawPlan, EpochSampler};
use crate::Result;

pub fn draws_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("draw", DataType::UInt64, false),
        Field::new("row", DataType::UInt64, false),
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::Int64, false),
        Field::new("snapshot", DataType::UInt64, false),
    ]))
}

fn draw_block(
    snapshot: &Snapshot,
    sampler: &EpochSampler,
    plan: &DrawPlan,
    b: u64,
) -> DfResult<RecordBatch> {
    let (start, end) = plan.block_range(b);
    // the partitions this block lands in have their tables made together
    let rows = sampler.rows(start..end, crate::threads())?;
    let identities = rows
        .iter()
        .map(|&r| snapshot.identity(r as usize))
        .collect::<Result<Vec<(i64, i64)>>>()?;
    let cache_ids = Int64Array::from_iter_values(identities.iter().map(|&(c, _)| c));
    let sample_ids = Int64Array::from_iter_values(identities.iter().map(|&(_, s)| s));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(start..end)),
        Arc::new(UInt64Array::from(rows)),
        Arc::new(cache_ids),
        Arc::new(sample_ids),
        Arc::new(UInt64Array::from_value(
            snapshot.number(),
            (end - start) as usize,
        )),
    ];
    Ok(RecordBatch::try_new(draws_schema(), columns)?)
}

/// A reader of a run that follows the head within the epoch: the run's
/// schedule, the segments of the epoch taken from it so far, and the
/// snapshots they opened.
struct Following {
    schedule: Schedule,
    segments: Segments,
    opened: BTreeMap<String, Arc<Snapshot>>,
    /// The end of the last block this reader drew.
    drawn_through: u64,
}

impl Following {
    fn new(snapshot: &Snapshot, run: &str) -> Result<Following> {
        Ok(Following {
            schedule: Schedule::open(snapshot.dir(), run)?,
            segments: Segments::default(),
            opened: BTreeMap::new(),
            drawn_through: 0,
        })
    }

    /// Block `b`, each draw from the snapshot the schedule gives it (the
    /// `row` column counts that snapshot's rows).
    fn block(&mut self, planned: &Snapshot, plan: &DrawPlan, b: u64) -> Result<RecordBatch> {
        let (start, end) = plan.block_range(b);
        let dir = planned.dir();
        let entries = self
            .schedule
            .claim(plan.epoch, end, plan.batch_size as u64, planned)?;
        self.segments.extend(dir, &entries, self.drawn_through)?;
        let how = (plan.sampling, plan.seed, plan.epoch, plan.epoch_len);
        let n = (end - start) as usize;
        let (mut rows, mut numbers) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut cache_ids, mut sample_ids) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for k in start..end {
            let i = self.segments.of(k);
            let (snapshot, _) = self.segments.drawer(i, dir, &mut self.opened, how)?;
            let row = self.segments.row(i, k)?;
            let (c, s) = snapshot.identity(row as usize)?;
            rows.push(row);
            numbers.push(self.segments.number(i));
            cache_ids.push(c);
            sample_ids.push(s);
        }
        self.drawn_through = end;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from_iter_values(start..end)),
            Arc::new(UInt64Array::from(rows)),
            Arc::new(Int64Array::from(cache_ids)),
            Arc::new(Int64Array::from(sample_ids)),
            Arc::new(UInt64Array::from(numbers)),
        ];
        Ok(RecordBatch::try_new(draws_schema(), columns)?)
    }
}

/// Source node: this reader's draws of one epoch, one batch per block.
#[derive(Debug)]
pub struct SampleExec {
    snapshot: Arc<Snapshot>,
    plan: DrawPlan,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl SampleExec {
    pub fn try_new(snapshot: Arc<Snapshot>, plan: DrawPlan) -> Result<Self> {
        plan.validate()?;
        let properties = PlanProperties::new(
            EquivalenceProperties::new(draws_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(SampleExec {
            snapshot,
            plan,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for SampleExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let p = &self.plan;
        if let DisplayFormatType::TreeRender = t {
            writeln!(f, "snapshot={}", self.snapshot.number())?;
            writeln!(f, "sampling={}", p.sampling.name())?;
            writeln!(f, "seed={}", p.seed)?;
            writeln!(f, "epoch={}", p.epoch)?;
            writeln!(f, "batch_size={}", p.batch_size)?;
            writeln!(f, "start_block={}", p.start_block)?;
            writeln!(f, "rank={}/{}", p.rank, p.world_size)?;
            return writeln!(f, "worker={}/{}", p.worker, p.num_workers);
        }
        write!(
            f,
            "SampleExec: snapshot={}, sampling={}, seed={}, epoch={}, epoch_len={}, batch_size={}, \
             start_block={}, rank={}/{}, worker={}/{}, drop_last={}",
            self.snapshot.number(),
            p.sampling.name(),
            p.seed,
            p.epoch,
            p.epoch_len,
            p.batch_size,
            p.start_block,
            p.rank,
            p.world_size,
            p.worker,
            p.num_workers,
            p.drop_last
        )
    }
}

impl ExecutionPlan for SampleExec {
    fn name(&self) -> &'static str {
        "SampleExec"
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// Exact: the plan says how many draws this reader delivers.
    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        let rows = usize::try_from(self.plan.reader_draws()).unwrap_or(usize::MAX);
        Ok(Arc::new(
            Statistics::new_unknown(&draws_schema())
                .with_num_rows(Precision::Exact(rows))
                .with_total_byte_size(Precision::Inexact(rows * 36)),
        ))
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

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "SampleExec has one partition, not {partition}"
            )));
        }
        let snapshot = self.snapshot.clone();
        let plan = self.plan.clone();
        let blocks = plan.my_blocks();
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        // the alias table (or sorted order) an epoch needs: built or mapped
        let build = MetricBuilder::new(&self.metrics).subset_time("sampler_build_time", partition);
        // The sampler (an alias table or a sorted order) is built on first poll.
        let mut sampler: Option<EpochSampler> = None;
        let mut following = match &plan.run {
            Some(run) => Some(Following::new(&snapshot, run)?),
            None => None,
        };
        let stream = futures::stream::iter(blocks).map(move |b| {
            let _compute = baseline.elapsed_compute().timer();
            if let Some(following) = following.as_mut() {
                let batch = following.block(&snapshot, &plan, b)?;
                baseline.record_output(batch.num_rows());
                return Ok(batch);
            }
            if sampler.is_none() {
                let _build = build.timer();
                sampler = Some(snapshot.epoch_sampler(&plan)?);
            }
            let batch = draw_block(&snapshot, sampler.as_ref().expect("just built"), &plan, b)?;
            baseline.record_output(batch.num_rows());
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            draws_schema(),
            stream,
        )))
    }
}
