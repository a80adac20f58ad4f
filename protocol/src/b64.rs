//! The one base64 codec of the wire: the standard alphabet of RFC 4648 §4, written with
//! padding, read with or without it.
//!
//! Every binary payload (`exec/output` of bytes that are not text, `exec/write` stdin,
//! `files/read`/`files/write` chunks, EPP/1 file chunks) passes through here, on both sides.
//! It is SIMD (`base64-simd`, AVX2/SSE4.1/NEON picked at run time, a scalar fallback
//! elsewhere): the scalar codec was the largest cost of streaming binary output.

use std::fmt;

/// Why a base64 text was refused, with where: "byte 0x21 at offset 4".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct B64Error(String);

impl fmt::Display for B64Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for B64Error {}

/// The length of the padded encoding of `n` bytes.
pub const fn encoded_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

/// `bytes` as padded base64.
pub fn encode(bytes: impl AsRef<[u8]>) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

/// Append the padded base64 of `bytes` to `out` (no zero-fill of the new room).
pub fn encode_append(bytes: &[u8], out: &mut Vec<u8>) {
    base64_simd::STANDARD.encode_append(bytes, out);
}

/// Decode `text`, padded or not.
pub fn decode(text: impl AsRef<[u8]>) -> Result<Vec<u8>, B64Error> {
    let mut out = Vec::new();
    decode_append(text, &mut out)?;
    Ok(out)
}

/// Decode `text` (padded or not) onto the end of `out`; on error `out` is as it was.
pub fn decode_append(text: impl AsRef<[u8]>, out: &mut Vec<u8>) -> Result<(), B64Error> {
    let text = text.as_ref();
    let engine = if text.len().is_multiple_of(4) {
        base64_simd::STANDARD
    } else {
        base64_simd::STANDARD_NO_PAD
    };
    let before = out.len();
    engine.decode_append(text, out).map_err(|_| {
        out.truncate(before);
        explain(text)
    })
}

/// Say what is wrong with a text the decoder refused (only on the error path).
fn explain(text: &[u8]) -> B64Error {
    let data_end = text.iter().rposition(|&b| b != b'=').map_or(0, |i| i + 1);
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || b == b'+' || b == b'/';
    if let Some(at) = text[..data_end].iter().position(|&b| !alphabet(b)) {
        return B64Error(format!(
            "invalid base64: byte 0x{:02x} at offset {at} is not in the standard alphabet",
            text[at]
        ));
    }
    let pad = text.len() - data_end;
    if data_end % 4 == 1 {
        return B64Error(format!(
            "invalid base64: {} characters cannot end a text (a length of 4n+1)",
            data_end
        ));
    }
    if pad > 0 && !text.len().is_multiple_of(4) || pad > 2 {
        return B64Error(format!(
            "invalid base64: {pad} padding character(s) after {data_end} characters"
        ));
    }
    B64Error("invalid base64: the last character has bits set past the end of the data".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_length_and_byte() {
        for n in 0..200usize {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
            let text = encode(&bytes);
            assert_eq!(text.len(), encoded_len(n));
            assert_eq!(decode(&text).unwrap(), bytes, "n={n}");
            // Unpadded input is accepted too.
            assert_eq!(decode(text.trim_end_matches('=')).unwrap(), bytes, "n={n}");
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(encode(&all)).unwrap(), all);
        let mut out = b"x".to_vec();
        encode_append(b"hi", &mut out);
        assert_eq!(out, b"xaGk=");
        // RFC 4648 §10 test vectors.
        for (plain, coded) in [
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(encode(plain.as_bytes()), coded);
        }
    }

    #[test]
    fn refusals_say_what_and_where_and_keep_the_output() {
        let mut out = b"kept".to_vec();
        let e = decode_append("ab!d", &mut out).unwrap_err();
        assert_eq!(out, b"kept");
        assert!(e.to_string().contains("0x21 at offset 2"), "{e}");
        assert!(decode("abcde").unwrap_err().to_string().contains("4n+1"));
        assert!(decode("ab=").unwrap_err().to_string().contains("padding"));
        assert!(decode("Zg=====").is_err());
        assert!(decode("!!not base64!!")
            .unwrap_err()
            .to_string()
            .contains("0x21 at offset 0"));
        assert!(decode(" Zg==").is_err(), "whitespace is not skipped");
    }
}
