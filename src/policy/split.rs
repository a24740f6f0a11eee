//! The shell-line splitter (PROTOCOL 7.2): a line is read into simple commands only when
//! it is a plain script; anything it cannot read exactly is flagged `unparsed`, never
//! guessed. Total: any input returns in linear time without panicking.
//!
//! It reads by allowlist. Every byte of the line must be one of the few things below, read
//! the way bash reads it and never so that dash would run more; anything else stops the
//! reading and flags the line. A differential test (`split/differential.rs`) runs every
//! line it calls plain under bash with `strace` (and its corpus again through `sh -c`,
//! dash where that is `/bin/sh`) and checks that only the commands it reported run.
//!
//! What a plain script is made of:
//! - Bare words of letters, digits and `_ . / + - , : @ % =` only. `{ } [ ] * ? ~ ! # $`,
//!   backquote, `^`, parentheses and every other byte stop the reading (`{fd}>file` is never
//!   a program named `{fd}`). Non-ASCII bytes in bare words too: bash gives them no meaning
//!   in UTF-8, but in a multibyte locale (GBK, Big5) the last byte of a character may be a
//!   `\` or `|` that the locale hides from bash and not from us.
//! - `\` before a printable ASCII byte or a tab: that byte, literally. `\` before a line
//!   break: nothing (line continuation, also between tokens). `\` before anything else or at
//!   the end of the line stops the reading.
//! - `'single'` quotes: anything up to the next `'`, literally, non-ASCII included (no
//!   locale can hide a `'`: it is below every multibyte trail byte).
//! - `"double"` quotes holding printable ASCII, tabs and line breaks, but no `$`, backquote or
//!   `!` (history expansion, should anything turn it on) and no non-ASCII byte (a hidden
//!   `\` would move the closing quote). Escapes are the ones bash and POSIX honour there:
//!   `\$ \` \" \\` stand for the byte, `\` + line break is nothing, any other `\` is itself.
//! - A control byte (other than tab and line break) or NUL anywhere makes the whole line
//!   unparsed: no argv can hold NUL, and `\x01`/`\x7f` are bash's own quoting bytes.
//! - Comments: a `#` where a token starts (after blanks, an operator or a line break) runs
//!   to the line break, exactly as bash reads it (a `\` before that line break does not
//!   continue a comment); `#` inside a word stops the reading.
//! - Separators `&&`, `||`, `;`, `|`, `|&` (bash) and line breaks; blank lines; a line break after
//!   `&&`, `||`, `|`. A lone `&`, `;;`, `;&`, parentheses, or a separator with no command
//!   before it stop the reading (`a &&` at the end is a syntax error: bash runs none of it).
//! - Redirections, ignored: `<`, `>`, `>>`, `>|`, `<>`, `&>`, `&>>` (bash) to a plain word; an fd
//!   number of one bare digit before any of the first five (`2>x`, and `2\` + line break +
//!   `>x`, which bash reads the same); `<&D`, `>&D`, `N<&D`, `N>&D` where D is one digit
//!   or `-` written right after the `&` and ending the token. Here-documents and strings,
//!   process substitution, `{var}>`, fd numbers of two or more digits, `>&word` (bash's
//!   `&>word`), a target that is an fd number itself (`> 2>x`) and the targets bash opens
//!   as sockets (`/dev/tcp/...`, `/dev/udp/...`) stop the reading.
//! - The line is read as bash reads it (execd's default shell), and never so that dash,
//!   should execd run lines with `/bin/sh`, would run more: bash's `|&` is a syntax error to
//!   dash, and bash's `&>` must end its command, since dash reads `a &>f b` as `a &` then
//!   `>f b`, which runs `b`. Inside `sh -c`, `dash -c`, `ash -c`, `busybox sh -c` neither
//!   is plain.
//! - Leading `NAME=value` and `NAME+=value` assignments with a bare name, before the program
//!   and between redirections: skipped, their names reported in `assigned` (the policy
//!   decides about `PATH`, `BASH_ENV`, `LD_*`, ...). Assignments to the variables bash
//!   gives a meaning of its own beyond their value stop the reading: the integer and
//!   dynamic ones (`RANDOM`, `SRANDOM`, `OPTIND`, `HISTCMD`, `SECONDS`, `LINENO`,
//!   `EPOCH*`), whose value is evaluated as arithmetic (`x='a[$(rm -rf V)]'; RANDOM=x`
//!   runs rm), every `BASH*` name but `BASH_ENV` and `BASHOPTS` (`BASH_CMDS=/bin/rm; 0 -rf V`
//!   runs rm as `0`), `POSIXLY_CORRECT` (POSIX mode), and `SSH_CLIENT`, `SSH2_CLIENT` and
//!   `SHLVL`: a bash started with one of the first two set and `SHLVL` below 1 reads
//!   `~/.bashrc` (Debian builds bash so), which the line itself may have just written. A
//!   command of assignments (and redirections) only is plain and runs nothing.
//!
//! What a simple command's first word (after quote removal) may be:
//! - A reserved word (`if`, `for`, `!`, `{`, `[[`, `time`, `coproc`, `function`, ...), in
//!   any spelling (bash ignores quoted ones, but nothing is lost by refusing them): unparsed.
//! - A builtin of bash, dash or busybox ash: unparsed (its argv is still reported) unless
//!   it is one that never reads its arguments as code, variable names or arithmetic:
//!   `echo`, `true`, `false`, `:`, `pwd`, `cd`, `exit`, and `printf` when its first
//!   argument is not an option (`printf -v 'a[$(..)]'` assigns through a subscript).
//!   The rest (`eval`, `.`, `source`, `exec`, `command`, `builtin`, `let`, `declare`,
//!   `read`, `test`, `[`, `hash`, `alias`, `shopt`, `set`, `trap`, `mapfile`, `kill`, ...)
//!   either run code or change how later words are read, or simply are not worth the risk.
//! - A word holding `=` that is no assignment (zsh runs `=rm` as `/bin/rm`; `1A=x`), or
//!   starting with `%` (a job to resume): unparsed.
//! - A shell (`sh`, `bash`, `rbash`, `dash`, `ash`, `busybox sh`/`busybox ash`, by basename)
//!   given exactly `[-e|-u|+e|+u|-o pipefail|errexit|nounset]... -c WORD [ARG...]`:
//!   replaced by WORD's commands (one level deep; a shell inside WORD is reported and
//!   unparsed). Options are read as the shell reads them: `l` anywhere in a short cluster
//!   (`-lc`, `-cl`, `-elc`) makes a login shell, which runs `/etc/profile` and the
//!   profile in `$HOME` first, code no rule saw: unparsed, unless the reading says
//!   `login_split` (the policy's `"login_shell": "split"`), which trusts those files and
//!   reports `login` (the policy weighs `HOME` and the like against it). Any other
//!   invocation of a shell is unparsed: `bash script.sh` and `echo .. | bash` run code
//!   nobody read, `--login`, `-i`, `--rcfile` and `--init-file` run profile and rc
//!   files, `-s` or no `-c` reads the terminal, `-x` runs `PS4`, `-k`, `-O` and `--posix`
//!   change how WORD is read. `ksh`, `mksh`, `zsh`, `fish` and the other shells with `-c`
//!   are always unparsed: their preset aliases (`integer`, `nameref`), expansions (`=cmd`,
//!   `<1-9>`) and startup files (zsh's `.zshenv`, read on every start) differ; what their
//!   WORD would run is still reported.
//! - In a shell session's line (`Reading::session`, PROTOCOL 7.2), a word naming the
//!   shell's own descriptors (containing `/proc/`, starting with `/dev/fd` or `/dev/std`;
//!   in a redirection or an assignment too) or a program named like the session helper's
//!   functions (`__execd...`) is not plain. (What a session line assigns is the policy's
//!   to weigh, from `assigned`.)
//! - Anything else (bare, quoted, `./x`, `/usr/bin/x`, `-x`): a program, argv as read.
//!
//! When reading stops, `commands` holds what was read before, plus the argv of the command
//! that stopped it when that is a whole command (an unparsed builtin or shell) or the words
//! of the one being read (a true prefix of its argv), so rules may still judge them.
//! Wrappers (`env`, `sudo`, `xargs`, `nohup`, `timeout`, `find -exec`) are programs: the
//! policy judges their argv, as the policy module says.

