//! How execctl prints: its stdout and stderr, JSON, aligned tables cut to the terminal's
//! width, and the few formats everything shares (sizes and durations as execd's flags
//! take them, ages, shell quoting, RFC 3339 times).
//!
//! Writing to a closed stdout (`execctl ps | head -1`) ends execctl quietly with 141, as
//! SIGPIPE would end a shell tool; a streaming command handles that itself (it must kill
//! what it runs first).

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::errors::{Fail, Res, EXIT_BROKEN_PIPE};

/// A write to stdout failed: a closed pipe ends quietly, anything else says why.
pub fn stdout_failed(e: &io::Error) -> Fail {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Fail::new("").with_code(EXIT_BROKEN_PIPE)
    } else {
        Fail::new(format!("cannot write to standard output: {e}"))
    }
}

/// Writes bytes to stdout and flushes them.
pub fn write_stdout(bytes: &[u8]) -> io::Result<()> {
    let mut o = io::stdout().lock();
    o.write_all(bytes)?;
    o.flush()
}

/// Writes bytes to stderr and flushes them.
pub fn write_stderr(bytes: &[u8]) -> io::Result<()> {
    let mut e = io::stderr().lock();
    e.write_all(bytes)?;
    e.flush()
}

/// Prints text on stdout.
pub fn print(text: &str) -> Res<()> {
    write_stdout(text.as_bytes()).map_err(|e| stdout_failed(&e))
}

/// Prints a JSON result on stdout, indented, with a final newline.
pub fn print_json(v: &Value) -> Res<()> {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    print(&format!("{}\n", json_escaped(text)))
}

/// Prints a JSON value as one line on stdout (a stream of records).
pub fn print_json_line(v: &Value) -> Res<()> {
    print(&format!("{}\n", json_line(v)))
}

/// A JSON value as execctl prints it on one line.
pub fn json_line(v: &Value) -> String {
    json_escaped(v.to_string())
}

