//! The bytes between the daemon and a session's shell: the lines it writes (the setup
//! line, a command's line, every byte escaped) and the markers it reads back out of the
//! terminal's output, with the nonce that makes them the shell's own (see the module
//! header of `core::shell` for how a line runs).

use std::hash::{Hash, Hasher};

use crate::core::vocab::LineOpts;

/// What opens every marker.
pub(super) const MARK: &[u8] = b"\x1b]6973;";
/// What ends every marker (BEL).
pub(super) const BEL: u8 = 0x07;
/// The longest marker read (a directory of 4096 bytes is 8192 in hex); a longer sequence
/// is not one of ours.
pub(super) const MARK_MAX: usize = 9 << 10;

/// A marker the shell printed, with the right nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// `s`: command `seq` has started; its output follows.
    Start { seq: u64 },
    /// `e`: a command ended with `status`, the shell now in `dir` (raw bytes).
    End { status: i32, dir: Vec<u8> },
    /// `p`: the prompt is shown; the shell reads its next line.
    Prompt,
    /// `x`: `exec_dir` does not exist and the request was strict.
    NoDir,
}

/// Finds markers in a terminal's byte stream as it arrives, across reads.
#[derive(Debug, Default)]
pub struct Scanner {
    /// The bytes of a marker begun and not finished yet (from its ESC).
    partial: Vec<u8>,
    /// The stream offset of `partial[0]`.
    at: u64,
}

impl Scanner {
    /// What an upgrade in place carries: a marker begun and not finished, and where.
    pub fn carry(&self) -> (&[u8], u64) {
        (&self.partial, self.at)
    }

    /// The scanner `carry` described.
    pub fn resume(partial: &[u8], at: u64) -> Scanner {
        Scanner {
            partial: partial.to_vec(),
            at,
        }
    }

    /// Reads `data`, whose first byte is at stream offset `offset`; returns each marker
    /// carrying `nonce`, with the offsets of its first byte and of the byte after it.
    /// Anything else, other OSC sequences and markers with another nonce included, is
    /// passed over.
    pub fn feed(&mut self, nonce: &str, offset: u64, data: &[u8]) -> Vec<(Marker, u64, u64)> {
        let mut found = Vec::new();
        let mut i = 0;
        while i < data.len() {
            if self.partial.is_empty() {
                match data[i..].iter().position(|&b| b == 0x1b) {
                    Some(n) => {
                        i += n;
                        self.partial.push(0x1b);
                        self.at = offset + i as u64;
                        i += 1;
                    }
                    None => break,
                }
                continue;
            }
            let b = data[i];
            let len = self.partial.len();
            if len < MARK.len() {
                if b == MARK[len] {
                    self.partial.push(b);
                    i += 1;
                } else {
                    // Not ours: look again from this byte (it may be an ESC).
                    self.partial.clear();
                }
                continue;
            }
            if b == BEL {
                let end = offset + i as u64 + 1;
                if let Some(m) = parse(&self.partial[MARK.len()..], nonce) {
                    found.push((m, self.at, end));
                }
                self.partial.clear();
                i += 1;
                continue;
            }
            if b == 0x1b || self.partial.len() >= MARK_MAX {
                self.partial.clear();
                continue;
            }
            self.partial.push(b);
            i += 1;
        }
        found
    }
}

/// A marker's body (after `ESC ] 6973 ;`, before BEL), if it carries `nonce`.
fn parse(body: &[u8], nonce: &str) -> Option<Marker> {
    let text = std::str::from_utf8(body).ok()?;
    let mut f = text.split(';');
    let kind = f.next()?;
    if f.next()? != nonce {
        return None;
    }
    let m = match kind {
        "s" => Marker::Start {
            seq: f.next()?.parse().ok()?,
        },
        "e" => Marker::End {
            status: f.next()?.parse().ok()?,
            dir: unhex(f.next()?)?,
        },
        "p" => Marker::Prompt,
        "x" => Marker::NoDir,
        _ => return None,
    };
    f.next().is_none().then_some(m)
}

/// Bytes from lowercase or uppercase hex.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `bytes` as `\xNN` escapes, for `printf %b` in the shell.
fn escaped(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 4);
    for b in bytes {
        out.push_str(&format!("\\x{b:02x}"));
    }
    out
}

