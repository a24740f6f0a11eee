//! Bounded byte ring with absolute offsets, grown on demand within a memory budget.
//!
//! A command's output stream is kept in one `Ring`. Every byte has an absolute offset: the
//! number of bytes the stream produced before it. The ring retains the newest bytes up to
//! its `limit`; older ones are dropped and only counted (`start()` is the offset of the
//! oldest retained byte, which is also the number of bytes dropped).
//!
//! Memory is committed as output arrives, not up front: the storage grows (doubling, from
//! a small first step) while the stream is young, each step granted by the caller's
//! budget (`growth_for`, then `grow`). When the storage is full and no more is granted
//! (or the limit is reached), the ring stops growing and wraps within what it holds,
//! dropping its oldest bytes: a bounded ring whose capacity is what it was given. All of
//! a ring's memory can be given back (`discard`): its bytes then count as dropped.
//!
//! Invariants:
//! - `start() <= end()` and `end() - start() <= committed() <= limit()` (after `discard`,
//!   `start() == end()`).
//! - While growing, the bytes of `[base, end)` lie at `buf[0..end - base]`; once wrapped,
//!   the byte at offset `o` lives at `(o - base) % buf.len()`, which agrees with the
//!   growing layout at the moment of wrapping (every stored offset is below the size).
//!
//! Text rules (see `utf8_window`): a window handed to a client never starts inside a
//! multi-byte UTF-8 character, and an incomplete character at the end of a stream that may
//! still grow is held back until it completes.

use crate::wire::state::{BlobsIn, BlobsOut, RingImage, StateError};

/// Longest UTF-8 encoding of one character, in bytes.
const MAX_CHAR_LEN: usize = 4;

/// The first storage a ring commits: small, so that a thousand commands that each print
/// a line cost a thousand small buffers, not a thousand rings' worth.
const FIRST_STEP: usize = 4 << 10;

/// A bounded byte ring addressed by absolute stream offsets.
#[derive(Debug)]
pub struct Ring {
    buf: Vec<u8>,
    limit: usize,
    /// The offset stored at `buf[0]` when the storage was (re)started.
    base: u64,
    end: u64,
    /// The storage is full and fixed; new bytes overwrite the oldest.
    wrapped: bool,
}

impl Ring {
    /// A ring that will retain at most `limit` bytes. Nothing is allocated yet.
    pub fn new(limit: usize) -> Ring {
        Ring {
            buf: Vec::new(),
            limit,
            base: 0,
            end: 0,
            wrapped: false,
        }
    }

    /// The most bytes this ring may retain.
    pub fn capacity(&self) -> usize {
        self.limit
    }

    /// Bytes of memory the ring holds now.
    pub fn committed(&self) -> usize {
        self.buf.capacity()
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
        if self.wrapped {
            (self.end - self.base).min(self.buf.len() as u64) as usize
        } else {
            self.buf.len()
        }
    }

    /// How many more bytes of storage the ring would like before taking `n` more bytes
    /// (0 when it has room, has wrapped, or is at its limit).
    pub fn growth_for(&self, n: usize) -> usize {
        let have = self.buf.capacity();
        let need = self.buf.len() + n;
        if self.wrapped || need <= have || have >= self.limit {
            return 0;
        }
        let target = need.max(have * 2).max(FIRST_STEP).min(self.limit);
        target - have
    }

    /// Commits `bytes` more of storage (what the budget granted of `growth_for`).
    pub fn grow(&mut self, bytes: usize) {
        if self.wrapped || bytes == 0 {
            return;
        }
        let target = (self.buf.capacity() + bytes).min(self.limit);
        self.buf.reserve_exact(target - self.buf.len());
    }

