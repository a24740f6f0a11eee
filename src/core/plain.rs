//! The plain text of what a program wrote to a terminal (PROTOCOL 12.1): what text replies
//! show for a PTY command. Escape sequences are removed (vte finds them), `\r\n` is `\n`, a
//! bare `\r` returns to the start of the line so that what is written next overwrites it
//! (a progress bar redrawn in place shows its last state), backspace moves back a column,
//! a tab moves to the next multiple of eight, and erasing in the line (`CSI K`) and moving
//! along it (`CSI C`, `D`, `G`) act on the line as a terminal would. Rendering is lazy: it
//! happens on read, over the window read, never as bytes arrive.
//!
//! Invariants:
//! - Offsets stay raw byte offsets: a window of `[from, to)` renders exactly the text that
//!   bytes in it print. A window that starts inside an escape sequence starts after it
//!   (the sequence is found by looking back from `from` for its introducer).
//! - Nothing here allocates more than the rendered text and one line.

use vte::{Params, Parser, Perform};

use crate::core::ring::Ring;

/// How far before a window's start to look for an escape sequence it may begin inside.
/// Longer sequences (a long OSC title) are rare; a window inside one past this shows its
/// tail as text.
const LOOKBACK: u64 = 256;

/// The plain text the bytes of `ring` in `[from, to)` print. `ended`: the stream ended at
/// `to`, so an incomplete character there is U+FFFD rather than nothing.
pub fn render(ring: &Ring, from: u64, to: u64, ended: bool) -> String {
    let mut parser = Parser::new();
    let mut text = Text::default();
    // Put the parser in the state the bytes before `from` left it in, printing nothing.
    let back = from.saturating_sub(LOOKBACK).max(ring.start());
    let (a, b) = ring.slices(back, from);
    if let Some(esc) = last_escape(a, b) {
        let skip = esc;
        let (a, b) = ring.slices(back + skip as u64, from);
        text.mute = true;
        parser.advance(&mut text, a);
        parser.advance(&mut text, b);
        text.mute = false;
    }
    let (a, b) = ring.slices(from, to);
    parser.advance(&mut text, a);
    parser.advance(&mut text, b);
    if ended && incomplete_utf8(a, b) {
        text.print('\u{FFFD}');
    }
    text.finish()
}

/// The index (into `a` then `b`, as one) of the last ESC byte, if any.
fn last_escape(a: &[u8], b: &[u8]) -> Option<usize> {
    if let Some(i) = b.iter().rposition(|&c| c == 0x1b) {
        return Some(a.len() + i);
    }
    a.iter().rposition(|&c| c == 0x1b)
}

/// Whether `a` then `b` ends inside a UTF-8 character (a lead byte without all its
/// continuation bytes).
fn incomplete_utf8(a: &[u8], b: &[u8]) -> bool {
    let mut tail: Vec<u8> = a.iter().chain(b).rev().take(3).copied().collect();
    tail.reverse();
    for (i, &c) in tail.iter().enumerate().rev() {
        if c & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let need = match c {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => 1,
        };
        return tail.len() - i < need;
    }
    false
}

/// The text built so far: finished lines, and the line the cursor is on.
#[derive(Default)]
struct Text {
    out: String,
    line: Vec<char>,
    col: usize,
    /// Replaying what came before the window: parse, print nothing.
    mute: bool,
}

impl Text {
    fn finish(mut self) -> String {
        self.out.extend(self.line.iter());
        self.out
    }

    fn newline(&mut self) {
        self.out.extend(self.line.iter());
        self.out.push('\n');
        self.line.clear();
        self.col = 0;
    }

    /// Moves the cursor to `col`, padding the line with spaces when it moves past its end
    /// by printing (a move alone does not pad).
    fn pad_to_cursor(&mut self) {
        while self.line.len() < self.col {
            self.line.push(' ');
        }
    }
}

/// The first parameter of a CSI sequence, `default` when absent or zero.
fn first(params: &Params, default: usize) -> usize {
    match params.iter().next().and_then(|p| p.first()).copied() {
        Some(0) | None => default,
        Some(n) => n as usize,
    }
}

impl Perform for Text {
    fn print(&mut self, c: char) {
        if self.mute {
            return;
        }
        self.pad_to_cursor();
        if self.col < self.line.len() {
            self.line[self.col] = c;
        } else {
            self.line.push(c);
        }
        self.col += 1;
    }

    fn execute(&mut self, byte: u8) {
        if self.mute {
            return;
        }
        match byte {
            b'\n' | 0x0b | 0x0c => self.newline(),
            b'\r' => self.col = 0,
            0x08 => self.col = self.col.saturating_sub(1),
            b'\t' => {
                self.col = (self.col / 8 + 1) * 8;
                self.pad_to_cursor();
            }
            _ => {}
        }
    }

    fn csi_dispatch(&mut self, params: &Params, intermediates: &[u8], _ignore: bool, c: char) {
        if self.mute || !intermediates.is_empty() {
            return;
        }
        match c {
            // Erase in line: to its end, from its start, all of it.
            'K' => match params.iter().next().and_then(|p| p.first()).copied() {
                None | Some(0) => self.line.truncate(self.col),
                Some(1) => {
                    for cell in self.line.iter_mut().take(self.col + 1) {
                        *cell = ' ';
                    }
                }
                Some(2) => self.line.clear(),
                Some(_) => {}
            },
            'C' => self.col += first(params, 1),
            'D' => self.col = self.col.saturating_sub(first(params, 1)),
            'G' => self.col = first(params, 1) - 1,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(bytes: &[u8]) -> String {
        let r = Ring::filled(bytes);
        render(&r, 0, r.end(), true)
    }

    #[test]
    fn colours_and_other_escapes_are_removed_and_crlf_is_a_newline() {
        assert_eq!(
            plain(b"\x1b[1;31mred\x1b[0m plain\r\n\x1b]0;title\x07next\r\n"),
            "red plain\nnext\n"
        );
    }

    #[test]
    fn a_bare_cr_overwrites_the_line_so_a_progress_bar_shows_its_last_state() {
        assert_eq!(plain(b" 10%\r 50%\r100%\r\ndone"), "100%\ndone");
        assert_eq!(plain(b"abcdef\rXY\n"), "XYcdef\n");
        // Erasing to the end of the line after the return, as many bars do.
        assert_eq!(plain(b"downloading 10%\r\x1b[Kdone\n"), "done\n");
    }

    #[test]
    fn backspace_moves_back_a_column_and_tabs_reach_the_next_stop() {
        assert_eq!(plain(b"abc\x08\x08X\n"), "aXc\n");
        assert_eq!(plain(b"a\tb\n"), "a       b\n");
    }

    #[test]
    fn a_window_that_starts_inside_an_escape_sequence_starts_after_it() {
        let bytes = b"one\x1b[38;5;196mtwo";
        let r = Ring::filled(bytes);
        // From inside the colour sequence: its tail is not text.
        assert_eq!(render(&r, 6, r.end(), true), "two");
        // From after it, and from before it.
        assert_eq!(render(&r, 14, r.end(), true), "two");
        assert_eq!(render(&r, 0, 3, true), "one");
    }

    #[test]
    fn an_incomplete_character_is_replaced_only_when_the_stream_ended() {
        let r = Ring::filled(b"a\xc3");
        assert_eq!(render(&r, 0, 2, true), "a\u{FFFD}");
        assert_eq!(render(&r, 0, 2, false), "a");
        assert_eq!(plain("é✓".as_bytes()), "é✓");
    }
}
