//! `SampleExec`: the source node of the loader plan. It emits, batch by batch,
//! the draws of one epoch that belong to this reader (rank and worker), as
//! rows `(draw, row, cache_id, sample_id)` of the pinned snapshot.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};

use crate::catalog::Snapshot;
use crate::sample::{DrawPlan, EpochSampler};
use crate::Result;

pub fn draws_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("draw", DataType::UInt64, false),
        Field::new("row", DataType::UInt32, false),
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::Int64, false),
    ]))
}

fn draw_block(
    snapshot: &Snapshot,
    sampler: &EpochSampler,
    plan: &DrawPlan,
    b: u64,
) -> DfResult<RecordBatch> {
    let (start, end) = plan.block_range(b);
    let rows: Vec<u32> = (start..end).map(|k| sampler.row(k)).collect();
    let ids = snapshot.cache_ids().values();
    let samples = snapshot.sample_ids().values();
    let cache_ids = Int64Array::from_iter_values(rows.iter().map(|&r| ids[r as usize]));
    let sample_ids = Int64Array::from_iter_values(rows.iter().map(|&r| samples[r as usize]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(start..end)),
        Arc::new(UInt32Array::from(rows)),
        Arc::new(cache_ids),
        Arc::new(sample_ids),
    ];
    Ok(RecordBatch::try_new(draws_schema(), columns)?)
}

/// Source node: this reader's draws of one epoch, one batch per block.
#[derive(Debug)]
pub struct SampleExec {
    snapshot: Arc<Snapshot>,
    plan: DrawPlan,
    properties: Arc<PlanProperties>,
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
        })
    }
}

impl DisplayAs for SampleExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let p = &self.plan;
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
                "SampleExec has one partition, not {partition}"
            )));
        }
        let snapshot = self.snapshot.clone();
        let plan = self.plan.clone();
        let blocks = plan.my_blocks();
        // The sampler (an alias table or a sorted order) is built on first poll.
        let mut sampler: Option<EpochSampler> = None;
        let stream = futures::stream::iter(blocks).map(move |b| {
            if sampler.is_none() {
                sampler = Some(snapshot.epoch_sampler(&plan)?);
            }
            draw_block(&snapshot, sampler.as_ref().expect("just built"), &plan, b)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            draws_schema(),
            stream,
        )))
    }
}
