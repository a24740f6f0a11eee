//! The command policy: rules from a JSON file, judged against a direct argv or the simple
//! commands `split` reads from a shell line.
//!
//! Every command passes one gate before it starts (PROTOCOL 7): `Policy::judge` looks at a
//! direct argv or a shell line and answers `allow`, `ask` or `deny`, with the rule that
//! decided and every rule that matched. Pure: no I/O except `Policy::load` reading its file.
//!
//! Invariants:
//! - A `Policy` value has passed every load check: rule names are non-empty, unique and not
//!   `default`/`unparsed`; patterns and their words are non-empty; every `match` example
//!   matches its rule and no `not_match` example does. A file that fails any check yields
//!   one single-line error naming the rule and the problem, never a partial policy.
//! - `by_first` maps every alternative of every rule's first pattern element to the indices
//!   of the rules that have it, ascending (file order). `judge` tries only those rules, so
//!   its cost follows the rules a command could match, not the size of the file.
//! - Strictest wins (`allow < ask < deny`). A line that is not fully readable never gets a
//!   weaker decision than its readable parts, nor weaker than `unparsed`.
//! - `split_line` is total: any input (unterminated quotes, NULs, megabytes) returns in
//!   linear time without panicking. What it cannot read exactly it flags `unparsed`; it
//!   never guesses a reading that could hide a command from the rules.
//!
//! What the splitter does not do: wrappers such as `env`, `sudo`, `exec`, `xargs`, `nohup`
//! or `timeout` are ordinary commands, judged by their own argv; a policy that cares about
//! what they run names them in rules. Policy is about intent, not a sandbox (PROTOCOL 9
//! holds a command once it runs).
//!
//! Error positions: `rule #N` counts rules from 1 (as a person reads the file);
//! `pattern[i]`, `match[i]` and the like are 0-based JSON array indices.

pub mod sandbox;
pub mod split;

use serde_json::{Map, Value};

use crate::types::Program;
use std::collections::HashMap;

use split::basename;
pub use split::{split_line, split_line_as, Reading, Split};
use std::path::Path;

/// A policy decision. The derived order is strictness: `Allow < Ask < Deny`, so the
/// strictest of several decisions is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decision {
    /// Start the command.
    Allow,
    /// Park the command until an approver answers.
    Ask,
    /// Refuse the command.
    Deny,
}

impl Decision {
    /// The word used in the policy file, in audit records and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Ask => "ask",
            Decision::Deny => "deny",
        }
    }

    /// The decision a policy file spells `word`, if any.
    fn from_word(word: &str) -> Option<Decision> {
        match word {
            "allow" => Some(Decision::Allow),
            "ask" => Some(Decision::Ask),
            "deny" => Some(Decision::Deny),
            _ => None,
        }
    }
}

/// What is judged.
#[derive(Debug, Clone, Copy)]
pub enum Judged<'a> {
    /// A direct command: argv[0] is the program as given (maybe a path), then its args.
    Argv(&'a [String]),
    /// A shell line (run as SHELL -c LINE).
    Line(&'a str),
    /// A line typed into a shell session's interactive shell (PROTOCOL 12.2), which lives
    /// on after it: judged as a `Line`, and also unparsed when it assigns one of bash's own
    /// variables (`bash_variable`: `MAILPATH` runs what it expands at a later prompt,
    /// `PROMPT_COMMAND` before every prompt, ...) or a name of the session helper's
    /// (`__execd...`), or names the shell's own descriptors (`/proc/...`, `/dev/fd...`).
    InteractiveLine(&'a str),
}

/// Who asks: the peer's credentials, for rules limited by `uids`/`gids`.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The peer's user id.
    pub uid: u32,
    /// Every group the peer is in (primary and supplementary).
    pub gids: &'a [u32],
}

/// A rule that matched one simple command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The rule's name.
    pub rule: String,
    /// The rule's decision.
    pub decision: Decision,
    /// The simple command it matched.
    pub argv: Vec<String>,
}

/// The outcome of judging one command or line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The strictest decision that applies.
    pub decision: Decision,
    /// The deciding rule's name; "default" when no rule matched, "unparsed" when the
    /// unparsed fallback decided.
    pub rule: String,
    /// The deciding rule's justification, if it has one.
    pub justification: Option<String>,
    /// Every rule that matched, per simple command in order, rules in file order: what
    /// `execctl policy check` shows.
    pub hits: Vec<Hit>,
    /// The line was (partly) not a plain script, or the request sets a variable that
    /// changes what runs.
    pub unparsed: bool,
    /// When the decision is `ask`: the ask rules the readable commands matched (with
    /// `default` for a command no rule matched under `"default": "ask"`), sorted. An
    /// approval for the session covers these.
    pub asked: Vec<String>,
    /// Every simple command read, in order (a direct command's argv first).
    pub commands: Vec<Vec<String>>,
    /// The rules carrying a sandbox that matched a simple command, in file order
    /// (PROTOCOL 16: the line runs in the intersection of theirs and, when
    /// `sandbox_top`, the top-level one).
    pub sandbox_rules: Vec<String>,
    /// Some simple command matched no rule carrying a sandbox, or the line is unparsed
    /// (then only the top-level one applies).
    pub sandbox_top: bool,
}

/// One rule of the policy file, checked.
#[derive(Debug, Clone)]
struct Rule {
    name: String,
    /// An argv prefix: element `i` lists the words argv[i] may be (alternatives).
    pattern: Vec<Vec<String>>,
    decision: Decision,
    /// `None`: every peer. `Some`: only peers whose uid is listed (never empty).
    uids: Option<Vec<u32>>,
    /// `None`: every peer. `Some`: only peers in one of these groups (never empty).
    gids: Option<Vec<u32>>,
    justification: Option<String>,
    /// Its own sandbox (PROTOCOL 16), fields it omits taking the top-level's.
    sandbox: Option<sandbox::Partial>,
}

impl Rule {
    /// Whether the rule applies to `peer`: every condition it states must hold.
    fn applies_to(&self, peer: &Subject<'_>) -> bool {
        let uid_ok = self.uids.as_ref().is_none_or(|u| u.contains(&peer.uid));
        let gid_ok = self
            .gids
            .as_ref()
            .is_none_or(|g| peer.gids.iter().any(|gid| g.contains(gid)));
        uid_ok && gid_ok
    }

    /// Whether `argv` starts with the pattern. The first element also matches the
    /// basename of a program given with a path.
    fn matches(&self, argv: &[String]) -> bool {
        argv.len() >= self.pattern.len()
            && self
                .pattern
                .iter()
                .zip(argv)
                .enumerate()
                .all(|(i, (alternatives, word))| {
                    alternatives
                        .iter()
                        .any(|alt| alt == word || (i == 0 && alt == basename(word)))
                })
    }
}

/// A checked policy: what `--policy FILE` holds, ready to judge.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The decision for a simple command no rule matches.
    default: Decision,
    /// The decision for a line that is not (entirely) a plain script.
    unparsed: Decision,
    /// `"env": "allow"`: a request that sets a variable changing what a shell or the
    /// dynamic loader runs (`PATH`, `BASH_ENV`, `LD_PRELOAD`, ...) is judged by its
    /// commands alone; otherwise it is unparsed (PROTOCOL 7.2).
    env_allow: bool,
    /// `"login_shell": "split"`: `bash -lc WORD` is read through like `bash -c WORD`,
    /// trusting the profile files a login shell reads first; otherwise it is unparsed.
    login_split: bool,
    rules: Vec<Rule>,
    /// First-word index: each alternative of a rule's first element -> rule indices,
    /// ascending. See the module invariants.
    by_first: HashMap<String, Vec<usize>>,
    /// The text it was parsed from (none for the policy without a file): an upgrade in
    /// place carries it, so that the new image keeps this policy when the file no longer
    /// loads (PROTOCOL 13).
    source: Option<String>,
    /// The top-level `"sandbox"`: what every command runs in unless a rule says
    /// otherwise (fields it omits take `--sandbox`'s).
    sandbox: Option<sandbox::Partial>,
    /// `"workspaces"`: directories `$CWD` may stand for, besides `--workspace`.
    workspaces: Vec<std::path::PathBuf>,
    /// `"escalation": "deny"`: a request wider than its sandbox is refused rather than
    /// sent to an approver.
    escalation_deny: bool,
}

impl Default for Policy {
    /// The policy without a file: every command is allowed (PROTOCOL 7.1).
    ///
    /// `unparsed` is `allow` here, not the file's default `ask`: with no file the protocol
    /// promises that every command runs, and `echo $(date)` is a command too.
    fn default() -> Policy {
        Policy {
            default: Decision::Allow,
            unparsed: Decision::Allow,
            env_allow: true,
            login_split: false,
            rules: Vec::new(),
            by_first: HashMap::new(),
            source: None,
            sandbox: None,
            workspaces: Vec::new(),
            escalation_deny: false,
        }
    }
}

/// The fields a policy file may have at the top level.
const TOP_FIELDS: &str =
    "default, unparsed, env, login_shell, rules, sandbox, workspaces, escalation";
/// The fields a rule may have.
const RULE_FIELDS: [&str; 9] = [
    "name",
    "pattern",
    "decision",
    "uids",
    "gids",
    "justification",
    "match",
    "not_match",
    "sandbox",
];
/// Rule names that verdicts use for "no rule": a rule may not take them.
const RESERVED_NAMES: [&str; 2] = ["default", "unparsed"];

