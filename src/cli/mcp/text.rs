//! A command's output as an MCP tool answers it: what arrived since the client last read,
//! kept bounded as head and tail, and cut head-and-tail on a character boundary past a
//! call's `max_output_bytes`.
//!
//! Invariants:
//! - Memory is bounded by twice the ceiling (`--max-output-bytes`) per command, however
//!   much it writes between two reads: the first `cap` bytes and the newest `cap` bytes
//!   are kept, and the bytes between them are only counted.
//! - Every cut falls on a character boundary, and says how many bytes it left out.

/// What a command wrote since its output was last taken.
#[derive(Debug, Default)]
pub struct Unread {
    /// The first bytes, up to `cap`.
    head: String,
    /// The newest bytes past the head, up to about `cap` (trimmed in steps).
    tail: String,
    /// Bytes between head and tail that were dropped.
    dropped: u64,
    /// Bytes the daemon could not deliver (a `Gap`).
    lost: u64,
    cap: usize,
}

impl Unread {
    /// Keeps at most `cap` bytes of head and of tail.
    pub fn new(cap: usize) -> Unread {
        Unread {
            cap: cap.max(64),
            ..Unread::default()
        }
    }

    /// Nothing arrived since the last `take`.
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_empty() && self.dropped == 0 && self.lost == 0
    }

    /// Text the command wrote.
    pub fn push(&mut self, mut text: &str) {
        if self.tail.is_empty() && self.dropped == 0 && self.head.len() < self.cap {
            let room = floor_boundary(text, self.cap - self.head.len());
            self.head.push_str(&text[..room]);
            text = &text[room..];
        }
        if text.is_empty() {
            return;
        }
        self.tail.push_str(text);
        // Trim in steps, so a stream of small chunks does not move the tail each time.
        if self.tail.len() > 2 * self.cap {
            let cut = ceil_boundary(&self.tail, self.tail.len() - self.cap);
            self.dropped += cut as u64;
            self.tail.drain(..cut);
        }
    }

    /// Bytes the daemon dropped before they reached us.
    pub fn lose(&mut self, bytes: u64) {
        self.lost += bytes;
    }

    /// Everything since the last take, cut to `max` bytes: `(text, truncated)`.
    pub fn take(&mut self, max: usize) -> (String, bool) {
        let whole = std::mem::take(self);
        self.cap = whole.cap;
        let lost = whole.lost;
        let dropped = whole.dropped;
        let marker = |left_out: u64| format!("\n[... {left_out} bytes of output left out ...]\n");
        let (text, cut) = if dropped == 0 {
            // Nothing dropped: head and tail are one text.
            let mut all = whole.head;
            all.push_str(&whole.tail);
            if all.len() <= max {
                (all, false)
            } else {
                let h = floor_boundary(&all, max / 2);
                let t = ceil_boundary(&all, all.len() - (max - h));
                (
                    format!("{}{}{}", &all[..h], marker((t - h) as u64), &all[t..]),
                    true,
                )
            }
        } else {
            let head = &whole.head[..floor_boundary(&whole.head, max / 2)];
            let keep = max - head.len();
            let from = ceil_boundary(&whole.tail, whole.tail.len().saturating_sub(keep));
            let left_out = (whole.head.len() - head.len()) as u64 + dropped + from as u64;
            (
                format!("{head}{}{}", marker(left_out), &whole.tail[from..]),
                true,
            )
        };
        if lost > 0 {
            let note =
                format!("[... {lost} bytes of output lost: execd could not keep them ...]\n");
            return (note + &text, true);
        }
        (text, cut)
    }
}

/// The largest character boundary of `s` at or below `at`.
pub fn floor_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The smallest character boundary of `s` at or above `at`.
pub fn ceil_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// `s` cut head-and-tail to about `max` bytes on character boundaries (for text the
/// daemon answered whole: a shell session's output): `(text, truncated)`.
pub fn cut(s: String, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut u = Unread::new(max);
    u.push(&s);
    u.take(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_comes_back_whole_and_once() {
        let mut u = Unread::new(100);
        u.push("hello ");
        u.push("world\n");
        assert_eq!(u.take(100), ("hello world\n".to_string(), false));
        assert!(u.is_empty());
        assert_eq!(u.take(100), (String::new(), false));
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_counts_the_middle() {
        let mut u = Unread::new(1000);
        let text: String = (0..10_000).map(|i| format!("{i}\n")).collect();
        for chunk in text.as_bytes().chunks(333) {
            u.push(std::str::from_utf8(chunk).unwrap());
        }
        let (out, truncated) = u.take(100);
        assert!(truncated);
        assert!(out.starts_with("0\n1\n2\n"), "{out}");
        assert!(out.ends_with("9998\n9999\n"), "{out}");
        let head = out.split("\n[...").next().unwrap();
        let tail = out.rsplit("...]\n").next().unwrap();
        let said: u64 = out
            .split("[... ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert_eq!(head.len() + tail.len() + said as usize, text.len());
        assert!(head.len() + tail.len() <= 100);
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        // Three-byte characters: no cut may split one, whatever the limits.
        let text = "€".repeat(1000);
        for max in [1, 2, 3, 4, 5, 50, 101, 2999] {
            for cap in [64, 100, 1000] {
                let mut u = Unread::new(cap);
                for chunk in text.split_inclusive('€').collect::<Vec<_>>().chunks(7) {
                    u.push(&chunk.concat());
                }
                let (out, truncated) = u.take(max);
                assert!(truncated);
                let kept: String = out.chars().filter(|c| *c == '€').collect();
                assert!(kept.len() <= max, "{max} {cap}");
                assert!(!out.contains('\u{fffd}'));
            }
        }
        let (out, t) = cut("é".repeat(10), 5);
        assert!(t);
        assert!(
            out.starts_with("é\n[... ") && out.ends_with("...]\né"),
            "{out}"
        );
    }

    #[test]
    fn memory_stays_bounded_and_lost_bytes_are_said() {
        let mut u = Unread::new(64);
        for _ in 0..10_000 {
            u.push("0123456789");
        }
        assert!(u.head.len() <= 64 && u.tail.len() <= 2 * 64 + 10);
        u.lose(7);
        let (out, truncated) = u.take(64);
        assert!(truncated);
        assert!(out.starts_with("[... 7 bytes of output lost"), "{out}");
        assert!(out.contains("bytes of output left out"), "{out}");
    }
}
