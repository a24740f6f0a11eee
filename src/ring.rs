//! Fixed-capacity byte ring with absolute offsets.
//!
//! A command's output stream is kept in one `Ring`. Every byte has an absolute offset: the
//! number of bytes the stream produced before it. The ring retains the newest `capacity`
//! bytes; older ones are dropped and only counted (`start()` is the offset of the oldest
//! retained byte, which is also the number of bytes dropped).
//!
//! Invariants:
//! - `start() <= end()` and `end() - start() <= capacity()`.
//! - Memory is reserved on the first write, never before, and never grows past `capacity`:
//!   a thousand idle commands cost nothing but their bookkeeping.
//! - The byte at absolute offset `o` lives at index `o % capacity` once written.
//!
//! Text rules (see `utf8_window`): a window handed to a client never starts inside a
//! multi-byte UTF-8 character, and an incomplete character at the end of a stream that may
//! still grow is held back until it completes.

/// Longest UTF-8 encoding of one character, in bytes.
const MAX_CHAR_LEN: usize = 4;

/// A fixed-capacity byte ring addressed by absolute stream offsets.
#[derive(Debug)]
pub struct Ring {
    buf: Vec<u8>,
    capacity: usize,
    end: u64,
}

impl Ring {
    /// A ring that will retain at most `capacity` bytes. Nothing is allocated yet.
    pub fn new(capacity: usize) -> Ring {
        Ring {
            buf: Vec::new(),
            capacity,
            end: 0,
        }
    }

    /// The most bytes this ring retains.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Offset one past the newest byte: the total number of bytes ever pushed.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Offset of the oldest retained byte; equal to the number of bytes dropped.
    pub fn start(&self) -> u64 {
        self.end - self.retained() as u64
    }

    /// Number of bytes currently retained.
    pub fn retained(&self) -> usize {
        self.end.min(self.capacity as u64) as usize
    }

