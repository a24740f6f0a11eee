//! Command-line parsing: each subcommand's flags are declared once (`Spec`, in
//! `cli::help`), and one parser reads them.
//!
//! Rules, as docker, sudo and ssh read a command line:
//! - `--name VALUE`, `--name=VALUE`, `-n VALUE`; boolean short flags may be grouped (`-di`).
//! - For subcommands that run a command (`run`, `exec`, `policy check`), options stop at the
//!   first operand: `execctl run echo --cwd / x` runs `echo --cwd / x`. Elsewhere options
//!   and operands may mix (`logs ID -f`). `--` ends options everywhere.
//! - The global options (`-H`, `--socket`, `--json`, `--verbose`, `--help`) are accepted
//!   before the subcommand and among its own options.
//! - An unknown option or subcommand is a usage error with a "did you mean" when a known
//!   name is close.

use std::ffi::OsString;

use super::errors::{Fail, Res};

/// One flag of a subcommand.
#[derive(Debug)]
pub struct Flag {
    /// The long name, with its dashes (`--cwd`).
    pub long: &'static str,
    /// The short name, with its dash (`-d`), if any.
    pub short: Option<&'static str>,
    /// The value's name in help (`DIR`); `None` for a switch.
    pub value: Option<&'static str>,
    /// One line of help.
    pub help: &'static str,
}

/// A subcommand: its name, its flags and its help.
#[derive(Debug)]
pub struct Spec {
    /// As typed: `run`, `sessions close`.
    pub name: &'static str,
    /// What follows the name in the usage line.
    pub usage: &'static str,
    /// One line for the command list.
    pub about: &'static str,
    /// The help's body: what it does, in a few lines.
    pub details: &'static str,
    /// Its own flags (the global ones come on top).
    pub flags: &'static [Flag],
    /// Options stop at the first operand (the operands are a command line).
    pub stop_at_operand: bool,
}

/// Flags every subcommand accepts.
pub const GLOBAL: &[Flag] = &[
    Flag {
        long: "--host",
        short: Some("-H"),
        value: Some("URL"),
        help: "ssh://[USER@]HOST[:PORT][/SOCKET] or unix:///PATH (default: $EXECD_HOST)",
    },
    Flag {
        long: "--socket",
        short: None,
        value: Some("PATH"),
        help: "a socket here (default: $EXECD_SOCKET, else as execd picks; execctl -h)",
    },
    Flag {
        long: "--json",
        short: None,
        value: None,
        help: "print results (and errors, on stderr) as JSON",
    },
    Flag {
        long: "--verbose",
        short: Some("-v"),
        value: None,
        help: "add the daemon's error codes and data to error messages",
    },
    Flag {
        long: "--help",
        short: Some("-h"),
        value: None,
        help: "print this help",
    },
];

/// What a command line held for one subcommand.
#[derive(Debug, Default)]
pub struct Args {
    /// Each flag met, by long name, with its value; in order.
    flags: Vec<(&'static str, Option<String>)>,
    /// The operands, in order.
    pub operands: Vec<String>,
}

impl Args {
    /// Whether the switch (or valued flag) `long` was given.
    pub fn has(&self, long: &str) -> bool {
        self.flags.iter().any(|(n, _)| *n == long)
    }

    /// The last value of `long`.
    pub fn value(&self, long: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(n, _)| *n == long)
            .and_then(|(_, v)| v.as_deref())
    }

    /// Every value of a repeatable flag, in order.
    pub fn values(&self, long: &str) -> Vec<&str> {
        self.flags
            .iter()
            .filter(|(n, _)| *n == long)
            .filter_map(|(_, v)| v.as_deref())
            .collect()
    }

    /// Records a flag found outside the parser (global options before the subcommand).
    pub fn set(&mut self, long: &'static str, value: Option<String>) {
        self.flags.push((long, value));
    }

