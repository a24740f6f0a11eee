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

    /// An empty screen of `size`.
    pub fn blank(size: WinSize) -> Screen {
        Screen {
            parser: vt100::Parser::new(size.rows, size.cols, 0),
        }
    }

    /// The escape sequences that paint this screen on a terminal that shows anything:
    /// the alternate screen entered if it is on, every row, the attributes and the
    /// cursor as they are (PROTOCOL 12.5: what a watcher is sent first).
    pub fn paint(&self) -> Vec<u8> {
        let s = self.parser.screen();
        let mut out = Vec::new();
        out.extend_from_slice(if s.alternate_screen() {
            b"\x1b[?1049h"
        } else {
            b"\x1b[?1049l"
        });
        out.extend_from_slice(b"\x1b[H\x1b[2J");
        out.extend_from_slice(&s.state_formatted());
        out
    }

    /// A screen frame for a watcher that has seen rows hashed `seen` (PROTOCOL 12.5):
    /// `{rows, cols, cursor: {row, col, visible}, alternate, app_cursor, lines: [{row,
    /// text, runs}]}` with the rows that changed (all of them when the size did), or
    /// `None` when nothing did. `seen` is updated. A row's `text` has its trailing blanks
    /// trimmed unless they are coloured; `runs` are `[start, len, attrs]` over its
    /// characters (a wide character is one character, two columns), for the characters
    /// whose attributes are not the default: `fg`, `bg` (a 256-colour index or
    /// `#rrggbb`), `bold`, `dim`, `italic`, `underline`, `inverse`.
    pub fn frame(&self, seen: &mut Vec<u64>) -> Option<Value> {
        use std::hash::{Hash, Hasher};
        let s = self.parser.screen();
        let (rows, cols) = s.size();
        let (crow, ccol) = s.cursor_position();
        let meta = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (
                rows,
                cols,
                crow,
                ccol,
                s.hide_cursor(),
                s.alternate_screen(),
            )
                .hash(&mut h);
            s.application_cursor().hash(&mut h);
            h.finish()
        };
        let fresh = seen.len() != usize::from(rows) + 1;
        if fresh {
            *seen = vec![0; usize::from(rows) + 1];
        }
        let mut lines = Vec::new();
        for row in 0..rows {
            let (text, runs, hash) = row_of(s, row, cols);
            let hash = hash | 1; // never the 0 of a fresh `seen`
            if fresh || seen[usize::from(row)] != hash {
                seen[usize::from(row)] = hash;
                lines.push(json!({ "row": row, "text": text, "runs": runs }));
            }
        }
        let last = usize::from(rows);
        if !fresh && lines.is_empty() && seen[last] == meta {
            return None;
        }
        seen[last] = meta;
        Some(json!({
            "rows": rows,
            "cols": cols,
            "cursor": { "row": crow, "col": ccol, "visible": !s.hide_cursor() },
            "alternate": s.alternate_screen(),
            "app_cursor": s.application_cursor(),
            "lines": lines,
        }))
    }

    /// Bytes the command wrote, in order.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.parser.process(bytes);
    }

    pub fn size(&self) -> WinSize {
        let (rows, cols) = self.parser.screen().size();
        WinSize { rows, cols }
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

/// A cell's attributes, as compared and hashed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
struct Attrs {
    fg: Option<(u8, u8, u8, u8)>,
    bg: Option<(u8, u8, u8, u8)>,
    /// bold, dim, italic, underline, inverse.
    flags: u8,
}

const FLAGS: [&str; 5] = ["bold", "dim", "italic", "underline", "inverse"];

fn packed(c: vt100::Color) -> Option<(u8, u8, u8, u8)> {
    match c {
        vt100::Color::Default => None,
        vt100::Color::Idx(i) => Some((0, i, 0, 0)),
        vt100::Color::Rgb(r, g, b) => Some((1, r, g, b)),
    }
}

/// A colour as a frame says it: its 256-colour index or `#rrggbb`.
fn color(c: (u8, u8, u8, u8)) -> Value {
    match c {
        (0, i, _, _) => i.into(),
        (_, r, g, b) => format!("#{r:02x}{g:02x}{b:02x}").into(),
    }
}

impl Attrs {
    fn of(cell: &vt100::Cell) -> Attrs {
        let flags = [
            cell.bold(),
            cell.dim(),
            cell.italic(),
            cell.underline(),
            cell.inverse(),
        ]
        .iter()
        .enumerate()
        .fold(0u8, |f, (i, on)| f | (u8::from(*on) << i));
        Attrs {
            fg: packed(cell.fgcolor()),
            bg: packed(cell.bgcolor()),
            flags,
        }
    }

    fn json(&self) -> Value {
        let mut m = serde_json::Map::new();
        if let Some(c) = self.fg {
            m.insert("fg".into(), color(c));
        }
        if let Some(c) = self.bg {
            m.insert("bg".into(), color(c));
        }
        for (i, name) in FLAGS.iter().enumerate() {
            if self.flags & (1 << i) != 0 {
                m.insert((*name).into(), true.into());
            }
        }
        Value::Object(m)
    }
}

/// One row's text, its attribute runs (see `Screen::frame`) and a hash of both.
fn row_of(s: &vt100::Screen, row: u16, cols: u16) -> (String, Value, u64) {
    use std::hash::{Hash, Hasher};
    let mut cells: Vec<(&str, Attrs)> = Vec::with_capacity(usize::from(cols));
    for col in 0..cols {
        let Some(cell) = s.cell(row, col) else {
            continue;
        };
        if cell.is_wide_continuation() {
            continue;
        }
        let text = if cell.has_contents() {
            cell.contents()
        } else {
            " "
        };
        cells.push((text, Attrs::of(cell)));
    }
    // Trailing blanks with no attributes are not drawn.
    while cells
        .last()
        .is_some_and(|(t, a)| *t == " " && *a == Attrs::default())
    {
        cells.pop();
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    cells.hash(&mut h);
    let mut text = String::new();
    let mut runs: Vec<Value> = Vec::new();
    let mut run: Option<(usize, usize, Attrs)> = None;
    for (i, (t, a)) in cells.iter().enumerate() {
        text.push_str(t);
        match &mut run {
            Some((_, len, attrs)) if attrs == a => *len += 1,
            _ => {
                if let Some((start, len, attrs)) = run.take() {
                    runs.push(json!([start, len, attrs.json()]));
                }
                if *a != Attrs::default() {
                    run = Some((i, 1, *a));
                }
            }
        }
    }
    if let Some((start, len, attrs)) = run {
        runs.push(json!([start, len, attrs.json()]));
    }
    (text, Value::Array(runs), h.finish())
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

    #[test]
    fn a_frame_has_every_row_first_then_the_changed_ones() {
        let mut s = Screen::blank(WinSize { rows: 3, cols: 10 });
        s.feed(b"ab\x1b[1;31mred\x1b[0m\r\n\x1b[44m  \x1b[0m");
        let mut seen = Vec::new();
        let f = s.frame(&mut seen).expect("the first frame");
        assert_eq!(f["lines"].as_array().unwrap().len(), 3);
        assert_eq!(
            f["lines"][0],
            json!({"row": 0, "text": "abred",
            "runs": [[2, 3, {"fg": 1, "bold": true}]]})
        );
        assert_eq!(
            f["lines"][1],
            json!({"row": 1, "text": "  ", "runs": [[0, 2, {"bg": 4}]]}),
            "coloured blanks are kept"
        );
        assert_eq!(f["cursor"], json!({"row": 1, "col": 2, "visible": true}));
        assert_eq!(s.frame(&mut seen), None, "nothing changed");
        s.feed(b"\x1b[3;1H\x1b[38;2;1;2;3m\xe4\xbd\xa0x");
        let f = s.frame(&mut seen).expect("a change");
        assert_eq!(
            f["lines"],
            json!([{"row": 2, "text": "你x",
            "runs": [[0, 2, {"fg": "#010203"}]]}])
        );
        s.feed(b"\x1b[?25l");
        let f = s.frame(&mut seen).expect("the cursor hid");
        assert_eq!(
            (
                f["lines"].as_array().unwrap().len(),
                &f["cursor"]["visible"]
            ),
            (0, &json!(false))
        );
        s.resize(WinSize { rows: 2, cols: 10 });
        assert_eq!(
            s.frame(&mut seen).unwrap()["lines"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        // The paint redraws the same screen on a fresh terminal.
        let mut again = Screen::blank(WinSize { rows: 2, cols: 10 });
        again.feed(&s.paint());
        assert_eq!(again.view()["lines"], s.view()["lines"]);
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