/// The line that makes a fresh bash a shell session's: no history of its own (commands
/// are added as sent) and no history file, no `!` expansion, no mail checks and no idle
/// exit (`MAILPATH` and `TMOUT` do nothing with `MAILCHECK` and `TMOUT` unset and
/// read-only), the markers, the functions lines call, `set -P` unless symlinks are kept,
/// and the start directory entered as given (so a kept symlink shows in `pwd`). One line:
/// bash runs each line it reads before reading the next. The prompts (`PS0`, `PS1`,
/// `PS2`, `PROMPT_COMMAND`, and `PS4`, which `set -x` expands before every command) are
/// read-only: no line makes them run anything.
///
/// Nothing a line assigns, defines or redirects changes what this code does (PROTOCOL
/// 7.2): the nonce, the prompt variables and the functions are read-only; the state the
/// functions hand each other (`__execd_back`, `__execd_was`, `__execd_chk`, the hex
/// cache `__execd_lp`/`__execd_hp`) is checked before use, only ever passed to `cd`, or
/// names what the daemon checks itself (the directory a marker names is checked against
/// the shell's real one); every command the helper runs is `builtin X` (so a function
/// named `printf`, `cd`, `set`, `local`, `return` or `eval` is never called), and every
/// expansion in its words is quoted (`builtin local` is no declaration builtin to the
/// parser: its words are split on `IFS`, which a line may have set); alias expansion is
/// off; lines never see `$?` or `$__execd_c` before the daemon's own values are put there;
/// and after a line that is not a plain script the prompt checks the shell's descriptors
/// and undoes what would make later words mean more than they say (`set -k`, `set -a`,
/// `set -H`, the command hash, alias expansion; `command_line`). What it cannot hold: a
/// line that defines a function named `builtin` (asked for, like every definition) takes
/// over every later line once approved; and what an approved line defines (a function, a
/// trap, an exported variable) applies to later lines as it would at a terminal, in the
/// open for its approver to read.
pub fn setup_line(nonce: &str, dir: &std::path::Path, keep_symlinks: bool) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let physical = if keep_symlinks { "+P" } else { "-P" };
    let dir = escaped(dir.as_os_str().as_bytes());
    format!(
        " set +o history +H; unset HISTFILE MAILCHECK TMOUT; builtin shopt -u expand_aliases; \
builtin export -n PS0 PS1 PS2 PROMPT_COMMAND; builtin readonly __execd_n={nonce} MAILCHECK TMOUT; \
__execd_lp=; __execd_hp=; __execd_back=; __execd_was=; __execd_c=; __execd_chk=; \
__execd_prompt() {{ builtin local \"__s=$?\"; \
if [[ -n $__execd_chk ]]; then \
[[ -S /dev/fd/0 && -t 1 && -t 2 ]] || builtin kill -KILL \"$$\"; builtin set +kaH; builtin hash -r; fi; \
if [[ -n $__execd_back ]]; then if [[ $__execd_back == /* ]]; then \
builtin cd -- \"$__execd_back\" 2>/dev/null || __execd_back=; fi; __execd_back=; fi; \
if [[ -n $__execd_was ]]; then if [[ $__execd_was == 1 ]]; then builtin set -P; \
elif [[ $__execd_was == 2 ]]; then builtin set +P; fi; __execd_was=; fi; \
if [[ $PWD != \"$__execd_lp\" ]]; then builtin local LC_ALL=C __i __h=; \
for ((__i=0; __i<${{#PWD}}; __i++)); do builtin printf -v __h '%s%02x' \"$__h\" \"'${{PWD:__i:1}}\"; done; \
__execd_hp=$__h; __execd_lp=$PWD; fi; \
builtin printf '\\033]6973;e;%s;%s;%s\\007' \"$__execd_n\" \"$__s\" \"$__execd_hp\" >/dev/tty; }}; \
__execd_pre() {{ if [[ -n $__execd_chk ]]; then builtin shopt -u expand_aliases; __execd_chk=; fi; \
builtin printf -v __execd_c %b \"$2\"; builtin history -s -- \"$__execd_c\"; \
if [[ $5 != . ]]; then if [[ -o physical ]]; then __execd_was=1; else __execd_was=2; fi; builtin set \"$5\"; fi; \
if [[ -n $3 ]]; then builtin local __d; builtin printf -v __d %b \"$3\"; [[ $4 == *e* ]] || __execd_back=$PWD; \
builtin cd -- \"$__d\" 2>/dev/null || {{ __execd_back=; if [[ $4 == *s* ]]; then __execd_c=; \
builtin printf '\\033]6973;x;%s\\007' \"$__execd_n\" >/dev/tty; builtin return 0; fi; }}; fi; \
builtin printf '\\033]6973;s;%s;%s\\007' \"$__execd_n\" \"$1\" >/dev/tty; }}; \
__execd_st() {{ builtin return \"$1\"; }}; \
builtin readonly -f __execd_prompt __execd_pre __execd_st; \
PROMPT_COMMAND=__execd_prompt; PS1='\\u@\\h:\\w\\$ \\[\\033]6973;p;{nonce}\\007\\]'; PS2=; PS0=; \
builtin readonly PROMPT_COMMAND PS0 PS1 PS2 PS4; \
builtin set {physical}; builtin printf -v __execd_c %b '{dir}'; builtin cd -- \"$__execd_c\"; \
__execd_c=; builtin history -c\n"
    )
    .into_bytes()
}

