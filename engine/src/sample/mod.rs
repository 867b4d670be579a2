//! Stateless sampling: draw `k` of epoch `e` is a pure function of
//! `(seed, e, k)` and the snapshot's weights. Resuming needs two integers, and
//! any split of `k` over ranks and workers gives the same global sequence.

mod alias;
mod rng;

pub use alias::AliasTable;
pub use rng::{draw_bits, unit_f64};

/// Rows of draws `start..start + count` of `epoch`, weighted with replacement.
pub fn weighted_draws(
    table: &AliasTable,
    seed: u64,
    epoch: u64,
    start: u64,
    count: usize,
) -> Vec<u32> {
    (start..start + count as u64)
        .map(|k| table.draw(draw_bits(seed, epoch, k)) as u32)
        .collect()
}
