//! How a cache is written: codec, level, shard size, threads.

use crate::store::codec::Codec;
use crate::{Error, Result};

/// How a cache is written.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    pub codec: Codec,
    /// zstd level (ignored by other codecs).
    pub level: i32,
    /// A new shard starts once the current one reaches this many bytes.
    pub shard_target_bytes: u64,
    /// Native threads that compress and checksum.
    pub threads: usize,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            codec: Codec::Zstd,
            level: 3,
            shard_target_bytes: 256 << 20,
            threads: crate::threads().min(4),
        }
    }
}

impl WriterOptions {
    /// Check the options as a whole (what [`CacheWriter::create`] does first):
    /// a positive shard size and thread count, and a zstd level zstd knows.
    pub fn check(&self) -> Result<()> {
        if self.shard_target_bytes == 0 {
            return Err(Error::invalid("shard_bytes must be positive"));
        }
        if self.threads == 0 {
            return Err(Error::invalid("threads must be positive"));
        }
        let levels = zstd::compression_level_range();
        if self.codec == Codec::Zstd && !levels.contains(&self.level) {
            return Err(Error::invalid(format!(
                "zstd level {} is outside [{}, {}]",
                self.level,
                levels.start(),
                levels.end()
            )));
        }
        Ok(())
    }
}
