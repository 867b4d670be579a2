//! The caches of one dataset as one value: sorted by `cache_id`, shared by
//! every plan node, loader and prefetcher that reads them. Locating a cache
//! by id and telling whether an identity names a stored sample live here;
//! reading records by identity is [`CacheSet::take`] (in `take`).

use std::ops::Deref;
use std::sync::Arc;

use super::Cache;
use crate::{Error, Result};

/// Caches sorted by id, without duplicates; cheap to clone.
#[derive(Debug, Clone)]
pub struct CacheSet(Arc<[Arc<Cache>]>);

impl CacheSet {
    /// The set of `caches`, sorted by id. Two caches with one id is an error
    /// naming both (one is a copy of the other).
    pub fn new(mut caches: Vec<Arc<Cache>>) -> Result<Self> {
        caches.sort_by_key(|c| c.id());
        if let Some(pair) = caches.windows(2).find(|w| w[0].id() == w[1].id()) {
            return Err(Error::invalid(format!(
                "caches {} and {} have the same cache_id {}; one is a copy of the other",
                pair[0].dir().display(),
                pair[1].dir().display(),
                pair[0].id()
            )));
        }
        Ok(CacheSet(caches.into()))
    }

    /// The ids, in order.
    pub fn ids(&self) -> Vec<i64> {
        self.0.iter().map(|c| c.id()).collect()
    }

    /// Position of `cache_id`, or an error listing the known ids.
    pub fn position(&self, cache_id: i64) -> Result<usize> {
        self.0
            .binary_search_by_key(&cache_id, |c| c.id())
            .map_err(|_| {
                Error::invalid(format!(
                    "cache_id {cache_id} is not a cache of this dataset (known cache_ids: {:?})",
                    self.ids()
                ))
                .at_column("cache_id", Some(cache_id.to_string()))
            })
    }

    /// Position of `cache_id`, trying `hint` first: consecutive rows mostly
    /// name the same cache.
    pub fn position_near(&self, cache_id: i64, hint: usize) -> Option<usize> {
        if self.0.get(hint).is_some_and(|c| c.id() == cache_id) {
            return Some(hint);
        }
        self.0.binary_search_by_key(&cache_id, |c| c.id()).ok()
    }

    /// Whether `(cache_id, sample_id)` names a stored sample; `hint` as for
    /// [`CacheSet::position_near`], updated to the cache found.
    pub fn holds(&self, cache_id: i64, sample_id: i64, hint: &mut usize) -> bool {
        let Some(at) = self.position_near(cache_id, *hint) else {
            return false;
        };
        *hint = at;
        u64::try_from(sample_id).is_ok_and(|s| s < self.0[at].records())
    }

    /// The cache (by position) and sample of each `(cache_id, sample_id)`,
    /// with the row named in the error for an unknown cache or a negative
    /// sample id (a sample id past the end fails when its entry is read).
    pub(crate) fn resolve(&self, cache_ids: &[i64], sample_ids: &[i64]) -> Result<Vec<(u32, u64)>> {
        let mut pos = 0usize;
        cache_ids
            .iter()
            .zip(sample_ids)
            .enumerate()
            .map(|(i, (&cid, &sid))| {
                pos = self.position_near(cid, pos).ok_or_else(|| {
                    Error::invalid(format!(
                        "row {i}: cache_id {cid} is not a cache of this dataset"
                    ))
                    .at_row(i)
                    .at_column("cache_id", Some(cid.to_string()))
                })?;
                let sample = u64::try_from(sid).map_err(|_| {
                    Error::invalid(format!("row {i}: sample_id {sid} is negative"))
                        .at_row(i)
                        .at_column("sample_id", Some(sid.to_string()))
                })?;
                Ok((pos as u32, sample))
            })
            .collect()
    }
}

impl Deref for CacheSet {
    type Target = [Arc<Cache>];

    fn deref(&self) -> &[Arc<Cache>] {
        &self.0
    }
}

impl<'a> IntoIterator for &'a CacheSet {
    type Item = &'a Arc<Cache>;
    type IntoIter = std::slice::Iter<'a, Arc<Cache>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
