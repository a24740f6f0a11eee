//! The line a person types at a shell session's prompt (PROTOCOL 12.5): the session's bash
//! never reads commands from its terminal, so at the prompt the daemon edits the line
//! itself and hands it to the gate on Enter. One editor per session; every watcher sees
//! and edits the same line. Pure: keys in, the bytes that show the edit (for the
//! watchers and the session's screen) out.
//!
//! Keys: printable characters insert at the cursor; Enter is `\r` or `\n` (`\r\n` once);
//! Backspace (DEL or BS), Delete, Ctrl-D (on a non-empty line) erase; Ctrl-U erases to the
//! start, Ctrl-K to the end, Ctrl-W the word before the cursor; Left/Right/Home/End (and
//! Ctrl-B/F/A/E) move; Up/Down (Ctrl-P/N) walk the session's history; Ctrl-C drops the
//! line; Ctrl-L clears the screen; Ctrl-D on an empty line does nothing. Other control
//! keys and escape sequences are read to their end and dropped.
//!
//! Invariants: the cursor is within the line; what `feed` echoes moves a terminal's
//! cursor exactly as the edit moved the editor's (characters count one column, or two for
//! wide ones; a line longer than the terminal's width is the one case it cannot follow,
//! as a terminal does not move back over a wrapped line).

/// How a line ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// Enter: the line to run.
    Line(String),
    /// Ctrl-C: the line is dropped.
    Cancelled,
    /// Ctrl-L: the screen is to be cleared and the prompt and line shown again.
    Clear,
}

/// Where an escape sequence a key began is.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Esc {
    #[default]
    None,
    /// ESC seen.
    Start,
    /// `ESC [` and the parameter bytes so far.
    Csi(String),
    /// `ESC O`: one more byte.
    Ss3,
}

/// The longest parameter string of a key's escape sequence kept; longer ones are no key.
const CSI_MAX: usize = 16;

/// A line being edited.
#[derive(Debug, Default, Clone)]
pub struct Editor {
    line: Vec<char>,
    /// Characters before the cursor.
    cursor: usize,
    esc: Esc,
    /// The last key was `\r` ending a line: a `\n` right after it is the same Enter.
    after_cr: bool,
    /// Walking the history: the entry shown, and the line as it was before the walk.
    walk: Option<(usize, Vec<char>)>,
}

/// Columns a character takes on a terminal: two for the wide East Asian ranges and
/// emoji, one otherwise.
fn width(c: char) -> usize {
    let c = c as u32;
    let wide = matches!(c,
        0x1100..=0x115f | 0x2e80..=0x303e | 0x3041..=0x33ff | 0x3400..=0x4dbf
        | 0x4e00..=0x9fff | 0xa000..=0xa4cf | 0xac00..=0xd7a3 | 0xf900..=0xfaff
        | 0xfe30..=0xfe4f | 0xff00..=0xff60 | 0xffe0..=0xffe6 | 0x1f300..=0x1f64f
        | 0x1f900..=0x1f9ff | 0x20000..=0x3fffd);
    if wide {
        2
    } else {
        1
    }
}

fn columns(chars: &[char]) -> usize {
    chars.iter().map(|&c| width(c)).sum()
}

fn back(echo: &mut Vec<u8>, n: usize) {
    echo.extend(std::iter::repeat_n(b'\x08', n));
}

fn put(echo: &mut Vec<u8>, chars: &[char]) {
    let mut b = [0u8; 4];
    for c in chars {
        echo.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
    }
}

impl Editor {
    /// The line as typed so far.
    #[cfg(test)]
    pub fn line(&self) -> String {
        self.line.iter().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.line.is_empty()
    }

    /// Shows the line after a prompt (the prompt already shown) with the cursor where it
    /// is: after a command ran, or when a watcher comes.
    pub fn show(&self, echo: &mut Vec<u8>) {
        put(echo, &self.line);
        back(echo, columns(&self.line[self.cursor..]));
    }

    /// Erases the line from the terminal (the editor keeps it): before something else is
    /// shown where it was.
    pub fn hide(&self, echo: &mut Vec<u8>) {
        back(echo, columns(&self.line[..self.cursor]));
        let w = columns(&self.line);
        echo.extend(std::iter::repeat_n(b' ', w));
        back(echo, w);
    }

