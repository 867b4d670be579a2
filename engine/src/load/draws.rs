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
use crate::sample::{EpochSampler, Sampling};
use crate::{Error, Result};

/// Which draws of an epoch one reader takes.
///
/// The epoch is the global sequence of draws `0..epoch_len`, cut into blocks
/// of `batch_size`. Counting from `start_block` (0, or the resume point),
/// block `start_block + i` belongs to rank `i % world_size` and, within that
/// rank, to worker `(i / world_size) % num_workers`. A DataLoader that collects
/// batches from its workers in turn therefore yields the global order, and the
/// union over all readers is exactly the sequence one reader alone would draw.
///
/// With several ranks every rank gets the same number of full batches: with
/// `drop_last` the blocks from `start_block` on are cut down to a multiple of
/// `world_size` full blocks; otherwise they are padded up to one, the extra draws continuing the
/// sequence (a new pass for permutation-like modes, as `DistributedSampler`
/// pads with repeats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawPlan {
    pub sampling: Sampling,
    pub seed: u64,
    pub epoch: u64,
    pub epoch_len: u64,
    pub batch_size: usize,
    /// First block of the epoch to deliver (resume), in global block numbers.
    pub start_block: u64,
    pub drop_last: bool,
    pub rank: u32,
    pub world_size: u32,
    pub worker: u32,
    pub num_workers: u32,
}

impl DrawPlan {
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::invalid("batch_size must be positive"));
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::invalid(format!(
                "rank {} is not in 0..world_size ({})",
                self.rank, self.world_size
            )));
        }
        if self.num_workers == 0 || self.worker >= self.num_workers {
            return Err(Error::invalid(format!(
                "worker {} is not in 0..num_workers ({})",
                self.worker, self.num_workers
            )));
        }
        Ok(())
    }

    /// Number of blocks in the epoch.
    pub fn blocks(&self) -> u64 {
        let bs = self.batch_size as u64;
        let world = self.world_size as u64;
        let base = if self.drop_last {
            self.epoch_len / bs
        } else {
            self.epoch_len.div_ceil(bs)
        };
        if world == 1 {
            return base;
        }
        let start = self.start_block.min(base);
        let remaining = base - start;
        start
            + if self.drop_last {
                remaining / world * world
            } else {
                remaining.div_ceil(world) * world
            }
    }

    /// Draws in the epoch after dropping or padding: what ranks deliver together.
    pub fn total_draws(&self) -> u64 {
        let bs = self.batch_size as u64;
        if self.world_size == 1 {
            (self.blocks() * bs).min(self.epoch_len)
        } else {
            self.blocks() * bs
        }
    }

    /// The global block numbers this reader delivers, in order.
    pub fn my_blocks(&self) -> impl Iterator<Item = u64> + Send + 'static {
        let stride = self.world_size as u64 * self.num_workers as u64;
        let mine = self.rank as u64 + self.world_size as u64 * self.worker as u64;
        (self.start_block + mine..self.blocks()).step_by(stride as usize)
    }

    /// Draw positions `start..end` of block `b`.
    pub fn block_range(&self, b: u64) -> (u64, u64) {
        let bs = self.batch_size as u64;
        (b * bs, ((b + 1) * bs).min(self.total_draws()))
    }
}

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

/// The sampler of `plan`'s epoch over `snapshot`.
pub fn epoch_sampler(snapshot: &Snapshot, plan: &DrawPlan) -> Result<EpochSampler> {
    let alias = match plan.sampling {
        Sampling::Replacement => Some(snapshot.alias_table()?),
        _ => None,
    };
    EpochSampler::new(
        plan.sampling,
        snapshot.weights().values(),
        alias,
        plan.seed,
        plan.epoch,
        plan.epoch_len,
    )
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
                sampler = Some(epoch_sampler(&snapshot, &plan)?);
            }
            draw_block(&snapshot, sampler.as_ref().expect("just built"), &plan, b)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            draws_schema(),
            stream,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(world: u32, workers: u32, rank: u32, worker: u32) -> DrawPlan {
        DrawPlan {
            sampling: Sampling::Replacement,
            seed: 1,
            epoch: 0,
            epoch_len: 103,
            batch_size: 10,
            start_block: 0,
            drop_last: false,
            rank,
            world_size: world,
            worker,
            num_workers: workers,
        }
    }

    #[test]
    fn readers_split_the_blocks_of_an_epoch_without_overlap() {
        for (world, workers) in [(1, 1), (1, 3), (2, 1), (2, 3), (4, 2)] {
            let mut all: Vec<u64> = Vec::new();
            for r in 0..world {
                for w in 0..workers {
                    all.extend(plan(world, workers, r, w).my_blocks());
                }
            }
            all.sort_unstable();
            let blocks = plan(world, workers, 0, 0).blocks();
            assert_eq!(
                all,
                (0..blocks).collect::<Vec<_>>(),
                "world {world} workers {workers}"
            );
        }
    }

    #[test]
    fn ranks_get_equal_full_batches_by_padding_or_dropping() {
        // 103 draws in blocks of 10: 11 blocks, the last one partial
        for world in [2u32, 4] {
            let padded = plan(world, 1, 0, 0);
            assert_eq!(padded.blocks() % world as u64, 0);
            assert_eq!(padded.total_draws(), padded.blocks() * 10);
            assert!(padded.total_draws() >= 103);
            let mut dropped = padded.clone();
            dropped.drop_last = true;
            assert_eq!(dropped.blocks() % world as u64, 0);
            assert!(dropped.total_draws() <= 100);
            let per_rank: Vec<usize> = (0..world)
                .map(|r| plan(world, 1, r, 0).my_blocks().count())
                .collect();
            assert!(per_rank.iter().all(|&c| c == per_rank[0]), "{per_rank:?}");
        }
        assert_eq!(plan(1, 1, 0, 0).total_draws(), 103);
    }

    #[test]
    fn a_resumed_reader_counts_its_blocks_from_the_resume_point() {
        let mut p = plan(2, 2, 1, 1);
        assert_eq!(p.my_blocks().collect::<Vec<_>>(), vec![3, 7, 11]);
        p.start_block = 4;
        assert_eq!(p.my_blocks().collect::<Vec<_>>(), vec![7, 11]);
        p.start_block = 5; // 6 blocks left (5..11) for 2 ranks: none padded
        assert_eq!(p.blocks(), 11);
        assert_eq!(p.my_blocks().collect::<Vec<_>>(), vec![8]);
        p.start_block = 12;
        assert_eq!(p.my_blocks().count(), 0);
    }

    #[test]
    fn drop_last_drops_the_partial_block() {
        let mut p = plan(1, 1, 0, 0);
        p.drop_last = true;
        assert_eq!(p.blocks(), 10);
        assert_eq!(p.block_range(9), (90, 100));
    }
}