impl Policy {
    /// Parses and checks a policy file's text (PROTOCOL 7.1). The error is one line that
    /// names the rule and the problem.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("policy is not valid JSON: {e}"))?;
        let top = match &value {
            Value::Object(fields) => fields,
            other => return Err(format!("policy must be a JSON object, not {}", kind(other))),
        };
        if let Some(key) = top.keys().find(|k| {
            !matches!(
                k.as_str(),
                "default"
                    | "unparsed"
                    | "env"
                    | "login_shell"
                    | "rules"
                    | "sandbox"
                    | "workspaces"
                    | "escalation"
            )
        }) {
            return Err(format!(
                "unknown field {key:?} at the top level (known: {TOP_FIELDS})"
            ));
        }
        let default = match top.get("default") {
            None => Decision::Allow,
            Some(v) => decision_of(v).map_err(|e| format!("\"default\" {e}"))?,
        };
        let unparsed = match top.get("unparsed") {
            None => Decision::Ask,
            Some(v) => decision_of(v).map_err(|e| format!("\"unparsed\" {e}"))?,
        };
        let env_allow = match top.get("env") {
            None => false,
            Some(Value::String(s)) if s == "allow" => true,
            Some(Value::String(s)) if s == "unparsed" => false,
            Some(other) => {
                return Err(format!(
                    "\"env\" must be \"allow\" or \"unparsed\", not {}",
                    match other {
                        Value::String(s) => format!("{s:?}"),
                        other => kind(other).to_string(),
                    }
                ))
            }
        };
        let sandbox = match top.get("sandbox") {
            None => None,
            Some(v) => Some(sandbox::parse(v).map_err(|e| format!("\"sandbox\" {e}"))?),
        };
        let workspaces = match top.get("workspaces") {
            None => Vec::new(),
            Some(Value::Array(dirs)) => dirs
                .iter()
                .map(|d| match d.as_str() {
                    Some(s) if s.starts_with('/') && s != "/" && !s.contains('\0') => {
                        Ok(std::path::PathBuf::from(s))
                    }
                    Some("/") => Err("\"workspaces\": / is never a workspace".to_string()),
                    _ => Err(format!(
                        "\"workspaces\" must hold absolute paths, not {}",
                        d.as_str()
                            .map_or_else(|| kind(d).to_string(), |s| format!("{s:?}"))
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(format!(
                    "\"workspaces\" must be an array of paths, not {}",
                    kind(other)
                ))
            }
        };
        let escalation_deny = match top.get("escalation") {
            None => false,
            Some(Value::String(s)) if s == "ask" => false,
            Some(Value::String(s)) if s == "deny" => true,
            Some(other) => {
                return Err(format!(
                    "\"escalation\" must be \"ask\" or \"deny\", not {}",
                    match other {
                        Value::String(s) => format!("{s:?}"),
                        other => kind(other).to_string(),
                    }
                ))
            }
        };
        let login_split = match top.get("login_shell") {
            None => false,
            Some(Value::String(s)) if s == "split" => true,
            Some(Value::String(s)) if s == "unparsed" => false,
            Some(other) => {
                return Err(format!(
                    "\"login_shell\" must be \"split\" or \"unparsed\", not {}",
                    match other {
                        Value::String(s) => format!("{s:?}"),
                        other => kind(other).to_string(),
                    }
                ))
            }
        };
        let entries: &[Value] = match top.get("rules") {
            // A file may set only the defaults; it then has no rules.
            None => &[],
            Some(Value::Array(entries)) => entries,
            Some(other) => return Err(format!("\"rules\" must be an array, not {}", kind(other))),
        };

        let mut rules = Vec::with_capacity(entries.len());
        let mut positions: HashMap<String, usize> = HashMap::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let rule = parse_rule(i + 1, entry, &positions)?;
            positions.insert(rule.name.clone(), i + 1);
            rules.push(rule);
        }

        let mut by_first: HashMap<String, Vec<usize>> = HashMap::new();
        for (index, rule) in rules.iter().enumerate() {
            for word in rule.pattern.iter().take(1).flatten() {
                let list = by_first.entry(word.clone()).or_default();
                // A rule listing the same first word twice is indexed once.
                if list.last() != Some(&index) {
                    list.push(index);
                }
            }
        }
        Ok(Policy {
            default,
            unparsed,
            env_allow,
            login_split,
            rules,
            by_first,
            source: Some(text.to_string()),
            sandbox,
            workspaces,
            escalation_deny,
        })
    }

    /// The top-level `"sandbox"`, if the file has one.
    pub fn sandbox(&self) -> Option<&sandbox::Partial> {
        self.sandbox.as_ref()
    }

    /// The sandbox of rule `name`, if it has one.
    pub fn rule_sandbox(&self, name: &str) -> Option<&sandbox::Partial> {
        self.rules
            .iter()
            .find(|r| r.name == name)
            .and_then(|r| r.sandbox.as_ref())
    }

    /// Every sandbox the file writes: the top-level one, then each rule's.
    pub fn sandboxes(&self) -> impl Iterator<Item = &sandbox::Partial> {
        self.sandbox
            .iter()
            .chain(self.rules.iter().filter_map(|r| r.sandbox.as_ref()))
    }

    /// The file's `"workspaces"`.
    pub fn workspaces(&self) -> &[std::path::PathBuf] {
        &self.workspaces
    }

    /// `"escalation": "deny"`.
    pub fn escalation_denied(&self) -> bool {
        self.escalation_deny
    }

    /// The text this policy was parsed from; `None` for the policy without a file.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// Reads and parses a policy file. The error names the file, then the problem.
    pub fn load(path: &Path) -> Result<Policy, String> {
        // Escaped so that the message stays one line whatever the path holds.
        let shown = path.display().to_string().escape_debug().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
        Policy::parse(&text).map_err(|e| format!("{shown}: {e}"))
    }

    /// How many rules the policy has.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Judges what `program` would run (its argv, or its shell line) with the variables
    /// `env` the request sets, for `subject`: the one way the gate and `policy/check` ask.
    pub fn judge_program(
        &self,
        program: &Program,
        env: &[(String, String)],
        subject: &Subject<'_>,
    ) -> Verdict {
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        match program {
            Program::Shell { line, .. } => self.judge(&Judged::Line(line), &names, subject),
            Program::Direct { .. } => self.judge(&Judged::Argv(&program.argv()), &names, subject),
        }
    }

    /// Judges a line typed into an interactive shell (`Judged::InteractiveLine`).
    pub fn judge_interactive(&self, line: &str, subject: &Subject<'_>) -> Verdict {
        self.judge(&Judged::InteractiveLine(line), &[], subject)
    }

    /// Judges a direct command or a shell line that runs with the variables `env` set
    /// (their names), for `peer` (PROTOCOL 7.2).
    pub fn judge(&self, what: &Judged<'_>, env: &[&str], peer: &Subject<'_>) -> Verdict {
        let session = matches!(what, Judged::InteractiveLine(_));
        let reading = Reading {
            session,
            login_split: self.login_split,
        };
        let (direct, split) = match *what {
            // A direct `sh -c WORD` is judged as itself and as the line it runs. The line
            // counts as already one level deep: its own nested shells are not read.
            Judged::Argv(argv) => (Some(argv), split::split_shell_c(argv, reading)),
            Judged::Line(line) | Judged::InteractiveLine(line) => {
                (None, split_line_as(line, reading))
            }
        };
        let commands: Vec<&[String]> = direct
            .into_iter()
            .chain(split.commands.iter().map(Vec::as_slice))
            .collect();
        let mut names = env
            .iter()
            .copied()
            .chain(split.assigned.iter().map(String::as_str));
        let unparsed = split.unparsed
            || names.any(|name| {
                // A variable that changes what a shell or the loader runs makes every
                // command's argv say less than what will run.
                (!self.env_allow && changes_what_runs(name))
                    // A login shell reads its profile from `$HOME` (and readline's file
                    // from `INPUTRC`, `sh` the file `ENV` names).
                    || (split.login && startup_files_from(name))
                    // A shell that lives on keeps what a line assigns: its own variables
                    // act at later prompts, and the helper's are its own.
                    || (session && (bash_variable(name) || name.starts_with("__execd")))
            });
        self.decide(commands, unparsed, peer)
    }

    /// The verdict for these simple commands, read from a line that was `unparsed` or not.
    fn decide(&self, commands: Vec<&[String]>, unparsed: bool, peer: &Subject<'_>) -> Verdict {
        let mut hits = Vec::new();
        // The strictest matching rule so far, and among rules with that decision the
        // first in file order.
        let mut best: Option<(Decision, usize)> = None;
        let mut some_unmatched = false;
        let mut sandbox_rules: Vec<usize> = Vec::new();
        let mut sandbox_top = unparsed;
        for argv in commands.iter().copied() {
            let mut matched = false;
            let mut sandboxed = false;
            for index in self.candidates(argv.first().map(String::as_str)) {
                let Some(rule) = self.rules.get(index) else {
                    continue;
                };
                if !rule.applies_to(peer) || !rule.matches(argv) {
                    continue;
                }
                matched = true;
                if rule.sandbox.is_some() {
                    sandboxed = true;
                    sandbox_rules.push(index);
                }
                hits.push(Hit {
                    rule: rule.name.clone(),
                    decision: rule.decision,
                    argv: argv.to_vec(),
                });
                best = match best {
                    Some((d, i)) if d > rule.decision || (d == rule.decision && i <= index) => {
                        Some((d, i))
                    }
                    _ => Some((rule.decision, index)),
                };
            }
            some_unmatched |= !matched;
            sandbox_top |= !sandboxed;
        }
        // An unparsed line runs in the top-level sandbox alone (PROTOCOL 16).
        if unparsed {
            sandbox_rules.clear();
        }
        sandbox_rules.sort_unstable();
        sandbox_rules.dedup();
        let sandbox_rules: Vec<String> = sandbox_rules
            .into_iter()
            .filter_map(|i| self.rules.get(i).map(|r| r.name.clone()))
            .collect();

        // `None` < `Some(_)`: with no readable command at all there is nothing to weigh.
        let readable = best
            .map(|(d, _)| d)
            .max(some_unmatched.then_some(self.default));
        let (decision, rule, justification) = match (best, readable) {
            (Some((d, index)), Some(r)) if d == r => match self.rules.get(index) {
                Some(rule) => (d, rule.name.clone(), rule.justification.clone()),
                None => (d, "default".to_owned(), None),
            },
            (_, Some(r)) => (r, "default".to_owned(), None),
            // An empty line (or one of comments only) runs nothing; it gets `default`.
            (_, None) => (self.default, "default".to_owned(), None),
        };
        // PROTOCOL 7.2 says an unparsed line gets `unparsed` "unless the strictest readable
        // decision is already deny". Taking the maximum is that rule, and also keeps a
        // readable `ask` from being lowered to a configured `unparsed: allow`.
        // The ask rules behind an `ask`: what an approval for the session covers.
        let mut asked: Vec<String> = Vec::new();
        if decision == Decision::Ask {
            asked = hits
                .iter()
                .filter(|h| h.decision == Decision::Ask)
                .map(|h| h.rule.clone())
                .collect();
            if some_unmatched && self.default == Decision::Ask {
                asked.push("default".to_owned());
            }
            asked.sort();
            asked.dedup();
        }
        let commands = commands.into_iter().map(<[String]>::to_vec).collect();
        if unparsed && Some(self.unparsed) > readable {
            return Verdict {
                decision: self.unparsed,
                rule: "unparsed".to_owned(),
                justification: None,
                hits,
                unparsed,
                asked,
                commands,
                sandbox_rules,
                sandbox_top,
            };
        }
        Verdict {
            decision,
            rule,
            justification,
            hits,
            unparsed,
            asked,
            commands,
            sandbox_rules,
            sandbox_top,
        }
    }

    /// The rules whose first element could match a command whose program is `program`: by
    /// the word as given and by its basename, merged in file order.
    fn candidates(&self, program: Option<&str>) -> Candidates<'_> {
        let list = |word: &str| self.by_first.get(word).map_or(&[][..], Vec::as_slice);
        match program {
            None => Candidates { a: &[], b: &[] },
            Some(word) => {
                let base = basename(word);
                let b = if base == word { &[][..] } else { list(base) };
                Candidates { a: list(word), b }
            }
        }
    }
}

