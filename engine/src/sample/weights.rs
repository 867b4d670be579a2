//! A population's weights in row order, as the slices its partitions hold:
//! the samplers read them in place, never as one copied column.

/// The sum of `weights` in order: a partition's weight mass as its
/// manifest records it and its alias table checks it.
pub fn mass(weights: &[f64]) -> f64 {
    weights.iter().sum()
}

/// Weights in row order, one slice per snapshot partition.
#[derive(Debug, Clone)]
pub struct Weights<'a> {
    parts: Vec<&'a [f64]>,
    len: usize,
}

impl<'a> Weights<'a> {
    pub fn new(parts: Vec<&'a [f64]>) -> Weights<'a> {
        let len = parts.iter().map(|p| p.len()).sum();
        Weights { parts, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every weight, in row order.
    pub fn iter(&self) -> impl Iterator<Item = &'a f64> + '_ {
        self.parts.iter().flat_map(|p| p.iter())
    }

    /// Every weight, copied into one vector.
    pub fn to_vec(&self) -> Vec<f64> {
        self.iter().copied().collect()
    }

    /// The slices, one per partition.
    pub fn parts(&self) -> &[&'a [f64]] {
        &self.parts
    }
}

impl<'a> From<&'a [f64]> for Weights<'a> {
    fn from(one: &'a [f64]) -> Weights<'a> {
        Weights::new(vec![one])
    }
}

impl<'a> From<&'a Vec<f64>> for Weights<'a> {
    fn from(one: &'a Vec<f64>) -> Weights<'a> {
        Weights::new(vec![one.as_slice()])
    }
}

impl<'a, const N: usize> From<&'a [f64; N]> for Weights<'a> {
    fn from(one: &'a [f64; N]) -> Weights<'a> {
        Weights::new(vec![one.as_slice()])
    }
}