    /// Appends `data`, dropping the oldest bytes when the ring is full.
    pub fn push(&mut self, data: &[u8]) {
        let total = data.len() as u64;
        let cap = self.capacity;
        if cap == 0 || data.is_empty() {
            self.end += total;
            return;
        }
        // Only the last `cap` bytes of a huge write can survive it.
        let data = &data[data.len().saturating_sub(cap)..];
        let first_offset = self.end + total - data.len() as u64;
        let pos = (first_offset % cap as u64) as usize;
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(cap);
        }
        if self.buf.len() == pos && pos + data.len() <= cap {
            // Filling for the first time: append without touching the untouched tail.
            self.buf.extend_from_slice(data);
        } else {
            if self.buf.len() < cap {
                // This write fills or wraps the ring, so every slot is about to be live.
                self.buf.resize(cap, 0);
            }
            let first = data.len().min(cap - pos);
            self.buf[pos..pos + first].copy_from_slice(&data[..first]);
            let rest = &data[first..];
            self.buf[..rest.len()].copy_from_slice(rest);
        }
        self.end += total;
    }

    /// The retained bytes in `[from, to)` as at most two slices, oldest first. The range is
    /// clamped to what is retained.
    pub fn slices(&self, from: u64, to: u64) -> (&[u8], &[u8]) {
        let from = from.max(self.start());
        let to = to.min(self.end);
        if from >= to {
            return (&[], &[]);
        }
        let cap = self.capacity as u64;
        let pos = (from % cap) as usize;
        let len = (to - from) as usize;
        if pos + len <= self.capacity {
            (&self.buf[pos..pos + len], &[])
        } else {
            let first = self.capacity - pos;
            (&self.buf[pos..], &self.buf[..len - first])
        }
    }

    /// The byte at absolute offset `at`, if retained.
    fn byte(&self, at: u64) -> Option<u8> {
        if at < self.start() || at >= self.end {
            return None;
        }
        Some(self.buf[(at % self.capacity as u64) as usize])
    }

    /// Narrows `[from, to)` (clamped to what is retained) to a window fit to hand out as
    /// text: leading continuation bytes are skipped (at most three: a valid character has
    /// no more), and when `more_may_come` an incomplete character at the end is held back.
    pub fn utf8_window(&self, from: u64, to: u64, more_may_come: bool) -> (u64, u64) {
        let mut from = from.max(self.start()).min(self.end);
        let to = to.min(self.end).max(from);
        let limit = (from + MAX_CHAR_LEN as u64 - 1).min(to);
        while from < limit && self.byte(from).is_some_and(is_continuation) {
            from += 1;
        }
        if !more_may_come {
            return (from, to);
        }
        (from, to - self.incomplete_tail(from, to) as u64)
    }

    /// How many bytes at the end of `[from, to)` form a character still missing bytes.
    fn incomplete_tail(&self, from: u64, to: u64) -> usize {
        let mut back = 0usize;
        while back < MAX_CHAR_LEN - 1 && to - back as u64 > from {
            let at = to - back as u64 - 1;
            let b = self.byte(at).unwrap_or(0);
            if is_continuation(b) {
                back += 1;
                continue;
            }
            let need = lead_len(b);
            // `back + 1` bytes of this character are present.
            return if need > back + 1 { back + 1 } else { 0 };
        }
        0
    }

    /// The retained bytes of `[from, to)` as text, invalid bytes replaced by U+FFFD. The
    /// caller chooses the window (usually from `utf8_window`).
    pub fn text(&self, from: u64, to: u64) -> String {
        let (a, b) = self.slices(from, to);
        if b.is_empty() {
            return String::from_utf8_lossy(a).into_owned();
        }
        let mut joined = Vec::with_capacity(a.len() + b.len());
        joined.extend_from_slice(a);
        joined.extend_from_slice(b);
        match String::from_utf8(joined) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Length of the character a lead byte starts; 1 for ASCII and for bytes that cannot lead
/// (those become U+FFFD on their own, so nothing is held back for them).
fn lead_len(b: u8) -> usize {
    match b {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 1,
    }
}

/// Cuts `text` in the middle to at most `max_chars` characters plus a marker naming how
/// many were left out. `max_chars == 0` disables the cut.
pub fn middle_cut(text: String, max_chars: usize) -> String {
    if max_chars == 0 {
        return text;
    }
    let total = text.chars().count();
    if total <= max_chars {
        return text;
    }
    let head = max_chars / 2;
    let tail = max_chars - head;
    let omitted = total - max_chars;
    let head_end = text.char_indices().nth(head).map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .nth(total - tail)
        .map_or(text.len(), |(i, _)| i);
    let mut out = String::with_capacity(head_end + (text.len() - tail_start) + 48);
    out.push_str(&text[..head_end]);
    out.push_str(&format!("\n[... {omitted} characters omitted ...]\n"));
    out.push_str(&text[tail_start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contents(r: &Ring) -> Vec<u8> {
        let (a, b) = r.slices(r.start(), r.end());
        [a, b].concat()
    }

    #[test]
    fn empty_ring_allocates_nothing() {
        let r = Ring::new(1 << 20);
        assert_eq!(r.buf.capacity(), 0);
        assert_eq!((r.start(), r.end()), (0, 0));
        assert_eq!(r.text(0, 10), "");
    }

    #[test]
    fn fill_then_wrap_keeps_newest_bytes() {
        let mut r = Ring::new(8);
        r.push(b"abcde");
        assert_eq!(contents(&r), b"abcde");
        assert_eq!(r.start(), 0);
        r.push(b"fghij");
        assert_eq!(contents(&r), b"cdefghij");
        assert_eq!((r.start(), r.end()), (2, 10));
        r.push(b"k");
        assert_eq!(contents(&r), b"defghijk");
        assert_eq!(r.start(), 3);
    }

    #[test]
    fn huge_write_keeps_its_tail_and_counts_the_rest() {
        let mut r = Ring::new(4);
        r.push(b"xy");
        r.push(b"0123456789");
        assert_eq!(contents(&r), b"6789");
        assert_eq!((r.start(), r.end()), (8, 12));
        // A write exactly the ring's size after a partial fill.
        let mut r = Ring::new(4);
        r.push(b"a");
        r.push(b"wxyz");
        assert_eq!(contents(&r), b"wxyz");
        assert_eq!(r.start(), 1);
    }

    #[test]
    fn zero_capacity_counts_everything_as_dropped() {
        let mut r = Ring::new(0);
        r.push(b"hello");
        assert_eq!((r.start(), r.end()), (5, 5));
        assert_eq!(r.text(0, 5), "");
    }

    #[test]
    fn offsets_survive_many_wraps() {
        let mut r = Ring::new(7);
        let mut all = Vec::new();
        for i in 0..200u32 {
            let chunk: Vec<u8> = (0..(i % 11)).map(|j| (i * 31 + j) as u8).collect();
            r.push(&chunk);
            all.extend_from_slice(&chunk);
            assert_eq!(r.end(), all.len() as u64);
            assert_eq!(contents(&r), &all[r.start() as usize..]);
            // Every sub-range reads back the same bytes.
            let mid = r.start() + (r.end() - r.start()) / 2;
            let (a, b) = r.slices(mid, r.end());
            assert_eq!([a, b].concat(), &all[mid as usize..]);
        }
    }

    #[test]
    fn slices_clamp_to_retained_range() {
        let mut r = Ring::new(4);
        r.push(b"abcdef");
        let (a, b) = r.slices(0, 100);
        assert_eq!([a, b].concat(), b"cdef");
        assert_eq!(r.slices(10, 20), (&[][..], &[][..]));
    }

    /// Every cut of a stream holding 1-, 2-, 3- and 4-byte characters: the window never
    /// starts inside a character, and a held-back tail is exactly the incomplete character.
    #[test]
    fn utf8_window_at_every_cut() {
        let text = "a\u{e9}\u{20ac}\u{1f600}b\u{e9}\u{1f600}\u{20ac}";
        let bytes = text.as_bytes();
        for from in 0..=bytes.len() {
            for to in from..=bytes.len() {
                let mut r = Ring::new(64);
                r.push(&bytes[..to]);
                let (s, e) = r.utf8_window(from as u64, to as u64, true);
                let (s, e) = (s as usize, e as usize);
                assert!(s >= from && s <= to && e <= to && s <= e);
                if s < e {
                    assert!(text.is_char_boundary(s), "from={from} to={to} s={s}");
                }
                assert!(
                    text.is_char_boundary(e) || e == s,
                    "from={from} to={to} e={e}"
                );
                // Nothing complete is held back: the hold-back is shorter than a character.
                assert!(to - e < 4);
                if text.is_char_boundary(to) && s < to {
                    assert_eq!(e, to);
                }
                let expected = if s < e { &text[s..e] } else { "" };
                assert_eq!(r.text(s as u64, e as u64), expected);
                // At end of stream nothing is held back.
                let (_, e2) = r.utf8_window(from as u64, to as u64, false);
                assert_eq!(e2 as usize, to);
            }
        }
    }

    #[test]
    fn utf8_window_after_drop_skips_partial_character() {
        // The ring's oldest byte falls inside a 3-byte character.
        let mut r = Ring::new(5);
        r.push("x\u{20ac}yz".as_bytes()); // 6 bytes: the euro sign's lead byte survives
        r.push(b"!"); // ...and now only its two continuation bytes do
        let (s, e) = r.utf8_window(0, r.end(), true);
        assert_eq!(r.text(s, e), "yz!");
    }

    #[test]
    fn invalid_bytes_are_replaced_not_held() {
        let mut r = Ring::new(16);
        r.push(b"ok\xff");
        let (s, e) = r.utf8_window(0, r.end(), true);
        assert_eq!(e, 3);
        assert_eq!(r.text(s, e), "ok\u{fffd}");
        // An incomplete character at end of stream becomes U+FFFD.
        let mut r = Ring::new(16);
        r.push(b"ok\xe2\x82");
        assert_eq!(r.utf8_window(0, 4, true), (0, 2));
        let (s, e) = r.utf8_window(0, 4, false);
        assert_eq!(r.text(s, e), "ok\u{fffd}");
    }

    #[test]
    fn text_across_the_wrap_point() {
        let mut r = Ring::new(6);
        r.push(b"1234");
        r.push("\u{e9}\u{e9}".as_bytes()); // wraps
        let (s, e) = r.utf8_window(r.start(), r.end(), false);
        assert_eq!(r.text(s, e), "34\u{e9}\u{e9}");
    }

    #[test]
    fn middle_cut_counts_characters() {
        assert_eq!(middle_cut("abcdef".into(), 0), "abcdef");
        assert_eq!(middle_cut("abcdef".into(), 6), "abcdef");
        let cut = middle_cut("\u{e9}\u{e9}\u{e9}xyz\u{20ac}\u{20ac}".into(), 4);
        assert_eq!(
            cut,
            "\u{e9}\u{e9}\n[... 4 characters omitted ...]\n\u{20ac}\u{20ac}"
        );
    }
}