#[cfg(test)]
mod differential;

/// A shell line split into simple commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// The simple commands read, in order: each an argv, assignments and redirections
    /// removed, `sh -c WORD` replaced by WORD's commands. Never an empty argv.
    pub commands: Vec<Vec<String>>,
    /// The line is not (entirely) a plain script. `commands` then holds what could be read
    /// before the first construct that could not (see the module header).
    pub unparsed: bool,
    /// The names of the variables the line's leading assignments set (`PATH=/x ls`),
    /// in order, nested `sh -c` lines included: the policy decides whether they change
    /// what runs.
    pub assigned: Vec<String>,
    /// A login shell's `-c WORD` was read through (only under `Reading::login_split`): it
    /// reads profile files from `$HOME` first, which the policy weighs against the
    /// variables set.
    pub login: bool,
}

/// How a line is read: where it will run, and what the policy trusts (PROTOCOL 7.2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// A line of a shell session (12.2), typed into a shell that lives on: a word that
    /// names the shell's own descriptors (`/proc/...`, `/dev/fd...`, `/dev/std...`) or a
    /// program named like the session helper's functions (`__execd...`) is unparsed.
    /// (Assignments to bash's own variables are the policy's to weigh: `assigned`.)
    pub session: bool,
    /// `"login_shell": "split"`: `bash -lc WORD` (any short cluster with `l`) is read
    /// through like `bash -c WORD`, trusting the profile files it reads first.
    pub login_split: bool,
}

/// The last path component of a program as given (`/usr/bin/rm` -> `rm`).
pub(crate) fn basename(program: &str) -> &str {
    match program.rfind('/') {
        Some(slash) => &program[slash + 1..],
        None => program,
    }
}

/// What a direct argv `sh -c WORD` (or `bash -c`, ...) runs: WORD split as a line that is
/// already one level deep, so its own nested shells are not read. Empty for an argv that
/// is no shell; unparsed for a shell run any other way (`bash x.sh`, `bash --login -c
/// WORD`, and `bash -l -c WORD` unless `reading` trusts login shells).
pub fn split_shell_c(argv: &[String], reading: Reading) -> Split {
    let mut shells = Vec::new();
    match shell_run(argv, reading.login_split) {
        None => Split::default(),
        Some(ShellRun::Plain { word, posix, login }) => {
            let mut out = split_at(word, 1, posix, reading, &mut shells);
            out.login |= login;
            out
        }
        Some(ShellRun::Opaque(word)) => {
            let mut out = word.map_or_else(Split::default, |w| {
                split_at(w, 1, true, reading, &mut shells)
            });
            out.unparsed = true;
            out
        }
    }
}

/// Splits a shell line into its simple commands, or says it is not a plain script (read
/// as a `bash -c` line, login shells unparsed).
pub fn split_line(line: &str) -> Split {
    split_line_as(line, Reading::default())
}

/// `split_line`, read as `reading` says.
pub fn split_line_as(line: &str, reading: Reading) -> Split {
    split_at(line, 0, false, reading, &mut Vec::new())
}

/// `split_line`, and the argv of every `sh -c WORD` it replaced by WORD's commands: what
/// the differential test lets run besides the commands.
#[cfg(test)]
fn split_line_traced(line: &str, reading: Reading) -> (Split, Vec<Vec<String>>) {
    let mut shells = Vec::new();
    let split = split_at(line, 0, false, reading, &mut shells);
    (split, shells)
}

/// Splits `line`, `depth` levels of `sh -c` deep: at depth 0 a `sh -c WORD` is replaced by
/// WORD's commands (and its argv added to `shells`); deeper, it is kept as it is and the
/// line counts as unparsed, since what it runs is not read. `posix`: the line is read by a
/// POSIX shell (dash, ash), not by bash: bash's `&>` and `|&` are not plain there.
fn split_at(
    line: &str,
    depth: u8,
    posix: bool,
    reading: Reading,
    shells: &mut Vec<Vec<String>>,
) -> Split {
    let mut out = Split::default();
    if line
        .bytes()
        .any(|b| (b < b' ' && b != b'\t' && b != b'\n') || b == 0x7f)
    {
        out.unparsed = true;
        return out;
    }
    let mut lexer = Lexer {
        s: line.as_bytes(),
        i: 0,
        posix,
        session: reading.session,
    };
    let mut argv: Vec<String> = Vec::new();
    // The current simple command has begun (a word, an assignment or a redirection).
    let mut started = false;
    // The last separator was `&&`, `||`, `|` or `|&`: a command must follow.
    let mut pending = false;
    // An `&>` was read in the current command: to dash it ends the command (`a &>f b` is
    // `a &` then `>f b`, which runs b), so no word may follow.
    let mut both_redirected = false;
    let plain = loop {
        let Ok(token) = lexer.next() else {
            break false;
        };
        match token {
            // `a &&` at the end is a syntax error: bash runs none of it.
            Token::End => break started || !pending,
            Token::Word(_) if both_redirected => break false,
            Token::Word(word) if argv.is_empty() && word.assignment => {
                let name = word.text.split('=').next().unwrap_or_default();
                let name = name.strip_suffix('+').unwrap_or(name);
                out.assigned.push(name.to_owned());
                started = true;
                if !assignment_is_plain(name)
                    || (reading.session && names_own_descriptors(&word.text))
                {
                    break false;
                }
            }
            Token::Word(word) => {
                let helper = argv.is_empty() && word.text.starts_with("__execd");
                if reading.session && (helper || names_own_descriptors(&word.text)) {
                    argv.push(word.text);
                    break false;
                }
                argv.push(word.text);
                started = true;
            }
            Token::Redirect { both } => {
                started = true;
                both_redirected |= both;
            }
            Token::Sep(sep) => {
                if !started {
                    // Blank lines are fine, and so is a line break after `&&`, `||`, `|`;
                    // any other separator with no command before it is a syntax error.
                    if sep == Sep::Newline {
                        continue;
                    }
                    break false;
                }
                if !finish(&mut out, std::mem::take(&mut argv), depth, reading, shells) {
                    return out;
                }
                started = false;
                both_redirected = false;
                pending = matches!(sep, Sep::AndOr | Sep::Pipe);
            }
        }
    };
    if plain {
        finish(&mut out, argv, depth, reading, shells);
    } else {
        out.unparsed = true;
        // The words of the command being read when reading stopped: a true prefix of its
        // argv, so rules may judge them. A reserved word starts no command.
        if argv.first().is_some_and(|p| !is_reserved(p)) {
            out.commands.push(argv);
        }
    }
    out
}

/// Adds the whole simple command `argv` to `out` (a `sh -c WORD` as WORD's commands).
/// False when it is not plain: `out` is then flagged unparsed and reading stops.
fn finish(
    out: &mut Split,
    argv: Vec<String>,
    depth: u8,
    reading: Reading,
    shells: &mut Vec<Vec<String>>,
) -> bool {
    let Some(program) = argv.first() else {
        return true;
    };
    if is_reserved(program) {
        out.unparsed = true;
        return false;
    }
    let plain = match builtin(program) {
        Some(Builtin::Plain) => true,
        Some(Builtin::PlainWithoutOptions) => argv
            .get(1)
            .is_none_or(|first| !first.starts_with('-') || first == "--"),
        Some(Builtin::Code) => false,
        // `=rm` is `/bin/rm` to zsh; `%1` resumes a job.
        None => !program.contains('=') && !program.starts_with('%'),
    };
    if !plain {
        out.commands.push(argv);
        out.unparsed = true;
        return false;
    }
    match shell_run(&argv, reading.login_split) {
        None => {
            out.commands.push(argv);
            true
        }
        Some(ShellRun::Plain { word, posix, login }) if depth == 0 => {
            let inner = split_at(word, depth + 1, posix, reading, shells);
            shells.push(argv);
            out.commands.extend(inner.commands);
            out.assigned.extend(inner.assigned);
            out.unparsed |= inner.unparsed;
            out.login |= login;
            !inner.unparsed
        }
        // One level only: what a shell inside a shell runs is not read.
        Some(ShellRun::Plain { .. }) => {
            out.commands.push(argv);
            out.unparsed = true;
            false
        }
        Some(ShellRun::Opaque(word)) => {
            // What it would run, read as best we can: a `deny` among it still counts.
            let inner = word
                .filter(|_| depth == 0)
                .map(|w| split_at(w, depth + 1, true, reading, &mut Vec::new()));
            out.commands.push(argv);
            if let Some(inner) = inner {
                out.commands.extend(inner.commands);
                out.assigned.extend(inner.assigned);
            }
            out.unparsed = true;
            false
        }
    }
}

