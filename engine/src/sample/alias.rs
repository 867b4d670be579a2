//! Walker/Vose alias table: O(n) build, O(1) weighted draw.

use super::rng::{mix64, unit_f64};
use crate::{Error, Result};

/// Weighted sampling with replacement in O(1) per draw.
#[derive(Debug, Clone)]
pub struct AliasTable {
    prob: Vec<f64>,
    alias: Vec<u32>,
}

impl AliasTable {
    /// Build from non-negative, finite weights with a positive sum.
    pub fn new(weights: &[f64]) -> Result<AliasTable> {
        let n = weights.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(Error::invalid(format!("cannot sample from {n} weights")));
        }
        let total: f64 = weights.iter().sum();
        if !(total.is_finite() && total > 0.0) || weights.iter().any(|w| !w.is_finite() || *w < 0.0)
        {
            return Err(Error::invalid(
                "weights must be finite, non-negative, with a positive sum",
            ));
        }
        let scale = n as f64 / total;
        let mut prob: Vec<f64> = weights.iter().map(|w| w * scale).collect();
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let mut small: Vec<u32> = Vec::new();
        let mut large: Vec<u32> = Vec::new();
        for (i, &p) in prob.iter().enumerate() {
            if p < 1.0 {
                small.push(i as u32);
            } else {
                large.push(i as u32);
            }
        }
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            alias[s as usize] = l;
            prob[l as usize] = (prob[l as usize] + prob[s as usize]) - 1.0;
            if prob[l as usize] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Leftovers are 1.0 up to rounding.
        for i in small.into_iter().chain(large) {
            prob[i as usize] = 1.0;
        }
        Ok(AliasTable { prob, alias })
    }

    pub fn len(&self) -> usize {
        self.prob.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prob.is_empty()
    }

    /// The row chosen by 64 random bits.
    #[inline]
    pub fn draw(&self, bits: u64) -> usize {
        let n = self.prob.len() as u128;
        let column = ((bits as u128 * n) >> 64) as usize;
        let coin = unit_f64(mix64(bits));
        if coin < self.prob[column] {
            column
        } else {
            self.alias[column] as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::rng::draw_bits;
    use super::*;

    #[test]
    fn zero_weight_rows_are_never_drawn_and_shares_follow_weights() {
        let weights = [0.0, 1.0, 3.0, 0.0, 4.0];
        let t = AliasTable::new(&weights).unwrap();
        let n = 400_000u64;
        let mut counts = [0u64; 5];
        for k in 0..n {
            counts[t.draw(draw_bits(3, 0, k))] += 1;
        }
        assert_eq!(counts[0] + counts[3], 0);
        for (i, &w) in weights.iter().enumerate() {
            let p = w / 8.0;
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            let diff = (counts[i] as f64 - n as f64 * p).abs();
            assert!(diff <= 5.0 * sd + 1.0, "row {i}: {counts:?}");
        }
    }

    #[test]
    fn bad_weights_are_refused() {
        assert!(AliasTable::new(&[]).is_err());
        assert!(AliasTable::new(&[0.0, 0.0]).is_err());
        assert!(AliasTable::new(&[1.0, f64::NAN]).is_err());
        assert!(AliasTable::new(&[1.0, -1.0]).is_err());
    }
}
