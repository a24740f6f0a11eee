//! The shell-line splitter (PROTOCOL 7.2): a line is read into simple commands only when
//! it is a plain script; anything it cannot read exactly is flagged `unparsed`, never
//! guessed. Total: any input returns in linear time without panicking.

/// A shell line split into simple commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// The simple commands read, in order: each an argv, assignments and redirections
    /// removed, `sh -c WORD` replaced by WORD's commands. Never an empty argv.
    pub commands: Vec<Vec<String>>,
    /// The line is not (entirely) a plain script. `commands` then holds what could be read
    /// before the first construct that could not.
    pub unparsed: bool,
    /// The names of the variables the line's leading assignments set (`PATH=/x ls`),
    /// in order: the policy decides whether they change what runs.
    pub assigned: Vec<String>,
}

/// The last path component of a program as given (`/usr/bin/rm` -> `rm`).
pub(crate) fn basename(program: &str) -> &str {
    match program.rfind('/') {
        Some(slash) => &program[slash + 1..],
        None => program,
    }
}

/// What a direct argv `sh -c WORD` (or `bash -c`, ...) runs: WORD split as a line that is
/// already one level deep, so its own nested shells are not read. Empty for other argvs.
pub fn split_shell_c(argv: &[String]) -> Split {
    shell_script(argv).map_or_else(Split::default, |line| split_at(line, 1))
}

/// Splits a shell line into its simple commands, or says it is not a plain script.
pub fn split_line(line: &str) -> Split {
    split_at(line, 0)
}

/// Shells whose `-c WORD` is read as a line (by basename). The brief's four plus the
/// common `ash`/`ksh`/`mksh`, which take `-c` the same way.
const SHELLS: [&str; 7] = ["sh", "bash", "dash", "zsh", "ash", "ksh", "mksh"];

/// Words that open or close a compound command when they are the first word; a plain
/// script has none (bash's reserved words).
const RESERVED_WORDS: [&str; 22] = [
    "if", "then", "else", "elif", "fi", "do", "done", "case", "esac", "while", "until", "for",
    "select", "function", "in", "time", "coproc", "{", "}", "!", "[[", "]]",
];

/// Builtins whose arguments are shell code: their argv says nothing of what they run.
const CODE_BUILTINS: [&str; 2] = ["eval", "trap"];

/// Splits `line`, `depth` levels of `sh -c` deep: at depth 0 a `sh -c WORD` is replaced by
/// WORD's commands; deeper, it is kept as it is and the line counts as unparsed, since
/// what it runs is not read.
fn split_at(line: &str, depth: u8) -> Split {
    let mut lexer = Lexer {
        s: line.as_bytes(),
        i: 0,
    };
    let mut out = Split::default();
    let mut words: Vec<String> = Vec::new();
    // The current simple command has begun (a word, an assignment or a redirection).
    let mut started = false;
    // The last separator was `&&`, `||`, `|` or `|&`: a command must follow.
    let mut pending = false;
    loop {
        let token = match lexer.next() {
            Ok(token) => token,
            Err(NotPlain) => {
                out.unparsed = true;
                break;
            }
        };
        match token {
            Token::End => {
                // `a &&` at the end is a syntax error: bash runs none of it.
                if pending && !started {
                    out.unparsed = true;
                }
                break;
            }
            Token::Word(word) => {
                if words.is_empty() {
                    if word.assignment {
                        let name = word.text.split('=').next().unwrap_or_default();
                        out.assigned.push(name.trim_end_matches('+').to_string());
                        started = true;
                        continue;
                    }
                    if opens_compound(&word) {
                        out.unparsed = true;
                        break;
                    }
                }
                words.push(word.text);
                started = true;
            }
            Token::Redirect => match lexer.next() {
                Ok(Token::Word(_)) => started = true,
                _ => {
                    out.unparsed = true;
                    break;
                }
            },
            Token::Sep(sep) => {
                if !started {
                    // Blank lines are fine, and so is a line break after `&&`, `||`, `|`;
                    // any other separator with no command before it is a syntax error.
                    if sep == Sep::Newline {
                        continue;
                    }
                    out.unparsed = true;
                    break;
                }
                emit(&mut out, std::mem::take(&mut words), depth);
                started = false;
                pending = matches!(sep, Sep::AndOr | Sep::Pipe);
            }
        }
    }
    // The last command, or (when unparsed) the words of the command that was being read
    // when reading stopped: they are a true prefix of its argv, so rules may judge them.
    emit(&mut out, words, depth);
    out
}

