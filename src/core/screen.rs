//! The screen of a PTY command (PROTOCOL 12.1): a terminal emulator (vt100, on vte) fed
//! the bytes the command wrote, so a full-screen program (`top`, `vim`, `less`) can be read
//! as a person sees it.
//!
//! Invariants:
//! - A command has no screen until one is asked for (a `screen` read, `execctl attach`):
//!   it then starts from the output retained at that moment and is fed every byte that
//!   arrives after, so commands nobody looks at cost nothing.
//! - Its memory (`Screen::bytes`) counts against `--max-output-memory` while it exists.

use serde_json::{json, Value};

use crate::core::ring::Ring;
use crate::types::WinSize;

/// A cell of the emulator's grid, in bytes (vt100 asserts it), and the two grids it keeps
/// (the primary screen and the alternate one).
const CELL: usize = 32;
const GRIDS: usize = 2;
/// What the emulator holds besides its grids.
const FIXED: usize = 4 << 10;

/// A terminal emulator's screen for one command.
pub struct Screen {
    parser: vt100::Parser,
}

impl std::fmt::Debug for Screen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rows, cols) = self.parser.screen().size();
        write!(f, "Screen({rows}x{cols})")
    }
}

impl Screen {
    /// The memory a screen of `size` holds.
    pub fn bytes_for(size: WinSize) -> usize {
        FIXED + GRIDS * CELL * size.rows as usize * size.cols as usize
    }

    /// A screen of `size` that has seen what `ring` retains.
    pub fn new(size: WinSize, ring: &Ring) -> Screen {
        let mut parser = vt100::Parser::new(size.rows, size.cols, 0);
        let (a, b) = ring.slices(ring.start(), ring.end());
        parser.process(a);
        parser.process(b);
        Screen { parser }
    }

    /// Bytes the command wrote, in order.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.parser.process(bytes);
    }

    pub fn resize(&mut self, size: WinSize) {
        self.parser.screen_mut().set_size(size.rows, size.cols);
    }

    /// What an upgrade in place carries (`wire::state::ScreenImage`): the visible grid as
    /// the escape sequences that redraw it, and whether it is the alternate screen.
    pub fn carry(&self) -> (Vec<u8>, bool) {
        let s = self.parser.screen();
        (s.state_formatted(), s.alternate_screen())
    }

    /// The screen `carry` described, of `size`. On the alternate screen the primary one
    /// under it is re-created from what `ring` retains (vt100 does not hand it out).
    pub fn resume(size: WinSize, visible: &[u8], alternate: bool, ring: &Ring) -> Screen {
        if !alternate {
            let mut parser = vt100::Parser::new(size.rows, size.cols, 0);
            parser.process(visible);
            return Screen { parser };
        }
        let mut screen = Screen::new(size, ring);
        if !screen.parser.screen().alternate_screen() {
            screen.parser.process(b"\x1b[?1049h");
        }
        screen.parser.process(visible);
        screen
    }

    /// `{rows, cols, lines, cursor: {row, col}, alternate}`: every row's text with trailing
    /// blanks trimmed, the cursor 0-based, and whether a full-screen program switched to
    /// the alternate screen.
    pub fn view(&self) -> Value {
        let s = self.parser.screen();
        let (rows, cols) = s.size();
        let lines: Vec<String> = s.rows(0, cols).map(|l| l.trim_end().to_string()).collect();
        let (row, col) = s.cursor_position();
        json!({
            "rows": rows,
            "cols": cols,
            "lines": lines,
            "cursor": {"row": row, "col": col},
            "alternate": s.alternate_screen(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_move_puts_text_where_a_terminal_would() {
        let s = Screen::new(WinSize::DEFAULT, &Ring::filled(b"\x1b[2J\x1b[5;10HXY"));
        let v = s.view();
        assert_eq!(v["rows"], 24);
        assert_eq!(v["cols"], 80);
        // Row 5, column 10 in terminal terms (1-based) is row 4, col 9 here (0-based).
        assert_eq!(v["lines"][4], "         XY");
        assert_eq!(v["cursor"], json!({"row": 4, "col": 11}));
        assert_eq!(v["alternate"], false);
        assert_eq!(v["lines"].as_array().map(Vec::len), Some(24));
    }

    #[test]
    fn the_alternate_screen_is_reported_and_fed_bytes_land_on_it() {
        let mut s = Screen::new(WinSize { rows: 3, cols: 10 }, &Ring::filled(b"main"));
        s.feed(b"\x1b[?1049h\x1b[Hfull");
        let v = s.view();
        assert_eq!(v["alternate"], true);
        assert_eq!(v["lines"], json!(["full", "", ""]));
        s.feed(b"\x1b[?1049l");
        assert_eq!(s.view()["lines"][0], "main");
        s.resize(WinSize { rows: 2, cols: 5 });
        assert_eq!(s.view()["rows"], 2);
    }

    /// Carries `s` as an upgrade does and reads it back on the ring's bytes.
    fn carried(s: &Screen, size: WinSize, ring: &Ring) -> Screen {
        let (visible, alternate) = s.carry();
        Screen::resume(size, &visible, alternate, ring)
    }

    #[test]
    fn a_screen_carried_by_an_upgrade_shows_the_same() {
        let size = WinSize { rows: 5, cols: 20 };
        // More output than the ring keeps: the screen saw it all, a replay would not.
        let mut ring = Ring::new(16);
        ring.push(b"\x1b[1;31mred\x1b[0m\r\nsecond line\r\n\x1b[3;5Hthird");
        let mut s = Screen::new(size, &Ring::filled(b""));
        s.feed(b"\x1b[1;31mred\x1b[0m\r\nsecond line\r\n\x1b[3;5Hthird\x1b[?25l");
        let back = carried(&s, size, &ring);
        assert_eq!(back.view(), s.view());
        assert_eq!(
            back.parser.screen().contents_formatted(),
            s.parser.screen().contents_formatted(),
            "colours, cursor and its visibility too"
        );
        // A full-screen program: the alternate screen is redrawn exactly, the primary one
        // under it comes back from the ring.
        let all = b"shell$ \x1b[?1049h\x1b[Hfull screen\x1b[2;3Hx";
        let mut s = Screen::new(size, &Ring::filled(b""));
        s.feed(all);
        let back = carried(&s, size, &Ring::filled(all));
        assert_eq!(back.view(), s.view());
        assert_eq!(back.view()["alternate"], true);
        let mut back = back;
        s.feed(b"\x1b[?1049l");
        back.feed(b"\x1b[?1049l");
        assert_eq!(back.view(), s.view(), "the primary screen under it");
    }
}