/// Two ascending lists of rule indices, merged without duplicates.
struct Candidates<'p> {
    a: &'p [usize],
    b: &'p [usize],
}

impl Iterator for Candidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match (self.a.split_first(), self.b.split_first()) {
            (Some((&x, rest_a)), Some((&y, rest_b))) => {
                if x <= y {
                    self.a = rest_a;
                }
                if y <= x {
                    self.b = rest_b;
                }
                Some(x.min(y))
            }
            (Some((&x, rest)), None) => {
                self.a = rest;
                Some(x)
            }
            (None, Some((&y, rest))) => {
                self.b = rest;
                Some(y)
            }
            (None, None) => None,
        }
    }
}

/// Whether setting variable `name` changes what a shell or the dynamic loader runs
/// (PROTOCOL 7.2): then a command's words say less than what will run. `SSH_CLIENT`,
/// `SSH2_CLIENT` and `SHLVL` too: with them Debian's bash reads `~/.bashrc` even for
/// `bash -c`.
pub fn changes_what_runs(name: &str) -> bool {
    matches!(
        name,
        "BASH_ENV"
            | "ENV"
            | "SHELLOPTS"
            | "BASHOPTS"
            | "PS4"
            | "PROMPT_COMMAND"
            | "IFS"
            | "PATH"
            | "SSH_CLIENT"
            | "SSH2_CLIENT"
            | "SHLVL"
    ) || name.starts_with("LD_")
        || name.starts_with("BASH_FUNC_")
}

/// Whether setting `name` for a shell changes which startup files it reads: a login
/// shell's profile is `$HOME`'s, zsh reads `$ZDOTDIR/.zshenv` on every start, fish its
/// `$XDG_CONFIG_HOME` config, readline `$INPUTRC`, an interactive `sh` what `$ENV` names
/// (PROTOCOL 7.2). zsh and fish are never read through (so always unparsed); this weighs
/// a login bash or sh read through under `"login_shell": "split"`.
pub fn startup_files_from(name: &str) -> bool {
    matches!(
        name,
        "HOME" | "ZDOTDIR" | "XDG_CONFIG_HOME" | "INPUTRC" | "ENV"
    )
}

/// The variables the bash manual lists under Shell Variables (bash 5.2, sections 5.1
/// "Bourne Shell Variables" and 5.2 "Bash Variables"; bash(1)'s "Shell Variables", which
/// also names `auto_resume`): the one list a shell session's lines are judged by
/// (PROTOCOL 7.2, `bash_variable`).
pub const BASH_VARIABLES: &[&str] = &[
    // 5.1 Bourne Shell Variables
    "CDPATH",
    "HOME",
    "IFS",
    "MAIL",
    "MAILPATH",
    "OPTARG",
    "OPTIND",
    "PATH",
    "PS1",
    "PS2",
    // 5.2 Bash Variables
    "_",
    "BASH",
    "BASHOPTS",
    "BASHPID",
    "BASH_ALIASES",
    "BASH_ARGC",
    "BASH_ARGV",
    "BASH_ARGV0",
    "BASH_CMDS",
    "BASH_COMMAND",
    "BASH_COMPAT",
    "BASH_ENV",
    "BASH_EXECUTION_STRING",
    "BASH_LINENO",
    "BASH_LOADABLES_PATH",
    "BASH_REMATCH",
    "BASH_SOURCE",
    "BASH_SUBSHELL",
    "BASH_VERSINFO",
    "BASH_VERSION",
    "BASH_XTRACEFD",
    "CHILD_MAX",
    "COLUMNS",
    "COMP_CWORD",
    "COMP_LINE",
    "COMP_POINT",
    "COMP_TYPE",
    "COMP_KEY",
    "COMP_WORDBREAKS",
    "COMP_WORDS",
    "COMPREPLY",
    "COPROC",
    "DIRSTACK",
    "EMACS",
    "ENV",
    "EPOCHREALTIME",
    "EPOCHSECONDS",
    "EUID",
    "EXECIGNORE",
    "FCEDIT",
    "FIGNORE",
    "FUNCNAME",
    "FUNCNEST",
    "GLOBIGNORE",
    "GROUPS",
    "histchars",
    "HISTCMD",
    "HISTCONTROL",
    "HISTFILE",
    "HISTFILESIZE",
    "HISTIGNORE",
    "HISTSIZE",
    "HISTTIMEFORMAT",
    "HOSTFILE",
    "HOSTNAME",
    "HOSTTYPE",
    "IGNOREEOF",
    "INPUTRC",
    "INSIDE_EMACS",
    "LANG",
    "LC_ALL",
    "LC_COLLATE",
    "LC_CTYPE",
    "LC_MESSAGES",
    "LC_NUMERIC",
    "LC_TIME",
    "LINENO",
    "LINES",
    "MACHTYPE",
    "MAILCHECK",
    "MAPFILE",
    "OLDPWD",
    "OPTERR",
    "OSTYPE",
    "PIPESTATUS",
    "POSIXLY_CORRECT",
    "PPID",
    "PROMPT_COMMAND",
    "PROMPT_DIRTRIM",
    "PS0",
    "PS3",
    "PS4",
    "PWD",
    "RANDOM",
    "READLINE_ARGUMENT",
    "READLINE_LINE",
    "READLINE_MARK",
    "READLINE_POINT",
    "REPLY",
    "SECONDS",
    "SHELL",
    "SHELLOPTS",
    "SHLVL",
    "SRANDOM",
    "TIMEFORMAT",
    "TMOUT",
    "TMPDIR",
    "UID",
    // Job control, listed in bash(1) with the others
    "auto_resume",
];

/// Whether `name` is one of bash's own variables (`BASH_VARIABLES`, and every name of
/// the families a newer bash adds to: `BASH*`, `LC_*`, `COMP_*`, `READLINE_*`). Assigning
/// one changes how a shell that lives on behaves at later prompts and lines: `MAILPATH`
/// expands (and runs) its message, `PROMPT_COMMAND` and `PS0`..`PS4` run, `PWD` and
/// `HOME` change what is shown and where `cd` goes, `CDPATH`, `GLOBIGNORE`, `EXECIGNORE`,
/// `BASH_CMDS` and `BASH_ALIASES` change what later words mean, `TMOUT` ends the shell.
pub fn bash_variable(name: &str) -> bool {
    name.starts_with("BASH")
        || name.starts_with("LC_")
        || name.starts_with("COMP_")
        || name.starts_with("READLINE_")
        || BASH_VARIABLES.contains(&name)
}

/// How a JSON value is named in errors.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A decision field's value, or the tail of an error about it.
fn decision_of(value: &Value) -> Result<Decision, String> {
    match value {
        Value::String(word) => Decision::from_word(word)
            .ok_or_else(|| format!("must be \"allow\", \"ask\" or \"deny\", not {word:?}")),
        other => Err(format!(
            "must be a string (\"allow\", \"ask\" or \"deny\"), not {}",
            kind(other)
        )),
    }
}

/// Parses and checks rule number `position` (from 1). `earlier` holds the names taken by
/// the rules before it, with their positions.
fn parse_rule(
    position: usize,
    entry: &Value,
    earlier: &HashMap<String, usize>,
) -> Result<Rule, String> {
    let fields = match entry {
        Value::Object(fields) => fields,
        other => {
            return Err(format!(
                "rule #{position}: must be an object, not {}",
                kind(other)
            ))
        }
    };
    let name = match fields.get("name") {
        None => return Err(format!("rule #{position}: \"name\" is missing")),
        Some(Value::String(name)) if name.is_empty() => {
            return Err(format!("rule #{position}: \"name\" is empty"))
        }
        Some(Value::String(name)) => name.clone(),
        Some(other) => {
            return Err(format!(
                "rule #{position}: \"name\" must be a string, not {}",
                kind(other)
            ))
        }
    };
    if RESERVED_NAMES.contains(&name.as_str()) {
        return Err(format!(
            "rule {name:?} (#{position}): the names \"default\" and \"unparsed\" are reserved \
             for verdicts no rule decided"
        ));
    }
    if let Some(first) = earlier.get(&name) {
        return Err(format!(
            "rule {name:?} (#{position}): the name is already used by rule #{first}"
        ));
    }
    // Debug formatting quotes the name and escapes anything that would break the line.
    let label = format!("rule {name:?}");
    if let Some(key) = fields.keys().find(|k| !RULE_FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "{label}: unknown field {key:?} (known: {})",
            RULE_FIELDS.join(", ")
        ));
    }
    let pattern = parse_pattern(&label, fields.get("pattern"))?;
    let decision = match fields.get("decision") {
        None => return Err(format!("{label}: \"decision\" is missing")),
        Some(v) => decision_of(v).map_err(|e| format!("{label}: \"decision\" {e}"))?,
    };
    let uids = parse_ids(&label, "uids", fields.get("uids"))?;
    let gids = parse_ids(&label, "gids", fields.get("gids"))?;
    let justification = match fields.get("justification") {
        None => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(other) => {
            return Err(format!(
                "{label}: \"justification\" must be a string, not {}",
                kind(other)
            ))
        }
    };
    let sandbox = match fields.get("sandbox") {
        None => None,
        Some(v) => Some(sandbox::parse(v).map_err(|e| format!("{label}: \"sandbox\" {e}"))?),
    };
    let rule = Rule {
        name,
        pattern,
        decision,
        uids,
        gids,
        justification,
        sandbox,
    };
    check_examples(&label, &rule, fields)?;
    Ok(rule)
}