    /// Folds the flags of an outer parse (the global options) into this one.
    pub fn absorb(&mut self, outer: Args) {
        let mut flags = outer.flags;
        flags.append(&mut self.flags);
        self.flags = flags;
    }
}

/// Converts the process's arguments to strings; JSON carries only UTF-8.
pub fn utf8_args(args: impl IntoIterator<Item = OsString>) -> Res<Vec<String>> {
    args.into_iter()
        .map(|a| {
            a.into_string().map_err(|a| {
                Fail::usage(format!(
                    "argument {a:?} is not valid UTF-8; execd passes text only"
                ))
            })
        })
        .collect()
}

fn find<'a>(flags: &'a [&'a Flag], name: &str) -> Option<&'a Flag> {
    flags
        .iter()
        .copied()
        .find(|f| f.long == name || f.short == Some(name))
}

/// Parses `args` (what follows the subcommand's name) by `spec`.
pub fn parse(spec: &Spec, args: &[String]) -> Res<Args> {
    let flags: Vec<&Flag> = spec.flags.iter().chain(GLOBAL).collect();
    parse_with(spec.name, &flags, spec.stop_at_operand, args)
}

/// Parses `args` against `flags`; `who` names the subcommand in messages.
pub fn parse_with(who: &str, flags: &[&Flag], stop: bool, args: &[String]) -> Res<Args> {
    let mut out = Args::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            out.operands.extend(args[i..].iter().cloned());
            break;
        }
        if !a.starts_with('-') || a == "-" {
            out.operands.push(a.clone());
            if stop {
                out.operands.extend(args[i..].iter().cloned());
                break;
            }
            continue;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let flag = match find(flags, name) {
            Some(f) => f,
            None => match short_group(flags, a) {
                Some(group) => {
                    for f in group {
                        out.flags.push((f.long, None));
                    }
                    continue;
                }
                None => return Err(unknown_option(who, name, flags)),
            },
        };
        match (flag.value, inline) {
            (None, None) => out.flags.push((flag.long, None)),
            (None, Some(_)) => {
                return Err(Fail::usage(format!(
                    "{} takes no value (execctl {who})",
                    flag.long
                )))
            }
            (Some(_), Some(v)) => out.flags.push((flag.long, Some(v))),
            (Some(meta), None) => {
                let Some(v) = args.get(i) else {
                    return Err(Fail::usage(format!(
                        "{name} needs a value ({meta}) (execctl {who})"
                    )));
                };
                i += 1;
                out.flags.push((flag.long, Some(v.clone())));
            }
        }
    }
    Ok(out)
}

/// `-di` as `-d -i` when every letter is a known switch.
fn short_group<'a>(flags: &[&'a Flag], arg: &str) -> Option<Vec<&'a Flag>> {
    let letters = arg.strip_prefix('-').filter(|l| !l.starts_with('-'))?;
    if letters.chars().count() < 2 {
        return None;
    }
    letters
        .chars()
        .map(|c| {
            let name = format!("-{c}");
            flags
                .iter()
                .copied()
                .find(|f| f.short == Some(name.as_str()) && f.value.is_none())
        })
        .collect()
}

fn unknown_option(who: &str, name: &str, flags: &[&Flag]) -> Fail {
    let names = flags
        .iter()
        .flat_map(|f| std::iter::once(f.long).chain(f.short));
    match did_you_mean(name, names) {
        Some(s) => Fail::usage(format!(
            "unknown option {name} for execctl {who}; did you mean {s}?"
        )),
        None => Fail::usage(format!(
            "unknown option {name} for execctl {who}; see: execctl help {who}"
        )),
    }
}

