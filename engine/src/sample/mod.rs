//! Stateless sampling: draw `k` of epoch `e` is a pure function of
//! `(seed, e, k)` and the snapshot's weights. Resuming needs two integers, and
//! any split of `k` over ranks and workers gives the same global sequence.

mod alias;
mod mixture;
mod modes;
mod partitioned;
mod plan;
mod rng;
mod shape;
mod weights;

pub use alias::AliasTable;
pub use mixture::{Group, Interleave, MixtureDraws, Shares, MAX_GROUPS, SHARE_WHOLE};
pub use modes::{EpochSampler, Sampling, DRAW_SCHEME};
pub use partitioned::{PartitionSource, PartitionedWeights};
pub use plan::DrawPlan;
pub use rng::{draw_bits, mix_key, unit_f64, Permutation};
pub use shape::{Shape, Shaping};
pub use weights::{mass, Weights};
