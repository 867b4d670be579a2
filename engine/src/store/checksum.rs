//! CRC-32C (Castagnoli), the checksum of every record, index, manifest,
//! snapshot manifest and alias table. One place computes it so the algorithm
//! is a single choice, and one place checks the headers those files share
//! (a magic and a version, or a first line and a checksum line).
//!
//! The `crc-fast` crate folds with carry-less multiplication (VPCLMULQDQ
//! where the CPU has it): ~50 GiB/s on a 16 KiB record in cache on this
//! project's machines, twice the SSE4.2 `crc32` instruction, and as fast as
//! a plain read from memory, so verifying every read costs no more than
//! reading it
//! (`cargo bench --workspace --bench checksum`).

use std::ops::RangeInclusive;
use std::path::Path;

use crc_fast::{CrcAlgorithm, Digest};

use crate::{Error, Result};

/// Bytes per checked chunk: a loader's draw reads 8 bytes of a column and
/// checks the 64 KiB around them once (16 pages), a batch of 256 draws a few
/// MiB; a sidecar is 1/16384 of its file.
pub const CHUNK: usize = 64 << 10;

/// CRC-32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    // The 32-bit algorithm's value always fits in the low 32 bits.
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// CRC-32C of the concatenation of `parts`, without concatenating them.
pub fn crc32c_parts(parts: &[&[u8]]) -> u32 {
    let mut digest = Digest::new(CrcAlgorithm::Crc32Iscsi);
    for part in parts {
        digest.update(part);
    }
    digest.finalize() as u32
}

/// CRC-32C and length of a whole file, read in 1 MiB pieces. A file that is
/// also mapped is checked this way so that the check does not fault every
/// page into this process (a loader worker would otherwise hold the whole
/// snapshot in its resident set for one pass over it).
pub fn crc32c_file(path: &std::path::Path) -> std::io::Result<(u32, u64)> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut digest = Digest::new(CrcAlgorithm::Crc32Iscsi);
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        digest.update(&buf[..n]);
        len += n as u64;
    }
    Ok((digest.finalize() as u32, len))
}

/// A writer that passes bytes on and keeps the CRC-32C and length of all it
/// wrote, and the CRC-32C of every [`CHUNK`], so a
/// file's checksums cost no second read.
pub struct CrcWriter<W> {
    inner: W,
    digest: Digest,
    len: u64,
    chunk: Digest,
    chunks: Vec<u32>,
}

impl<W> CrcWriter<W> {
    pub fn new(inner: W) -> Self {
        CrcWriter {
            inner,
            digest: Digest::new(CrcAlgorithm::Crc32Iscsi),
            len: 0,
            chunk: Digest::new(CrcAlgorithm::Crc32Iscsi),
            chunks: Vec::new(),
        }
    }

    /// The inner writer, the CRC-32C and the length of everything written,
    /// and the CRC-32C of each chunk of it.
    pub fn finish(mut self) -> (W, u32, u64, Vec<u32>) {
        if !self.len.is_multiple_of(CHUNK as u64) {
            self.chunks.push(self.chunk.finalize() as u32);
        }
        (
            self.inner,
            self.digest.finalize() as u32,
            self.len,
            self.chunks,
        )
    }

    fn account(&mut self, mut bytes: &[u8]) {
        self.digest.update(bytes);
        while !bytes.is_empty() {
            let room = CHUNK - (self.len % CHUNK as u64) as usize;
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.chunk.update(now);
            self.len += now.len() as u64;
            if self.len.is_multiple_of(CHUNK as u64) {
                self.chunks.push(self.chunk.finalize() as u32);
                self.chunk = Digest::new(CrcAlgorithm::Crc32Iscsi);
            }
            bytes = rest;
        }
    }
}

impl<W: std::io::Write> std::io::Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.account(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A text file's body sealed with its checksum: the body, then the line
/// `checksum=<crc32c of every byte before it, 8 hex digits>` (manifests,
/// snapshot manifests, heads, tags, group records, schedule entries).
pub fn seal_text(body: &str) -> String {
    format!("{body}checksum={:08x}\n", crc32c(body.as_bytes()))
}

/// Why bytes sealed by [`seal_text`] or [`seal_bytes`] did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsealed {
    /// Not UTF-8 (a text seal).
    NotText,
    /// No seal where one must be: no `checksum=` line, or fewer than 4 bytes.
    Missing,
    /// The seal is not `checksum=` with 8 hex digits and a newline.
    Unreadable,
    /// The seal is whole but the bytes before it have another checksum.
    Mismatch { stored: u32, computed: u32 },
}