/// Bash's reserved words (`compgen -k`): they open or close compound commands.
fn is_reserved(word: &str) -> bool {
    matches!(
        word,
        "if" | "then"
            | "else"
            | "elif"
            | "fi"
            | "case"
            | "esac"
            | "for"
            | "select"
            | "while"
            | "until"
            | "do"
            | "done"
            | "in"
            | "function"
            | "time"
            | "{"
            | "}"
            | "!"
            | "[["
            | "]]"
            | "coproc"
    )
}

/// How a builtin treats its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Builtin {
    /// Never as code, variable names or arithmetic: its argv says what it does.
    Plain,
    /// Like `Plain` unless its first argument is an option (`printf -v NAME`).
    PlainWithoutOptions,
    /// Runs code, assigns or evaluates through its arguments, or changes how later
    /// commands are read or found: not plain, whatever its words.
    Code,
}

/// The builtins of bash 5 (`enable -a`), dash (`chdir`) and busybox ash, by the word that
/// runs them (a word with a `/` never does).
fn builtin(word: &str) -> Option<Builtin> {
    match word {
        "echo" | "true" | "false" | ":" | "pwd" | "cd" | "exit" => Some(Builtin::Plain),
        "printf" => Some(Builtin::PlainWithoutOptions),
        "." | "[" | "alias" | "bg" | "bind" | "break" | "builtin" | "caller" | "chdir"
        | "command" | "compgen" | "complete" | "compopt" | "continue" | "declare" | "dirs"
        | "disown" | "enable" | "eval" | "exec" | "export" | "fc" | "fg" | "getopts" | "hash"
        | "help" | "history" | "jobs" | "kill" | "let" | "local" | "logout" | "mapfile"
        | "popd" | "pushd" | "read" | "readarray" | "readonly" | "return" | "set" | "shift"
        | "shopt" | "source" | "suspend" | "test" | "times" | "trap" | "type" | "typeset"
        | "ulimit" | "umask" | "unalias" | "unset" | "wait" => Some(Builtin::Code),
        _ => None,
    }
}

/// Whether assigning `name` only sets a value (see the module header for those that do
/// more). The policy judges the names that change what a later program runs.
fn assignment_is_plain(name: &str) -> bool {
    let special = matches!(
        name,
        "RANDOM"
            | "SRANDOM"
            | "OPTIND"
            | "HISTCMD"
            | "SECONDS"
            | "LINENO"
            | "EPOCHSECONDS"
            | "EPOCHREALTIME"
            | "POSIXLY_CORRECT"
            | "SSH_CLIENT"
            | "SSH2_CLIENT"
            | "SHLVL"
    ) || (name.starts_with("BASH") && !matches!(name, "BASH_ENV" | "BASHOPTS"));
    !special
}

/// How a shell argv runs code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShellRun<'a> {
    /// `SHELL [plain options] -c WORD [ARG...]` of a shell whose reading of WORD we know;
    /// `posix` unless that shell is bash; `login` when `-l` was among the options (read
    /// through only under `"login_shell": "split"`).
    Plain {
        word: &'a str,
        posix: bool,
        login: bool,
    },
    /// Any other way of running a shell; the `-c` WORD if one could be made out.
    Opaque(Option<&'a str>),
}

/// Shells whose `-c WORD` we read as we read a line: bash, and the POSIX shells that read
/// our plain subset without `&>` and `|&` exactly as bash does (checked against bash and
/// dash by the differential test).
const SPLIT_SHELLS: [&str; 5] = ["sh", "bash", "rbash", "dash", "ash"];

/// Other shells that take `-c`: never read, always unparsed.
const OTHER_SHELLS: [&str; 13] = [
    "zsh", "ksh", "ksh93", "mksh", "lksh", "pdksh", "oksh", "posh", "yash", "hush", "fish", "csh",
    "tcsh",
];

/// How `argv` runs a shell, if its program is one (by basename; `busybox sh` too).
/// `login_split`: a login shell's `-c WORD` may be read through.
fn shell_run(argv: &[String], login_split: bool) -> Option<ShellRun<'_>> {
    let (shell, args) = match (argv.first().map(|p| basename(p)), argv.get(1)) {
        // `busybox sh`: the applet named by its basename, as busybox finds it.
        (Some("busybox"), Some(applet)) => (basename(applet), argv.get(2..)?),
        (Some(program), _) => (program, argv.get(1..)?),
        (None, _) => return None,
    };
    let readable = SPLIT_SHELLS.contains(&shell);
    if !readable && !OTHER_SHELLS.contains(&shell) {
        return None;
    }
    let options = shell_options(args);
    let plain = options.plain && (!options.login || login_split);
    Some(match options.word {
        Some(word) if readable && plain => ShellRun::Plain {
            word,
            posix: !matches!(shell, "bash" | "rbash"),
            login: options.login,
        },
        word => ShellRun::Opaque(word),
    })
}

/// A shell's options as the shell reads them.
struct ShellOptions<'a> {
    /// Every option is a plain one (see the module header), `-l` included, and there is a
    /// `-c` script.
    plain: bool,
    /// `-l` was among them (in any short cluster: `-lc`, `-cl`, `-elc`): a login shell.
    login: bool,
    /// The script, when `-c` is among them (the first operand).
    word: Option<&'a str>,
}

/// Reads a shell's options (see `ShellOptions`).
fn shell_options(args: &[String]) -> ShellOptions<'_> {
    let mut plain = true;
    let mut login = false;
    let mut command_mode = false;
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        let arg = arg.as_str();
        i += 1;
        if arg == "--" {
            break;
        }
        if arg == "-o" || arg == "+o" {
            let name = args.get(i).map(String::as_str);
            plain &= matches!(name, Some("pipefail" | "errexit" | "nounset"));
            i += 1;
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            // `--login`, `--rcfile`, `--init-file`, `--posix`, ...: never read through.
            plain = false;
            // The two long options that take a value: skip it too.
            if matches!(long, "rcfile" | "init-file") {
                i += 1;
            }
            continue;
        }
        let (minus, letters) = match (arg.strip_prefix('-'), arg.strip_prefix('+')) {
            (Some(l), _) => (true, l),
            (_, Some(l)) => (false, l),
            // The first operand: the script when `-c` was given.
            _ => {
                i -= 1;
                break;
            }
        };
        if letters.is_empty() {
            // A lone `-` ends bash's options; dash reads it otherwise.
            plain = false;
            break;
        }
        for b in letters.bytes() {
            match b {
                b'c' if minus => command_mode = true,
                // A login shell reads `/etc/profile` and `~/.bash_profile` (or
                // `~/.profile`) first: code no rule saw (PROTOCOL 7.2). The caller reads
                // its script through only under `"login_shell": "split"`.
                b'l' if minus => login = true,
                b'e' | b'u' => {}
                // `-i` (interactive: the rc file), `-s`, `-x` (PS4), `-k`, `-O`, ...
                _ => plain = false,
            }
        }
        // `-o NAME` inside a cluster (`-eo pipefail`): the name is the option's.
        if letters.contains(['o', 'O']) {
            i += 1;
        }
    }
    let word = if command_mode {
        args.get(i).map(String::as_str)
    } else {
        None
    };
    ShellOptions {
        plain: plain && word.is_some(),
        login,
        word,
    }
}

/// Whether a word names a shell's own descriptors, which a session's line has no business
/// with (PROTOCOL 7.2: the command channel's guarantee is the socket; this keeps the line
/// honest): a path through `/proc`, or `/dev/fd`, `/dev/stdin`, `/dev/stdout`,
/// `/dev/stderr`.
fn names_own_descriptors(word: &str) -> bool {
    word.contains("/proc/")
        || word.ends_with("/proc")
        || word.starts_with("/dev/fd")
        || word.starts_with("/dev/std")
}

/// The rest of the line is not a plain script.
struct NotPlain;

/// A separator between simple commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sep {
    /// A line break.
    Newline,
    /// `;`
    Semi,
    /// `&&` or `||`
    AndOr,
    /// `|` or `|&`
    Pipe,
}

