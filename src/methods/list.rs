//! Listings a page at a time (`terminal/list`, `bash/commands`): the page a request asks
//! for, which of the caller's commands are on it, and command lines cut to what a listing
//! shows. Listings run newest first; a cursor names the key of the last entry shown.

use crate::core::table::{Key, Proc};
use crate::core::Core;
use serde_json::Value;

use crate::wire::rpc::{Params, RpcError};

/// Bytes of a command line (the command and its arguments together) a listing shows.
pub const LISTED_LINE_MAX: usize = 4 << 10;

/// Entries of a listing page when the request names no `limit`.
pub const DEFAULT_PAGE: usize = 256;

/// The most entries of one page.
pub const MAX_PAGE: usize = 4096;

/// A listing's page: how many entries, after which one. Listings run newest first, so
/// a cursor names the key of the last entry shown and the next page starts below it.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    limit: usize,
    below: Option<u64>,
}

impl Page {
    /// `limit` and the cursor field (`cursor`) of a request.
    pub fn from_params(p: &Params, cursor_field: &str) -> Result<Page, RpcError> {
        let limit = p
            .opt_u64("limit")?
            .map_or(DEFAULT_PAGE, |n| (n as usize).clamp(1, MAX_PAGE));
        let below = match p.opt_str(cursor_field)? {
            None => None,
            Some(c) => Some(
                c.strip_prefix('k')
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| {
                        RpcError::invalid_params(cursor_field, "not a cursor this daemon gave")
                    })?,
            ),
        };
        Ok(Page { limit, below })
    }

    /// The key the page starts below: its cursor.
    pub fn below(&self) -> Option<Key> {
        self.below.map(Key)
    }

    /// The page of `items` (newest first, from below the cursor) and the cursor of the
    /// next page, if any.
    pub fn take<'a>(
        &self,
        items: impl Iterator<Item = &'a Proc>,
    ) -> (Vec<&'a Proc>, Option<String>) {
        let mut page: Vec<&Proc> = items.take(self.limit + 1).collect();
        let next = if page.len() > self.limit {
            page.truncate(self.limit);
            page.last().map(|p| format!("k{}", p.key))
        } else {
            None
        };
        (page, next)
    }
}

/// A command line cut for a listing: at most `LISTED_LINE_MAX` bytes of the command and
/// its arguments together, the rest replaced by a marker saying how much was cut.
pub fn cut_command_line(command: &str, args: &[String]) -> (String, Vec<String>) {
    let mut left = LISTED_LINE_MAX;
    let mut cut_bytes = 0usize;
    let mut cut = |s: &str| -> String {
        if s.len() <= left {
            left -= s.len();
            return s.to_string();
        }
        let mut end = left;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        left = 0;
        cut_bytes += s.len() - end;
        s[..end].to_string()
    };
    let mut command = cut(command);
    let mut kept: Vec<String> = Vec::new();
    for a in args {
        let c = cut(a);
        if c.is_empty() && !a.is_empty() {
            continue;
        }
        kept.push(c);
    }
    if cut_bytes > 0 {
        let marker = format!("[... {cut_bytes} bytes cut]");
        if args.is_empty() {
            command.push_str(&marker);
        } else {
            kept.push(marker);
        }
    }
    (command, kept)
}

/// Room left for a listing's envelope (the response around the entries).
const ENVELOPE: usize = 4 << 10;

/// One page of the caller's commands of one family (bash commands when `bash`, else
/// terminals), newest first, only those of session `only` when it is named, each
/// rendered by `render`: the entries and the cursor of the next page, if any. A page
/// ends early rather than make its reply longer than `--client-buffer` (PROTOCOL 8).
pub fn page_of(
    core: &Core,
    uid: u32,
    p: &Params,
    only: Option<&str>,
    bash: bool,
    render: impl Fn(&Proc) -> Value,
) -> Result<(Vec<Value>, Option<String>), RpcError> {
    let page = Page::from_params(p, "cursor")?;
    let of_family = core.table.list(uid, page.below()).filter(|c| {
        // A shell session's shell is listed by `shell/sessions`, not here.
        !c.family.is_shell()
            && c.family.is_bash() == bash
            && only.is_none_or(|o| o == c.family.session_id())
    });
    let (items, mut next) = page.take(of_family);
    let budget = core.cfg.client_buffer.saturating_sub(ENVELOPE);
    let mut used = 0;
    let mut entries = Vec::with_capacity(items.len());
    for (i, c) in items.iter().enumerate() {
        let entry = render(c);
        used += serde_json::to_vec(&entry).map_or(0, |v| v.len()) + 1;
        // The first entry always goes out: one entry is bounded well below any buffer.
        if used > budget && i > 0 {
            next = Some(format!("k{}", items[i - 1].key));
            break;
        }
        entries.push(entry);
    }
    Ok((entries, next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit;

    #[test]
    fn a_page_ends_early_rather_than_outgrow_the_client_buffer() {
        let mut core = testkit::core();
        core.cfg.client_buffer = ENVELOPE + 1000;
        let keys: Vec<_> = (0..10).map(|_| testkit::terminal(&mut core)).collect();
        let none = serde_json::Map::new();
        let render = |_: &Proc| Value::String("x".repeat(298)); // 301 bytes a line
        let (entries, next) = page_of(&core, 1000, &Params(&none), None, false, render).unwrap();
        assert_eq!(entries.len(), 3, "3 x 301 fit in 1000, 4 do not");
        // Newest first: the cursor names the last one shown, the next page goes on below.
        assert_eq!(next, Some(format!("k{}", keys[7])));
        let mut p = serde_json::Map::new();
        p.insert("cursor".into(), next.unwrap().into());
        let (rest, _) = page_of(&core, 1000, &Params(&p), None, false, render).unwrap();
        assert_eq!(rest.len(), 3);
        // Everything fits in a big buffer: one page, no cursor.
        core.cfg.client_buffer = 1 << 20;
        let (all, next) = page_of(&core, 1000, &Params(&none), None, false, render).unwrap();
        assert_eq!((all.len(), next), (10, None));
    }

    #[test]
    fn long_command_lines_are_cut_with_a_marker() {
        let (c, a) = cut_command_line("ls", &["-l".into()]);
        assert_eq!((c.as_str(), a), ("ls", vec!["-l".to_string()]));
        let long = "x".repeat(10_000);
        let (c, a) = cut_command_line(&long, &[]);
        assert!(c.starts_with(&"x".repeat(LISTED_LINE_MAX)));
        assert!(c.ends_with(&format!("[... {} bytes cut]", 10_000 - LISTED_LINE_MAX)));
        assert!(a.is_empty());
        let args: Vec<String> = (0..100).map(|_| "y".repeat(100)).collect();
        let (c, a) = cut_command_line("echo", &args);
        assert_eq!(c, "echo");
        let shown: usize = a[..a.len() - 1].iter().map(String::len).sum();
        assert_eq!(shown + 4, LISTED_LINE_MAX);
        assert_eq!(
            a.last().unwrap(),
            &format!("[... {} bytes cut]", 100 * 100 + 4 - LISTED_LINE_MAX)
        );
        // Never inside a character.
        let (c, _) = cut_command_line(&"é".repeat(LISTED_LINE_MAX), &[]);
        assert!(c.starts_with(&"é".repeat(LISTED_LINE_MAX / 2)));
    }
}