/// Whether a command's first word makes it something other than a simple command.
fn opens_compound(word: &Word) -> bool {
    // Quoting stops a reserved word (`"if"` is a command named if) but not a builtin.
    (!word.quoted && RESERVED_WORDS.contains(&word.text.as_str()))
        || CODE_BUILTINS.contains(&word.text.as_str())
        // `/bin/r? -rf x` runs whatever the glob finds; the program must be read exactly.
        || word.glob
}

/// Adds one simple command to `out`, reading a `sh -c WORD` as WORD's commands.
fn emit(out: &mut Split, argv: Vec<String>, depth: u8) {
    if argv.is_empty() {
        return;
    }
    let nested = shell_script(&argv).map(|line| (depth == 0).then(|| split_at(line, depth + 1)));
    match nested {
        Some(Some(inner)) => {
            out.commands.extend(inner.commands);
            out.unparsed |= inner.unparsed;
            out.assigned.extend(inner.assigned);
        }
        Some(None) => {
            out.unparsed = true;
            out.commands.push(argv);
        }
        None => out.commands.push(argv),
    }
}

/// The script a shell runs when `argv` is `SHELL [options] -c WORD [args]`: the options
/// are short letters (`-c`, `-lc`, `-ec`, `-l -c`), long options (`--login`) or `-o NAME`.
fn shell_script(argv: &[String]) -> Option<&str> {
    let program = argv.first()?;
    if !SHELLS.contains(&basename(program)) {
        return None;
    }
    let mut command_mode = false;
    let mut i = 1;
    while let Some(arg) = argv.get(i) {
        let arg = arg.as_str();
        if arg == "--" || arg == "-" {
            i += 1;
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            // The two long options that take a value: skip it too.
            i += if matches!(long, "rcfile" | "init-file") {
                2
            } else {
                1
            };
            continue;
        }
        let letters = match arg.strip_prefix('-').or_else(|| arg.strip_prefix('+')) {
            Some(l) if !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphabetic()) => l,
            // The first operand: the script when `-c` was given.
            _ => break,
        };
        if arg.starts_with('-') && letters.contains('c') {
            command_mode = true;
        }
        // `-o NAME` / `-O NAME` (and `+o`): the name is the option's, not the script.
        i += if letters.contains(['o', 'O']) { 2 } else { 1 };
    }
    if command_mode {
        argv.get(i).map(String::as_str)
    } else {
        None
    }
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
    /// A redirection operator (its fd number, if any, included); its target word follows.
    Redirect,
    End,
}

/// A word after quote removal, with what the parser needs to know of its spelling.
struct Word {
    text: String,
    /// Some part was quoted or backslash-escaped.
    quoted: bool,
    /// A leading `NAME=value` (or `NAME+=value`) with a bare, valid name.
    assignment: bool,
    /// Holds a bare glob (`*`, `?`, `[...]`): bash may replace it with file names.
    glob: bool,
}