    /// Appends `data` within the storage the ring holds: when it is full the ring wraps,
    /// dropping the oldest bytes. Never allocates more than was granted.
    pub fn append(&mut self, data: &[u8]) {
        let total = data.len() as u64;
        if data.is_empty() {
            return;
        }
        if !self.wrapped {
            let room = self.buf.capacity() - self.buf.len();
            if data.len() <= room {
                self.buf.extend_from_slice(data);
                self.end += total;
                return;
            }
            if self.buf.capacity() == 0 {
                // Nothing granted yet (the budget is spent): the bytes are dropped, and the
                // ring may still grow once memory is given back, instead of wrapping at
                // nothing for the rest of its life.
                self.end += total;
                self.base = self.end;
                return;
            }
            // Full, and no more is coming: wrap within what is held. Every stored offset
            // is below the size, so `(o - base) % size` is where each already lies.
            self.wrapped = true;
            let size = self.buf.capacity();
            self.buf.resize(size, 0);
        }
        let cap = self.buf.len();
        if cap == 0 {
            self.end += total;
            self.base = self.end;
            return;
        }
        // Only the last `cap` bytes of a huge write can survive it.
        let data = &data[data.len().saturating_sub(cap)..];
        let first_offset = self.end + total - data.len() as u64;
        let pos = ((first_offset - self.base) % cap as u64) as usize;
        let first = data.len().min(cap - pos);
        self.buf[pos..pos + first].copy_from_slice(&data[..first]);
        let rest = &data[first..];
        self.buf[..rest.len()].copy_from_slice(rest);
        self.end += total;
    }

    #[cfg(test)]
    /// Appends `data`, growing up to the limit without asking the budget (tests).
    pub fn push(&mut self, data: &[u8]) {
        let want = self.growth_for(data.len());
        self.grow(want);
        self.append(data);
    }

    /// Gives back all of the ring's memory; what it held counts as dropped. Returns the
    /// bytes freed. Later output starts a fresh, growing storage.
    pub fn discard(&mut self) -> usize {
        let freed = self.buf.capacity();
        self.buf = Vec::new();
        self.base = self.end;
        self.wrapped = false;
        freed
    }

    /// Gives back all but `keep` bytes of the ring's memory (nothing when it holds no
    /// more): the newest `keep` bytes stay, the older ones count as dropped. Returns the
    /// bytes freed. A ring left full is fixed at its new size, as a wrapped one is.
    pub fn shrink_to(&mut self, keep: usize) -> usize {
        let had = self.buf.capacity();
        if keep >= had {
            return 0;
        }
        let from = self.end - (self.retained().min(keep) as u64);
        let mut buf = Vec::with_capacity(keep);
        let (a, b) = self.slices(from, self.end);
        buf.extend_from_slice(a);
        buf.extend_from_slice(b);
        self.base = from;
        self.wrapped = buf.len() == buf.capacity() && !buf.is_empty();
        self.buf = buf;
        had.saturating_sub(self.buf.capacity())
    }

    /// Index in `buf` of retained offset `o`.
    fn index(&self, o: u64) -> usize {
        let rel = o - self.base;
        if self.wrapped {
            (rel % self.buf.len() as u64) as usize
        } else {
            rel as usize
        }
    }

    /// A ring of 64 KiB holding `bytes` (tests of what reads a ring).
    #[cfg(test)]
    pub fn filled(bytes: &[u8]) -> Ring {
        let mut r = Ring::new(1 << 16);
        r.grow(1 << 16);
        r.append(bytes);
        r
    }

    /// The retained bytes in `[from, to)` as at most two slices, oldest first. The range is
    /// clamped to what is retained.
    pub fn slices(&self, from: u64, to: u64) -> (&[u8], &[u8]) {
        let from = from.max(self.start());
        let to = to.min(self.end);
        if from >= to {
            return (&[], &[]);
        }
        let pos = self.index(from);
        let len = (to - from) as usize;
        if pos + len <= self.buf.len() {
            (&self.buf[pos..pos + len], &[])
        } else {
            let first = self.buf.len() - pos;
            (&self.buf[pos..], &self.buf[..len - first])
        }
    }