/// One token of a plain script.
enum Token {
    Word(Word),
    Sep(Sep),
    /// A redirection, its operator and target read whole; `both` for bash's `&>`/`&>>`.
    Redirect {
        both: bool,
    },
    End,
}

/// A word after quote removal.
struct Word {
    text: String,
    /// A leading `NAME=value` (or `NAME+=value`) with a bare, valid name.
    assignment: bool,
    /// Bare digits only: an fd number when `<` or `>` follows at once.
    digits: bool,
}

/// Bytes that may stand bare in a word: those no shell gives a meaning to.
fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_./+-,:@%=".contains(&b)
}

/// Bytes that end a word, as bash splits tokens (the others that would are not plain).
fn ends_word(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'<' | b'>')
}

/// A valid shell variable name.
fn is_name(bytes: &[u8]) -> bool {
    match bytes.split_first() {
        Some((first, rest)) => {
            (first.is_ascii_alphabetic() || *first == b'_')
                && rest.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
        }
        None => false,
    }
}

/// The tokenizer. It works on bytes: every byte it acts on is ASCII, so the words it cuts
/// out are whole UTF-8. Every call consumes input or returns `End`/`NotPlain`, and none
/// recurses, so reading a line is linear in its length.
struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
    /// Read as dash reads it: bash's `&>` and `|&` are not plain.
    posix: bool,
    /// A shell session's line: a redirection to the shell's own descriptors is not plain.
    session: bool,
}