/// JSON text with DEL and the characters `hidden` names written as `\uXXXX`. serde_json
/// escapes only what JSON requires (C0 controls, `"` and `\`), but JSON is read on
/// terminals too. The value read back is the same: outside its strings JSON text is ASCII
/// punctuation and whitespace, so each such character is inside a string, where `\uXXXX`
/// (a surrogate pair of them past the Basic Multilingual Plane) stands for it.
fn json_escaped(text: String) -> String {
    use std::fmt::Write as _;
    let raw = |c: char| c == '\x7f' || (!c.is_ascii() && hidden(c));
    if !text.contains(raw) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if raw(c) {
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One line on stderr, prefixed `execctl: `.
pub fn warn(text: &str) {
    let _ = write_stderr(format!("execctl: {text}\n").as_bytes());
}

/// Whether to colour stdout: a terminal, and `NO_COLOR` unset or empty.
pub fn use_color() -> bool {
    io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The width of the terminal on stdout, when it is one.
pub fn terminal_width() -> Option<usize> {
    if io::stdout().is_terminal() {
        crate::sys::host::terminal_width()
    } else {
        None
    }
}

/// Cuts `text` to `room` characters, the last one an ellipsis when cut.
pub fn cut(text: &str, room: usize) -> String {
    if text.chars().count() <= room {
        return text.to_string();
    }
    if room == 0 {
        return String::new();
    }
    let mut t: String = text.chars().take(room - 1).collect();
    t.push('\u{2026}');
    t
}

/// The room the last column keeps on a narrow terminal before it is cut, as docker's
/// `ps` keeps for its COMMAND.
const LAST_COLUMN_ROOM: usize = 20;

/// Which columns to show at `width`: all, unless the last would get less than its room
/// (`LAST_COLUMN_ROOM`, or its widest cell when narrower); then the columns of
/// `give_way` are left out, in that order, until it has it.
fn shown_columns(
    widths: &[usize],
    last_widest: usize,
    width: usize,
    give_way: &[usize],
) -> Vec<bool> {
    let mut shown = vec![true; widths.len()];
    let want = LAST_COLUMN_ROOM.min(last_widest);
    let before = |shown: &[bool]| -> usize {
        widths[..widths.len() - 1]
            .iter()
            .zip(shown)
            .filter(|(_, s)| **s)
            .map(|(w, _)| w + 2)
            .sum()
    };
    for &col in give_way {
        if width.saturating_sub(before(&shown)) >= want {
            break;
        }
        shown[col] = false;
    }
    shown
}

/// Prints rows as aligned columns, two spaces apart. Each row is cut to the terminal's
/// width; the last column gives way first, but keeps some room: on a narrow terminal the
/// columns of `give_way` are left out, in order, so that it does (a `ps` row with no
/// command says little). `color_col` is painted by state.
pub fn table(
    headers: &[&str],
    rows: &[Vec<String>],
    color_col: Option<usize>,
    give_way: &[usize],
) -> Res<()> {
    let last = headers.len() - 1;
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, cell) in r.iter().enumerate().take(last) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let color = use_color();
    let width = terminal_width();
    let last_widest = rows
        .iter()
        .filter_map(|r| r.get(last))
        .map(|c| c.chars().count())
        .fold(headers[last].chars().count(), usize::max);
    let shown = match width {
        Some(w) => shown_columns(&widths, last_widest, w, give_way),
        None => vec![true; headers.len()],
    };
    let mut out = String::new();
    let mut line = |cells: &[String], is_header: bool| {
        let mut plain = String::new();
        let mut spans = Vec::new(); // (start char, end char) of the cell to paint
        for (i, cell) in cells.iter().enumerate() {
            if !shown[i] {
                continue;
            }
            if i == last {
                plain.push_str(cell);
            } else {
                let start = plain.chars().count();
                plain.push_str(cell);
                if color && !is_header && Some(i) == color_col {
                    spans.push((start, start + cell.chars().count(), cell.clone()));
                }
                let pad = widths[i] - cell.chars().count() + 2;
                plain.extend(std::iter::repeat_n(' ', pad));
            }
        }
        let shown = match width {
            Some(w) => cut(plain.trim_end(), w),
            None => plain.trim_end().to_string(),
        };
        out.push_str(&paint(&shown, &spans));
        out.push('\n');
    };
    line(
        &headers.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        true,
    );
    for r in rows {
        line(r, false);
    }
    print(&out)
}

/// Paints the state cells of a line that may have been cut.
fn paint(line: &str, spans: &[(usize, usize, String)]) -> String {
    let mut out = String::new();
    let chars: Vec<char> = line.chars().collect();
    let mut at = 0;
    for (start, end, word) in spans {
        if *end > chars.len() {
            break;
        }
        let code = match word.as_str() {
            "running" => "32",
            "input" => "33",
            "killed" | "timed_out" => "31",
            _ => continue,
        };
        out.extend(&chars[at..*start]);
        out.push_str(&format!("\x1b[{code}m"));
        out.extend(&chars[*start..*end]);
        out.push_str("\x1b[0m");
        at = *end;
    }
    out.extend(&chars[at..]);
    out
}

/// `n` things, the noun agreeing: `1 rule`, `2 rules` (`many` is the plural).
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A size as execd's flags take it: `4M`, `64K`, `1G`, or bytes when no unit divides it.
pub fn size(bytes: u64) -> String {
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        let n = 1u64 << shift;
        if bytes >= n && bytes % n == 0 {
            return format!("{}{unit}", bytes / n);
        }
    }
    bytes.to_string()
}

/// A duration as execd's flags take it: `1h`, `30m`, `90s`, `1500ms`.
pub fn flag_duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    for (unit, n) in [("h", 3_600_000), ("m", 60_000), ("s", 1000)] {
        if ms % n == 0 {
            return format!("{}{unit}", ms / n);
        }
    }
    format!("{ms}ms")
}

/// A duration for a person, two units at most: `0.4s`, `12s`, `5m03s`, `2h05m`, `3d04h`.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    let s = ms / 1000;
    match s {
        0..=9 => format!("{}.{}s", s, ms % 1000 / 100),
        10..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{}d{:02}h", s / 86_400, s / 3600 % 24),
    }
}

