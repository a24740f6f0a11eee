//! The terminal modes a program on execctl's terminal turned on (PROTOCOL 12.4), as read
//! from the output execctl forwarded: what a detach must turn off again, so that the
//! user's terminal is left as it was (not in vi's alternate screen, with mouse reporting
//! and keypad mode on) without a full reset, which would clear their scrollback.
//!
//! Tracked: the alternate screen (modes 47, 1047, 1049), mouse reporting (9, 1000-1003,
//! and its encodings 1005, 1006, 1015, 1016), focus events (1004), application cursor
//! keys (1), the application keypad (`ESC =` / `ESC >`), bracketed paste (2004) and the
//! cursor's visibility (25). Each is as the last sequence that named it left it; a
//! sequence split across chunks is read whole (vte keeps its state between them).

use vte::{Params, Parser, Perform};

/// The DEC private modes a program may set that a detach turns off, in the order the
/// reset writes them (the alternate screen last, so the rest is turned off on the screen
/// the user comes back to as well).
const PRIVATE: [u16; 11] = [1, 9, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1015, 1016];
/// Bracketed paste: turned off too.
const PASTE: u16 = 2004;
/// The cursor's visibility: set means shown, which is the default.
const CURSOR: u16 = 25;
/// The alternate screen's modes; 1049 also saves and restores the cursor.
const ALTERNATE: [u16; 3] = [47, 1047, 1049];

/// What the program left on.
#[derive(Debug, Default, Clone, PartialEq)]
struct State {
    /// Private modes set (of `PRIVATE` and `PASTE`).
    on: Vec<u16>,
    /// The alternate screen mode it entered by, while it is on it.
    alternate: Option<u16>,
    cursor_hidden: bool,
    keypad: bool,
}

impl Perform for State {
    fn csi_dispatch(&mut self, params: &Params, intermediates: &[u8], _ignore: bool, c: char) {
        if intermediates != b"?" || !matches!(c, 'h' | 'l') {
            return;
        }
        let set = c == 'h';
        for p in params.iter() {
            let Some(&mode) = p.first() else { continue };
            if ALTERNATE.contains(&mode) {
                self.alternate = set.then_some(mode);
            } else if mode == CURSOR {
                self.cursor_hidden = !set;
            } else if PRIVATE.contains(&mode) || mode == PASTE {
                self.on.retain(|m| *m != mode);
                if set {
                    self.on.push(mode);
                }
            }
        }
    }

    fn esc_dispatch(&mut self, intermediates: &[u8], _ignore: bool, byte: u8) {
        if !intermediates.is_empty() {
            return;
        }
        match byte {
            b'=' => self.keypad = true,
            b'>' => self.keypad = false,
            // RIS, a full reset, turns everything off.
            b'c' => *self = State::default(),
            _ => {}
        }
    }
}

/// Follows the modes in what a program writes to the terminal.
pub struct Modes {
    parser: Parser,
    state: State,
}

impl Default for Modes {
    fn default() -> Modes {
        Modes::new(false)
    }
}

impl std::fmt::Debug for Modes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.fmt(f)
    }
}

impl Modes {
    /// Nothing on yet, but the alternate screen when `alternate` (an `attach` painted the
    /// program's screen there).
    pub fn new(alternate: bool) -> Modes {
        Modes {
            parser: Parser::new(),
            state: State {
                alternate: alternate.then_some(1049),
                ..State::default()
            },
        }
    }

    /// Reads output as it goes to the terminal.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.parser.advance(&mut self.state, bytes);
    }

    /// What turns off every mode the program left on (empty when none is): never a full
    /// reset, which would clear the user's scrollback.
    pub fn reset(&self) -> Vec<u8> {
        let s = &self.state;
        let mut out = String::new();
        for m in PRIVATE.iter().chain([&PASTE]) {
            if s.on.contains(m) {
                out.push_str(&format!("\x1b[?{m}l"));
            }
        }
        if s.keypad {
            out.push_str("\x1b>");
        }
        if s.cursor_hidden {
            out.push_str("\x1b[?25h");
        }
        if let Some(m) = s.alternate {
            out.push_str(&format!("\x1b[?{m}l"));
        }
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(chunks: &[&[u8]]) -> String {
        let mut m = Modes::default();
        for c in chunks {
            m.feed(c);
        }
        String::from_utf8(m.reset()).unwrap()
    }

    #[test]
    fn what_vi_turns_on_is_turned_off_and_nothing_else() {
        // vim: alternate screen, application keys, keypad, bracketed paste, mouse, a
        // hidden cursor while it redraws.
        let vim: &[u8] = b"\x1b[?1049h\x1b[?1h\x1b=\x1b[?2004h\x1b[?1000h\x1b[?1006h\x1b[?25lhello";
        assert_eq!(
            after(&[vim]),
            "\x1b[?1l\x1b[?1000l\x1b[?1006l\x1b[?2004l\x1b>\x1b[?25h\x1b[?1049l"
        );
        // Split anywhere, the same.
        let (a, b) = vim.split_at(5);
        assert_eq!(after(&[a, b]), after(&[vim]));
        // What it turned off again needs nothing; plain output needs nothing.
        assert_eq!(
            after(&[vim, b"\x1b[?1000l\x1b[?25h\x1b>\x1b[?1049l"]),
            "\x1b[?1l\x1b[?1006l\x1b[?2004l"
        );
        assert_eq!(after(&[b"ls -l\r\n\x1b[1;31mred\x1b[0m"]), "");
        // Several modes in one sequence, and a full reset.
        assert_eq!(after(&[b"\x1b[?1002;1006h"]), "\x1b[?1002l\x1b[?1006l");
        assert_eq!(after(&[vim, b"\x1bc"]), "");
        // Not private modes (insert mode, CSI 4 h): nothing.
        assert_eq!(after(&[b"\x1b[4h"]), "");
        // An attach that painted the alternate screen leaves it.
        assert_eq!(
            String::from_utf8(Modes::new(true).reset()).unwrap(),
            "\x1b[?1049l"
        );
    }
}
