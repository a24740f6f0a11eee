//! Text encodings every wire format and the client share, both ways: JSON strings (the hot
//! path of output events), base64 (RFC 4648) and RFC 3339 times in UTC.

use serde_json::Value;

/// Appends `value` as compact JSON. Writing to a `Vec` cannot fail and a `Value` always
/// serializes, so there is no error to report.
pub fn write_json(out: &mut Vec<u8>, value: &Value) {
    let _ = serde_json::to_writer(out, value);
}

/// Appends `s` as a JSON string literal, with the same escapes serde_json writes.
///
/// This is the hot path of output events (every byte a command prints passes here), so
/// it skips eight bytes at a time over runs that need no escape and copies each run whole.
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0; // start of the bytes not yet copied
    let mut i = 0;
    while i < bytes.len() {
        if let Some(chunk) = bytes.get(i..i + 8) {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            if !needs_escape(word) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => {
                out.extend_from_slice(&bytes[run..i]);
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
                i += 1;
                run = i;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[run..i]);
        out.extend_from_slice(escape);
        i += 1;
        run = i;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether any of the eight bytes in `w` is a control character, a quote or a backslash
/// (the classic "has a byte less than n" and "has a zero byte" bit tricks).
fn needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    below_space | zero_byte(w ^ (ONES * u64::from(b'"'))) | zero_byte(w ^ (ONES * u64::from(b'\\')))
        != 0
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Appends the standard base64 (with padding) of `bytes`. Output events of base64
/// subscriptions are encoded here, so it works on whole groups of three at a time.
/// (Written here rather than taken from a crate: encoding and decoding are the whole
/// need, a few dozen lines, tested against the RFC 4648 vectors below.)
pub fn base64_encode(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len().div_ceil(3) * 4);
    let mut chunks = bytes.chunks_exact(3);
    for c in &mut chunks {
        let n = u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]);
        out.extend_from_slice(&[
            BASE64[(n >> 18) as usize & 63],
            BASE64[(n >> 12) as usize & 63],
            BASE64[(n >> 6) as usize & 63],
            BASE64[n as usize & 63],
        ]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend_from_slice(&[
                BASE64[(n >> 18) as usize & 63],
                BASE64[(n >> 12) as usize & 63],
                b'=',
                b'=',
            ]);
        }
        [a, b] => {
            let n = u32::from(a) << 16 | u32::from(b) << 8;
            out.extend_from_slice(&[
                BASE64[(n >> 18) as usize & 63],
                BASE64[(n >> 12) as usize & 63],
                BASE64[(n >> 6) as usize & 63],
                b'=',
            ]);
        }
        _ => {}
    }
}

/// The value of each base64 digit, 255 for bytes that are not one.
const BASE64_VALUES: [u8; 256] = {
    let mut t = [255u8; 256];
    let mut i = 0;
    while i < 64 {
        t[BASE64[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Decodes standard base64; the padding may be left out. `None` for anything else. A
/// client of a base64 subscription decodes every byte of output here, so whole groups of
/// four go through a table with one check per group.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let body = bytes
        .strip_suffix(b"==")
        .or_else(|| bytes.strip_suffix(b"="))
        .unwrap_or(bytes);
    if bytes.len() % 4 != 0 && body.len() != bytes.len() {
        return None; // padding on input whose length is not a multiple of four
    }
    if body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    let mut groups = body.chunks_exact(4);
    for g in &mut groups {
        let (a, b, c, d) = (
            BASE64_VALUES[g[0] as usize],
            BASE64_VALUES[g[1] as usize],
            BASE64_VALUES[g[2] as usize],
            BASE64_VALUES[g[3] as usize],
        );
        if (a | b | c | d) & 0xc0 != 0 {
            return None;
        }
        let n = u32::from(a) << 18 | u32::from(b) << 12 | u32::from(c) << 6 | u32::from(d);
        out.extend_from_slice(&n.to_be_bytes()[1..]);
    }
    let rest = groups.remainder();
    if !rest.is_empty() {
        let mut n = 0u32;
        for (i, &ch) in rest.iter().enumerate() {
            let v = BASE64_VALUES[ch as usize];
            if v & 0xc0 != 0 {
                return None;
            }
            n |= u32::from(v) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..rest.len()]);
    }
    Some(out)
}

/// Formats a time as RFC 3339 in UTC with millisecond precision, e.g.
/// `2026-11-21T22:23:51.123Z`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Digits by hand: every log line and audit record is stamped, and `format!` with
    // padding took microseconds of the loop's time per line.
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year.clamp(0, 9999) as u64);
    put(5, 2, month as u64);
    put(8, 2, day as u64);
    put(11, 2, rem / 3600);
    put(14, 2, rem % 3600 / 60);
    put(17, 2, rem % 60);
    put(20, 3, u64::from(d.subsec_millis()));
    out.iter().map(|&b| char::from(b)).collect()
}

