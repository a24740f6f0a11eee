//! `execctl completions bash|zsh|fish`: shell completion scripts printed from the command
//! table (`help`), so every flag a subcommand takes is completed.

use super::args::{Flag, Spec, GLOBAL};
use super::help::COMMANDS;

/// Subcommands that take a process id as their operand (completed from `execctl ps -q`).
const TAKES_IDS: &[&str] = &["write", "attach", "logs", "wait", "kill", "release"];

/// A completion script for `shell`.
pub fn script(shell: &str) -> Option<String> {
    match shell {
        "bash" => Some(bash()),
        "zsh" => Some(zsh()),
        "fish" => Some(fish()),
        _ => None,
    }
}

fn names(spec: &Spec) -> Vec<&'static str> {
    spec.flags
        .iter()
        .chain(GLOBAL)
        .flat_map(|f| std::iter::once(f.long).chain(f.short))
        .collect()
}

fn bash() -> String {
    let subs: Vec<&str> = COMMANDS.iter().map(|c| c.name).collect();
    let globals: Vec<&str> = GLOBAL
        .iter()
        .flat_map(|f| std::iter::once(f.long).chain(f.short))
        .collect();
    let mut cases = String::new();
    for c in COMMANDS {
        let mut words = names(c);
        match c.name {
            "sessions" => words.extend(["close", "prune"]),
            "policy" => words.extend(["check", "--policy", "--uid", "--gid"]),
            "completions" => words.extend(["bash", "zsh", "fish"]),
            "help" => words.extend(subs.iter().copied()),
            _ => {}
        }
        let ids = if TAKES_IDS.contains(&c.name) {
            " $(execctl ps -q 2>/dev/null)"
        } else {
            ""
        };
        cases.push_str(&format!(
            "        {}) words=\"{}{ids}\" ;;\n",
            c.name,
            words.join(" ")
        ));
    }
    let valued: Vec<&str> = super::help::ALL
        .iter()
        .flat_map(|s| s.flags.iter().chain(GLOBAL))
        .filter(|f| f.value.is_some())
        .flat_map(|f| std::iter::once(f.long).chain(f.short))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    format!(
        "# bash completion for execctl (execctl completions bash)\n\
_execctl() {{\n\
    local cur=\"${{COMP_WORDS[COMP_CWORD]}}\" prev=\"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
    local sub=\"\" i words\n\
    case \"$prev\" in\n\
        {valued}) return 0 ;;\n\
    esac\n\
    for ((i = 1; i < COMP_CWORD; i++)); do\n\
        case \"${{COMP_WORDS[i]}}\" in\n\
            --socket) ((i++)) ;;\n\
            -*) ;;\n\
            *) sub=\"${{COMP_WORDS[i]}}\"; break ;;\n\
        esac\n\
    done\n\
    case \"$sub\" in\n\
        \"\") words=\"{subs} {globals} --version -V\" ;;\n\
{cases}        *) return 0 ;;\n\
    esac\n\
    COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n\
}}\n\
complete -o default -F _execctl execctl\n",
        valued = valued.join("|"),
        subs = subs.join(" "),
        globals = globals.join(" "),
    )
}

/// Text safe inside single quotes and zsh's `[...]` descriptions.
fn zsh_text(s: &str) -> String {
    s.replace('\'', "'\\''")
        .replace('[', "(")
        .replace(']', ")")
        .replace(':', " -")
}

