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
}