impl Lexer<'_> {
    /// The byte `k` places ahead.
    fn at(&self, k: usize) -> Option<u8> {
        self.s.get(self.i + k).copied()
    }

    /// Skips blanks and line continuations.
    fn blanks(&mut self) {
        loop {
            match (self.at(0), self.at(1)) {
                (Some(b' ' | b'\t'), _) => self.i += 1,
                (Some(b'\\'), Some(b'\n')) => self.i += 2,
                _ => return,
            }
        }
    }

    fn next(&mut self) -> Result<Token, NotPlain> {
        self.blanks();
        let (sep, len) = match (self.at(0), self.at(1)) {
            (None, _) => return Ok(Token::End),
            (Some(b'#'), _) => {
                // A comment runs to the line break, which still separates commands.
                let rest = self.s.get(self.i..).unwrap_or_default();
                self.i += rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
                return self.next_after_comment();
            }
            (Some(b'\n'), _) => (Sep::Newline, 1),
            // `;;`, `;&`: case arms.
            (Some(b';'), Some(b';' | b'&')) => return Err(NotPlain),
            (Some(b';'), _) => (Sep::Semi, 1),
            (Some(b'&'), Some(b'&')) | (Some(b'|'), Some(b'|')) => (Sep::AndOr, 2),
            // `&>` and `&>>`: stdout and stderr to a file, to bash; to dash, `&` then `>`.
            (Some(b'&'), Some(b'>')) if !self.posix => {
                self.i += 2;
                if self.at(0) == Some(b'>') {
                    self.i += 1;
                }
                self.target()?;
                return Ok(Token::Redirect { both: true });
            }
            // A lone `&` runs the command in the background.
            (Some(b'&'), _) => return Err(NotPlain),
            // `|&`: bash's `2>&1 |`; a syntax error to dash.
            (Some(b'|'), Some(b'&')) if !self.posix => (Sep::Pipe, 2),
            (Some(b'|'), Some(b'&')) => return Err(NotPlain),
            (Some(b'|'), _) => (Sep::Pipe, 1),
            (Some(b'<' | b'>'), _) => return self.redirect(),
            (Some(_), _) => {
                let word = self.word()?;
                if word.digits && matches!(self.at(0), Some(b'<' | b'>')) {
                    // `2>x`: a bare number right before `<`/`>` is the fd redirected.
                    // One digit only: bash's reading of big numbers is not worth knowing.
                    return if word.text.len() == 1 {
                        self.redirect()
                    } else {
                        Err(NotPlain)
                    };
                }
                return Ok(Token::Word(word));
            }
        };
        self.i += len;
        Ok(Token::Sep(sep))
    }

    /// `next` once a comment has been skipped: what follows is a line break or the end.
    fn next_after_comment(&mut self) -> Result<Token, NotPlain> {
        match self.at(0) {
            None => Ok(Token::End),
            _ => {
                self.i += 1;
                Ok(Token::Sep(Sep::Newline))
            }
        }
    }

    /// A redirection operator at `<` or `>`, with its target.
    fn redirect(&mut self) -> Result<Token, NotPlain> {
        match (self.at(0), self.at(1)) {
            // Here-documents, here-strings, process substitution.
            (Some(b'<'), Some(b'<')) | (Some(b'<' | b'>'), Some(b'(')) => Err(NotPlain),
            (Some(b'<' | b'>'), Some(b'&')) => {
                // `>&2`, `<&0`, `2>&-`: a digit or `-`, then the token ends. `>&file` is
                // bash's `&>file`; `2>&1-` moves the fd: neither is read.
                self.i += 2;
                match (self.at(0), self.at(1)) {
                    (Some(b'0'..=b'9' | b'-'), next) if next.is_none_or(ends_word) => {
                        self.i += 1;
                        Ok(Token::Redirect { both: false })
                    }
                    _ => Err(NotPlain),
                }
            }
            (Some(b'<'), Some(b'>')) | (Some(b'>'), Some(b'>' | b'|')) => {
                self.i += 2;
                self.target()
            }
            (Some(b'<' | b'>'), _) => {
                self.i += 1;
                self.target()
            }
            _ => Err(NotPlain),
        }
    }

    /// The word a redirection opens: plain, not an fd number (`> 2>x` is a syntax error),
    /// not one of the sockets bash opens itself.
    fn target(&mut self) -> Result<Token, NotPlain> {
        self.blanks();
        match self.at(0) {
            Some(b) if !ends_word(b) && b != b'#' => {}
            // A comment (`> #x`), an operator or the end: no target.
            _ => return Err(NotPlain),
        }
        let word = self.word()?;
        let socket = word.text.starts_with("/dev/tcp/") || word.text.starts_with("/dev/udp/");
        let own = self.session && names_own_descriptors(&word.text);
        if socket || own || (word.digits && matches!(self.at(0), Some(b'<' | b'>'))) {
            return Err(NotPlain);
        }
        Ok(Token::Redirect { both: false })
    }

    /// A word starting at a byte that does not end one: bare parts, `'single'` and
    /// `"double"` quotes, backslash escapes. Anything else is `NotPlain`.
    fn word(&mut self) -> Result<Word, NotPlain> {
        let mut buf: Vec<u8> = Vec::new();
        // Length of `buf` when the first quoted or escaped byte was added.
        let mut first_quoted: Option<usize> = None;
        // Index in `buf` of the first bare `=`.
        let mut first_eq: Option<usize> = None;
        let mut digits = true;
        while let Some(b) = self.at(0) {
            match b {
                _ if ends_word(b) => break,
                b'\'' => {
                    first_quoted.get_or_insert(buf.len());
                    digits = false;
                    let rest = self.s.get(self.i + 1..).unwrap_or_default();
                    let Some(end) = rest.iter().position(|&c| c == b'\'') else {
                        return Err(NotPlain);
                    };
                    buf.extend_from_slice(rest.get(..end).unwrap_or_default());
                    self.i += end + 2;
                }
                b'"' => {
                    first_quoted.get_or_insert(buf.len());
                    digits = false;
                    self.i += 1;
                    self.double_quoted(&mut buf)?;
                }
                b'\\' => match self.at(1) {
                    // Line continuation: gone before bash tokenizes.
                    Some(b'\n') => self.i += 2,
                    Some(c @ (b'\t' | b' '..=b'~')) => {
                        first_quoted.get_or_insert(buf.len());
                        digits = false;
                        buf.push(c);
                        self.i += 2;
                    }
                    // Non-ASCII (locale-dependent), or the end of the line.
                    _ => return Err(NotPlain),
                },
                _ if is_word_byte(b) => {
                    if b == b'=' {
                        first_eq.get_or_insert(buf.len());
                    }
                    digits &= b.is_ascii_digit();
                    buf.push(b);
                    self.i += 1;
                }
                _ => return Err(NotPlain),
            }
        }
        let assignment = match first_eq {
            Some(eq) if first_quoted.is_none_or(|q| q > eq) => {
                let name = buf.get(..eq).unwrap_or_default();
                is_name(name.strip_suffix(b"+").unwrap_or(name))
            }
            _ => false,
        };
        let digits = digits && !buf.is_empty();
        let text = String::from_utf8(buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        Ok(Word {
            text,
            assignment,
            digits,
        })
    }

    /// The inside of a `"double"` quote, after the opening quote, through the closing one.
    fn double_quoted(&mut self, buf: &mut Vec<u8>) -> Result<(), NotPlain> {
        loop {
            match (self.at(0), self.at(1)) {
                (None, _) | (Some(b'$' | b'`' | b'!' | 0x80..), _) => return Err(NotPlain),
                (Some(b'"'), _) => {
                    self.i += 1;
                    return Ok(());
                }
                (Some(b'\\'), Some(b'\n')) => self.i += 2,
                (Some(b'\\'), Some(c @ (b'$' | b'`' | b'"' | b'\\'))) => {
                    buf.push(c);
                    self.i += 2;
                }
                // Before any other byte a backslash is itself; that byte is read next.
                (Some(c), _) => {
                    buf.push(c);
                    self.i += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line and how it splits: its commands and whether it is unparsed.
    pub(super) type Case = (&'static str, &'static [&'static [&'static str]], bool);

    /// The lines a red team used against the splitter's first version, and how each must
    /// split now: unparsed, or exactly right.
    pub(super) const RED_TEAM: &[Case] = &[
        ("{fd}>/dev/null rm -rf V", &[], true),
        ("let 'a[$(rm -rf V)]'", &[&["let", "a[$(rm -rf V)]"]], true),
        (
            "printf -v 'a[$(rm -rf V)]' x",
            &[&["printf", "-v", "a[$(rm -rf V)]", "x"]],
            true,
        ),
        (
            "declare 'a[$(rm -rf V)]=1'",
            &[&["declare", "a[$(rm -rf V)]=1"]],
            true,
        ),
        (
            "test -v 'a[$(rm -rf V)]'",
            &[&["test", "-v", "a[$(rm -rf V)]"]],
            true,
        ),
        ("[ -v 'a[$(rm -rf V)]' ]", &[], true),
        (
            "declare -i n; n='a[$(rm -rf V)]'",
            &[&["declare", "-i", "n"]],
            true,
        ),
        (
            "mapfile -C 'rm -rf V #' -c 1",
            &[&["mapfile", "-C", "rm -rf V #", "-c", "1"]],
            true,
        ),
        (
            "compgen -C 'rm -rf V' x",
            &[&["compgen", "-C", "rm -rf V", "x"]],
            true,
        ),
        (
            "hash -p /bin/rm ls; ls -rf V",
            &[&["hash", "-p", "/bin/rm", "ls"]],
            true,
        ),
        (
            "shopt -s expand_aliases; alias x='rm -rf'; x V",
            &[&["shopt", "-s", "expand_aliases"]],
            true,
        ),
        (
            "echo 'rm -rf V' > s.sh; . s.sh",
            &[&["echo", "rm -rf V"], &[".", "s.sh"]],
            true,
        ),
        (
            "builtin eval 'rm -rf V'",
            &[&["builtin", "eval", "rm -rf V"]],
            true,
        ),
        (
            "command eval 'rm -rf V'",
            &[&["command", "eval", "rm -rf V"]],
            true,
        ),
        ("PS4='$(rm -rf V)' ; set -x; true", &[&["set", "-x"]], true),
        ("rbash -c 'rm -rf V'", &[&["rm", "-rf", "V"]], false),
        ("x=$(rm -rf V)", &[], true),
        ("true; rm -rf V", &[&["true"], &["rm", "-rf", "V"]], false),
    ];

    /// Ways around the first version found while rewriting it (each ran `rm` unseen).
    pub(super) const FOUND: &[Case] = &[
        // Assigning an integer variable evaluates the value as arithmetic, subscripts
        // and all; through a variable too.
        ("RANDOM='a[$(rm -rf V)]'", &[], true),
        ("x='a[$(rm -rf V)]'; RANDOM=x", &[], true),
        ("x='a[$(rm -rf V)]'; OPTIND=x", &[], true),
        ("SRANDOM=x HISTCMD=y p1", &[], true),
        // BASH_CMDS is the command hash table: `0` runs /bin/rm.
        ("BASH_CMDS=/bin/rm; 0 -rf V", &[], true),
        // A shell reading a script or its stdin runs what no rule saw.
        (
            "echo 'rm -rf V' | bash",
            &[&["echo", "rm -rf V"], &["bash"]],
            true,
        ),
        (
            "echo 'rm -rf V' > s.sh; sh s.sh",
            &[&["echo", "rm -rf V"], &["sh", "s.sh"]],
            true,
        ),
        // An interactive shell runs its rc file first.
        ("bash -ic 'ls'", &[&["bash", "-ic", "ls"], &["ls"]], true),
        // zsh runs `=rm` as /bin/rm; ksh and mksh alias `integer` to `typeset -i`.
        (
            "zsh -c '=rm -rf V'",
            &[&["zsh", "-c", "=rm -rf V"], &["=rm", "-rf", "V"]],
            true,
        ),
        (
            "mksh -c \"integer x='a[1]'\"",
            &[&["mksh", "-c", "integer x='a[1]'"], &["integer", "x=a[1]"]],
            true,
        ),
        ("=rm -rf V", &[&["=rm", "-rf", "V"]], true),
        // Builtins that take variable names evaluate their subscripts.
        (
            "read 'a[$(rm -rf V)]'",
            &[&["read", "a[$(rm -rf V)]"]],
            true,
        ),
        (
            "unset 'a[$(rm -rf V)]'",
            &[&["unset", "a[$(rm -rf V)]"]],
            true,
        ),
        // bash with SSH_CLIENT set and SHLVL low reads ~/.bashrc, written just before.
        (
            "cd; echo 'rm -rf V' > .bashrc; SSH_CLIENT=x SHLVL=0 bash -c true; true",
            &[&["cd"], &["echo", "rm -rf V"]],
            true,
        ),
        // A word bash reads as an fd number or a dup target, not an argument.
        ("p1 >&rm", &[&["p1"]], true),
        // dash reads `a &>f b` as `a &` then `>f b`: b runs.
        ("true &>/dev/null rm -rf V", &[&["true"]], true),
        ("sh -c 'true &>/dev/null rm -rf V'", &[&["true"]], true),
        ("p1 12>x", &[&["p1"]], true),
        // In a GBK locale the second byte of a character may be a `\`.
        ("echo \u{20ac}\\; rm -rf V", &[&["echo"]], true),
        (
            "echo \"\u{20ac}\\\" ; rm -rf V ; \\\"\"",
            &[&["echo"]],
            true,
        ),
    ];

    /// How the splitter reads lines: every one of them is also in the differential test's
    /// corpus (`tests/data/splitter-corpus.txt`).
    pub(super) const CASES: &[Case] = &[
        // Chains and pipelines.
        ("ls -la", &[&["ls", "-la"]], false),
        (
            "ps aux | grep x | head",
            &[&["ps", "aux"], &["grep", "x"], &["head"]],
            false,
        ),
        ("cd x && make", &[&["cd", "x"], &["make"]], false),
        (
            "cargo build --release && cargo test -- --nocapture",
            &[
                &["cargo", "build", "--release"],
                &["cargo", "test", "--", "--nocapture"],
            ],
            false,
        ),
        ("a || b", &[&["a"], &["b"]], false),
        ("a ; b", &[&["a"], &["b"]], false),
        ("a;b;", &[&["a"], &["b"]], false),
        ("a |& b", &[&["a"], &["b"]], false),
        (
            "make||echo failed",
            &[&["make"], &["echo", "failed"]],
            false,
        ),
        (
            "git status\ngit diff\n",
            &[&["git", "status"], &["git", "diff"]],
            false,
        ),
        ("\n\n  ls\n\n", &[&["ls"]], false),
        (
            "cargo fmt &&\n  cargo clippy",
            &[&["cargo", "fmt"], &["cargo", "clippy"]],
            false,
        ),
        (
            "cd /repo && git fetch origin && git rebase origin/main",
            &[
                &["cd", "/repo"],
                &["git", "fetch", "origin"],
                &["git", "rebase", "origin/main"],
            ],
            false,
        ),
        (
            "p1 2>&1 | p2 &&\n p3 || p4",
            &[&["p1"], &["p2"], &["p3"], &["p4"]],
            false,
        ),
        ("p1 |\n\n p2", &[&["p1"], &["p2"]], false),
        // Quotes and escapes.
        (
            r#"git commit -m "fix: a thing""#,
            &[&["git", "commit", "-m", "fix: a thing"]],
            false,
        ),
        (
            "python3 -c 'print(1)'",
            &[&["python3", "-c", "print(1)"]],
            false,
        ),
        ("echo 'a;b'", &[&["echo", "a;b"]], false),
        (
            r#"grep -r "foo|bar" ."#,
            &[&["grep", "-r", "foo|bar", "."]],
            false,
        ),
        (
            r#"echo "say \"hi\"" 'it''s'"#,
            &[&["echo", "say \"hi\"", "its"]],
            false,
        ),
        (
            r"echo a\ b \; c\\d",
            &[&["echo", "a b", ";", "c\\d"]],
            false,
        ),
        (r#"echo 'a\nb' "c\d""#, &[&["echo", "a\\nb", "c\\d"]], false),
        (
            "echo '$HOME' \"\\$HOME\" \\$HOME",
            &[&["echo", "$HOME", "$HOME", "$HOME"]],
            false,
        ),
        ("echo '' \"\"", &[&["echo", "", ""]], false),
        (
            "git log --format='%h %s' -n 5",
            &[&["git", "log", "--format=%h %s", "-n", "5"]],
            false,
        ),
        (
            "find . -name '*.rs' -exec grep -l foo '{}' +",
            &[&[
                "find", ".", "-name", "*.rs", "-exec", "grep", "-l", "foo", "{}", "+",
            ]],
            false,
        ),
        (
            "cat file.txt | python3 -c \"import sys; print(sys.stdin.read())\"",
            &[
                &["cat", "file.txt"],
                &["python3", "-c", "import sys; print(sys.stdin.read())"],
            ],
            false,
        ),
        ("echo 'héllo wörld'", &[&["echo", "héllo wörld"]], false),
        ("echo '!' \\! \\*", &[&["echo", "!", "!", "*"]], false),
        ("p1 \"a\tb\nc\" 'd\\'", &[&["p1", "a\tb\nc", "d\\"]], false),
        ("p1 \"a\\\nb\"", &[&["p1", "ab"]], false),
        ("'p1' \"p2\" p\\3", &[&["p1", "p2", "p3"]], false),
        (
            "./configure --prefix=/usr/local && make -j4 && /usr/bin/make install",
            &[
                &["./configure", "--prefix=/usr/local"],
                &["make", "-j4"],
                &["/usr/bin/make", "install"],
            ],
            false,
        ),
        (
            "p1 a,b c:d e@f g%h +i -j k=l",
            &[&["p1", "a,b", "c:d", "e@f", "g%h", "+i", "-j", "k=l"]],
            false,
        ),
        // Assignments, redirections, comments, line continuations.
        ("FOO=1 cmd", &[&["cmd"]], false),
        (
            "RUST_LOG=debug CARGO_TERM_COLOR=never PATH+=:/x cargo test",
            &[&["cargo", "test"]],
            false,
        ),
        (
            "docker run -e FOO=bar img",
            &[&["docker", "run", "-e", "FOO=bar", "img"]],
            false,
        ),
        ("VAR=1", &[], false),
        ("A=1 B='x y' >out C=\"z\"", &[], false),
        ("A=1 >out B=2 p1 C=3", &[&["p1", "C=3"]], false),
        ("A\\\n=1 p1", &[&["p1"]], false),
        ("BASH_ENV=x PATH=/tmp p1", &[&["p1"]], false),
        (
            "cargo test 2>&1 | tail -n 20",
            &[&["cargo", "test"], &["tail", "-n", "20"]],
            false,
        ),
        ("ls > out.txt", &[&["ls"]], false),
        ("echo hi >> log.txt 2>/dev/null", &[&["echo", "hi"]], false),
        ("npm install &> /dev/null", &[&["npm", "install"]], false),
        ("p1 <>rw >|clobber 0<in &>>log", &[&["p1"]], false),
        (
            "p1 a &>o1 2>&1; p2 &>o2 && p3",
            &[&["p1", "a"], &["p2"], &["p3"]],
            false,
        ),
        ("bash -c 'p1 &>o1 |& p2'", &[&["p1"], &["p2"]], false),
        ("&>o1 p1", &[], true),
        ("p1 &>o1 A=1", &[&["p1"]], true),
        ("sh -c 'p1 |& p2'", &[&["p1"]], true),
        ("dash -c 'p1 &>o1'", &[&["p1"]], true),
        ("sort < in.txt > 'out file.txt'", &[&["sort"]], false),
        (
            "cmd 1>&2; echo err >&2",
            &[&["cmd"], &["echo", "err"]],
            false,
        ),
        ("p1 >&- 2>&- <&0 2>&1>x", &[&["p1"]], false),
        ("> out.txt echo hi", &[&["echo", "hi"]], false),
        ("> out.txt", &[], false),
        ("echo a2>x 2>y", &[&["echo", "a2"]], false),
        ("p1 2\\\n>x", &[&["p1"]], false),
        ("p1 2 >x \"2\">y", &[&["p1", "2", "2"]], false),
        ("ls # list files", &[&["ls"]], false),
        ("# just a comment", &[], false),
        ("p1;# c\np2 |# d\n p3", &[&["p1"], &["p2"], &["p3"]], false),
        (
            "true # not continued \\\nrm -rf V",
            &[&["true"], &["rm", "-rf", "V"]],
            false,
        ),
        (
            "make \\\n  -j4 \\\n  all",
            &[&["make", "-j4", "all"]],
            false,
        ),
        ("ec\\\nho hi", &[&["echo", "hi"]], false),
        (
            "pytest -k \"not slow\" -x -q 2>&1 | head -50",
            &[&["pytest", "-k", "not slow", "-x", "-q"], &["head", "-50"]],
            false,
        ),
        // Builtins that read their words as words.
        (
            "cd build && pwd -P && echo done: && exit 3",
            &[
                &["cd", "build"],
                &["pwd", "-P"],
                &["echo", "done:"],
                &["exit", "3"],
            ],
            false,
        ),
        (
            "true x; false; : y",
            &[&["true", "x"], &["false"], &[":", "y"]],
            false,
        ),
        (
            "printf '%s\\n' a; printf -- -v x; printf %d 'a[$(rm -rf V)]'",
            &[
                &["printf", "%s\\n", "a"],
                &["printf", "--", "-v", "x"],
                &["printf", "%d", "a[$(rm -rf V)]"],
            ],
            false,
        ),
        // Shells with -c.
        ("sh -c \"npm test\"", &[&["npm", "test"]], false),
        ("/bin/bash -c 'ls'", &[&["ls"]], false),
        (
            "cd /repo && bash -c \"cargo fmt && cargo clippy\"",
            &[&["cd", "/repo"], &["cargo", "fmt"], &["cargo", "clippy"]],
            false,
        ),
        (
            "bash -e -o pipefail -c 'p1 | p2' && dash -eu -c p3",
            &[&["p1"], &["p2"], &["p3"]],
            false,
        ),
        ("bash -c -e 'p1' name arg", &[&["p1"]], false),
        ("bash -c -- 'p1'", &[&["p1"]], false),
        ("busybox sh -c 'p1 x'", &[&["p1", "x"]], false),
        ("busybox rm -rf V", &[&["busybox", "rm", "-rf", "V"]], false),
        ("A=1 sh -c 'B=2 p1'", &[&["p1"]], false),
        // Not a plain script inside: the whole is unparsed, what was read is kept.
        ("bash -c 'echo $(id)'", &[&["echo"]], true),
        (
            "bash -c 'p1'; bash -c 'p2 &'; p3",
            &[&["p1"], &["p2"]],
            true,
        ),
        // Deeper than one level is not read.
        ("bash -c \"sh -c 'ls'\"", &[&["sh", "-c", "ls"]], true),
        // `env` is an ordinary command.
        (
            "/usr/bin/env bash -c 'ls'",
            &[&["/usr/bin/env", "bash", "-c", "ls"]],
            false,
        ),
        // A shell run any other way is unparsed; what its -c WORD runs is still read.
        ("bash script.sh", &[&["bash", "script.sh"]], true),
        ("p1 | sh", &[&["p1"], &["sh"]], true),
        ("bash -c", &[&["bash", "-c"]], true),
        // `bash -lc WORD`, as agents wrap commands, reads the profile files first: unparsed
        // (unless the policy says `"login_shell": "split"`), what WORD runs still read.
        (
            "bash -lc 'git status && git diff'",
            &[
                &["bash", "-lc", "git status && git diff"],
                &["git", "status"],
                &["git", "diff"],
            ],
            true,
        ),
        (
            "bash -lc 'rm -rf V'",
            &[&["bash", "-lc", "rm -rf V"], &["rm", "-rf", "V"]],
            true,
        ),
        (
            "bash -x -c 'p1'",
            &[&["bash", "-x", "-c", "p1"], &["p1"]],
            true,
        ),
        (
            "bash --norc -c 'p1'",
            &[&["bash", "--norc", "-c", "p1"], &["p1"]],
            true,
        ),
        (
            "bash -O extglob -c 'p1'",
            &[&["bash", "-O", "extglob", "-c", "p1"], &["p1"]],
            true,
        ),
        (
            "bash -o posix -c p1",
            &[&["bash", "-o", "posix", "-c", "p1"], &["p1"]],
            true,
        ),
        ("ksh -c p1", &[&["ksh", "-c", "p1"], &["p1"]], true),
        // Expansions, substitutions, background, compound commands, syntax errors.
        ("echo $(date)", &[&["echo"]], true),
        ("echo `whoami`", &[&["echo"]], true),
        ("echo $HOME", &[&["echo"]], true),
        ("cat \"$HOME/x\"", &[&["cat"]], true),
        ("echo ${PATH}", &[&["echo"]], true),
        ("echo $((1+2))", &[&["echo"]], true),
        ("echo $'\\x41'", &[&["echo"]], true),
        ("echo a$ \"b$\"", &[&["echo"]], true),
        ("export PATH=/x:$PATH", &[&["export"]], true),
        ("export A=1", &[&["export", "A=1"]], true),
        ("sleep 10 &", &[&["sleep", "10"]], true),
        ("curl -s https://x.y/z?a=1&b=2", &[&["curl", "-s"]], true),
        ("cat <<EOF\nhello\nEOF", &[&["cat"]], true),
        ("cat <<< \"hi\"", &[&["cat"]], true),
        ("diff <(ls a) <(ls b)", &[&["diff"]], true),
        ("p1 >(p2)", &[&["p1"]], true),
        ("for f in *; do echo $f; done", &[], true),
        ("if true; then ls; fi", &[], true),
        ("while true; do sleep 1; done", &[], true),
        ("ls; case x in a) ;; esac", &[&["ls"]], true),
        ("(cd x; make)", &[], true),
        ("{ a; b; }", &[], true),
        ("f() { echo hi; }", &[], true),
        ("function f { echo hi; }", &[], true),
        ("echo {a,b}", &[&["echo"]], true),
        ("echo {1..3}", &[&["echo"]], true),
        (
            "find . -exec rm {} +",
            &[&["find", ".", "-exec", "rm"]],
            true,
        ),
        ("time make", &[], true),
        ("\"time\" make", &[], true),
        ("A=1 if true", &[], true),
        ("! grep -q x f", &[], true),
        ("eval \"rm -rf /\"", &[&["eval", "rm -rf /"]], true),
        ("/bin/r? -rf x", &[], true),
        ("ls -la /tmp/*.log", &[&["ls", "-la"]], true),
        ("ls ~/x", &[&["ls"]], true),
        ("ls && [[ -f x ]]", &[&["ls"]], true),
        ("[ -f x ] && echo y", &[], true),
        ("echo 'unterminated", &[&["echo"]], true),
        ("ls; echo \"unterminated", &[&["ls"], &["echo"]], true),
        ("a && ", &[&["a"]], true),
        ("a |", &[&["a"]], true),
        ("; ls", &[], true),
        ("a && && b", &[&["a"]], true),
        ("a ;; b", &[&["a"]], true),
        ("ls >", &[&["ls"]], true),
        ("ls\0; rm x", &[], true),
        ("ls\r", &[], true),
        ("echo 'a\u{1}b'", &[], true),
        ("echo \\", &[&["echo"]], true),
        ("ls#no-comment a", &[], true),
        ("ls a#b", &[&["ls"]], true),
        ("p1 > #x", &[&["p1"]], true),
        ("p1 > 2>x", &[&["p1"]], true),
        ("p1 2>&1- x", &[&["p1"]], true),
        ("p1 > /dev/tcp/127.0.0.1/9", &[&["p1"]], true),
        ("p1 < /dev/udp/host/53", &[&["p1"]], true),
        ("echo héllo", &[&["echo"]], true),
        ("echo \"héllo\"", &[&["echo"]], true),
        ("echo \"hi!\"", &[&["echo"]], true),
        ("p1 a^b", &[&["p1"]], true),
        ("%1", &[&["%1"]], true),
        ("\"FOO\"=1 x", &[&["FOO=1", "x"]], true),
        ("kill -9 1", &[&["kill", "-9", "1"]], true),
        ("POSIXLY_CORRECT=1 p1", &[], true),
        ("BASH_XTRACEFD=1; p1", &[], true),
    ];

    /// Asserts what `split_line(line)` reads.
    #[track_caller]
    fn splits((line, commands, unparsed): &Case) {
        let got = split_line(line);
        let want: Vec<Vec<String>> = commands
            .iter()
            .map(|c| c.iter().map(|w| (*w).to_owned()).collect())
            .collect();
        assert_eq!(
            (&got.commands, got.unparsed),
            (&want, *unparsed),
            "line {line:?}"
        );
    }

    #[test]
    fn every_red_team_line_is_unparsed_or_exactly_right() {
        RED_TEAM.iter().for_each(splits);
    }

    #[test]
    fn every_way_around_found_since_is_closed() {
        FOUND.iter().for_each(splits);
    }

    #[test]
    fn lines_split_as_written() {
        CASES.iter().for_each(splits);
    }

    #[test]
    fn assignments_are_reported_by_name_even_when_skipped() {
        let names = |line: &str| split_line(line).assigned;
        assert_eq!(names("A=1 B+=2 p1 C=3"), ["A", "B"]);
        assert_eq!(names("A=1; B=2 && p1"), ["A", "B"]);
        assert_eq!(names("X=1 bash -c 'PATH=/x p1'"), ["X", "PATH"]);
        assert_eq!(
            names("LD_PRELOAD=x zsh -c 'BASH_ENV=y p1'"),
            ["LD_PRELOAD", "BASH_ENV"]
        );
        // Reported before the reading stops.
        let s = split_line("A=1 RANDOM=x p1");
        assert_eq!(
            (s.assigned, s.unparsed),
            (vec!["A".into(), "RANDOM".into()], true)
        );
        assert!(names("\"A\"=1 p1").is_empty());
        assert!(names("p1 A=1").is_empty());
    }

    #[test]
    fn a_direct_shell_argv_is_read_like_its_line_one_level_deep() {
        let argv = |ws: &[&str]| ws.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
        let plain = Reading::default();
        let split = |ws: &[&str]| split_shell_c(&argv(ws), plain);
        let s = split(&["bash", "-c", "p1 && p2"]);
        assert_eq!(
            (s.commands, s.unparsed),
            (vec![argv(&["p1"]), argv(&["p2"])], false)
        );
        let s = split(&["sh", "-c", "bash -c p1"]);
        assert_eq!(
            (s.commands, s.unparsed),
            (vec![argv(&["bash", "-c", "p1"])], true)
        );
        // A login shell reads profile files first: unparsed unless the policy trusts them.
        for login in [&["bash", "-l", "-c", "p1"][..], &["bash", "-lc", "p1"][..]] {
            let s = split(login);
            assert_eq!(
                (&s.commands, s.unparsed, s.login),
                (&vec![argv(&["p1"])], true, false)
            );
            let trusted = Reading {
                login_split: true,
                ..plain
            };
            let s = split_shell_c(&argv(login), trusted);
            assert_eq!(
                (&s.commands, s.unparsed, s.login),
                (&vec![argv(&["p1"])], false, true)
            );
        }
        let s = split(&["bash", "--login", "-c", "p1"]);
        assert_eq!((s.commands, s.unparsed), (vec![argv(&["p1"])], true));
        assert!(split(&["bash", "x.sh"]).unparsed);
        assert!(split(&["zsh"]).unparsed);
        assert_eq!(split(&["python3", "-c", "p1"]), Split::default());
        assert_eq!(split(&["busybox", "ls"]), Split::default());
        assert_eq!(split(&[]), Split::default());
    }

    /// How a shell reads its options (PROTOCOL 7.2): `l` or `i` anywhere in a short
    /// cluster, `--login`, `--rcfile`, `--init-file`, `-O`/`+O` and `-o` (but the three
    /// that only change how errors end it) make a login, interactive or option-changing
    /// shell; only `-l` is ever read through, and only under `"login_shell": "split"`.
    #[test]
    fn login_interactive_and_option_changing_shells_are_read_as_the_shell_reads_them() {
        let trusted = Reading {
            login_split: true,
            ..Reading::default()
        };
        for line in [
            "bash -lc p1",
            "bash -cl p1",
            "bash -ilc p1",
            "bash -l -c p1",
            "bash -elc p1",
            "sh -lc p1",
            "sh -l -c p1",
            "dash -lc p1",
            "busybox sh -lc p1",
        ] {
            let s = split_line(line);
            assert!(s.unparsed, "{line}");
            assert!(s.commands.contains(&vec!["p1".to_owned()]), "{line}: {s:?}");
        }
        for line in ["bash -lc p1", "bash -cl p1", "bash -l -c p1", "sh -elc p1"] {
            let s = split_line_as(line, trusted);
            assert!(!s.unparsed && s.login, "{line}");
        }
        for line in [
            "bash -ilc p1",
            "bash -lic p1",
            "bash -i -c p1",
            "bash --login -c p1",
            "bash --rcfile x -c p1",
            "bash --init-file x -c p1",
            "bash -O extglob -c p1",
            "bash +O extglob -c p1",
            "bash -o posix -c p1",
            "bash -o vi -c p1",
            "bash -s",
            "bash -ls",
            "bash",
            "sh",
            "zsh",
            "fish",
            "zsh -c p1",
            "fish -c p1",
            "ksh -c p1",
            "mksh -c p1",
            "rbash",
            "busybox sh",
        ] {
            assert!(split_line_as(line, trusted).unparsed, "{line}");
        }
        // The three options that change only how errors end the script stay plain.
        assert!(!split_line("bash -o pipefail -c p1").unparsed);
        assert!(!split_line("bash -e -o nounset -c p1").unparsed);
    }

    /// In a shell session (PROTOCOL 7.2) a word that names the shell's own descriptors,
    /// anywhere in the line (a redirection's target, an assignment's value, inside a
    /// `bash -c` script), or a program named like the helper's functions, is unparsed;
    /// the same words elsewhere are only words.
    #[test]
    fn a_session_line_naming_the_shells_descriptors_is_unparsed() {
        let session = Reading {
            session: true,
            ..Reading::default()
        };
        for line in [
            "echo 'rm -rf V' > /proc/self/fd/10",
            "echo x >/proc/self/fd/0",
            "cat /proc/self/fd/10",
            "cd /proc/self/fd",
            "ls /proc",
            "echo x > /dev/fd/10",
            "echo x >/dev/stderr",
            "cat /dev/stdin",
            "p1 /dev/fd",
            "X=/proc/self/fd/10 p1",
            "bash -c 'echo x > /proc/self/fd/10'",
            "__execd_prompt",
            "__execd_pre 1 x",
            "p1 && __execd_st 3",
        ] {
            assert!(split_line_as(line, session).unparsed, "{line}");
            assert!(!split_line(line).unparsed, "{line} outside a session");
        }
        for line in [
            "echo proc",
            "cat /dev/null",
            "p1 /dev/tty",
            "p1 ./procs/x",
            "p1 __execd",
        ] {
            assert!(!split_line_as(line, session).unparsed, "{line}");
        }
    }

    /// Pieces of shell syntax, plain and not, for lines that reach every branch.
    const FRAGMENTS: &[&str] = &[
        "p1",
        "a",
        " ",
        " ",
        "'x y'",
        "\"x\"",
        "\\;",
        "\\",
        "A=1 ",
        "RANDOM=",
        "2>",
        ">",
        ">>",
        "<",
        "<>",
        ">|",
        "&>",
        "2>&1",
        ">&-",
        "<<",
        "|&",
        "|",
        "&&",
        "||",
        ";",
        ";;",
        "&",
        "\n",
        "#",
        "\\\n",
        "$",
        "(",
        ")",
        "{",
        "}",
        "*",
        "~",
        "!",
        "=",
        "%",
        "é",
        "\u{1}",
        "\r",
        "bash -c ",
        "sh -c ",
        "bash -lc ",
        "zsh -c ",
        "'",
        "\"",
        "eval ",
        "printf -v ",
        "cd ",
        "echo ",
        "\"$\"",
        "'$(p9)'",
        "\"\\$\"",
        "\\\"",
        "\t",
        "-",
        "/dev/tcp/",
    ];

    fn fragments() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(FRAGMENTS), 0..40).prop_map(|v| v.concat())
    }

    /// `text` single-quoted for a shell.
    pub(super) fn single_quoted(text: &str) -> String {
        format!("'{}'", text.replace('\'', r"'\''"))
    }

    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_line_splits_into_nonempty_argvs(line in fragments()) {
            let (split, shells) = split_line_traced(&line, Reading::default());
            prop_assert!(split.commands.iter().all(|c| !c.is_empty()));
            prop_assert!(shells.iter().all(|c| c.len() >= 3));
        }

        /// A plain line reads the same through `bash -c`, quoted; through `sh -c` too, but
        /// for bash's own `&>` and `|&`. A script that starts like an option is no script
        /// to the shell: unparsed.
        #[test]
        fn a_plain_line_reads_the_same_through_a_shell(line in fragments()) {
            let (split, shells) = split_line_traced(&line, Reading::default());
            if !split.unparsed && shells.is_empty() {
                let option = line.starts_with(['-', '+']);
                let bash_only = line.contains("&>") || line.contains("|&");
                let inner = split_line(&format!("bash -c {}", single_quoted(&line)));
                prop_assert!(inner == split || (option && inner.unparsed), "{:?}", inner);
                let inner = split_line(&format!("sh -c {}", single_quoted(&line)));
                let may_differ = option || bash_only;
                prop_assert!(inner == split || (may_differ && inner.unparsed), "{:?}", inner);
            }
        }

        /// No input makes the splitter recurse or rescan: a line a hundred thousand bytes
        /// long of any repeated piece splits (a quadratic reading would not finish).
        #[test]
        fn long_lines_split_in_one_pass(piece in fragments(), tail in fragments()) {
            let times = 100_000 / piece.len().max(1);
            let line = piece.repeat(times) + &tail;
            let split = split_line(&line);
            prop_assert!(split.commands.len() <= line.len());
        }
    }

    #[test]
    fn splits_huge_and_odd_inputs_in_passing() {
        let long = "ls && ".repeat(20_000) + "ls";
        let s = split_line(&long);
        assert_eq!(s.commands.len(), 20_001);
        assert!(!s.unparsed);
        let quotes = "'".repeat(100_001);
        assert!(split_line(&quotes).unparsed);
        let backslashes = "\\".repeat(100_000);
        assert_eq!(split_line(&backslashes).commands, [["\\".repeat(50_000)]]);
        assert!(split_line(&(backslashes + "\\")).unparsed);
        let word = "a".repeat(1 << 20);
        assert_eq!(split_line(&word).commands, [[word.clone()]]);
        assert!(split_line(&"(".repeat(10_000)).unparsed);
        // Redirections read their targets without recursing.
        let redirects = "p1".to_owned() + &" 2>x".repeat(50_000);
        assert_eq!(split_line(&redirects).commands, [["p1"]]);
        assert!(split_line(&"> 2".repeat(50_000)).unparsed);
        assert!(split_line(&">".repeat(100_000)).unparsed);
        assert!(split_line(&"bash -c ".repeat(10_000)).unparsed);
        assert_eq!(
            split_line("\t\r\n"),
            Split {
                unparsed: true,
                ..Split::default()
            }
        );
    }
}