fn zsh() -> String {
    let mut s = String::from(
        "#compdef execctl\n# zsh completion for execctl (execctl completions zsh)\n\n\
_execctl_ids() {\n  local -a ids\n  ids=(${(f)\"$(execctl ps -q 2>/dev/null)\"})\n  compadd -a ids\n}\n\n\
_execctl() {\n  local -a cmds\n  cmds=(\n",
    );
    for c in COMMANDS {
        s.push_str(&format!("    '{}:{}'\n", c.name, zsh_text(c.about)));
    }
    s.push_str("  )\n  local i=2\n  while (( i < CURRENT )) && [[ ${words[i]} == -* ]]; do\n    [[ ${words[i]} == --socket ]] && (( i++ ))\n    (( i++ ))\n  done\n  if (( CURRENT <= i )); then\n    _describe 'command' cmds\n    return\n  fi\n  local sub=${words[i]}\n  case $sub in\n");
    for c in COMMANDS {
        let mut args: Vec<String> = Vec::new();
        for f in c.flags.iter().chain(GLOBAL) {
            let action = match f.value {
                None => String::new(),
                Some("DIR") => ":dir:_files -/".into(),
                Some("FILE" | "PATH") => ":file:_files".into(),
                Some(v) => format!(":{}:", v.to_lowercase()),
            };
            let spec_for = |name: &str| format!("'{name}[{}]{action}'", zsh_text(f.help));
            match f.short {
                Some(short) => {
                    args.push(spec_for(&format!("({short} {}){}", f.long, f.long)));
                    args.push(spec_for(&format!("({short} {}){short}", f.long)));
                }
                None => args.push(spec_for(f.long)),
            }
        }
        let rest = match c.name {
            "run" | "exec" | "policy" => "'*::command:_normal'",
            "completions" => "'1:shell:(bash zsh fish)'",
            "help" => "'1:command:_execctl_commands'",
            "sessions" => "'1:action:(close prune)'",
            n if TAKES_IDS.contains(&n) => "'*:id:_execctl_ids'",
            _ => "",
        };
        s.push_str(&format!(
            "    {})\n      _arguments -s \\\n        {} {rest} ;;\n",
            c.name,
            args.join(" \\\n        ")
        ));
    }
    s.push_str("  esac\n}\n\n_execctl_commands() {\n  compadd");
    for c in COMMANDS {
        s.push(' ');
        s.push_str(c.name);
    }
    s.push_str("\n}\n\n_execctl \"$@\"\n");
    s
}

fn fish() -> String {
    let mut s = String::from(
        "# fish completion for execctl (execctl completions fish)\ncomplete -c execctl -f\n",
    );
    let all: Vec<&str> = COMMANDS.iter().map(|c| c.name).collect();
    let q = |t: &str| t.replace('\\', "\\\\").replace('\'', "\\'");
    for f in GLOBAL {
        s.push_str(&fish_flag("", f, &q));
    }
    for c in COMMANDS {
        s.push_str(&format!(
            "complete -c execctl -n 'not __fish_seen_subcommand_from {}' -a {} -d '{}'\n",
            all.join(" "),
            c.name,
            q(c.about)
        ));
        let cond = format!("-n '__fish_seen_subcommand_from {}' ", c.name);
        for f in c.flags {
            s.push_str(&fish_flag(&cond, f, &q));
        }
        if TAKES_IDS.contains(&c.name) {
            s.push_str(&format!(
                "complete -c execctl {cond}-a '(execctl ps -q 2>/dev/null)'\n"
            ));
        }
    }
    s.push_str(
        "complete -c execctl -n '__fish_seen_subcommand_from completions' -a 'bash zsh fish'\n",
    );
    s.push_str("complete -c execctl -n '__fish_seen_subcommand_from sessions' -a 'close prune'\n");
    s.push_str("complete -c execctl -n '__fish_seen_subcommand_from policy' -a check\n");
    s
}

fn fish_flag(cond: &str, f: &Flag, q: &dyn Fn(&str) -> String) -> String {
    let mut line = format!("complete -c execctl {cond}-l {}", &f.long[2..]);
    if let Some(short) = f.short {
        line.push_str(&format!(" -s {}", &short[1..]));
    }
    match f.value {
        Some("DIR" | "FILE" | "PATH") => line.push_str(" -r -F"),
        Some(_) => line.push_str(" -r"),
        None => {}
    }
    line.push_str(&format!(" -d '{}'\n", q(f.help)));
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_completes_every_command() {
        for shell in ["bash", "zsh", "fish"] {
            let script = script(shell).expect("a script");
            for c in COMMANDS {
                assert!(script.contains(c.name), "{shell} lacks {}", c.name);
            }
        }
        assert!(script("tcsh").is_none());
    }
}