    /// Drops what a `\n` right after an Enter by `\r` would repeat: the keys to take,
    /// without it.
    pub fn after_enter<'a>(&mut self, keys: &'a str) -> &'a str {
        if keys.is_empty() {
            return keys;
        }
        let skip = std::mem::take(&mut self.after_cr) && keys.starts_with('\n');
        if skip {
            &keys[1..]
        } else {
            keys
        }
    }

    /// Takes `keys` until one ends the line: what they show is added to `echo`; returns
    /// how many bytes of `keys` were taken and, when one ended the line, how. `history`
    /// is the session's, oldest first.
    pub fn feed(
        &mut self,
        keys: &str,
        history: &[&str],
        echo: &mut Vec<u8>,
    ) -> (usize, Option<Done>) {
        for (i, c) in keys.char_indices() {
            let used = i + c.len_utf8();
            if self.after_cr && c == '\n' {
                self.after_cr = false;
                continue;
            }
            self.after_cr = false;
            if let Some(done) = self.key(c, history, echo) {
                return (used, Some(done));
            }
        }
        (keys.len(), None)
    }

    /// One key (a character of the input).
    fn key(&mut self, c: char, history: &[&str], echo: &mut Vec<u8>) -> Option<Done> {
        match std::mem::take(&mut self.esc) {
            Esc::None => {}
            Esc::Start => {
                self.esc = match c {
                    '[' => Esc::Csi(String::new()),
                    'O' => Esc::Ss3,
                    _ => Esc::None, // Alt and a key: dropped
                };
                return None;
            }
            Esc::Csi(mut params) => {
                if ('\u{40}'..='\u{7e}').contains(&c) {
                    self.sequence(&params, c, history, echo);
                } else if params.len() < CSI_MAX && ('\u{20}'..='\u{3f}').contains(&c) {
                    params.push(c);
                    self.esc = Esc::Csi(params);
                }
                return None;
            }
            Esc::Ss3 => {
                self.sequence("", c, history, echo);
                return None;
            }
        }
        if !matches!(c, '\u{10}' | '\u{0e}' | '\u{1b}') {
            self.walk = None;
        }
        match c {
            '\r' | '\n' => {
                self.after_cr = c == '\r';
                put(echo, &self.line[self.cursor..]);
                echo.extend_from_slice(b"\r\n");
                let line = std::mem::take(&mut self.line).into_iter().collect();
                self.cursor = 0;
                return Some(Done::Line(line));
            }
            '\u{03}' => {
                put(echo, &self.line[self.cursor..]);
                echo.extend_from_slice(b"^C\r\n");
                self.line.clear();
                self.cursor = 0;
                return Some(Done::Cancelled);
            }
            '\u{0c}' => return Some(Done::Clear),
            '\u{7f}' | '\u{08}' if self.cursor > 0 && self.cursor == self.line.len() => {
                if let Some(c) = self.line.pop() {
                    self.cursor -= 1;
                    let w = width(c);
                    back(echo, w);
                    echo.extend(std::iter::repeat_n(b' ', w));
                    back(echo, w);
                }
            }
            '\u{7f}' | '\u{08}' if self.cursor > 0 => {
                let mut line = self.line.clone();
                line.remove(self.cursor - 1);
                self.replace(line, self.cursor - 1, echo);
            }
            '\u{04}' if self.line.is_empty() => {} // nothing, as 12.5 says
            '\u{04}' => self.delete(echo),
            '\u{15}' => {
                let line = self.line[self.cursor..].to_vec();
                self.replace(line, 0, echo);
            }
            '\u{0b}' => {
                let line = self.line[..self.cursor].to_vec();
                self.replace(line, self.cursor, echo);
            }
            '\u{17}' => {
                let mut start = self.cursor;
                while start > 0 && self.line[start - 1] == ' ' {
                    start -= 1;
                }
                while start > 0 && self.line[start - 1] != ' ' {
                    start -= 1;
                }
                let mut line = self.line[..start].to_vec();
                line.extend_from_slice(&self.line[self.cursor..]);
                self.replace(line, start, echo);
            }
            '\u{01}' => self.move_to(0, echo),
            '\u{05}' => self.move_to(self.line.len(), echo),
            '\u{02}' => self.move_to(self.cursor.saturating_sub(1), echo),
            '\u{06}' => self.move_to((self.cursor + 1).min(self.line.len()), echo),
            '\u{10}' => self.up(history, echo),
            '\u{0e}' => self.down(history, echo),
            '\u{1b}' => self.esc = Esc::Start,
            c if c >= ' ' && c != '\u{7f}' && !('\u{80}'..'\u{a0}').contains(&c) => {
                if self.cursor == self.line.len() {
                    self.line.push(c);
                    self.cursor += 1;
                    put(echo, &[c]);
                } else {
                    let mut line = self.line.clone();
                    line.insert(self.cursor, c);
                    self.replace(line, self.cursor + 1, echo);
                }
            }
            _ => {} // other control keys (Tab included): nothing
        }
        None
    }

    /// A whole escape sequence: `ESC [ params final` or `ESC O final`.
    fn sequence(&mut self, params: &str, last: char, history: &[&str], echo: &mut Vec<u8>) {
        if !matches!(last, 'A' | 'B') {
            self.walk = None;
        }
        match (params, last) {
            (_, 'A') => self.up(history, echo),
            (_, 'B') => self.down(history, echo),
            (_, 'C') => self.move_to((self.cursor + 1).min(self.line.len()), echo),
            (_, 'D') => self.move_to(self.cursor.saturating_sub(1), echo),
            (_, 'H') | ("1" | "7", '~') => self.move_to(0, echo),
            (_, 'F') | ("4" | "8", '~') => self.move_to(self.line.len(), echo),
            ("3", '~') => self.delete(echo),
            _ => {}
        }
    }

    fn delete(&mut self, echo: &mut Vec<u8>) {
        if self.cursor < self.line.len() {
            let mut line = self.line.clone();
            line.remove(self.cursor);
            self.replace(line, self.cursor, echo);
        }
    }

    fn move_to(&mut self, to: usize, echo: &mut Vec<u8>) {
        if to < self.cursor {
            back(echo, columns(&self.line[to..self.cursor]));
        } else {
            put(echo, &self.line[self.cursor..to]);
        }
        self.cursor = to;
    }

    fn up(&mut self, history: &[&str], echo: &mut Vec<u8>) {
        let at = match &self.walk {
            None if history.is_empty() => return,
            None => history.len() - 1,
            Some((0, _)) => return,
            Some((i, _)) => i - 1,
        };
        let saved = match self.walk.take() {
            Some((_, saved)) => saved,
            None => self.line.clone(),
        };
        let line: Vec<char> = history[at].chars().collect();
        let end = line.len();
        self.replace(line, end, echo);
        self.walk = Some((at, saved));
    }

    fn down(&mut self, history: &[&str], echo: &mut Vec<u8>) {
        let Some((i, saved)) = self.walk.take() else {
            return;
        };
        let (line, walk) = if i + 1 < history.len() {
            (history[i + 1].chars().collect(), Some((i + 1, saved)))
        } else {
            (saved, None)
        };
        let end = Vec::len(&line);
        self.replace(line, end, echo);
        self.walk = walk;
    }

    /// Makes `line` the line with the cursor at `cursor`, redrawing from the line's start:
    /// what was longer is blanked.
    fn replace(&mut self, line: Vec<char>, cursor: usize, echo: &mut Vec<u8>) {
        back(echo, columns(&self.line[..self.cursor]));
        put(echo, &line);
        let (old, new) = (columns(&self.line), columns(&line));
        if old > new {
            echo.extend(std::iter::repeat_n(b' ', old - new));
            back(echo, old - new);
        }
        back(echo, columns(&line[cursor..]));
        self.line = line;
        self.cursor = cursor;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A terminal's line as the echo leaves it: characters at columns, the cursor.
    #[derive(Default)]
    struct Term {
        cells: Vec<char>,
        col: usize,
    }

    impl Term {
        fn play(&mut self, echo: &[u8]) {
            for c in String::from_utf8(echo.to_vec()).unwrap().chars() {
                match c {
                    '\x08' => self.col = self.col.saturating_sub(1),
                    '\r' => self.col = 0,
                    '\n' => {}
                    c => {
                        let w = width(c);
                        if self.cells.len() < self.col + w {
                            self.cells.resize(self.col + w, ' ');
                        }
                        self.cells[self.col] = c;
                        if w == 2 {
                            self.cells[self.col + 1] = '\0';
                        }
                        self.col += w;
                    }
                }
            }
        }

        fn text(&self) -> String {
            let text: String = self.cells.iter().filter(|&&c| c != '\0').collect();
            text.trim_end().to_string()
        }
    }

    /// Types `keys` into `e` on terminal `t`: how the line ended, if it did.
    fn typed(e: &mut Editor, t: &mut Term, keys: &str, history: &[&str]) -> Option<Done> {
        let mut echo = Vec::new();
        let (used, done) = e.feed(keys, history, &mut echo);
        t.play(&echo);
        if done.is_none() {
            assert_eq!(used, keys.len());
        }
        // What shows is what the editor holds, the cursor where its cursor is.
        if done.is_none() {
            assert_eq!(t.text(), e.line().trim_end(), "after {keys:?}");
            assert_eq!(t.col, columns(&e.line[..e.cursor]), "after {keys:?}");
        }
        done
    }

    #[test]
    fn typing_and_enter_give_the_line() {
        let (mut e, mut t) = (Editor::default(), Term::default());
        assert_eq!(typed(&mut e, &mut t, "echo hi", &[]), None);
        assert_eq!(
            typed(&mut e, &mut t, "\r", &[]),
            Some(Done::Line("echo hi".into()))
        );
        assert!(e.is_empty());
        // "\r\n" is one Enter: the "\n" that follows is dropped, also in the next feed.
        assert_eq!(e.after_enter("\nls"), "ls");
        assert_eq!(e.after_enter("\nls"), "\nls", "only right after it");
        let mut echo = Vec::new();
        assert_eq!(
            e.feed("a\r\nb\n", &[], &mut echo),
            (2, Some(Done::Line("a".into())))
        );
        assert_eq!(
            e.feed("\nb\n", &[], &mut echo),
            (3, Some(Done::Line("b".into())))
        );
        assert_eq!(
            e.feed("\n", &[], &mut echo),
            (1, Some(Done::Line(String::new())))
        );
    }

    #[test]
    fn backspace_ctrl_u_ctrl_w_and_delete_edit_where_the_cursor_is() {
        let (mut e, mut t) = (Editor::default(), Term::default());
        typed(&mut e, &mut t, "git push origin", &[]);
        typed(&mut e, &mut t, "\x7f\x7f", &[]);
        assert_eq!(e.line(), "git push orig");
        typed(&mut e, &mut t, "\x17", &[]);
        assert_eq!(e.line(), "git push ");
        typed(&mut e, &mut t, "\x17", &[]);
        assert_eq!(e.line(), "git ");
        typed(&mut e, &mut t, "log\x1b[D\x1b[D\x08", &[]);
        assert_eq!((e.line().as_str(), e.cursor), ("git og", 4));
        typed(&mut e, &mut t, "\x1b[3~", &[]);
        assert_eq!(e.line(), "git g");
        typed(&mut e, &mut t, "\x04", &[]);
        assert_eq!((e.line().as_str(), e.cursor), ("git ", 4));
        typed(&mut e, &mut t, "xyz\x1b[D\x1b[D\x15", &[]);
        assert_eq!((e.line().as_str(), e.cursor), ("yz", 0));
        typed(&mut e, &mut t, "\x1b[C\x0b", &[]);
        assert_eq!((e.line().as_str(), e.cursor), ("y", 1));
        typed(&mut e, &mut t, "\x15", &[]);
        assert!(e.is_empty());
        typed(&mut e, &mut t, "\x04\x7f", &[]);
        assert!(
            e.is_empty(),
            "Ctrl-D and Backspace on an empty line do nothing"
        );
    }

    #[test]
    fn arrows_home_and_end_move_and_insertion_happens_at_the_cursor() {
        let (mut e, mut t) = (Editor::default(), Term::default());
        typed(&mut e, &mut t, "echo world", &[]);
        typed(&mut e, &mut t, "\x1b[H\x1b[C\x1b[C\x1b[C\x1b[C\x1b[C", &[]);
        typed(&mut e, &mut t, "hello ", &[]);
        assert_eq!(e.line(), "echo hello world");
        typed(&mut e, &mut t, "\x1bOF!\x01#\x05\x02\x06", &[]);
        assert_eq!(e.line(), "#echo hello world!");
        typed(
            &mut e,
            &mut t,
            "\x1b[1~\x1b[4~\x1b[7~\x1b[8~\x1b[99;5X\x1bx",
            &[],
        );
        assert_eq!(e.cursor, e.line.len());
        // Enter with the cursor inside the line takes all of it.
        typed(&mut e, &mut t, "\x1b[D\x1b[D", &[]);
        assert_eq!(
            typed(&mut e, &mut t, "\r", &[]),
            Some(Done::Line("#echo hello world!".into()))
        );
    }

    #[test]
    fn up_and_down_walk_the_history_and_come_back_to_the_line() {
        let history = ["ls", "echo $((6*7))", "pwd"];
        let (mut e, mut t) = (Editor::default(), Term::default());
        typed(&mut e, &mut t, "ca", &history);
        typed(&mut e, &mut t, "\x1b[A", &history);
        assert_eq!(e.line(), "pwd");
        typed(&mut e, &mut t, "\x1b[A\x1b[A\x1b[A", &history);
        assert_eq!(e.line(), "ls", "stops at the oldest");
        typed(&mut e, &mut t, "\x1b[B", &history);
        assert_eq!(e.line(), "echo $((6*7))");
        typed(&mut e, &mut t, "\x0e\x0e", &history);
        assert_eq!(e.line(), "ca", "back to what was typed");
        typed(&mut e, &mut t, "\x10 -l", &history);
        assert_eq!(e.line(), "pwd -l", "an entry is edited like a line");
        typed(&mut e, &mut t, "\x1b[B", &history);
        assert_eq!(e.line(), "pwd -l", "the walk ended with the edit");
    }

    #[test]
    fn ctrl_c_drops_the_line_and_escapes_split_across_feeds_are_whole() {
        let (mut e, mut t) = (Editor::default(), Term::default());
        typed(&mut e, &mut t, "rm -rf", &[]);
        let mut echo = Vec::new();
        assert_eq!(
            e.feed("\x03rest", &[], &mut echo),
            (1, Some(Done::Cancelled))
        );
        assert!(echo.ends_with(b"^C\r\n") && e.is_empty());
        let (mut e, mut t) = (Editor::default(), Term::default());
        typed(&mut e, &mut t, "ab\x1b", &[]);
        typed(&mut e, &mut t, "[", &[]);
        typed(&mut e, &mut t, "D", &[]);
        assert_eq!(e.cursor, 1);
        assert_eq!(typed(&mut e, &mut t, "\x0c", &[]), Some(Done::Clear));
        // Tab and other controls insert nothing.
        typed(&mut e, &mut t, "\t\x07\u{85}", &[]);
        assert_eq!(e.line(), "ab");
    }

    #[test]
    fn wide_characters_take_two_columns() {
        let (mut e, mut t) = (Editor::default(), Term::default());
        typed(&mut e, &mut t, "echo 你好", &[]);
        let mut echo = Vec::new();
        e.feed("\x7f", &[], &mut echo);
        assert_eq!(echo, b"\x08\x08  \x08\x08");
        let mut echo = Vec::new();
        e.feed("\x1b[D\x7f", &[], &mut echo);
        assert_eq!(
            echo,
            b"\x08\x08\x08\x08\x08\x08\x08echo\xe4\xbd\xa0 \x08\x08\x08"
        );
        let mut echo = Vec::new();
        e.hide(&mut echo);
        // Back over the 4 columns before the cursor, blank all 6, back over them.
        assert_eq!(echo.iter().filter(|&&b| b == 8).count(), 4 + 6);
        let mut echo = Vec::new();
        e.show(&mut echo);
        assert_eq!(echo, b"echo\xe4\xbd\xa0\x08\x08");
    }
}