/// A rule's `pattern`: a non-empty array of non-empty words or non-empty word lists.
fn parse_pattern(label: &str, value: Option<&Value>) -> Result<Vec<Vec<String>>, String> {
    let elements = match value {
        None => return Err(format!("{label}: \"pattern\" is missing")),
        Some(Value::Array(elements)) => elements,
        Some(other) => {
            return Err(format!(
                "{label}: \"pattern\" must be an array, not {}",
                kind(other)
            ))
        }
    };
    if elements.is_empty() {
        return Err(format!("{label}: \"pattern\" is empty"));
    }
    elements
        .iter()
        .enumerate()
        .map(|(i, element)| match element {
            Value::String(word) if word.is_empty() => {
                Err(format!("{label}: pattern[{i}] is an empty string"))
            }
            Value::String(word) => Ok(vec![word.clone()]),
            Value::Array(alternatives) if alternatives.is_empty() => Err(format!(
                "{label}: pattern[{i}] is an empty list of alternatives"
            )),
            Value::Array(alternatives) => alternatives
                .iter()
                .enumerate()
                .map(|(j, alternative)| match alternative {
                    Value::String(word) if word.is_empty() => {
                        Err(format!("{label}: pattern[{i}][{j}] is an empty string"))
                    }
                    Value::String(word) => Ok(word.clone()),
                    other => Err(format!(
                        "{label}: pattern[{i}][{j}] must be a string, not {}",
                        kind(other)
                    )),
                })
                .collect(),
            other => Err(format!(
                "{label}: pattern[{i}] must be a string or an array of strings, not {}",
                kind(other)
            )),
        })
        .collect()
}

/// A rule's `uids` or `gids`: absent, or a non-empty array of 32-bit ids.
fn parse_ids(label: &str, field: &str, value: Option<&Value>) -> Result<Option<Vec<u32>>, String> {
    let items = match value {
        None => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(format!(
                "{label}: {field:?} must be an array of ids, not {}",
                kind(other)
            ))
        }
    };
    // An empty list would make the rule apply to no one: surely a mistake, and a silent
    // one for a `deny` rule.
    if items.is_empty() {
        return Err(format!(
            "{label}: {field:?} is empty (the rule would apply to no one)"
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    format!(
                        "{label}: {field}[{i}] must be an integer from 0 to {}",
                        u32::MAX
                    )
                })
        })
        .collect::<Result<Vec<u32>, String>>()
        .map(Some)
}