/// Bytes that end a bare word.
fn is_meta(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'<' | b'>' | b'(' | b')'
    )
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
/// out are whole UTF-8. Every call consumes input or returns `End`/`NotPlain`, so reading
/// a line is linear in its length.
struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    /// The byte `k` places ahead.
    fn at(&self, k: usize) -> Option<u8> {
        self.s.get(self.i + k).copied()
    }

    fn next(&mut self) -> Result<Token, NotPlain> {
        loop {
            match (self.at(0), self.at(1)) {
                (None, _) => return Ok(Token::End),
                (Some(b' ' | b'\t'), _) => self.i += 1,
                // Line continuation: gone before bash tokenizes.
                (Some(b'\\'), Some(b'\n')) => self.i += 2,
                (Some(b'#'), _) => {
                    // A comment runs to the line break, which still separates commands.
                    let rest = self.s.get(self.i..).unwrap_or_default();
                    self.i += rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
                }
                (Some(b'\n'), _) => {
                    self.i += 1;
                    return Ok(Token::Sep(Sep::Newline));
                }
                // `;;`, `;&`: case arms.
                (Some(b';'), Some(b';' | b'&')) => return Err(NotPlain),
                (Some(b';'), _) => {
                    self.i += 1;
                    return Ok(Token::Sep(Sep::Semi));
                }
                (Some(b'&'), Some(b'&')) => {
                    self.i += 2;
                    return Ok(Token::Sep(Sep::AndOr));
                }
                (Some(b'&'), Some(b'>')) => {
                    // `&>` and `&>>`: stdout and stderr to a file.
                    self.i += 2;
                    if self.at(0) == Some(b'>') {
                        self.i += 1;
                    }
                    return Ok(Token::Redirect);
                }
                // A lone `&` runs the command in the background.
                (Some(b'&'), _) => return Err(NotPlain),
                (Some(b'|'), Some(b'|')) => {
                    self.i += 2;
                    return Ok(Token::Sep(Sep::AndOr));
                }
                (Some(b'|'), Some(b'&')) => {
                    self.i += 2;
                    return Ok(Token::Sep(Sep::Pipe));
                }
                (Some(b'|'), _) => {
                    self.i += 1;
                    return Ok(Token::Sep(Sep::Pipe));
                }
                (Some(b'<' | b'>'), _) => return self.redirect(),
                // Subshells, function definitions, arithmetic `((`.
                (Some(b'(' | b')'), _) => return Err(NotPlain),
                (Some(_), _) => {
                    let word = self.word()?;
                    // `2>&1`: a bare number right before `<`/`>` is the fd redirected.
                    let fd_number = !word.quoted
                        && !word.text.is_empty()
                        && word.text.bytes().all(|b| b.is_ascii_digit());
                    if fd_number && matches!(self.at(0), Some(b'<' | b'>')) {
                        return self.redirect();
                    }
                    return Ok(Token::Word(word));
                }
            }
        }
    }

    /// A redirection operator at `<` or `>`: `<`, `>`, `>>`, `>|`, `<>`, `<&`, `>&`.
    /// Here-documents, here-strings and process substitution are not plain.
    fn redirect(&mut self) -> Result<Token, NotPlain> {
        match (self.at(0), self.at(1)) {
            (Some(b'<'), Some(b'<')) | (Some(b'<' | b'>'), Some(b'(')) => Err(NotPlain),
            (Some(b'<'), Some(b'&' | b'>')) | (Some(b'>'), Some(b'>' | b'&' | b'|')) => {
                self.i += 2;
                Ok(Token::Redirect)
            }
            (Some(b'<' | b'>'), _) => {
                self.i += 1;
                Ok(Token::Redirect)
            }
            _ => Err(NotPlain),
        }
    }

    /// A word starting at a byte that is not a metacharacter: bare parts, `'single'` and
    /// `"double"` quotes, backslash escapes. Any expansion is `NotPlain`.
    fn word(&mut self) -> Result<Word, NotPlain> {
        let mut buf: Vec<u8> = Vec::new();
        // Length of `buf` when the first quoted or escaped byte was added.
        let mut first_quoted: Option<usize> = None;
        // Index in `buf` of the first bare `=`.
        let mut first_eq: Option<usize> = None;
        let mut glob = false;
        let mut open_bracket = false;
        let mut open_brace = false;
        while let Some(b) = self.at(0) {
            match b {
                _ if is_meta(b) => break,
                // NUL cannot reach a shell in an argument: the line is not what runs.
                0 | b'`' => return Err(NotPlain),
                b'\'' => {
                    first_quoted.get_or_insert(buf.len());
                    let rest = self.s.get(self.i + 1..).unwrap_or_default();
                    let Some(end) = rest.iter().position(|&c| c == b'\'') else {
                        return Err(NotPlain);
                    };
                    let quoted = &rest[..end];
                    if quoted.contains(&0) {
                        return Err(NotPlain);
                    }
                    buf.extend_from_slice(quoted);
                    self.i += end + 2;
                }
                b'"' => {
                    first_quoted.get_or_insert(buf.len());
                    self.i += 1;
                    self.double_quoted(&mut buf)?;
                }
                b'\\' => match self.at(1) {
                    Some(b'\n') => self.i += 2,
                    Some(0) => return Err(NotPlain),
                    Some(c) => {
                        first_quoted.get_or_insert(buf.len());
                        buf.push(c);
                        self.i += 2;
                    }
                    // A backslash ending the line stands for itself.
                    None => {
                        first_quoted.get_or_insert(buf.len());
                        buf.push(b'\\');
                        self.i += 1;
                    }
                },
                b'$' => match self.at(1) {
                    // A `$` that ends the word starts nothing: literal, as in `grep a$`.
                    None | Some(b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'<' | b'>') => {
                        buf.push(b);
                        self.i += 1;
                    }
                    // `$VAR`, `${..}`, `$(..)`, `$((..))`, `$'..'`, `$".."`.
                    Some(_) => return Err(NotPlain),
                },
                _ => {
                    match b {
                        b'*' | b'?' => glob = true,
                        b'[' => open_bracket = true,
                        b']' if open_bracket => glob = true,
                        b'{' => open_brace = true,
                        // Brace expansion (`{a,b}`, `{1..3}`) makes several words of one.
                        b',' if open_brace => return Err(NotPlain),
                        b'.' if open_brace && self.at(1) == Some(b'.') => return Err(NotPlain),
                        b'=' => {
                            first_eq.get_or_insert(buf.len());
                        }
                        _ => {}
                    }
                    buf.push(b);
                    self.i += 1;
                }
            }
        }
        let assignment = match first_eq {
            Some(eq) if first_quoted.is_none_or(|q| q > eq) => {
                let name = buf.get(..eq).unwrap_or_default();
                let name = name.strip_suffix(b"+").unwrap_or(name);
                is_name(name)
            }
            _ => false,
        };
        let text = String::from_utf8(buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        Ok(Word {
            text,
            quoted: first_quoted.is_some(),
            assignment,
            glob,
        })
    }

    /// The inside of a `"double"` quote, after the opening quote, through the closing one.
    fn double_quoted(&mut self, buf: &mut Vec<u8>) -> Result<(), NotPlain> {
        loop {
            match (self.at(0), self.at(1)) {
                (None, _) | (Some(0 | b'`'), _) => return Err(NotPlain),
                (Some(b'"'), _) => {
                    self.i += 1;
                    return Ok(());
                }
                (Some(b'\\'), Some(b'\n')) => self.i += 2,
                (Some(b'\\'), Some(c @ (b'$' | b'`' | b'"' | b'\\'))) => {
                    buf.push(c);
                    self.i += 2;
                }
                // Before any other byte a backslash is literal.
                (Some(b'\\'), _) => {
                    buf.push(b'\\');
                    self.i += 1;
                }
                // `"a$"`: a `$` right before the closing quote starts nothing.
                (Some(b'$'), Some(b'"')) => {
                    buf.push(b'$');
                    self.i += 1;
                }
                (Some(b'$'), _) => return Err(NotPlain),
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

    fn words(ws: &[&str]) -> Vec<String> {
        ws.iter().map(|w| w.to_string()).collect()
    }

    /// Asserts what `split_line(line)` reads.
    #[track_caller]
    fn splits(line: &str, commands: &[&[&str]], unparsed: bool) {
        let got = split_line(line);
        assert_eq!(
            (&got.commands, got.unparsed),
            (&commands.iter().map(|c| words(c)).collect(), unparsed),
            "line {line:?}"
        );
    }

    #[test]
    fn splits_chains_and_pipelines() {
        splits("ls -la", &[&["ls", "-la"]], false);
        splits(
            "ps aux | grep x | head",
            &[&["ps", "aux"], &["grep", "x"], &["head"]],
            false,
        );
        splits("cd x && make", &[&["cd", "x"], &["make"]], false);
        splits(
            "cargo build --release && cargo test -- --nocapture",
            &[
                &["cargo", "build", "--release"],
                &["cargo", "test", "--", "--nocapture"],
            ],
            false,
        );
        splits("a || b", &[&["a"], &["b"]], false);
        splits("a ; b", &[&["a"], &["b"]], false);
        splits("a;b;", &[&["a"], &["b"]], false);
        splits("a |& b", &[&["a"], &["b"]], false);
        splits(
            "make||echo failed",
            &[&["make"], &["echo", "failed"]],
            false,
        );
        splits(
            "git status\ngit diff\n",
            &[&["git", "status"], &["git", "diff"]],
            false,
        );
        splits("\n\n  ls\n\n", &[&["ls"]], false);
        // A line break may follow `&&`, `||` and `|`.
        splits(
            "cargo fmt &&\n  cargo clippy",
            &[&["cargo", "fmt"], &["cargo", "clippy"]],
            false,
        );
        splits(
            "cd /repo && git fetch origin && git rebase origin/main",
            &[
                &["cd", "/repo"],
                &["git", "fetch", "origin"],
                &["git", "rebase", "origin/main"],
            ],
            false,
        );
    }

    #[test]
    fn splits_quotes_and_escapes() {
        splits(
            r#"git commit -m "fix: a thing""#,
            &[&["git", "commit", "-m", "fix: a thing"]],
            false,
        );
        splits(
            "python3 -c 'print(1)'",
            &[&["python3", "-c", "print(1)"]],
            false,
        );
        splits("echo 'a;b'", &[&["echo", "a;b"]], false);
        splits(
            r#"grep -r "foo|bar" ."#,
            &[&["grep", "-r", "foo|bar", "."]],
            false,
        );
        splits(
            r#"echo "say \"hi\"" 'it''s'"#,
            &[&["echo", "say \"hi\"", "its"]],
            false,
        );
        splits(
            r"echo a\ b \; c\\d",
            &[&["echo", "a b", ";", "c\\d"]],
            false,
        );
        splits(r#"echo 'a\nb' "c\d""#, &[&["echo", "a\\nb", "c\\d"]], false);
        splits(
            "echo '$HOME' \"\\$HOME\"",
            &[&["echo", "$HOME", "$HOME"]],
            false,
        );
        splits(
            r#"echo "price: 5$" grep a$"#,
            &[&["echo", "price: 5$", "grep", "a$"]],
            false,
        );
        splits("echo '' \"\"", &[&["echo", "", ""]], false);
        splits(
            "git log --format='%h %s' -n 5",
            &[&["git", "log", "--format=%h %s", "-n", "5"]],
            false,
        );
        splits(
            "find . -name '*.rs' -exec grep -l foo {} +",
            &[&[
                "find", ".", "-name", "*.rs", "-exec", "grep", "-l", "foo", "{}", "+",
            ]],
            false,
        );
        splits(
            "cat file.txt | python3 -c \"import sys; print(sys.stdin.read())\"",
            &[
                &["cat", "file.txt"],
                &["python3", "-c", "import sys; print(sys.stdin.read())"],
            ],
            false,
        );
        splits("echo héllo 'wörld'", &[&["echo", "héllo", "wörld"]], false);
        // Globs in arguments are left as written.
        splits(
            "grep -n TODO src/*.rs | wc -l",
            &[&["grep", "-n", "TODO", "src/*.rs"], &["wc", "-l"]],
            false,
        );
    }

    #[test]
    fn splits_assignments_redirections_comments_continuations() {
        splits("FOO=1 cmd", &[&["cmd"]], false);
        splits(
            "RUST_LOG=debug CARGO_TERM_COLOR=never PATH+=:/x cargo test",
            &[&["cargo", "test"]],
            false,
        );
        // Only leading assignments; later ones are arguments.
        splits(
            "docker run -e FOO=bar img",
            &[&["docker", "run", "-e", "FOO=bar", "img"]],
            false,
        );
        // A quoted name is no assignment.
        splits("\"FOO\"=1 x", &[&["FOO=1", "x"]], false);
        splits("VAR=1", &[], false);
        splits(
            "cargo test 2>&1 | tail -n 20",
            &[&["cargo", "test"], &["tail", "-n", "20"]],
            false,
        );
        splits("ls > out.txt", &[&["ls"]], false);
        splits("echo hi >> log.txt 2>/dev/null", &[&["echo", "hi"]], false);
        splits("npm install &> /dev/null", &[&["npm", "install"]], false);
        splits("sort < in.txt > 'out file.txt'", &[&["sort"]], false);
        splits(
            "cmd 1>&2; echo err >&2",
            &[&["cmd"], &["echo", "err"]],
            false,
        );
        splits("> out.txt echo hi", &[&["echo", "hi"]], false);
        splits("> out.txt", &[], false);
        // `a2>x` is a word then a redirection; `2>x` redirects fd 2.
        splits("echo a2>x 2>y", &[&["echo", "a2"]], false);
        splits("ls # list files", &[&["ls"]], false);
        splits("# just a comment", &[], false);
        splits(
            "ls#no-comment a #c\nmake",
            &[&["ls#no-comment", "a"], &["make"]],
            false,
        );
        splits(
            "make \\\n  -j4 \\\n  all",
            &[&["make", "-j4", "all"]],
            false,
        );
        splits("ec\\\nho hi", &[&["echo", "hi"]], false);
        splits(
            "pytest -k \"not slow\" -x -q 2>&1 | head -50",
            &[&["pytest", "-k", "not slow", "-x", "-q"], &["head", "-50"]],
            false,
        );
    }

    #[test]
    fn splits_shell_c_once() {
        splits(
            "bash -lc 'git status && git diff'",
            &[&["git", "status"], &["git", "diff"]],
            false,
        );
        splits("sh -c \"npm test\"", &[&["npm", "test"]], false);
        splits("/bin/bash -c 'ls'", &[&["ls"]], false);
        splits(
            "cd /repo && bash -c \"cargo fmt && cargo clippy\"",
            &[&["cd", "/repo"], &["cargo", "fmt"], &["cargo", "clippy"]],
            false,
        );
        // Not a plain script inside: the whole is unparsed, what was read is kept.
        splits("bash -c 'echo $(id)'", &[&["echo"]], true);
        // Deeper than one level is not read.
        splits("bash -c \"sh -c 'ls'\"", &[&["sh", "-c", "ls"]], true);
        // `env` is an ordinary command.
        splits(
            "/usr/bin/env bash -c 'ls'",
            &[&["/usr/bin/env", "bash", "-c", "ls"]],
            false,
        );
        splits("bash script.sh", &[&["bash", "script.sh"]], false);
    }

    #[test]
    fn flags_what_is_not_a_plain_script() {
        splits("echo $(date)", &[&["echo"]], true);
        splits("echo `whoami`", &[&["echo"]], true);
        splits("echo $HOME", &[&["echo"]], true);
        splits("cat \"$HOME/x\"", &[&["cat"]], true);
        splits("echo ${PATH}", &[&["echo"]], true);
        splits("echo $((1+2))", &[&["echo"]], true);
        splits("echo $'\\x41'", &[&["echo"]], true);
        splits("export PATH=/x:$PATH", &[&["export"]], true);
        splits("sleep 10 &", &[&["sleep", "10"]], true);
        splits(
            "curl -s https://x.y/z?a=1&b=2",
            &[&["curl", "-s", "https://x.y/z?a=1"]],
            true,
        );
        splits("cat <<EOF\nhello\nEOF", &[&["cat"]], true);
        splits("cat <<< \"hi\"", &[&["cat"]], true);
        splits("diff <(ls a) <(ls b)", &[&["diff"]], true);
        splits("for f in *; do echo $f; done", &[], true);
        splits("if true; then ls; fi", &[], true);
        splits("while true; do sleep 1; done", &[], true);
        splits("ls; case x in a) ;; esac", &[&["ls"]], true);
        splits("(cd x; make)", &[], true);
        splits("{ a; b; }", &[], true);
        splits("f() { echo hi; }", &[&["f"]], true);
        splits("function f { echo hi; }", &[], true);
        splits("echo {a,b}", &[&["echo"]], true);
        splits("echo {1..3}", &[&["echo"]], true);
        splits("time make", &[], true);
        splits("! grep -q x f", &[], true);
        splits("eval \"rm -rf /\"", &[], true);
        splits("/bin/r? -rf x", &[], true);
        splits("ls && [[ -f x ]]", &[&["ls"]], true);
        splits("echo 'unterminated", &[&["echo"]], true);
        splits("ls; echo \"unterminated", &[&["ls"], &["echo"]], true);
        splits("a && ", &[&["a"]], true);
        splits("a |", &[&["a"]], true);
        splits("; ls", &[], true);
        splits("a && && b", &[&["a"]], true);
        splits("ls >", &[&["ls"]], true);
        splits("ls\0; rm x", &[], true);
        // `[` alone is the test command, not a glob.
        splits(
            "[ -f x ] && echo y",
            &[&["[", "-f", "x", "]"], &["echo", "y"]],
            false,
        );
    }

    #[test]
    fn splits_huge_and_odd_inputs_in_passing() {
        let long = "ls && ".repeat(20_000) + "ls";
        let s = split_line(&long);
        assert_eq!(s.commands.len(), 20_001);
        assert!(!s.unparsed);
        let quotes = "'".repeat(100_001);
        assert!(split_line(&quotes).unparsed);
        let backslashes = "\\".repeat(100_001);
        assert_eq!(split_line(&backslashes).commands.len(), 1);
        let word = "a".repeat(1 << 20);
        assert_eq!(split_line(&word).commands, [[word.clone()]]);
        assert!(split_line(&"(".repeat(10_000)).unparsed);
        assert_eq!(
            split_line("\t\r\n"),
            Split {
                commands: vec![vec!["\r".to_owned()]],
                ..Split::default()
            }
        );
    }
}