/// The line that runs command `seq` with `opts` (see the module's header): its
/// `exec_dir` (left again afterwards unless `enter`), `strict` (a missing `exec_dir`
/// fails it rather than running it in the session's directory), its own
/// `preserve_symlinks`; `status` is what `$?` says when it starts (the last command's,
/// as the daemon read it from the end marker), and `tty` the terminal's path, opened
/// afresh (read and write, as a terminal is) as its stdin. Every command word is quoted
/// (`\x`), so no alias applies; no reserved word is used, so no alias of one (`{`) does
/// either.
///
/// `guarded`: the line is not a plain script (PROTOCOL 7.2), so it may `exec`, `set` or
/// name bash's saved descriptors (a plain line can do none of these). Its stdout and
/// stderr are the terminal too, restored after it whatever it redirected; and it sets
/// `__execd_chk`, for which the prompt after it checks that the shell's stdin is still
/// its socket and its stdout and stderr terminals (a line that closed the copies bash
/// saved could leave it reading commands from elsewhere: the shell ends itself then, and
/// the session starts another) and undoes `set -k`, `set -a`, `set -H` and the command
/// hash; the next line's `__execd_pre` turns alias expansion off again (bash restores
/// that option after running `PROMPT_COMMAND`, so the prompt cannot). A plain line pays
/// for none of it.
pub fn command_line(
    seq: u64,
    command: &str,
    opts: &LineOpts,
    (tty, status): (&std::path::Path, i32),
    guarded: bool,
) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let physical = match opts.keep_symlinks {
        None => ".",
        Some(true) => "+P",
        Some(false) => "-P",
    };
    let flags = match (opts.strict, opts.enter) {
        (false, false) => "-",
        (true, false) => "s",
        (false, true) => "e",
        (true, true) => "se",
    };
    let tty = escaped(tty.as_os_str().as_bytes());
    let (chk, outs) = if guarded {
        (" __execd_chk=1;", " 1>&0 2>&0")
    } else {
        ("", "")
    };
    // `__execd_pre` leaves `$?` at 0: a status of 0 needs no more.
    let status = match status.clamp(0, 255) {
        0 => String::new(),
        s => format!(" \\__execd_st {s} && \\builtin :;"),
    };
    format!(
        " \\__execd_pre {seq} '{}' '{}' {flags} {physical};{chk}{status} \
\\builtin eval -- \"$__execd_c\" 0<>$'{tty}'{outs}\n",
        escaped(command.as_bytes()),
        escaped(opts.exec_dir.as_deref().unwrap_or("").as_bytes()),
    )
    .into_bytes()
}

/// A shell's nonce: 128 bits from the daemon's secret and a counter (SipHash keyed by
/// neither, over both; the secret is what makes it unguessable).
pub(super) fn nonce(secret: &[u8; 32], n: u64) -> String {
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        secret.hash(&mut h);
        n.hash(&mut h);
        salt.hash(&mut h);
        h.finish()
    };
    format!("{:016x}{:016x}", half(0), half(1))
}