impl std::fmt::Display for Unsealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unsealed::NotText => f.write_str("is not UTF-8"),
            Unsealed::Missing => f.write_str("has no checksum"),
            Unsealed::Unreadable => f.write_str("has an unreadable checksum line"),
            Unsealed::Mismatch { stored, computed } => {
                write!(
                    f,
                    "checksum mismatch (stored {stored:08x}, computed {computed:08x})"
                )
            }
        }
    }
}

/// The body of text sealed by [`seal_text`]: everything before its checksum
/// line, if that line is exactly as `seal_text` writes it and matches.
pub fn unseal_text(raw: &[u8]) -> std::result::Result<&str, Unsealed> {
    let text = std::str::from_utf8(raw).map_err(|_| Unsealed::NotText)?;
    let split = text.rfind("checksum=").ok_or(Unsealed::Missing)?;
    let hex = text[split + 9..]
        .strip_suffix('\n')
        .filter(|hex| hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or(Unsealed::Unreadable)?;
    let stored = u32::from_str_radix(hex, 16).map_err(|_| Unsealed::Unreadable)?;
    check_seal(&raw[..split], stored)?;
    Ok(&text[..split])
}

/// Seal binary `bytes`: append the CRC-32C of all of them (little-endian).
pub fn seal_bytes(bytes: &mut Vec<u8>) {
    let crc = crc32c(bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
}

/// The body of bytes sealed by [`seal_bytes`], if the last 4 bytes are the
/// CRC-32C of the rest.
pub fn unseal_bytes(bytes: &[u8]) -> std::result::Result<&[u8], Unsealed> {
    let split = bytes.len().checked_sub(4).ok_or(Unsealed::Missing)?;
    let stored = u32::from_le_bytes(bytes[split..].try_into().expect("4 bytes"));
    check_seal(&bytes[..split], stored)?;
    Ok(&bytes[..split])
}

fn check_seal(body: &[u8], stored: u32) -> std::result::Result<(), Unsealed> {
    let computed = crc32c(body);
    if computed != stored {
        return Err(Unsealed::Mismatch { stored, computed });
    }
    Ok(())
}

/// Open a text file sealed by [`seal_text`] whose first line is `<header>
/// <version>`: its version (one of `versions`, else
/// [`Error::UnsupportedVersion`]) and the body before the checksum line.
/// Anything else is [`Error::Corrupt`] naming `what` the file is.
pub fn open_sealed_text<'a>(
    path: &Path,
    text: &'a [u8],
    header: &str,
    versions: RangeInclusive<u32>,
    what: &str,
) -> Result<(u32, &'a str)> {
    let bad = |detail: String| Error::corrupt(path, detail);
    let lossy = String::from_utf8_lossy(text);
    let first = lossy.lines().next().unwrap_or_default();
    let version: u32 = first
        .strip_prefix(header)
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| bad(format!("first line {first:?} is not '{header} <version>'")))?;
    check_version(path, version, versions)?;
    let body = unseal_text(text).map_err(|why| bad(format!("{what} {why}")))?;
    Ok((version, body))
}

/// A binary file's first 8 bytes are `magic`, else it is not a DatasetRT
/// `what` ([`Error::Corrupt`]).
pub fn check_magic(path: &Path, bytes: &[u8], magic: &[u8; 8], what: &str) -> Result<()> {
    if bytes.len() < 8 || bytes[0..8] != magic[..] {
        return Err(Error::corrupt(
            path,
            format!("bad magic: not a DatasetRT {what}"),
        ));
    }
    Ok(())
}

/// The format version in bytes 8..12 of a binary header (little-endian),
/// one of `versions`.
pub fn header_version(path: &Path, bytes: &[u8], versions: RangeInclusive<u32>) -> Result<u32> {
    let version = bytes
        .get(8..12)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| Error::corrupt(path, "header shorter than its version field"))?;
    check_version(path, version, versions)
}