/// Checks a rule's `match` and `not_match` examples against its pattern (uids and gids
/// aside). An example matches when the pattern matches one of its simple commands.
fn check_examples(label: &str, rule: &Rule, fields: &Map<String, Value>) -> Result<(), String> {
    for (field, must_match) in [("match", true), ("not_match", false)] {
        let examples = match fields.get(field) {
            None => continue,
            Some(Value::Array(examples)) => examples,
            Some(other) => {
                return Err(format!(
                    "{label}: {field:?} must be an array of command lines, not {}",
                    kind(other)
                ))
            }
        };
        for (i, example) in examples.iter().enumerate() {
            let Value::String(line) = example else {
                return Err(format!(
                    "{label}: {field}[{i}] must be a string, not {}",
                    kind(example)
                ));
            };
            let matched = split_line(line).commands.iter().any(|c| rule.matches(c));
            if matched != must_match {
                let problem = if must_match {
                    "does not match its pattern"
                } else {
                    "matches its pattern"
                };
                return Err(format!("{label}: {field} example {line:?} {problem}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The policy of PROTOCOL 7.1, verbatim.
    const EXAMPLE: &str = r#"{
      "default": "allow",
      "unparsed": "ask",
      "rules": [
        {"name": "no-force-push", "pattern": ["git", "push", ["-f", "--force"]], "decision": "deny",
         "match": ["git push -f origin main"], "not_match": ["git push origin main"]},
        {"name": "push", "pattern": ["git", "push"], "decision": "ask",
         "justification": "pushes leave this machine"},
        {"name": "read-only-git", "pattern": ["git", ["status", "diff", "log", "show"]], "decision": "allow"},
        {"name": "rm", "pattern": ["rm"], "decision": "ask", "uids": [1000, 1001]}
      ]
    }"#;

    /// A peer no `uids`/`gids` rule in these tests names.
    const ANYONE: Subject<'static> = Subject {
        uid: 4242,
        gids: &[4242],
    };

    fn words(ws: &[&str]) -> Vec<String> {
        ws.iter().map(|w| (*w).to_owned()).collect()
    }

    #[track_caller]
    fn policy(text: &str) -> Policy {
        match Policy::parse(text) {
            Ok(p) => p,
            Err(e) => panic!("policy refused: {e}"),
        }
    }

    fn line(p: &Policy, l: &str) -> Verdict {
        p.judge(&Judged::Line(l), &[], &ANYONE)
    }

    fn direct(p: &Policy, ws: &[&str]) -> Verdict {
        p.judge(&Judged::Argv(&words(ws)), &[], &ANYONE)
    }

    /// Asserts decision and deciding rule.
    #[track_caller]
    fn decides(v: &Verdict, decision: Decision, rule: &str) {
        assert_eq!(
            (v.decision, v.rule.as_str()),
            (decision, rule),
            "verdict {v:?}"
        );
    }

    fn hit_names(v: &Verdict) -> Vec<&str> {
        v.hits.iter().map(|h| h.rule.as_str()).collect()
    }

    // ---- matching -----------------------------------------------------------------

    #[test]
    fn protocol_example_loads() {
        let p = policy(EXAMPLE);
        assert_eq!(p.rule_count(), 4);
        assert_eq!(Decision::Deny.as_str(), "deny");
        assert_eq!(Decision::Ask.as_str(), "ask");
        assert_eq!(Decision::Allow.as_str(), "allow");
        assert!(Decision::Allow < Decision::Ask && Decision::Ask < Decision::Deny);
    }

    #[test]
    fn patterns_are_argv_prefixes_with_alternatives() {
        let p = policy(EXAMPLE);
        decides(
            &line(&p, "git push -f origin main"),
            Decision::Deny,
            "no-force-push",
        );
        decides(
            &line(&p, "git push --force"),
            Decision::Deny,
            "no-force-push",
        );
        let push = line(&p, "git push origin main");
        decides(&push, Decision::Ask, "push");
        assert_eq!(
            push.justification.as_deref(),
            Some("pushes leave this machine")
        );
        // Exactly as long as the pattern still matches.
        decides(&line(&p, "git push"), Decision::Ask, "push");
        decides(&line(&p, "git status"), Decision::Allow, "read-only-git");
        decides(
            &line(&p, "git log --oneline -5"),
            Decision::Allow,
            "read-only-git",
        );
        // Shorter than the pattern, or another word: no rule.
        decides(&line(&p, "git"), Decision::Allow, "default");
        decides(&line(&p, "git pull"), Decision::Allow, "default");
        decides(&line(&p, "git stash"), Decision::Allow, "default");
        // A word must equal the pattern element, not merely start with it.
        decides(&line(&p, "git pushy"), Decision::Allow, "default");
        assert!(line(&p, "git pushy").hits.is_empty());
        // The force flag must be the third word: a prefix, not a search.
        decides(&line(&p, "git push origin -f"), Decision::Ask, "push");
    }

    #[test]
    fn first_word_matches_the_basename_of_a_path() {
        let p = policy(
            r#"{"rules": [
              {"name": "rm", "pattern": ["rm"], "decision": "deny"},
              {"name": "git-rm", "pattern": ["git", "rm"], "decision": "ask"},
              {"name": "opt-tool", "pattern": ["/opt/tool"], "decision": "ask"}
            ]}"#,
        );
        decides(
            &direct(&p, &["/usr/bin/rm", "-rf", "x"]),
            Decision::Deny,
            "rm",
        );
        decides(&line(&p, "/bin/rm x"), Decision::Deny, "rm");
        decides(&line(&p, "./rm x"), Decision::Deny, "rm");
        decides(&line(&p, "rmdir x"), Decision::Allow, "default");
        decides(&line(&p, "/usr/bin/git rm x"), Decision::Ask, "git-rm");
        // Only the first element: a path in a later word is a different word.
        decides(&line(&p, "git /bin/rm"), Decision::Allow, "default");
        // A pattern with a path matches that path only.
        decides(&line(&p, "/opt/tool run"), Decision::Ask, "opt-tool");
        decides(&line(&p, "tool run"), Decision::Allow, "default");
        decides(&line(&p, "/usr/opt/tool run"), Decision::Allow, "default");
    }

    #[test]
    fn strictest_wins_and_the_first_rule_with_it_decides() {
        let p = policy(
            r#"{"rules": [
              {"name": "git", "pattern": ["git"], "decision": "allow"},
              {"name": "push-1", "pattern": ["git", "push"], "decision": "ask", "justification": "one"},
              {"name": "push-2", "pattern": ["git", "push"], "decision": "ask", "justification": "two"},
              {"name": "curl", "pattern": ["curl"], "decision": "deny", "justification": "network"},
              {"name": "pipe-to-sh", "pattern": ["sh"], "decision": "deny"},
              {"name": "wget", "pattern": ["wget"], "decision": "deny"}
            ]}"#,
        );
        let v = line(&p, "git push");
        decides(&v, Decision::Ask, "push-1");
        assert_eq!(v.justification.as_deref(), Some("one"));
        assert_eq!(hit_names(&v), ["git", "push-1", "push-2"]);
        assert!(v.hits.iter().all(|h| h.argv == words(&["git", "push"])));

        let v = line(&p, "git status && curl -s x | sh");
        decides(&v, Decision::Deny, "curl");
        assert_eq!(v.justification.as_deref(), Some("network"));
        assert_eq!(hit_names(&v), ["git", "curl", "pipe-to-sh"]);
        assert_eq!(v.hits[1].argv, words(&["curl", "-s", "x"]));
        assert_eq!(v.hits[1].decision, Decision::Deny);

        // File order, not line order, names the decider.
        decides(&line(&p, "wget x; curl y"), Decision::Deny, "curl");
    }

    #[test]
    fn unmatched_commands_get_the_default() {
        let p = policy(
            r#"{"default": "ask", "rules": [
              {"name": "ls", "pattern": ["ls"], "decision": "allow"},
              {"name": "make", "pattern": ["make"], "decision": "ask"}
            ]}"#,
        );
        decides(&line(&p, "ls -la"), Decision::Allow, "ls");
        // One unmatched command is enough for the default to count.
        let v = line(&p, "ls && cargo build");
        decides(&v, Decision::Ask, "default");
        assert_eq!(hit_names(&v), ["ls"]);
        // A rule with the winning decision is named rather than "default".
        decides(&line(&p, "cargo build && make"), Decision::Ask, "make");
        // Nothing to run: the default.
        let v = line(&p, "");
        decides(&v, Decision::Ask, "default");
        assert!(v.hits.is_empty() && !v.unparsed);
        decides(&line(&p, "# only a comment\n"), Decision::Ask, "default");
        decides(&direct(&p, &[]), Decision::Ask, "default");

        let p = policy(
            r#"{"default": "deny", "rules": [{"name": "ls", "pattern": ["ls"], "decision": "ask"}]}"#,
        );
        decides(&line(&p, "ls"), Decision::Ask, "ls");
        decides(&line(&p, "ls; whoami"), Decision::Deny, "default");
    }

    #[test]
    fn uids_and_gids_limit_who_a_rule_applies_to() {
        let p = policy(
            r#"{"rules": [
              {"name": "rm-users", "pattern": ["rm"], "decision": "ask", "uids": [1000, 1001]},
              {"name": "docker-group", "pattern": ["docker"], "decision": "deny", "gids": [999]},
              {"name": "both", "pattern": ["shutdown"], "decision": "deny", "uids": [1000], "gids": [27]}
            ]}"#,
        );
        let judge = |l: &str, uid: u32, gids: &[u32]| {
            p.judge(&Judged::Line(l), &[], &Subject { uid, gids })
        };
        decides(&judge("rm x", 1000, &[1000]), Decision::Ask, "rm-users");
        decides(&judge("rm x", 1001, &[]), Decision::Ask, "rm-users");
        decides(&judge("rm x", 0, &[0]), Decision::Allow, "default");
        assert!(judge("rm x", 0, &[0]).hits.is_empty());
        // Any of the peer's groups will do.
        decides(
            &judge("docker ps", 5, &[5, 999, 7]),
            Decision::Deny,
            "docker-group",
        );
        decides(&judge("docker ps", 5, &[5, 7]), Decision::Allow, "default");
        // Both stated conditions must hold.
        decides(
            &judge("shutdown now", 1000, &[1000, 27]),
            Decision::Deny,
            "both",
        );
        decides(
            &judge("shutdown now", 1000, &[1000]),
            Decision::Allow,
            "default",
        );
        decides(
            &judge("shutdown now", 1001, &[27]),
            Decision::Allow,
            "default",
        );
    }

    #[test]
    fn direct_shell_c_is_judged_as_itself_and_as_its_line() {
        let p = policy(EXAMPLE);
        let v = direct(&p, &["bash", "-c", "git status && git push -f origin"]);
        decides(&v, Decision::Deny, "no-force-push");
        assert_eq!(hit_names(&v), ["read-only-git", "no-force-push", "push"]);
        assert_eq!(v.hits[1].argv, words(&["git", "push", "-f", "origin"]));
        assert!(!v.unparsed);
        // `bash -lc`, as agents wrap commands, reads profile files no rule saw: unparsed,
        // unless the policy says `"login_shell": "split"` (PROTOCOL 7.2). A deny still
        // decides.
        let v = direct(&p, &["bash", "-lc", "git status && git push -f origin"]);
        decides(&v, Decision::Deny, "no-force-push");
        assert!(v.unparsed);
        decides(
            &direct(&p, &["bash", "-lc", "git status"]),
            Decision::Ask,
            "unparsed",
        );
        let trusting = policy(&EXAMPLE.replacen('{', r#"{"login_shell": "split","#, 1));
        let v = direct(&trusting, &["bash", "-lc", "git status"]);
        decides(&v, Decision::Allow, "read-only-git");
        assert!(!v.unparsed);
        decides(
            &direct(&p, &["/bin/sh", "-c", "git push"]),
            Decision::Ask,
            "push",
        );
        decides(
            &direct(&p, &["dash", "-ec", "git push"]),
            Decision::Ask,
            "push",
        );
        decides(
            &direct(&p, &["bash", "-e", "-c", "git push"]),
            Decision::Ask,
            "push",
        );
        // Unparsed shells (`--login`, zsh) still show what their script would run.
        for argv in [
            &["bash", "--login", "-c", "git push"][..],
            &["zsh", "--login", "-c", "git push"][..],
        ] {
            let v = direct(&p, argv);
            decides(&v, Decision::Ask, "push");
            assert!(v.unparsed, "{argv:?}");
        }
        decides(
            &direct(&p, &["zsh", "-c", "git status"]),
            Decision::Ask,
            "unparsed",
        );
        decides(
            &direct(&p, &["sh", "-o", "pipefail", "-c", "git push"]),
            Decision::Ask,
            "push",
        );
        // Positional arguments after the script do not change it.
        decides(
            &direct(&p, &["sh", "-c", "git push", "sh", "x"]),
            Decision::Ask,
            "push",
        );
        // Not a shell, or no -c: just the argv.
        decides(
            &direct(&p, &["python3", "-c", "git push"]),
            Decision::Allow,
            "default",
        );
        // A shell running a script file runs what no rule read.
        decides(
            &direct(&p, &["bash", "git push"]),
            Decision::Ask,
            "unparsed",
        );
        // The argv itself is judged too.
        let shells =
            policy(r#"{"rules": [{"name": "no-bash", "pattern": ["bash"], "decision": "deny"}]}"#);
        decides(
            &direct(&shells, &["bash", "-c", "ls"]),
            Decision::Deny,
            "no-bash",
        );
        // An unreadable script is unparsed.
        let v = direct(&p, &["sh", "-c", "echo $(id)"]);
        decides(&v, Decision::Ask, "unparsed");
        assert!(v.unparsed);
        // One level only: a shell inside the script is not read, and says so.
        let v = direct(&p, &["bash", "-c", "sh -c 'git push -f'"]);
        decides(&v, Decision::Ask, "unparsed");
        assert!(v.unparsed && v.hits.is_empty());
        // A direct argv never goes through a shell: its words are taken as they are.
        decides(
            &direct(&p, &["echo", "$(rm -rf /)", "&"]),
            Decision::Allow,
            "default",
        );
        assert!(!direct(&p, &["echo", "$(rm -rf /)"]).unparsed);
    }

    #[test]
    fn unparsed_lines_get_at_least_the_unparsed_decision() {
        let p = policy(EXAMPLE);
        let v = line(&p, "echo $(id)");
        decides(&v, Decision::Ask, "unparsed");
        assert!(v.unparsed && v.justification.is_none());
        // The readable part is already deny: it decides.
        let v = line(&p, "git push -f $(git remote | head -1)");
        decides(&v, Decision::Deny, "no-force-push");
        assert!(v.unparsed);
        // Equal, not stricter: the readable rule keeps the name.
        decides(
            &line(&p, "git push origin `git branch --show-current`"),
            Decision::Ask,
            "push",
        );
        decides(&line(&p, "sleep 100 &"), Decision::Ask, "unparsed");
        decides(&line(&p, "git status"), Decision::Allow, "read-only-git");
        assert!(!line(&p, "git status").unparsed);

        let strict = policy(
            r#"{"unparsed": "deny", "rules": [{"name": "push", "pattern": ["git", "push"], "decision": "ask"}]}"#,
        );
        decides(
            &line(&strict, "git push; echo `id`"),
            Decision::Deny,
            "unparsed",
        );
        decides(&line(&strict, "(ls)"), Decision::Deny, "unparsed");

        // A lenient `unparsed` never weakens what the readable part asks.
        let lenient = policy(
            r#"{"unparsed": "allow", "rules": [{"name": "push", "pattern": ["git", "push"], "decision": "ask"}]}"#,
        );
        decides(&line(&lenient, "git push $REMOTE"), Decision::Ask, "push");
        decides(&line(&lenient, "echo $HOME"), Decision::Allow, "default");
    }

    #[test]
    fn sandboxes_come_from_the_rules_that_matched_and_the_top_level_for_the_rest() {
        let p = policy(
            r#"{"sandbox": "workspace", "workspaces": ["/w"], "escalation": "deny",
                "rules": [
                {"name": "cargo", "pattern": ["cargo"], "decision": "allow",
                 "sandbox": {"network": "all"}},
                {"name": "rm", "pattern": ["rm"], "decision": "allow", "sandbox": "read-only"},
                {"name": "ls", "pattern": ["ls"], "decision": "allow"}
            ]}"#,
        );
        assert!(p.escalation_denied());
        assert_eq!(p.workspaces(), &[std::path::PathBuf::from("/w")]);
        assert!(p.sandbox().is_some() && p.rule_sandbox("cargo").is_some());
        assert!(p.rule_sandbox("ls").is_none());
        let v = line(&p, "cargo build && rm x");
        assert_eq!(v.sandbox_rules, vec!["cargo", "rm"]);
        assert!(!v.sandbox_top);
        // `ls` carries no sandbox: the top-level one applies to it.
        let v = line(&p, "cargo build; ls");
        assert_eq!(v.sandbox_rules, vec!["cargo"]);
        assert!(v.sandbox_top);
        // An unparsed line gets the top-level one alone.
        let v = line(&p, "cargo build $(x)");
        assert!(v.sandbox_rules.is_empty() && v.sandbox_top);
        for (text, message) in [
            (r#"{"sandbox": "sealed"}"#, "\"sandbox\" unknown preset"),
            (
                r#"{"sandbox": {"write": [], "net": "none"}}"#,
                "\"sandbox\" \"net\": unknown key",
            ),
            (r#"{"workspaces": ["/"]}"#, "/ is never a workspace"),
            (r#"{"workspaces": ["rel"]}"#, "absolute paths"),
            (r#"{"escalation": "maybe"}"#, "\"escalation\" must be"),
            (
                r#"{"rules": [{"name": "a", "pattern": ["a"], "decision": "allow",
                    "sandbox": {"network": "some"}}]}"#,
                "rule \"a\": \"sandbox\" \"network\"",
            ),
        ] {
            let e = Policy::parse(text).unwrap_err();
            assert!(e.contains(message), "{text}: {e}");
        }
    }

    #[test]
    fn the_default_policy_allows_everything() {
        let p = Policy::default();
        assert_eq!(p.rule_count(), 0);
        decides(&line(&p, "rm -rf /tmp/x"), Decision::Allow, "default");
        decides(&direct(&p, &["/bin/rm", "x"]), Decision::Allow, "default");
        let v = line(&p, "echo $(date) &");
        assert_eq!(v.decision, Decision::Allow);
        assert!(v.unparsed);
        decides(&line(&p, "$(date)"), Decision::Allow, "unparsed");
        // A file with no fields keeps the file defaults: unparsed asks.
        decides(&line(&policy("{}"), "$(date)"), Decision::Ask, "unparsed");
        decides(&line(&policy("{}"), "date"), Decision::Allow, "default");
    }

    #[test]
    fn a_thousand_rules_are_found_through_the_first_word_index() {
        let decisions = ["allow", "ask", "deny"];
        let rules: Vec<String> = (0..1000)
            .map(|i| {
                format!(
                    r#"{{"name": "r{i}", "pattern": ["tool{i}", ["run", "start"]], "decision": "{}"}}"#,
                    decisions[i % 3]
                )
            })
            .collect();
        let text = format!(r#"{{"default": "ask", "rules": [{}]}}"#, rules.join(",\n"));
        let p = policy(&text);
        assert_eq!(p.rule_count(), 1000);
        // Only the rules a program could match are tried.
        assert_eq!(p.candidates(Some("tool500")).collect::<Vec<_>>(), [500]);
        assert_eq!(
            p.candidates(Some("/opt/bin/tool999")).collect::<Vec<_>>(),
            [999]
        );
        assert_eq!(p.candidates(Some("ls")).count(), 0);
        assert_eq!(p.candidates(None).count(), 0);

        let v = line(&p, "tool500 run --fast");
        decides(&v, Decision::Deny, "r500");
        assert_eq!(hit_names(&v), ["r500"]);
        decides(&line(&p, "/opt/bin/tool999 start"), Decision::Allow, "r999");
        decides(&line(&p, "tool998 start x"), Decision::Deny, "r998");
        decides(&line(&p, "tool5 stop"), Decision::Ask, "default");
        let v = line(&p, "tool1 run && tool3 start | tool2 run; tool4 run");
        decides(&v, Decision::Deny, "r2");
        assert_eq!(hit_names(&v), ["r1", "r3", "r2", "r4"]);
        // Every rule is reachable, and only by its own program.
        for i in (0..1000).step_by(37) {
            let v = line(&p, &format!("tool{i} start"));
            assert_eq!(hit_names(&v), [format!("r{i}")]);
            assert_eq!(v.decision.as_str(), decisions[i % 3]);
        }
    }

    #[test]
    fn candidates_merge_the_path_and_its_basename_in_file_order() {
        let p = policy(
            r#"{"rules": [
              {"name": "path", "pattern": ["/opt/tool"], "decision": "allow"},
              {"name": "base", "pattern": ["tool"], "decision": "allow"},
              {"name": "both", "pattern": [["/opt/tool", "tool", "tool"], "x"], "decision": "allow"},
              {"name": "other", "pattern": ["other"], "decision": "allow"},
              {"name": "base-again", "pattern": ["tool", "x"], "decision": "ask"}
            ]}"#,
        );
        assert_eq!(
            p.candidates(Some("/opt/tool")).collect::<Vec<_>>(),
            [0, 1, 2, 4]
        );
        assert_eq!(p.candidates(Some("tool")).collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!(
            p.candidates(Some("/usr/tool")).collect::<Vec<_>>(),
            [1, 2, 4]
        );
        let v = line(&p, "/opt/tool x");
        assert_eq!(hit_names(&v), ["path", "base", "both", "base-again"]);
        decides(&v, Decision::Ask, "base-again");
    }

    #[test]
    fn variables_that_change_what_runs_make_a_request_unparsed_unless_env_allow() {
        let strict =
            policy(r#"{"rules": [{"name": "ls", "pattern": ["ls"], "decision": "allow"}]}"#);
        let judged = |p: &Policy, l: &str, env: &[&str]| p.judge(&Judged::Line(l), env, &ANYONE);
        for (line, env) in [
            ("ls", &["BASH_ENV"][..]),
            ("ls", &["LD_PRELOAD"][..]),
            ("ls", &["BASH_FUNC_ls%%"][..]),
            ("PATH=/tmp/evil ls", &[][..]),
            ("IFS=/ ls", &[][..]),
            ("PS4=x ls", &[][..]),
            ("ls && SHELLOPTS=xtrace ls", &[][..]),
        ] {
            let v = judged(&strict, line, env);
            assert!(v.unparsed, "{line} {env:?}");
            decides(&v, Decision::Ask, "unparsed");
        }
        for (line, env) in [("ls", &["HOME", "LANG"][..]), ("LANG=C ls", &[][..])] {
            assert!(!judged(&strict, line, env).unparsed, "{line} {env:?}");
        }
        let lenient = policy(r#"{"env": "allow", "rules": []}"#);
        assert!(!judged(&lenient, "PATH=/x ls", &["BASH_ENV"]).unparsed);
        assert!(Policy::parse(r#"{"env": "sometimes"}"#)
            .unwrap_err()
            .contains(r#""env" must be "allow" or "unparsed""#));
        // A shell session's shell lives on: what a line assigns to bash's own variables
        // acts at later prompts and lines (a prompt runs what it expands, MAILPATH its
        // message), and the helper's names are its own (PROTOCOL 7.2).
        for line in [
            "PS1='$(rm -rf ~)'",
            "PS0=x",
            "ls; PS2=y",
            "MAILPATH='f?$(rm -rf V)'",
            "MAILPATH=f",
            "PWD=/tmp/harmless",
            "cd V && PWD=/tmp/harmless",
            "HOME=h ls",
            "LANG=C ls",
            "LC_ALL=C ls",
            "TMPDIR=/x",
            "histchars=x",
            "BASH_XTRACEFD=3",
            "__execd_was=-k",
            "__execd_n=x ls",
        ] {
            assert!(strict.judge_interactive(line, &ANYONE).unparsed, "{line}");
        }
        for line in [
            "PS1=x",
            "MAILPATH=f",
            "PWD=/tmp",
            "LANG=C ls",
            "__execd_was=-k",
        ] {
            assert!(!judged(&strict, line, &[]).unparsed, "{line}");
        }
        // Not even `"env": "allow"` lets a session line set them.
        assert!(lenient.judge_interactive("MAILPATH=f", &ANYONE).unparsed);
        assert!(strict.judge_interactive("PATH=/x", &ANYONE).unparsed);
        assert!(!strict.judge_interactive("X=1 ls", &ANYONE).unparsed);
        assert!(!strict.judge_interactive("ls; cd /tmp", &ANYONE).unparsed);
        // Direct commands too.
        let v = strict.judge_program(
            &Program::Direct {
                program: "ls".into(),
                args: vec![],
            },
            &[("LD_PRELOAD".into(), "/tmp/x.so".into())],
            &ANYONE,
        );
        assert!(v.unparsed);
    }

    /// Login shells read files no rule saw (PROTOCOL 7.2): unparsed unless the policy
    /// says `"login_shell": "split"`; and even then, a request that moves where a login
    /// shell finds its profile (`HOME`, ...) is unparsed. zsh reads `$ZDOTDIR/.zshenv` on
    /// every start and fish its config, so those with such a variable are unparsed however
    /// they are run; a shell without `-c` (or with `-s`) is interactive on a terminal.
    #[test]
    fn login_shells_and_the_variables_that_move_their_startup_files_are_unparsed() {
        let rules =
            r#""rules": [{"name": "t", "pattern": [["true", "echo"]], "decision": "allow"}]"#;
        let strict = policy(&format!("{{{rules}}}"));
        let trusting = policy(&format!(r#"{{"login_shell": "split", {rules}}}"#));
        let lenient = policy(&format!(
            r#"{{"login_shell": "split", "env": "allow", {rules}}}"#
        ));
        let judged = |p: &Policy, l: &str, env: &[&str]| p.judge(&Judged::Line(l), env, &ANYONE);
        // The red team's: a profile written, then a login shell pointed at it.
        let attack = "echo 'rm -rf V' > h/.bash_profile; HOME=h bash -lc true";
        for p in [&strict, &trusting, &lenient] {
            let v = judged(p, attack, &[]);
            assert!(v.unparsed, "{attack}");
            decides(&v, Decision::Ask, "unparsed");
            assert!(p.judge_interactive(attack, &ANYONE).unparsed);
        }
        for line in [
            "bash -lc true",
            "bash -l -c true",
            "sh -lc true",
            "bash -ilc true",
        ] {
            decides(&judged(&strict, line, &[]), Decision::Ask, "unparsed");
        }
        for line in ["bash -lc true", "bash -cl true", "sh -l -c 'echo x'"] {
            let v = judged(&trusting, line, &[]);
            decides(&v, Decision::Allow, "t");
            assert!(!v.unparsed, "{line}");
        }
        assert!(judged(&trusting, "bash -ilc true", &[]).unparsed);
        for (line, env) in [
            ("bash -lc true", &["HOME"][..]),
            ("bash -lc true", &["INPUTRC"][..]),
            ("HOME=h bash -lc true", &[][..]),
            ("XDG_CONFIG_HOME=x bash -lc true", &[][..]),
            ("ZDOTDIR=d bash -lc true", &[][..]),
        ] {
            assert!(judged(&trusting, line, env).unparsed, "{line} {env:?}");
            assert!(judged(&lenient, line, env).unparsed, "{line} {env:?}");
        }
        // Not a login shell: its profile is not read, its HOME is only a value.
        assert!(!judged(&trusting, "HOME=h bash -c true", &[]).unparsed);
        let direct = |p: &Policy, argv: &[&str], env: &[&str]| {
            p.judge(&Judged::Argv(&words(argv)), env, &ANYONE)
        };
        assert!(direct(&trusting, &["bash", "-lc", "true"], &["HOME"]).unparsed);
        assert!(!direct(&trusting, &["bash", "-lc", "true"], &[]).unparsed);
        assert!(direct(&strict, &["bash", "-lc", "true"], &[]).unparsed);
        // zsh's `.zshenv` variant, and fish: however they are run.
        for p in [&strict, &trusting, &lenient] {
            for (line, env) in [
                ("ZDOTDIR=d zsh -c true", &[][..]),
                ("zsh -c true", &["ZDOTDIR"][..]),
                ("HOME=h zsh -c true", &[][..]),
                ("XDG_CONFIG_HOME=x fish -c true", &[][..]),
                ("zsh -c true", &[][..]),
            ] {
                assert!(judged(p, line, env).unparsed, "{line} {env:?}");
                assert!(p.judge_interactive(line, &ANYONE).unparsed, "{line}");
            }
            assert!(direct(p, &["zsh", "-c", "true"], &["ZDOTDIR"]).unparsed);
            assert!(direct(p, &["fish", "-c", "true"], &["XDG_CONFIG_HOME"]).unparsed);
            // A shell without `-c`, or with `-s`, reads its commands from where it runs
            // (a session's terminal): interactive, its rc file and whatever is typed.
            for line in [
                "bash",
                "sh",
                "bash -s",
                "dash -s x",
                "zsh",
                "fish",
                "busybox sh",
                "bash -i",
            ] {
                assert!(p.judge_interactive(line, &ANYONE).unparsed, "{line}");
                assert!(judged(p, line, &[]).unparsed, "{line}");
            }
        }
        // The field is checked like the others.
        assert!(Policy::parse(r#"{"login_shell": "sometimes"}"#)
            .unwrap_err()
            .contains(r#""login_shell" must be "split" or "unparsed", not "sometimes""#));
        assert!(Policy::parse(r#"{"login_shell": true}"#)
            .unwrap_err()
            .contains("not a boolean"));
        assert!(
            !Policy::parse(r#"{"login_shell": "unparsed"}"#)
                .unwrap()
                .login_split
        );
    }

    /// The one list of bash's own variables holds every variable an interactive bash sets
    /// itself (a newer bash's new variable fails here first); `TERM` is the terminal's.
    #[test]
    fn the_list_of_bash_variables_covers_what_the_installed_bash_sets() {
        let Ok(out) = std::process::Command::new("bash")
            .args(["--norc", "--noprofile", "-i", "-c", "compgen -v"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
        else {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("bash is not installed");
            }
            eprintln!("SKIPPED: bash is not installed");
            return;
        };
        let names = String::from_utf8_lossy(&out.stdout);
        assert!(names.lines().count() > 30, "{names}");
        for name in names.lines().filter(|n| *n != "TERM") {
            assert!(
                bash_variable(name),
                "bash sets {name}: is it in the manual's list?"
            );
        }
        for name in [
            "MAILPATH",
            "PS0",
            "PS3",
            "PROMPT_COMMAND",
            "CDPATH",
            "histchars",
        ] {
            assert!(bash_variable(name), "{name}");
        }
        for name in ["TERM", "USER", "X", "PAGER", "__execd_n", "LD_PRELOAD"] {
            assert!(!bash_variable(name), "{name}");
        }
    }

    #[test]
    fn an_ask_names_every_ask_rule_behind_it() {
        let p = policy(
            r#"{"default": "ask", "rules": [
                {"name": "true", "pattern": ["true"], "decision": "ask"},
                {"name": "rm", "pattern": ["rm"], "decision": "ask"},
                {"name": "ls", "pattern": ["ls"], "decision": "allow"}
            ]}"#,
        );
        assert_eq!(line(&p, "true; rm -rf x; ls").asked, ["rm", "true"]);
        assert_eq!(line(&p, "true; whoami").asked, ["default", "true"]);
        assert!(line(&p, "ls").asked.is_empty(), "not an ask");
        assert_eq!(
            line(&p, "true; ls -l").commands,
            [words(&["true"]), words(&["ls", "-l"])]
        );
    }

    // ---- load errors --------------------------------------------------------------

    /// Asserts that `text` is refused with exactly `message`, on one line.
    #[track_caller]
    fn refused(text: &str, message: &str) {
        match Policy::parse(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => {
                assert!(!e.contains('\n'), "multi-line error: {e:?}");
                assert_eq!(e, message);
            }
        }
    }

    /// A policy whose only rule is `rule` (a JSON object's inside).
    fn one_rule(rule: &str) -> String {
        format!(r#"{{"rules": [{{{rule}}}]}}"#)
    }

    #[test]
    fn refuses_what_is_not_a_json_object() {
        let e = Policy::parse("{").expect_err("not JSON");
        assert!(e.starts_with("policy is not valid JSON: "), "{e}");
        assert!(!e.contains('\n'));
        let e = Policy::parse("").expect_err("empty");
        assert!(e.starts_with("policy is not valid JSON: "), "{e}");
        refused("[]", "policy must be a JSON object, not an array");
        refused("null", "policy must be a JSON object, not null");
    }

    #[test]
    fn refuses_bad_top_level_fields() {
        refused(
            r#"{"rule": []}"#,
            r#"unknown field "rule" at the top level (known: default, unparsed, env, login_shell, rules, sandbox, workspaces, escalation)"#,
        );
        refused(
            r#"{"default": "maybe"}"#,
            r#""default" must be "allow", "ask" or "deny", not "maybe""#,
        );
        refused(
            r#"{"unparsed": 1}"#,
            r#""unparsed" must be a string ("allow", "ask" or "deny"), not a number"#,
        );
        refused(
            r#"{"rules": {}}"#,
            r#""rules" must be an array, not an object"#,
        );
    }

    #[test]
    fn refuses_rules_without_a_usable_name_by_position() {
        refused(
            r#"{"rules": ["git"]}"#,
            "rule #1: must be an object, not a string",
        );
        refused(
            r#"{"rules": [{"name": "a", "pattern": ["a"], "decision": "allow"}, {"pattern": ["b"], "decision": "deny"}]}"#,
            r#"rule #2: "name" is missing"#,
        );
        refused(
            &one_rule(r#""name": "", "pattern": ["a"], "decision": "allow""#),
            r#"rule #1: "name" is empty"#,
        );
        refused(
            &one_rule(r#""name": 7, "pattern": ["a"], "decision": "allow""#),
            r#"rule #1: "name" must be a string, not a number"#,
        );
    }

    #[test]
    fn refuses_reserved_and_duplicate_names() {
        refused(
            &one_rule(r#""name": "default", "pattern": ["a"], "decision": "allow""#),
            r#"rule "default" (#1): the names "default" and "unparsed" are reserved for verdicts no rule decided"#,
        );
        refused(
            &one_rule(r#""name": "unparsed", "pattern": ["a"], "decision": "allow""#),
            r#"rule "unparsed" (#1): the names "default" and "unparsed" are reserved for verdicts no rule decided"#,
        );
        refused(
            r#"{"rules": [
              {"name": "a", "pattern": ["a"], "decision": "allow"},
              {"name": "b", "pattern": ["b"], "decision": "allow"},
              {"name": "a", "pattern": ["c"], "decision": "deny"}
            ]}"#,
            r#"rule "a" (#3): the name is already used by rule #1"#,
        );
    }

    #[test]
    fn refuses_unknown_rule_fields() {
        refused(
            &one_rule(r#""name": "a", "patern": ["a"], "decision": "allow""#),
            r#"rule "a": unknown field "patern" (known: name, pattern, decision, uids, gids, justification, match, not_match, sandbox)"#,
        );
    }

    #[test]
    fn refuses_bad_patterns() {
        let with = |pattern: &str| {
            one_rule(&format!(
                r#""name": "p", "pattern": {pattern}, "decision": "deny""#
            ))
        };
        refused(
            &one_rule(r#""name": "p", "decision": "deny""#),
            r#"rule "p": "pattern" is missing"#,
        );
        refused(
            &with(r#""git push""#),
            r#"rule "p": "pattern" must be an array, not a string"#,
        );
        refused(&with("[]"), r#"rule "p": "pattern" is empty"#);
        refused(
            &with(r#"["git", ""]"#),
            r#"rule "p": pattern[1] is an empty string"#,
        );
        refused(
            &with(r#"["git", []]"#),
            r#"rule "p": pattern[1] is an empty list of alternatives"#,
        );
        refused(
            &with(r#"["git", ["", "push"]]"#),
            r#"rule "p": pattern[1][0] is an empty string"#,
        );
        refused(
            &with(r#"["git", ["push", null]]"#),
            r#"rule "p": pattern[1][1] must be a string, not null"#,
        );
        refused(
            &with(r#"[{"word": "git"}]"#),
            r#"rule "p": pattern[0] must be a string or an array of strings, not an object"#,
        );
        refused(
            &with(r#"["git", [["push"]]]"#),
            r#"rule "p": pattern[1][0] must be a string, not an array"#,
        );
    }

    #[test]
    fn refuses_bad_decisions() {
        refused(
            &one_rule(r#""name": "d", "pattern": ["a"]"#),
            r#"rule "d": "decision" is missing"#,
        );
        refused(
            &one_rule(r#""name": "d", "pattern": ["a"], "decision": "block""#),
            r#"rule "d": "decision" must be "allow", "ask" or "deny", not "block""#,
        );
        refused(
            &one_rule(r#""name": "d", "pattern": ["a"], "decision": "Deny""#),
            r#"rule "d": "decision" must be "allow", "ask" or "deny", not "Deny""#,
        );
        refused(
            &one_rule(r#""name": "d", "pattern": ["a"], "decision": true"#),
            r#"rule "d": "decision" must be a string ("allow", "ask" or "deny"), not a boolean"#,
        );
    }

    #[test]
    fn refuses_bad_ids_and_justifications() {
        let with = |extra: &str| {
            one_rule(&format!(
                r#""name": "u", "pattern": ["a"], "decision": "ask", {extra}"#
            ))
        };
        refused(
            &with(r#""uids": 1000"#),
            r#"rule "u": "uids" must be an array of ids, not a number"#,
        );
        refused(
            &with(r#""uids": [1000, -1]"#),
            r#"rule "u": uids[1] must be an integer from 0 to 4294967295"#,
        );
        refused(
            &with(r#""uids": [1.5]"#),
            r#"rule "u": uids[0] must be an integer from 0 to 4294967295"#,
        );
        refused(
            &with(r#""uids": ["1000"]"#),
            r#"rule "u": uids[0] must be an integer from 0 to 4294967295"#,
        );
        refused(
            &with(r#""gids": [0, 4294967296]"#),
            r#"rule "u": gids[1] must be an integer from 0 to 4294967295"#,
        );
        refused(
            &with(r#""uids": []"#),
            r#"rule "u": "uids" is empty (the rule would apply to no one)"#,
        );
        refused(
            &with(r#""gids": []"#),
            r#"rule "u": "gids" is empty (the rule would apply to no one)"#,
        );
        refused(
            &with(r#""justification": ["x"]"#),
            r#"rule "u": "justification" must be a string, not an array"#,
        );
        // The largest id is fine.
        policy(&with(r#""uids": [0, 4294967295]"#));
    }

    #[test]
    fn refuses_examples_that_disagree_with_their_rule() {
        let with = |extra: &str| {
            one_rule(&format!(
                r#""name": "no-force-push", "pattern": ["git", "push", ["-f", "--force"]], "decision": "deny", {extra}"#
            ))
        };
        refused(
            &with(r#""match": ["git push origin main"]"#),
            r#"rule "no-force-push": match example "git push origin main" does not match its pattern"#,
        );
        refused(
            &with(r#""match": ["git push -f", "git push"]"#),
            r#"rule "no-force-push": match example "git push" does not match its pattern"#,
        );
        refused(
            &with(r#""not_match": ["cd repo && git push --force"]"#),
            r#"rule "no-force-push": not_match example "cd repo && git push --force" matches its pattern"#,
        );
        refused(
            &with(r#""match": "git push -f""#),
            r#"rule "no-force-push": "match" must be an array of command lines, not a string"#,
        );
        refused(
            &with(r#""not_match": [42]"#),
            r#"rule "no-force-push": not_match[0] must be a string, not a number"#,
        );
        // Examples are split like any line: chains, `sh -c`, readable parts of unparsed
        // lines, paths. uids/gids do not matter to them.
        policy(&with(
            r#""uids": [1], "match": ["make && git push -f", "bash -lc 'git push --force'",
               "git push -f $(git remote)", "/usr/bin/git push -f"],
               "not_match": ["git push", "echo 'git push -f'", "git status; git push origin"]"#,
        ));
    }

    #[test]
    fn the_first_problem_is_reported_and_names_stay_on_one_line() {
        // Rule 1 is fine, rule 2 is the first bad one; rule 3 is never reached.
        refused(
            r#"{"rules": [
              {"name": "ok", "pattern": ["a"], "decision": "allow"},
              {"name": "bad", "pattern": ["b"], "decision": "nope"},
              {"name": "worse"}
            ]}"#,
            r#"rule "bad": "decision" must be "allow", "ask" or "deny", not "nope""#,
        );
        refused(
            &one_rule(r#""name": "two\nlines \"q\"", "pattern": [], "decision": "allow""#),
            r#"rule "two\nlines \"q\"": "pattern" is empty"#,
        );
        refused(
            &one_rule(r#""name": "x", "pattern": ["a"], "decision": "allow", "match": ["b\nc"]"#),
            r#"rule "x": match example "b\nc" does not match its pattern"#,
        );
    }

    #[test]
    fn load_names_the_file() {
        let dir = std::env::temp_dir().join(format!("execd-policy-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let missing = dir.join("missing.json");
        let e = Policy::load(&missing).expect_err("missing file");
        assert!(
            e.starts_with(&format!("{}: cannot read: ", missing.display())),
            "{e}"
        );

        let bad = dir.join("bad.json");
        std::fs::write(&bad, r#"{"rules": [{"name": "x", "pattern": ["a"]}]}"#).expect("write");
        let e = Policy::load(&bad).expect_err("bad file");
        assert_eq!(
            e,
            format!(r#"{}: rule "x": "decision" is missing"#, bad.display())
        );

        let good = dir.join("good.json");
        std::fs::write(&good, EXAMPLE).expect("write");
        assert_eq!(Policy::load(&good).map(|p| p.rule_count()), Ok(4));
        let _ = std::fs::remove_dir_all(&dir);
    }

    // ---- properties ---------------------------------------------------------------

    /// Shell syntax and a few plain characters, for strings that hit every lexer branch.
    const SHELLISH: &[char] = &[
        '\'', '"', '$', '\\', '`', '|', '&', ';', '<', '>', '(', ')', '{', '}', '[', ']', ' ',
        '\n', '\t', '=', '#', '*', '?', ',', '.', '!', '\0', 'a', 'b', 'c', 's', 'h', '-', '1',
        '2', 'é',
    ];

    fn shellish() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(SHELLISH), 0..160)
            .prop_map(|chars| chars.into_iter().collect())
    }

    /// JSON trees using the policy file's field names, to reach deep into `parse`.
    fn policy_like_json() -> impl Strategy<Value = Value> {
        const KEYS: &[&str] = &[
            "default",
            "unparsed",
            "rules",
            "name",
            "pattern",
            "decision",
            "uids",
            "gids",
            "justification",
            "match",
            "not_match",
            "other",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            prop::sample::select(vec![
                "allow", "ask", "deny", "git", "push", "-f", "", "default"
            ])
            .prop_map(Value::from),
            shellish().prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 96, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..8).prop_map(
                    |fields| {
                        Value::Object(
                            fields
                                .into_iter()
                                .map(|(k, v)| ((*k).to_owned(), v))
                                .collect(),
                        )
                    }
                ),
            ]
        })
    }

    /// What holds for the split of any line, and judging it does not panic.
    fn split_holds(text: &str) -> Result<(), TestCaseError> {
        let split = split_line(text);
        prop_assert!(split.commands.iter().all(|c| !c.is_empty()));
        let v = line(&policy(EXAMPLE), text);
        prop_assert_eq!(v.unparsed, split.unparsed);
        if split.unparsed {
            // The example policy says `unparsed: ask`: never weaker than that.
            prop_assert!(v.decision >= Decision::Ask);
        }
        Ok(())
    }

    /// A word as written in a plain script, and the word it stands for.
    fn plain_word() -> impl Strategy<Value = (String, String)> {
        prop_oneof![
            "[a-zA-Z0-9._/-]{1,8}".prop_map(|w| (w.clone(), w)),
            "[a-zA-Z0-9 ;|&$()<>.*_/#{},=\"-]{0,8}".prop_map(|w| (format!("'{w}'"), w)),
            "[a-zA-Z0-9 ;|&()<>.*_/#{},='-]{0,8}".prop_map(|w| (format!("\"{w}\""), w)),
        ]
    }

    /// A plain script of 1 to 5 simple commands, and the argvs it stands for.
    fn plain_script() -> impl Strategy<Value = (String, Vec<Vec<String>>)> {
        let command = (
            "(/usr/bin/)?[a-z]{1,6}[0-9]",
            prop::collection::vec(plain_word(), 0..5),
        );
        let separator = prop::sample::select(vec![
            " && ", "&&", " || ", "||", "; ", ";", " | ", "|", " |& ", "\n", " &&\n ",
        ]);
        prop::collection::vec((command, separator), 1..6).prop_map(|parts| {
            let mut text = String::new();
            let mut argvs = Vec::new();
            let last = parts.len() - 1;
            for (i, ((program, args), separator)) in parts.into_iter().enumerate() {
                text.push_str(&program);
                let mut argv = vec![program];
                for (written, word) in args {
                    text.push(' ');
                    text.push_str(&written);
                    argv.push(word);
                }
                if i < last {
                    text.push_str(separator);
                }
                argvs.push(argv);
            }
            (text, argvs)
        })
    }

    proptest! {
        #[test]
        fn split_line_takes_any_string(text in any::<String>()) {
            split_holds(&text)?;
        }

        #[test]
        fn split_line_takes_shellish_strings(text in shellish()) {
            split_holds(&text)?;
        }

        #[test]
        fn parse_takes_any_string(text in any::<String>()) {
            if let Err(e) = Policy::parse(&text) {
                prop_assert!(!e.contains('\n'));
            }
        }

        #[test]
        fn parse_takes_policy_like_json(value in policy_like_json()) {
            if let Err(e) = Policy::parse(&value.to_string()) {
                prop_assert!(!e.contains('\n'));
            }
        }

        #[test]
        fn parse_takes_shellish_names_patterns_and_examples(
            word in shellish(),
            example in shellish(),
        ) {
            let text = serde_json::json!({"rules": [{
                "name": word, "pattern": [word, [word, "x"]], "decision": "ask",
                "not_match": [example],
            }]})
            .to_string();
            match Policy::parse(&text) {
                Ok(p) => {
                    prop_assert_eq!(p.rule_count(), 1);
                    let _ = line(&p, &example);
                }
                Err(e) => prop_assert!(!e.contains('\n')),
            }
        }

        #[test]
        fn plain_scripts_split_into_exactly_their_words((text, argvs) in plain_script()) {
            let split = split_line(&text);
            prop_assert_eq!((split.commands, split.unparsed), (argvs.clone(), false));
            // Through `bash -c`, once, double-quoting what has no `"` or `\`.
            if !text.contains(['"', '\\', '$', '`']) {
                let wrapped = format!("bash -c \"{text}\"");
                let inner = split_line(&wrapped);
                prop_assert_eq!((inner.commands, inner.unparsed), (argvs, false));
            }
        }
    }
}
