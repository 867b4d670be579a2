//! Which draws of an epoch each reader (rank and worker) delivers, and the
//! arithmetic of blocks, padding and resume positions: the one owner of it.

use super::Sampling;
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
    /// The run whose schedule the epoch follows (a loader that follows the
    /// head within the epoch), if any.
    pub run: Option<String>,
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
        (self.start_block.saturating_add(mine)..self.blocks()).step_by(stride as usize)
    }

    /// Batches this reader delivers: the length of [`DrawPlan::my_blocks`].
    pub fn batches(&self) -> u64 {
        let stride = self.world_size as u64 * self.num_workers as u64;
        let first = self
            .start_block
            .saturating_add(self.rank as u64 + self.world_size as u64 * self.worker as u64);
        self.blocks().saturating_sub(first).div_ceil(stride)
    }

    /// Draws this reader delivers: its batches, the last one possibly short.
    pub fn reader_draws(&self) -> u64 {
        let n = self.batches();
        if n == 0 {
            return 0;
        }
        let stride = self.world_size as u64 * self.num_workers as u64;
        let mine = self.rank as u64 + self.world_size as u64 * self.worker as u64;
        let (start, end) = self.block_range(self.start_block + mine + (n - 1) * stride);
        (n - 1) * self.batch_size as u64 + (end - start)
    }

    /// The global draw position once this reader has delivered `batches`
    /// batches and every other reader kept pace (ranks in lockstep, a
    /// DataLoader's workers in turn): where an epoch resumed from here starts.
    pub fn position_after(&self, batches: u64) -> u64 {
        let stride = self.world_size as u64 * self.num_workers as u64;
        let blocks = self
            .start_block
            .saturating_add(batches.saturating_mul(stride));
        blocks
            .saturating_mul(self.batch_size as u64)
            .min(self.total_draws())
    }

    /// The global draw position once this reader has delivered `batches`
    /// batches and the consumer took batches from the readers in turn, this
    /// reader's last (a DataLoader's workers: the state torchdata keeps for
    /// the worker it took a batch from last). With no batch delivered, the
    /// plan's start.
    pub fn position_through(&self, batches: u64) -> u64 {
        if batches == 0 {
            return self
                .start_block
                .saturating_mul(self.batch_size as u64)
                .min(self.total_draws());
        }
        let world = self.world_size as u64;
        let stride = world * self.num_workers as u64;
        let blocks = self
            .start_block
            .saturating_add(world * (self.worker as u64 + 1))
            .saturating_add((batches - 1).saturating_mul(stride));
        blocks
            .saturating_mul(self.batch_size as u64)
            .min(self.total_draws())
    }

    /// The start block of a plan in which this reader (the same rank of as
    /// many ranks, worker of as many workers) continues alone after it
    /// delivered `batches` batches, whatever the other readers delivered.
    pub fn reader_resume_block(&self, batches: u64) -> u64 {
        let stride = self.world_size as u64 * self.num_workers as u64;
        self.start_block
            .saturating_add(batches.saturating_mul(stride))
    }

    /// The first block of an epoch resumed at draw `position`, which must lie
    /// on a block boundary of this plan's `batch_size` or at the epoch's end
    /// (a state saved after the last, short batch).
    pub fn resume_block(&self, position: u64) -> Result<u64> {
        let bs = self.batch_size as u64;
        if position >= self.total_draws() {
            return Ok(position.div_ceil(bs));
        }
        if !position.is_multiple_of(bs) {
            return Err(Error::invalid(format!(
                "position {position} is not a multiple of batch_size {bs}; resume with the \
                 batch_size the state was saved with"
            )));
        }
        Ok(position / bs)
    }

    /// Draw positions `start..end` of block `b`.
    pub fn block_range(&self, b: u64) -> (u64, u64) {
        let bs = self.batch_size as u64;
        let total = self.total_draws();
        (
            b.saturating_mul(bs).min(total),
            b.saturating_add(1).saturating_mul(bs).min(total),
        )
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
            run: None,
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
    fn batches_and_resume_positions_follow_the_blocks() {
        for (world, workers) in [(1, 1), (1, 3), (2, 1), (2, 3), (4, 2)] {
            for start in [0u64, 3, 5, 11, 20] {
                for r in 0..world {
                    for w in 0..workers {
                        let mut p = plan(world, workers, r, w);
                        p.start_block = start;
                        assert_eq!(p.batches(), p.my_blocks().count() as u64);
                        let draws: u64 = p
                            .my_blocks()
                            .map(|b| p.block_range(b))
                            .map(|(s, e)| e - s)
                            .sum();
                        assert_eq!(p.reader_draws(), draws);
                        // after n batches of every reader the next block of this one is due
                        for (n, b) in p.my_blocks().enumerate() {
                            let at = p.position_after(n as u64);
                            assert!(at <= p.block_range(b).0, "{at} {b}");
                            assert_eq!(
                                p.resume_block(at).unwrap()
                                    + p.rank as u64
                                    + p.world_size as u64 * p.worker as u64,
                                b
                            );
                        }
                        assert_eq!(p.position_after(p.batches() + 1), p.total_draws());
                    }
                }
            }
        }
        assert!(plan(1, 1, 0, 0).resume_block(15).is_err());
        // the end of an epoch whose last batch is short resumes to nothing
        let end = plan(1, 1, 0, 0).resume_block(103).unwrap();
        assert_eq!(end, 11);
    }

    #[test]
    fn readers_taken_in_turn_know_the_global_position_and_their_own_next_block() {
        for (world, workers) in [(1, 1), (1, 3), (2, 1), (2, 3), (4, 2)] {
            for start in [0u64, 3, 5] {
                // the consumer of rank 0 takes blocks from its workers in turn
                let readers: Vec<DrawPlan> = (0..workers)
                    .map(|w| DrawPlan {
                        start_block: start,
                        ..plan(world, workers, 0, w)
                    })
                    .collect();
                let mut delivered = vec![0u64; workers as usize];
                let mut queues: Vec<Vec<u64>> =
                    readers.iter().map(|p| p.my_blocks().collect()).collect();
                let mut consumed = start;
                for turn in 0.. {
                    let w = turn % workers as usize;
                    if queues[w].is_empty() {
                        break;
                    }
                    let block = queues[w].remove(0);
                    delivered[w] += 1;
                    consumed = block + world as u64; // this block's round, all ranks
                    let p = &readers[w];
                    let total = p.total_draws();
                    assert_eq!(p.position_through(delivered[w]), (consumed * 10).min(total));
                    // every reader resumed alone continues with its own next block
                    for (v, r) in readers.iter().enumerate() {
                        let alone = DrawPlan {
                            start_block: r.reader_resume_block(delivered[v]),
                            ..r.clone()
                        };
                        assert_eq!(alone.my_blocks().next(), queues[v].first().copied());
                    }
                }
                assert!(consumed >= start);
            }
        }
    }

    #[test]
    fn drop_last_drops_the_partial_block() {
        let mut p = plan(1, 1, 0, 0);
        p.drop_last = true;
        assert_eq!(p.blocks(), 10);
        assert_eq!(p.block_range(9), (90, 100));
    }
}