/// How long ago an RFC 3339 time was, coarsely: `3s`, `5m`, `2h`, `4d`.
pub fn age(started: &str) -> String {
    let Some(t) = crate::wire::encode::parse_rfc3339(started) else {
        return "?".into();
    };
    let secs = SystemTime::now()
        .duration_since(t)
        .unwrap_or_default()
        .as_secs();
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Text from a peer (a command line, a directory, a session id) as a terminal may show
/// it to a person: control characters and bidirectional controls cannot move the cursor,
/// clear a line, start an escape sequence or reorder what is shown; each reads as its
/// escape instead (`\n`, `\r`, `\t`, `\x1b`, `\u{202e}`), and a backslash as `\\`, so
/// every shown text stands for exactly one original. Printable text of any script stays
/// as it is.
pub fn visible(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if hidden(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// Characters a terminal acts on or hides rather than shows (`wire::shown`, the table
/// the daemon escapes its approval texts by): controls (the C1 ones included: some
/// terminals read U+009B as CSI), format characters (the bidirectional embeddings,
/// overrides and isolates, which reorder what follows them; zero-width spaces and joiners;
/// U+FEFF), line and paragraph separators, spaces other than U+0020, and every
/// default-ignorable character (variation selectors, tags, fillers), so that two command
/// lines that look alike are shown apart.
fn hidden(c: char) -> bool {
    crate::wire::shown::invisible(c)
}

/// A word as a POSIX shell would need it typed: as is when plain, else single-quoted.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '_' | '-' | '.' | '/' | ':' | '@' | '%' | '+' | ',' | '=')
        });
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A command line with each word quoted as needed.
pub fn quoted_line<'a>(words: impl IntoIterator<Item = &'a str>) -> String {
    words
        .into_iter()
        .map(shell_quote)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `camelCase` as `snake_case`.
pub fn snake(key: &str) -> String {
    let mut s = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            s.push('_');
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

/// A JSON value with every object key in `snake_case`, all the way down.
pub fn snake_keys(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (snake(k), snake_keys(v))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(snake_keys).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(counted(1, "rule", "rules"), "1 rule");
        assert_eq!(counted(0, "rule", "rules"), "0 rules");
        assert_eq!(
            counted(2, "bash command", "bash commands"),
            "2 bash commands"
        );
    }

    #[test]
    fn sizes_and_durations_read_as_flags() {
        assert_eq!(size(4 << 20), "4M");
        assert_eq!(size(64 << 10), "64K");
        assert_eq!(size(1 << 30), "1G");
        assert_eq!(size(1500), "1500");
        assert_eq!(size(0), "0");
        assert_eq!(flag_duration(3_600_000), "1h");
        assert_eq!(flag_duration(90_000), "90s");
        assert_eq!(flag_duration(1500), "1500ms");
        assert_eq!(flag_duration(120_000), "2m");
        for s in ["4M", "64K", "1G", "1500"] {
            let n = crate::config::parse_size(s).expect("parses");
            assert_eq!(size(n as u64), s);
        }
        for s in ["1h", "90s", "1500ms"] {
            let d = crate::config::parse_duration(s).expect("parses");
            assert_eq!(flag_duration(d.as_millis() as u64), s);
        }
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(Duration::from_millis(400)), "0.4s");
        assert_eq!(human_duration(Duration::from_secs(12)), "12s");
        assert_eq!(human_duration(Duration::from_secs(303)), "5m03s");
        assert_eq!(human_duration(Duration::from_secs(7500)), "2h05m");
        assert_eq!(
            human_duration(Duration::from_secs(86_400 * 3 + 3600 * 4)),
            "3d04h"
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(quoted_line(["sh", "-c", "exit 5"]), "sh -c 'exit 5'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a=b"), "a=b");
    }

    #[test]
    fn snake_keys_convert_camel_case() {
        assert_eq!(snake("killGraceMs"), "kill_grace_ms");
        assert_eq!(
            snake_keys(&serde_json::json!({"outputMemory": {"maxRssKb": 1}})),
            serde_json::json!({"output_memory": {"max_rss_kb": 1}})
        );
    }

    #[test]
    fn peer_text_is_shown_escaped() {
        // The review's example: a carriage return and "erase line" would show `ls`.
        assert_eq!(
            visible("rm -rf ~ #\r\u{1b}[2K  command  ls"),
            "rm -rf ~ #\\r\\x1b[2K  command  ls"
        );
        assert_eq!(visible("a\nb\tc"), "a\\nb\\tc");
        assert_eq!(visible("\0\u{7}\u{7f}"), "\\x00\\x07\\x7f");
        assert_eq!(visible("\u{9b}31m\u{85}"), "\\u{9b}31m\\u{85}");
        for bidi in [
            '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}', '\u{2067}',
            '\u{2068}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{61c}',
        ] {
            let shown = visible(&format!("x{bidi}y"));
            assert_eq!(shown, format!("x\\u{{{:x}}}y", u32::from(bidi)));
        }
        assert_eq!(visible("a\u{2028}b"), "a\\u{2028}b");
        // Two paths that look alike are shown apart (PROTOCOL 7.3): zero-width and
        // default-ignorable characters, and spaces other than U+0020.
        assert_eq!(visible("/tmp/a\u{200b}b"), "/tmp/a\\u{200b}b");
        assert_eq!(visible("\u{feff}rm"), "\\u{feff}rm");
        assert_eq!(
            visible("a\u{a0}b\u{3164}\u{e0041}"),
            "a\\u{a0}b\\u{3164}\\u{e0041}"
        );
        // A backslash is escaped too, so no typed text can pose as an escape.
        assert_eq!(visible(r"C:\x1b"), r"C:\\x1b");
        assert_ne!(visible("\u{1b}"), visible(r"\x1b"));
        // Printable text of any script, and plain ASCII, are left alone.
        assert_eq!(visible("café 漢字 ~/src 'a b'"), "café 漢字 ~/src 'a b'");
        assert_eq!(visible(""), "");
    }

    #[test]
    fn json_escapes_what_a_terminal_would_act_on() {
        let v = serde_json::json!({"k\u{202e}": ["a\u{1b}\u{7f}\u{9b}\u{2066}b", "é 漢字"]});
        let line = json_line(&v);
        assert_eq!(
            line,
            r#"{"k\u202e":["a\u001b\u007f\u009b\u2066b","é 漢字"]}"#
        );
        assert_eq!(serde_json::from_str::<Value>(&line).ok(), Some(v.clone()));
        let pretty = json_escaped(serde_json::to_string_pretty(&v).unwrap_or_default());
        assert!(pretty.contains('\n') && !pretty.contains(['\u{202e}', '\u{9b}']));
        assert_eq!(serde_json::from_str::<Value>(&pretty).ok(), Some(v));
        // Past the Basic Multilingual Plane, a surrogate pair.
        let v = serde_json::json!(["a\u{200b}\u{feff}\u{e0041}b"]);
        let line = json_line(&v);
        assert_eq!(line, r#"["a\u200b\ufeff\udb40\udc41b"]"#);
        assert_eq!(serde_json::from_str::<Value>(&line).ok(), Some(v));
    }

    #[test]
    fn narrow_tables_leave_out_columns_before_the_last_is_lost() {
        // ID SESSION PID STATE EXIT AGE DURATION COMMAND, as ps has them.
        let widths = [7, 16, 6, 7, 4, 4, 8, 7];
        let all = shown_columns(&widths, 40, 200, &[1, 6, 5, 2]);
        assert!(all.iter().all(|s| *s));
        let narrow = shown_columns(&widths, 40, 60, &[1, 6, 5, 2]);
        assert_eq!(narrow, [true, false, true, true, true, true, false, true]);
        let before: usize = widths[..7]
            .iter()
            .zip(&narrow)
            .filter(|(_, s)| **s)
            .map(|(w, _)| w + 2)
            .sum();
        assert!(60 - before >= LAST_COLUMN_ROOM);
        // A short last column needs no more room than it has.
        let short = shown_columns(&widths, 4, 80, &[1, 6, 5, 2]);
        assert!(short.iter().all(|s| *s));
    }

    #[test]
    fn cutting() {
        assert_eq!(cut("abcdef", 4), "abc\u{2026}");
        assert_eq!(cut("abc", 4), "abc");
        let spans = [(0usize, 7usize, "running".to_string())];
        assert_eq!(paint("running  x", &spans), "\x1b[32mrunning\x1b[0m  x");
        assert_eq!(paint("runn\u{2026}", &spans), "runn\u{2026}");
    }
}