/// Parses what `rfc3339` writes (`YYYY-MM-DDTHH:MM:SS.mmmZ`; the fraction may be left
/// out). `None` for anything else.
pub fn parse_rfc3339(s: &str) -> Option<std::time::SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let millis = match b.get(19) {
        Some(b'.') => s
            .get(20..23)
            .and_then(|m| m.parse::<u64>().ok())
            .unwrap_or(0),
        _ => 0,
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    Some(
        std::time::UNIX_EPOCH
            + std::time::Duration::from_millis(secs.max(0) as u64 * 1000 + millis),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_match_serde_json() {
        let mut cases: Vec<String> = (0u8..0x80)
            .flat_map(|b| {
                (0..10).map(move |pos| {
                    let mut s = "abcdefghijklmnopq".to_string().into_bytes();
                    s.insert(pos, b);
                    String::from_utf8(s).unwrap_or_default()
                })
            })
            .collect();
        cases.push(String::new());
        cases.push("\u{e9}\u{20ac}\u{1f600} \"quoted\" \\ back\tslash\r\n\u{7f}\u{1}".repeat(5));
        cases.push("the quick brown fox jumps over the lazy dog\n".repeat(100));
        for c in cases {
            let mut ours = Vec::new();
            write_json_str(&mut ours, &c);
            assert_eq!(ours, serde_json::to_vec(&c).unwrap(), "{c:?}");
        }
    }
    #[test]
    fn base64_matches_rfc_4648_and_round_trips() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, coded) in vectors {
            let mut out = Vec::new();
            base64_encode(&mut out, plain.as_bytes());
            assert_eq!(out, coded.as_bytes(), "{plain}");
            assert_eq!(base64_decode(coded).as_deref(), Some(plain.as_bytes()));
        }
        let all: Vec<u8> = (0..=255).collect();
        for n in 0..all.len() {
            let mut out = Vec::new();
            base64_encode(&mut out, &all[..n]);
            let text = String::from_utf8(out).unwrap();
            assert_eq!(base64_decode(&text).unwrap(), &all[..n]);
            assert_eq!(
                base64_decode(text.trim_end_matches('=')).unwrap(),
                &all[..n],
                "unpadded"
            );
        }
        for bad in ["Z", "Zg=", "Z===", "Zm9v!", "Zm 9v", "=Zm9"] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }
    #[test]
    fn rfc3339_dates() {
        use std::time::{Duration, UNIX_EPOCH};
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(951_782_400_250); // leap day 2000
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.250Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_299_831);
        assert_eq!(rfc3339(t), "2026-11-21T22:23:51.000Z");
        for t in [
            UNIX_EPOCH,
            t,
            UNIX_EPOCH + Duration::from_millis(951_782_400_250),
        ] {
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        }
        assert_eq!(parse_rfc3339("nope"), None);
        assert_eq!(parse_rfc3339("2026-11-21T22:23:51Z"), Some(t));
    }
}