    /// The byte at absolute offset `at`, if retained.
    fn byte(&self, at: u64) -> Option<u8> {
        if at < self.start() || at >= self.end {
            return None;
        }
        Some(self.buf[self.index(at)])
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

impl Ring {
    /// What an upgrade in place carries: the bound, the memory held (which the budget
    /// counted), the end offset, whether it wraps, and the retained bytes, oldest first.
    pub fn carry(&self, blobs: &mut BlobsOut) -> RingImage {
        let (a, b) = self.slices(self.start(), self.end);
        RingImage {
            limit: self.limit,
            committed: self.committed(),
            end: self.end,
            wrapped: self.wrapped,
            bytes: blobs.put2(a, b),
        }
    }

    /// The ring `carry` described: the same offsets, bytes and memory, laid out afresh
    /// from its oldest byte. A description no ring could have is refused.
    pub fn resume(img: &RingImage, blobs: &BlobsIn) -> Result<Ring, StateError> {
        let bytes = blobs.get(img.bytes)?;
        let fits = bytes.len() <= img.committed
            && img.committed <= img.limit.max(FIRST_STEP)
            && bytes.len() as u64 <= img.end
            && (!img.wrapped || bytes.len() == img.committed);
        if !fits {
            return Err(StateError::new(format!(
                "a ring of {} bytes holding {} of {} committed, {} in all",
                img.limit,
                bytes.len(),
                img.committed,
                img.end
            )));
        }
        let mut buf = Vec::with_capacity(img.committed);
        buf.extend_from_slice(bytes);
        Ok(Ring {
            buf,
            limit: img.limit,
            base: img.end - bytes.len() as u64,
            end: img.end,
            wrapped: img.wrapped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_shrunk_keeps_its_newest_bytes_and_counts_the_rest_dropped() {
        for wrap in [false, true] {
            let mut r = Ring::new(64);
            r.grow(64);
            r.append(&[b'a'; 40]);
            if wrap {
                r.append(&[b'b'; 40]); // wraps: 64 retained, 16 dropped
            }
            let end = r.end();
            assert_eq!(r.shrink_to(16), 48);
            assert_eq!(r.committed(), 16);
            assert_eq!((r.start(), r.end()), (end - 16, end));
            let last = if wrap { "b" } else { "a" };
            assert_eq!(r.text(r.start(), end), last.repeat(16));
            // Full at its new size: it wraps there, and reads stay right.
            r.append(b"0123456789");
            assert_eq!(r.end(), end + 10);
            assert_eq!(r.retained(), 16);
            assert_eq!(
                r.text(r.start(), r.end()),
                format!("{}0123456789", last.repeat(6))
            );
            assert_eq!(r.shrink_to(32), 0, "never grows");
        }
        // Holding less than it keeps: the storage shrinks, the bytes all stay.
        let mut r = Ring::new(1 << 20);
        r.grow(1 << 16);
        r.append(b"short");
        assert_eq!(r.shrink_to(4096), (1 << 16) - 4096);
        assert_eq!(r.text(r.start(), r.end()), "short");
        assert_eq!(r.start(), 0);
        r.append(b" and more");
        assert_eq!(r.text(0, r.end()), "short and more");
    }

    #[test]
    fn a_ring_granted_nothing_drops_bytes_and_grows_later() {
        let mut r = Ring::new(1 << 20);
        r.append(b"lost");
        assert_eq!((r.start(), r.end(), r.committed()), (4, 4, 0));
        let want = r.growth_for(3);
        assert!(want > 0, "it still asks for storage");
        r.grow(want);
        r.append(b"new");
        assert_eq!((r.start(), r.end()), (4, 7));
        assert_eq!(r.retained(), 3);
    }

    fn contents(r: &Ring) -> Vec<u8> {
        let (a, b) = r.slices(r.start(), r.end());
        [a, b].concat()
    }

    #[test]
    fn empty_ring_allocates_nothing() {
        let r = Ring::new(1 << 20);
        assert_eq!(r.committed(), 0);
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
    fn storage_grows_as_output_arrives_up_to_the_limit() {
        let mut r = Ring::new(1 << 20);
        r.push(b"hello");
        assert_eq!(r.committed(), FIRST_STEP, "a small first step");
        r.push(&[b'x'; 10_000]);
        assert_eq!(
            r.committed(),
            10_005,
            "what the write needs, more than double"
        );
        r.push(b"y");
        assert_eq!(r.committed(), 20_010, "doubling");
        r.push(&vec![b'y'; 2 << 20]);
        assert_eq!(r.committed(), 1 << 20, "never past the limit");
        assert_eq!(r.retained(), 1 << 20);
        assert_eq!(r.start(), 10_006 + (2 << 20) - (1 << 20));
    }

    #[test]
    fn a_ring_denied_growth_wraps_within_what_it_holds() {
        let mut r = Ring::new(1 << 20);
        let want = r.growth_for(3);
        assert_eq!(want, FIRST_STEP);
        r.grow(want);
        r.append(b"abc");
        // The budget grants nothing more: the ring keeps its newest 4 KiB.
        assert_eq!(r.growth_for(10_000), 10_003 - FIRST_STEP);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        r.append(&data);
        assert_eq!(r.committed(), FIRST_STEP);
        assert_eq!(r.end(), 10_003);
        assert_eq!(r.start(), 10_003 - FIRST_STEP as u64);
        assert_eq!(contents(&r), &data[data.len() - FIRST_STEP..]);
        assert_eq!(r.growth_for(1), 0, "a wrapped ring asks for nothing more");
        r.append(b"zz");
        assert_eq!(&contents(&r)[FIRST_STEP - 2..], b"zz");
    }

    #[test]
    fn a_ring_granted_nothing_counts_everything_as_dropped() {
        let mut r = Ring::new(1 << 20);
        r.append(b"lost");
        assert_eq!((r.start(), r.end()), (4, 4));
        assert_eq!(r.committed(), 0);
    }

    #[test]
    fn discard_gives_memory_back_and_reports_the_drop() {
        let mut r = Ring::new(64);
        r.push(b"0123456789");
        assert!(r.discard() > 0);
        assert_eq!(r.committed(), 0);
        assert_eq!((r.start(), r.end()), (10, 10));
        assert_eq!(r.text(0, 10), "");
        // Later output starts afresh at its own offsets.
        r.push(b"abc");
        assert_eq!((r.start(), r.end()), (10, 13));
        assert_eq!(contents(&r), b"abc");
        r.push(&[b'z'; 100]);
        assert_eq!(r.retained(), 64);
        assert_eq!(r.end(), 113);
        assert_eq!(contents(&r), [b'z'; 64]);
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

    #[test]
    fn a_ring_carried_by_an_upgrade_keeps_its_offsets_bytes_and_memory() {
        use crate::wire::state::{BlobsIn, BlobsOut};
        let mut growing = Ring::new(1 << 20);
        growing.push(b"abc");
        let mut wrapped = Ring::new(8);
        wrapped.push(b"0123456789abc");
        let mut discarded = Ring::new(64);
        discarded.push(b"gone");
        discarded.discard();
        for mut r in [growing, wrapped, discarded, Ring::new(16)] {
            let mut blobs = BlobsOut::default();
            let img = r.carry(&mut blobs);
            let area = blobs.bytes().to_vec();
            let mut back = Ring::resume(&img, &BlobsIn(&area)).unwrap();
            assert_eq!(
                (back.start(), back.end(), back.committed(), back.capacity()),
                (r.start(), r.end(), r.committed(), r.capacity())
            );
            let joined = |r: &Ring| {
                let (a, b) = r.slices(0, u64::MAX);
                [a, b].concat()
            };
            assert_eq!(joined(&back), joined(&r));
            // Both go on alike.
            r.append(b"XYZ");
            back.append(b"XYZ");
            assert_eq!(back.text(0, u64::MAX), r.text(0, u64::MAX));
            assert_eq!((back.start(), back.end()), (r.start(), r.end()));
        }
        let mut blobs = BlobsOut::default();
        let mut img = Ring::new(8).carry(&mut blobs);
        img.committed = 4;
        img.wrapped = true;
        assert!(
            Ring::resume(&img, &BlobsIn(&[])).is_err(),
            "wrapped yet not full"
        );
    }
}
