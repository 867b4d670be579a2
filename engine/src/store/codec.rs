//! Payload codecs. A record that does not shrink is stored raw.

use std::cell::RefCell;

use crate::{Error, Result};

/// How one record's bytes are stored. The discriminant is the on-disk flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Codec {
    None = 0,
    Zstd = 1,
    Lz4 = 2,
}

/// Records shorter than this are stored raw without trying to compress them:
/// no codec shrinks a few bytes, and trying costs more than storing.
pub const MIN_COMPRESS_LEN: usize = 64;

impl Codec {
    pub fn from_flag(flag: u8) -> Option<Codec> {
        match flag {
            0 => Some(Codec::None),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::Lz4),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Zstd => "zstd",
            Codec::Lz4 => "lz4",
        }
    }

    pub fn parse(name: &str) -> Result<Codec> {
        match name {
            "none" => Ok(Codec::None),
            "zstd" => Ok(Codec::Zstd),
            "lz4" => Ok(Codec::Lz4),
            other => Err(Error::invalid(format!(
                "unknown codec {other:?}: expected one of \"zstd\", \"lz4\", \"none\""
            ))),
        }
    }
}

/// A per-thread compressor. Appends the stored form of `raw` to `out` and
/// returns the codec actually used (`Codec::None` when compression did not help).
pub struct Compressor {
    codec: Codec,
    zstd: Option<zstd::bulk::Compressor<'static>>,
    scratch: Vec<u8>,
}

impl Compressor {
    pub fn new(codec: Codec, level: i32) -> Result<Self> {
        let zstd = match codec {
            Codec::Zstd => Some(
                zstd::bulk::Compressor::new(level)
                    .map_err(|e| Error::invalid(format!("zstd level {level}: {e}")))?,
            ),
            _ => None,
        };
        Ok(Compressor {
            codec,
            zstd,
            scratch: Vec::new(),
        })
    }

    /// The codec this compressor was made for.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    pub fn compress_into(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Codec {
        if self.codec == Codec::None || raw.len() < MIN_COMPRESS_LEN {
            out.extend_from_slice(raw);
            return Codec::None;
        }
        self.scratch.clear();
        let ok = match self.codec {
            Codec::Zstd => {
                let bound = zstd::zstd_safe::compress_bound(raw.len());
                self.scratch.reserve(bound);
                let z = self.zstd.as_mut().expect("zstd compressor for zstd codec");
                z.compress_to_buffer(raw, &mut self.scratch).is_ok()
            }
            Codec::Lz4 => {
                self.scratch
                    .resize(lz4_flex::block::get_maximum_output_size(raw.len()), 0);
                match lz4_flex::block::compress_into(raw, &mut self.scratch) {
                    Ok(n) => {
                        self.scratch.truncate(n);
                        true
                    }
                    Err(_) => false,
                }
            }
            Codec::None => unreachable!(),
        };
        if ok && self.scratch.len() < raw.len() {
            out.extend_from_slice(&self.scratch);
            self.codec
        } else {
            out.extend_from_slice(raw);
            Codec::None
        }
    }
}

thread_local! {
    static ZSTD_DECODER: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Decode `stored` (written with `codec`) into `out`, whose length must be
/// the record's raw length. Errors are returned as plain text for the caller
/// to wrap with the file, shard and offset.
pub fn decode_into(codec: Codec, stored: &[u8], out: &mut [u8]) -> std::result::Result<(), String> {
    let raw_len = out.len();
    let n = match codec {
        Codec::None => {
            if stored.len() != raw_len {
                return Err(format!(
                    "raw record has {} bytes, index says {raw_len}",
                    stored.len()
                ));
            }
            out.copy_from_slice(stored);
            raw_len
        }
        Codec::Zstd => ZSTD_DECODER.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
            }
            let dec = slot.as_mut().expect("decoder just set");
            dec.decompress_to_buffer(stored, out)
                .map_err(|e| format!("zstd: {e}"))
        })?,
        Codec::Lz4 => {
            lz4_flex::block::decompress_into(stored, out).map_err(|e| format!("lz4: {e}"))?
        }
    };
    if n != raw_len {
        return Err(format!(
            "{} gave {n} bytes, index says {raw_len}",
            codec.name()
        ));
    }
    Ok(())
}

/// Like [`decode_into`], appending `raw_len` bytes to `out`; on error `out`
/// is left as it was.
pub fn decompress_into(
    codec: Codec,
    stored: &[u8],
    raw_len: usize,
    out: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let start = out.len();
    out.resize(start + raw_len, 0);
    let result = decode_into(codec, stored, &mut out[start..]);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressible_records_round_trip_with_every_codec() {
        let raw: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 17).to_le_bytes())
            .collect();
        for codec in [Codec::None, Codec::Zstd, Codec::Lz4] {
            let mut c = Compressor::new(codec, 3).unwrap();
            let mut stored = Vec::new();
            let used = c.compress_into(&raw, &mut stored);
            assert_eq!(used, codec, "compressible data should use {codec:?}");
            let mut back = Vec::new();
            decompress_into(used, &stored, raw.len(), &mut back).unwrap();
            assert_eq!(back, raw);
        }
    }

    #[test]
    fn incompressible_and_tiny_records_are_stored_raw() {
        let mut c = Compressor::new(Codec::Zstd, 3).unwrap();
        let mut out = Vec::new();
        assert_eq!(c.compress_into(b"sixteen bytes!!!", &mut out), Codec::None);
        // pseudo-random bytes do not shrink
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        out.clear();
        assert_eq!(c.compress_into(&noise, &mut out), Codec::None);
        assert_eq!(out, noise);
    }

    #[test]
    fn wrong_lengths_are_reported_not_delivered() {
        let mut out = Vec::new();
        assert!(decompress_into(Codec::None, b"abc", 4, &mut out).is_err());
        assert!(decompress_into(Codec::Zstd, b"not zstd at all", 10, &mut out).is_err());
        assert!(out.is_empty());
    }
}