fn check_version(path: &Path, found: u32, versions: RangeInclusive<u32>) -> Result<u32> {
    if !versions.contains(&found) {
        return Err(Error::UnsupportedVersion {
            path: path.to_path_buf(),
            found,
            supported: *versions.end(),
        });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_castagnoli_check_value() {
        // The standard check input of every CRC catalogue.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c_parts(&[b"1234", b"", b"56789"]), 0xE306_9283);
    }

    #[test]
    fn long_inputs_agree_with_the_split_form() {
        let bytes: Vec<u8> = (0..100_003u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let whole = crc32c(&bytes);
        for at in [0, 1, 15, 16, 4096, 99_999, bytes.len()] {
            assert_eq!(
                crc32c_parts(&[&bytes[..at], &bytes[at..]]),
                whole,
                "split at {at}"
            );
        }
    }

    #[test]
    fn sealed_text_opens_to_its_body_and_any_edit_is_corrupt() {
        let path = Path::new("m");
        let text = seal_text("thing 2\nkey=value\n");
        let (version, body) =
            open_sealed_text(path, text.as_bytes(), "thing", 1..=2, "thing").unwrap();
        assert_eq!((version, body), (2, "thing 2\nkey=value\n"));
        let edited = text.replace("value", "valuf");
        let err = open_sealed_text(path, edited.as_bytes(), "thing", 1..=2, "thing").unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("thing checksum mismatch"), "{err}");
        let future = seal_text("thing 3\n");
        let err = open_sealed_text(path, future.as_bytes(), "thing", 1..=2, "thing").unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnsupportedVersion {
                    found: 3,
                    supported: 2,
                    ..
                }
            ),
            "{err}"
        );
        let other = seal_text("other 1\n");
        let err = open_sealed_text(path, other.as_bytes(), "thing", 1..=2, "thing").unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    }

    #[test]
    fn a_seal_opens_only_as_it_was_written() {
        let text = seal_text("head\nsnapshot=7\n");
        assert_eq!(unseal_text(text.as_bytes()), Ok("head\nsnapshot=7\n"));
        // A seal must be 8 hex digits and a newline: a trimmed, padded,
        // signed or truncated line is refused even where its value would
        // match. The body is one whose checksum starts with a 0, so the
        // line without it still parses as the same number.
        let text = (0..)
            .map(|n| seal_text(&format!("head\nsnapshot={n}\n")))
            .find(|t| t[t.len() - 9..].starts_with('0'))
            .expect("a checksum with a leading zero");
        assert!(unseal_text(text.as_bytes()).is_ok());
        let hex = &text[text.len() - 9..text.len() - 1];
        let short = &hex[1..];
        for bad in [
            text.trim_end().to_string(),
            format!("{text} "),
            text.replace(hex, &format!(" {hex}")),
            text.replace(hex, short),
            text.replace(hex, &format!("+{short}")),
        ] {
            assert_ne!(bad, text);
            assert_eq!(
                unseal_text(bad.as_bytes()),
                Err(Unsealed::Unreadable),
                "{bad:?}"
            );
        }
        assert_eq!(unseal_text(b"head\n"), Err(Unsealed::Missing));
        assert_eq!(
            unseal_text(b"\xff checksum=00000000\n"),
            Err(Unsealed::NotText)
        );
        let edited = text.replacen("head", "hexd", 1);
        assert!(matches!(
            unseal_text(edited.as_bytes()),
            Err(Unsealed::Mismatch { .. })
        ));

        let mut bytes = b"DRTTHING body".to_vec();
        seal_bytes(&mut bytes);
        assert_eq!(unseal_bytes(&bytes), Ok(&b"DRTTHING body"[..]));
        assert_eq!(unseal_bytes(&bytes[..3]), Err(Unsealed::Missing));
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            assert!(unseal_bytes(&flipped).is_err(), "byte {at} flipped");
        }
    }

    #[test]
    fn binary_headers_are_checked_for_magic_then_version() {
        let path = Path::new("b");
        let mut h = [0u8; 16];
        h[0..8].copy_from_slice(b"DRTTHING");
        h[8..12].copy_from_slice(&1u32.to_le_bytes());
        check_magic(path, &h, b"DRTTHING", "thing").unwrap();
        assert_eq!(header_version(path, &h, 1..=1).unwrap(), 1);
        let err = check_magic(path, &h, b"DRTOTHER", "other").unwrap_err();
        assert!(err.to_string().contains("not a DatasetRT other"), "{err}");
        assert!(check_magic(path, &h[..4], b"DRTTHING", "thing").is_err());
        h[8..12].copy_from_slice(&9u32.to_le_bytes());
        assert!(matches!(
            header_version(path, &h, 1..=1),
            Err(Error::UnsupportedVersion { found: 9, .. })
        ));
    }
}