/// The candidate closest to `typed`, if it is close enough to be a typo of it: at most
/// two edits (one in three characters), two letters swapped (`sp` for `ps`), or a word
/// that begins as the candidate does and goes elsewhere (`approvals` for `approve`: the
/// first five characters and three quarters of the candidate alike).
pub fn did_you_mean<'a>(typed: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let typed_len = typed.chars().count();
    let swapped = |c: &str| {
        let (mut a, mut b): (Vec<char>, Vec<char>) = (typed.chars().collect(), c.chars().collect());
        a.sort_unstable();
        b.sort_unstable();
        a == b
    };
    let same_start = |c: &str| {
        let shared = typed
            .chars()
            .zip(c.chars())
            .take_while(|(x, y)| x == y)
            .count();
        shared >= 5 && shared * 4 >= c.chars().count() * 3
    };
    candidates
        .map(|c| (edit_distance(typed, c), c))
        .filter(|&(d, c)| {
            let len = typed_len.max(c.chars().count());
            d > 0 && ((d <= 2 && d * 3 <= len) || (d == 1 && swapped(c)) || same_start(c))
        })
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Levenshtein distance with adjacent transpositions counted as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev2: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                cur[j] = cur[j].min(prev2[j - 2] + 1);
            }
        }
        prev2 = std::mem::replace(&mut prev, cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[Flag] = &[
        Flag {
            long: "--cwd",
            short: None,
            value: Some("DIR"),
            help: "",
        },
        Flag {
            long: "--env",
            short: Some("-e"),
            value: Some("K=V"),
            help: "",
        },
        Flag {
            long: "--detach",
            short: Some("-d"),
            value: None,
            help: "",
        },
        Flag {
            long: "--interactive",
            short: Some("-i"),
            value: None,
            help: "",
        },
    ];

    fn spec(stop: bool) -> Spec {
        Spec {
            name: "run",
            usage: "",
            about: "",
            details: "",
            flags: FLAGS,
            stop_at_operand: stop,
        }
    }

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_stop_at_the_first_operand() {
        let p = parse(
            &spec(true),
            &strings(&["--cwd", "/x", "echo", "--cwd", "/", "x"]),
        )
        .expect("parses");
        assert_eq!(p.value("--cwd"), Some("/x"));
        assert_eq!(p.operands, ["echo", "--cwd", "/", "x"]);
        let p = parse(&spec(true), &strings(&["git", "--help"])).expect("parses");
        assert!(!p.has("--help"));
        assert_eq!(p.operands, ["git", "--help"]);
    }

    #[test]
    fn values_groups_and_double_dash() {
        let p = parse(
            &spec(false),
            &strings(&["-e", "A=1", "--env=B=2", "-di", "x", "--", "-e"]),
        )
        .expect("parses");
        assert_eq!(p.values("--env"), ["A=1", "B=2"]);
        assert!(p.has("--detach") && p.has("--interactive"));
        assert_eq!(p.operands, ["x", "-e"]);
        assert!(parse(&spec(false), &strings(&["--cwd"])).is_err());
        assert!(parse(&spec(false), &strings(&["--detach=1"])).is_err());
    }

    #[test]
    fn typos_get_a_suggestion() {
        let e = parse(&spec(false), &strings(&["--cdw", "/"])).expect_err("unknown");
        assert!(e.message.contains("did you mean --cwd?"), "{}", e.message);
        let e = parse(&spec(false), &strings(&["--frobnicate"])).expect_err("unknown");
        assert!(!e.message.contains("did you mean"), "{}", e.message);
        assert_eq!(
            did_you_mean("sesions", ["sessions", "status"].into_iter()),
            Some("sessions")
        );
        assert_eq!(did_you_mean("xyz", ["ps", "run"].into_iter()), None);
        let commands = [
            "approve", "attach", "ps", "policy", "run", "shell", "status",
        ];
        assert_eq!(did_you_mean("sp", commands.into_iter()), Some("ps"));
        assert_eq!(
            did_you_mean("approvals", commands.into_iter()),
            Some("approve")
        );
        assert_eq!(did_you_mean("statistics", commands.into_iter()), None);
    }
}
