//! The command table: every subcommand, its flags and its help, declared once. `--help`,
//! `execctl help [CMD]` and `execctl completions bash|zsh|fish` are all printed from it,
//! so a flag added here is parsed, documented and completed alike.

use super::args::{Flag, Spec, GLOBAL};

const fn flag(
    long: &'static str,
    short: Option<&'static str>,
    value: Option<&'static str>,
    help: &'static str,
) -> Flag {
    Flag {
        long,
        short,
        value,
        help,
    }
}

const CWD: Flag = flag(
    "--cwd",
    Some("-w"),
    Some("DIR"),
    "working directory (default: execctl's own; with -H ssh://, the remote daemon's)",
);
const SANDBOX: Flag = flag(
    "--sandbox",
    None,
    Some("SPEC"),
    "run in this sandbox, within the daemon's: workspace, read-only, a JSON object or a \
     file holding one; wider asks an approver",
);
const ENV: Flag = flag(
    "--env",
    Some("-e"),
    Some("K=V|K"),
    "set a variable; K alone copies execctl's value (repeatable)",
);
const ENV_FILE: Flag = flag(
    "--env-file",
    None,
    Some("FILE"),
    "read K=V lines (and # comments) from FILE (repeatable)",
);
const TIMEOUT: Flag = flag(
    "--timeout",
    None,
    Some("SECS"),
    "kill the command after SECS (5, 1.5, 500ms, 2m, 1h) and exit 124; 0: no limit",
);
const DETACH: Flag = flag(
    "--detach",
    Some("-d"),
    None,
    "start it in the background and print its id",
);
const INTERACTIVE: Flag = flag(
    "--interactive",
    Some("-i"),
    None,
    "forward stdin even from a terminal; with -d, keep it open for execctl write",
);

const TTY: Flag = flag(
    "--tty",
    Some("-t"),
    None,
    "give the command a PTY and your terminal (raw mode) until it ends or you detach",
);
const DETACH_KEYS: Flag = flag(
    "--detach-keys",
    None,
    Some("KEYS"),
    "keys that detach from a -t command (default ctrl-p,ctrl-q; \"\": none)",
);

/// `execctl run`.
pub const RUN: Spec = Spec {
    name: "run",
    usage: "[OPTIONS] [--] COMMAND [ARGS...]",
    about: "run a command, stream its output, exit with its status",
    details: "\
Runs COMMAND with ARGS (no shell) in a terminal of execd: stdout and stderr merged in
the order written, streamed to execctl's stdout byte for byte as they come. Options
stop at COMMAND: `execctl run ls -l` passes -l to ls. A single operand that is not a
plain word is run by the daemon's shell (`execctl run 'ls | wc -l'`).

stdin is forwarded to the command when it is not a terminal (or with -i), and closed at
its end; otherwise the command's stdin is empty. A --detach'ed command's stdin is closed,
or with -d -i left open for execctl write. Ctrl-C, a hang-up or SIGTERM is passed on to
the command (SIGINT, SIGHUP, SIGTERM), which may handle it; one that outlives a hang-up
or SIGTERM by the daemon's grace gets SIGKILL, and so does one still in the grace of a
first signal when a second comes. execctl's own end, even by SIGKILL, kills it; a
--detach'ed one runs on. The command gets the daemon's environment with -e and
--env-file on top (-e PATH hands over yours).

-t runs it on a PTY sized like your terminal, which goes to raw mode: every key goes to
the program (Ctrl-C too), its output comes back as written, and resizes follow. The
detach keys (Ctrl-P Ctrl-Q) leave it running: execctl attach ID comes back (and so
does a -t command outlive an execctl killed with SIGKILL). Exit status: the command's
(128+N for signal N); 124 after --timeout; 127 command not found; 126 not executable;
125 execctl's or the daemon's error (-t without a terminal included), or output lost
(a warning says how much).",
    flags: &[
        CWD,
        SANDBOX,
        ENV,
        ENV_FILE,
        TIMEOUT,
        DETACH,
        INTERACTIVE,
        TTY,
        DETACH_KEYS,
        flag(
            "--limit",
            None,
            Some("BYTES"),
            "output the daemon retains for logs (4M, 64K; default: the daemon's)",
        ),
    ],
    stop_at_operand: true,
};

/// `execctl exec`.
pub const EXEC: Spec = Spec {
    name: "exec",
    usage: "[OPTIONS] [--] 'SHELL LINE'",
    about: "run a shell line; stdout and stderr apart, exit with its status",
    details: "\
Runs the line as `SHELL -c LINE` through bash/exec. The command's stdout and stderr go
to execctl's, byte for byte, as they come. Several operands are joined with spaces
into one line. Options stop at the first operand.

Without --session, a session is made for the one command and closed when it is done.
stdin, signals, -t, --timeout, --detach and the exit status work as for run. --wait SECS
returns after SECS with the command still running (its id on stderr, exit 0).",
    flags: &[
        flag(
            "--session",
            None,
            Some("ID"),
            "run in this bash session (created if new)",
        ),
        CWD,
        SANDBOX,
        ENV,
        ENV_FILE,
        TIMEOUT,
        flag(
            "--hard-timeout",
            None,
            Some("SECS"),
            "the same as --timeout",
        ),
        flag(
            "--wait",
            None,
            Some("SECS"),
            "stop following after SECS; the command runs on (exit 0)",
        ),
        DETACH,
        flag("--async", None, None, "the same as --detach"),
        INTERACTIVE,
        TTY,
        DETACH_KEYS,
    ],
    stop_at_operand: true,
};

/// `execctl write`.
pub const WRITE: Spec = Spec {
    name: "write",
    usage: "[--eof] ID [TEXT]",
    about: "write to the stdin of a running command",
    details: "\
Writes TEXT as given (no newline added), or, without TEXT, execctl's stdin up to its
end, to the stdin of terminal or bash command ID. --eof then closes the command's
stdin. A terminal has a stdin only when it was started with one (execctl run -i, or a
piped stdin).",
    flags: &[flag(
        "--eof",
        None,
        None,
        "close the command's stdin after writing",
    )],
    stop_at_operand: false,
};

/// `execctl attach`.
pub const ATTACH: Spec = Spec {
    name: "attach",
    usage: "[--detach-keys KEYS] ID",
    about: "put a command started with -t back on your terminal",
    details: "\
Shows the current screen of terminal or bash command ID (started with run -t or exec
-t), then its live output; your keys go to it and your terminal's size becomes its
size. The detach keys (Ctrl-P Ctrl-Q) leave again with the command running, and so do
SIGINT, SIGHUP and SIGTERM sent to execctl (exit 128+N): attach never ends what it did
not start. When the command exits, so does attach, with its status. A command without
a terminal is an error (125): follow it with execctl logs -f ID.",
    flags: &[DETACH_KEYS],
    stop_at_operand: false,
};

/// `execctl ps`.
pub const PS: Spec = Spec {
    name: "ps",
    usage: "[--running] [--session ID] [-l] [-q] [--json]",
    about: "list processes, newest first",
    details: "\
One row per terminal and bash command, newest first: ID, SESSION, PID, STATE (running,
exited, killed, timed_out), EXIT (code or signal), AGE, DURATION and COMMAND (arguments
quoted as a shell would need). Rows are cut to the terminal's width. -l adds SANDBOX:
the sandbox each runs in (workspace:/its/workspace, read-only, custom, off).",
    flags: &[
        flag("--running", None, None, "only running commands"),
        flag(
            "--long",
            Some("-l"),
            None,
            "also show each command's sandbox",
        ),
        flag(
            "--session",
            None,
            Some("ID"),
            "only commands of this session",
        ),
        flag("--quiet", Some("-q"), None, "print ids only, one a line"),
    ],
    stop_at_operand: false,
};

/// `execctl logs`.
pub const LOGS: Spec = Spec {
    name: "logs",
    usage: "[-f] [--tail N] [--stderr] ID",
    about: "print a process's output",
    details: "\
Prints the output execd still holds for terminal or bash command ID: a terminal's
merged output on stdout, a bash command's stdout and stderr on execctl's own. When the
oldest output is no longer held, a line on stderr says how many bytes are missing.
-f then follows the output live, losing nothing, until the command exits.",
    flags: &[
        flag(
            "--follow",
            Some("-f"),
            None,
            "follow live output until the command exits",
        ),
        flag(
            "--tail",
            None,
            Some("N"),
            "only the last N lines (of each stream)",
        ),
        flag("--stderr", None, None, "only stderr (bash commands)"),
    ],
    stop_at_operand: false,
};

/// `execctl wait`.
pub const WAIT: Spec = Spec {
    name: "wait",
    usage: "ID",
    about: "wait for a process to exit; exit with its status",
    details: "\
Waits until terminal or bash command ID exits and exits with its status (128+N when
signal N ended it; 124 when a hard timeout did).",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl kill`.
pub const KILL: Spec = Spec {
    name: "kill",
    usage: "[-s SIGNAL | -SIGNAL] ID...",
    about: "stop processes (SIGTERM, then SIGKILL)",
    details: "\
Without a signal, each command gets SIGTERM and, if it outlives the daemon's grace,
SIGKILL; execctl says which ended it. -s SIGNAL (or -9, -KILL, -s 9, -s SIGKILL) sends
that one signal instead: TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP or CONT. A
command that had already exited is reported, not an error.",
    flags: &[flag(
        "--signal",
        Some("-s"),
        Some("SIGNAL"),
        "send this signal only",
    )],
    stop_at_operand: false,
};

/// `execctl release`.
pub const RELEASE: Spec = Spec {
    name: "release",
    usage: "ID...",
    about: "kill if running and forget terminals",
    details: "Kills each terminal if it still runs and forgets it, with its output.",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl shell`.
pub const SHELL: Spec = Spec {
    name: "shell",
    usage: "[ID] [--cwd DIR] [--sandbox SPEC]",
    about: "a shell session at your terminal, line by line",
    details: "\
Opens the shell session ID (a new one without ID, in --cwd or your directory) and runs
each line you type in it as a command: state (cd, export, functions) persists from line
to line, and every line passes the daemon's policy. While a command runs, a line goes to
it as input, and Ctrl-C interrupts it; at the prompt Ctrl-D leaves, and the session stays
(execctl shell ID returns to it; execctl sessions close ID ends it). From a pipe, each
line runs to its end before the next, and execctl exits with the last exit code.
Line mode: keys are not sent one by one, so a program that echoes what it reads shows
a line twice, and full-screen programs are not for it. A new session's --sandbox is
its own for good: every line of it runs in it.",
    flags: &[CWD, SANDBOX],
    stop_at_operand: false,
};

/// `execctl sessions`.
pub const SESSIONS: Spec = Spec {
    name: "sessions",
    usage: "[--json]",
    about: "list bash and shell sessions (sessions close ID..., sessions prune)",
    details: "\
Lists your bash and shell sessions: SESSION, KIND, COMMANDS, AGE, IDLE, DIR, RUNNING.
  execctl sessions close ID...   close sessions, killing what runs in them
  execctl sessions prune         close every session with no running command",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl sessions close`.
pub const SESSIONS_CLOSE: Spec = Spec {
    name: "sessions close",
    usage: "ID...",
    about: "close bash or shell sessions",
    details: "Closes each session, killing its running commands (a shell's whole tree).",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl sessions prune`.
pub const SESSIONS_PRUNE: Spec = Spec {
    name: "sessions prune",
    usage: "",
    about: "close every idle bash or shell session",
    details: "Closes every session of yours that has no running command, and names them.",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl status`.
pub const STATUS: Spec = Spec {
    name: "status",
    usage: "[--json] [--path]",
    about: "daemon version, uptime, counts and limits",
    details: "\
The daemon's version, pid, socket and uptime; your processes and sessions; clients;
output memory; and its limits, sizes and durations written as its flags take them.
--path prints only the socket's path, once the daemon answered there, for other
clients: socat - UNIX-CONNECT:\"$(execctl status --path)\".",
    flags: &[flag(
        "--path",
        None,
        None,
        "print only the path of the socket the daemon answered on",
    )],
    stop_at_operand: false,
};

/// `execctl upgrade`.
pub const UPGRADE: Spec = Spec {
    name: "upgrade",
    usage: "[--binary PATH] [--json]",
    about: "upgrade the daemon in place, keeping every command and connection",
    details: "\
Asks execd to execute a new binary in its own process (execd(8)): every command,
its output, every connection and every waiting request carries over; clients see a
pause, not a disconnect. The binary is PATH, else the path execd was started as (where
a package manager put the new version). The new binary is asked first (--upgrade-check)
and must take the daemon's state; otherwise nothing changes. Prints one line once the
new image serves (exit 0), or the reason it was refused (exit 1). Only execd's own
user and root may upgrade it. The same as: kill -USR2 $(pidof execd), or under systemd:
systemctl kill -s USR2 execd.",
    flags: &[flag(
        "--binary",
        None,
        Some("PATH"),
        "the new execd (default: the path execd was started as)",
    )],
    stop_at_operand: false,
};

/// `execctl call`.
pub const CALL: Spec = Spec {
    name: "call",
    usage: "METHOD [JSON]",
    about: "send one raw JSON-RPC request",
    details: "\
Sends METHOD with JSON as its params (default {}) and prints the result. An error is
printed with its code and data (exit 125).",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl dial-stdio`.
pub const DIAL_STDIO: Spec = Spec {
    name: "dial-stdio",
    usage: "[--socket PATH]",
    about: "relay stdin and stdout to the daemon's socket (a transport for ssh)",
    details: "\
Copies standard input to the daemon's socket and the socket to standard output, as it
comes. stdin's end half-closes the socket (the daemon answers what it got, then closes);
the daemon's end ends dial-stdio. Any JSON-RPC or HTTP client can reach a daemon through
it, e.g. over ssh HOST execctl dial-stdio, which is what execctl -H ssh://HOST runs.
It never follows $EXECD_HOST. Exits 0 once the daemon closed normally, 125 when it
cannot be reached or does not let this user in.",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl mcp`.
pub const MCP: Spec = Spec {
    name: "mcp",
    usage: "[--cwd DIR] [--sandbox S] [--max-output-bytes N]",
    about: "an MCP server on stdio: an agent's tools run through the daemon",
    details: "\
Serves the Model Context Protocol on stdin and stdout (one JSON-RPC message a line) for
an agent that takes its tools from MCP servers (claude mcp add execd -- execctl mcp).
Tools: run (a shell line, in one bash session of this process), read, write, kill, list,
shell and shell_view (a shell session whose cd and exports persist). Every call passes
the daemon's policy, approvals, audit and limits: a denied line is a tool error naming
the rule; one waiting for approval says so (execctl approve answers it). Commands die
when the client closes stdin, except those run with background: true. --cwd, --sandbox
and --max-output-bytes are ceilings the model cannot lift. A daemon it cannot reach is
one line on stderr, exit 1. See execctl(1).",
    flags: &[
        flag(
            "--cwd",
            Some("-w"),
            Some("DIR"),
            "calls run here, or in a directory inside it they name (default: execctl's own)",
        ),
        flag(
            "--sandbox",
            None,
            Some("S"),
            "the most a call may get: workspace, read-only, off, a JSON object or a file",
        ),
        flag(
            "--max-output-bytes",
            None,
            Some("N"),
            "most output a call answers with, head and tail kept (default 30000)",
        ),
    ],
    stop_at_operand: false,
};

/// The flags of `policy check`, which `policy --help` shows too.
const POLICY_CHECK_FLAGS: &[Flag] = &[
    flag(
        "--policy",
        None,
        Some("FILE"),
        "judge with this policy file instead of the daemon's",
    ),
    flag(
        "--uid",
        None,
        Some("N"),
        "judge as this user (default: yours)",
    ),
    flag(
        "--gid",
        None,
        Some("N"),
        "with --policy: a group of that user (repeatable; default: yours)",
    ),
];

/// `execctl policy`: the group's help is its one action's, with what the policy is.
pub const POLICY: Spec = Spec {
    name: "policy",
    usage: "check [OPTIONS] [--] COMMAND... | 'SHELL LINE'",
    about: "check what the policy decides (policy check)",
    details: "\
execd's policy (execd --policy FILE; rules in execd-protocol(7)) allows, asks about or
denies each command before it starts. An ask waits for an approver: execctl approve.

  execctl policy check [OPTIONS] [--] COMMAND... | 'SHELL LINE'

judges a command as execd would before starting it: several operands are one argv (a
direct command), a single operand is a shell line. It prints the decision (allow, ask
or deny), the deciding rule and every rule that matched. With --policy FILE it reads the
file (offline; the file is checked as execd checks it); without, it asks the running
daemon. Options stop at the first operand. Example:
  execctl policy check --policy ./policy.json -- git push -f origin main",
    flags: POLICY_CHECK_FLAGS,
    stop_at_operand: true,
};

/// `execctl policy check`.
pub const POLICY_CHECK: Spec = Spec {
    name: "policy check",
    usage: "[--policy FILE] [--uid N] [--gid N] [--] COMMAND... | 'SHELL LINE'",
    about: "print the policy's decision and every rule that matched",
    details: "\
Judges a command as execd would before starting it: several operands are one argv
(a direct command), a single operand is a shell line. Prints the decision (allow, ask
or deny), the deciding rule and every rule that matched. With --policy FILE it reads
the file (offline; the file is checked as execd checks it); without, it asks the
running daemon. Options stop at the first operand.",
    flags: POLICY_CHECK_FLAGS,
    stop_at_operand: true,
};

/// `execctl approve`.
pub const APPROVE: Spec = Spec {
    name: "approve",
    usage: "[--json]",
    about: "answer approval requests of the policy",
    details: "\
Becomes an approver: shows each command the policy asks about (id, user, directory,
session, command, rule and justification) and asks [y]es / [n]o / [s]ession (approve
this rule for the rest of the session). With --json, stdout is JSON lines ({\"type\":
\"ready\"} once subscribed, then each request, and each request settled) and answers are
JSON lines on stdin:
  {\"request_id\": \"appr_7\", \"response\": \"approve\"|\"approve_for_session\"|\"reject\", \"feedback\": \"...\"}
It runs until interrupted or until its stdin ends.",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl help`.
pub const HELP: Spec = Spec {
    name: "help",
    usage: "[COMMAND]",
    about: "print help for execctl or one command",
    details: "Prints the help of COMMAND (e.g. execctl help run), or the command list.",
    flags: &[],
    stop_at_operand: false,
};

/// `execctl completions`.
pub const COMPLETIONS: Spec = Spec {
    name: "completions",
    usage: "bash|zsh|fish",
    about: "print a shell completion script",
    details: "\
Prints a completion script. bash: execctl completions bash > /etc/bash_completion.d/execctl
zsh: execctl completions zsh > \"${fpath[1]}/_execctl\"
fish: execctl completions fish > ~/.config/fish/completions/execctl.fish",
    flags: &[],
    stop_at_operand: false,
};

/// Every subcommand as the command list shows it.
pub const COMMANDS: &[&Spec] = &[
    &RUN,
    &EXEC,
    &WRITE,
    &ATTACH,
    &PS,
    &LOGS,
    &WAIT,
    &KILL,
    &RELEASE,
    &SESSIONS,
    &SHELL,
    &STATUS,
    &UPGRADE,
    &POLICY,
    &APPROVE,
    &CALL,
    &DIAL_STDIO,
    &MCP,
    &HELP,
    &COMPLETIONS,
];

/// Every spec, the two-word ones included.
pub const ALL: &[&Spec] = &[
    &RUN,
    &EXEC,
    &WRITE,
    &ATTACH,
    &PS,
    &LOGS,
    &WAIT,
    &KILL,
    &RELEASE,
    &SESSIONS,
    &SESSIONS_CLOSE,
    &SESSIONS_PRUNE,
    &SHELL,
    &STATUS,
    &UPGRADE,
    &POLICY,
    &POLICY_CHECK,
    &APPROVE,
    &CALL,
    &DIAL_STDIO,
    &MCP,
    &HELP,
    &COMPLETIONS,
];

/// The spec named `name` (`"run"`, `"sessions close"`).
pub fn spec(name: &str) -> Option<&'static Spec> {
    ALL.iter().copied().find(|s| s.name == name)
}

/// The top-level help.
pub fn usage() -> String {
    let mut s = String::from(
        "usage: execctl [-H URL | --socket PATH] [--json] [--verbose] COMMAND [ARGS...]\n\n\
         Runs and manages commands through a running execd. The daemon is, in order:\n\
         \x20 -H ssh://[USER@]HOST[:PORT][/SOCKET]  on another host, through your ssh\n\
         \x20 -H unix:///PATH or --socket PATH       a socket here\n\
         \x20 $EXECD_HOST                            a URL as -H takes\n\
         \x20 $EXECD_SOCKET                          a socket here\n\
         \x20 $XDG_RUNTIME_DIR/execd.sock, /run/user/$UID/execd.sock (yours),\n\
         \x20 /run/execd.sock (root), /tmp/execd-$UID/execd.sock: the first\n\
         \x20 with a daemon, as execd picks its own; one of another uid is refused\n\
         Commands run in the daemon's environment with -e/--env-file on top. See execctl(1).\n\n\
         commands:\n",
    );
    for c in COMMANDS {
        s.push_str(&format!("  {:<12}{}\n", c.name, c.about));
    }
    s.push_str("\nglobal options:\n");
    flag_lines(&mut s, GLOBAL.iter());
    s.push_str("  -V, --version       print execctl's version\n");
    s.push_str(
        "\nexit status: the command's for run, exec and wait; 124 timeout; 125 execctl or\n\
         daemon error (usage included); 126 cannot execute; 127 command not found.\n\
         execctl help COMMAND tells more.\n",
    );
    s
}

fn flag_lines<'a>(s: &mut String, flags: impl Iterator<Item = &'a Flag>) {
    for f in flags {
        let mut names = match f.short {
            Some(short) => format!("{short}, {}", f.long),
            None => format!("    {}", f.long),
        };
        if let Some(v) = f.value {
            names.push(' ');
            names.push_str(v);
        }
        if names.len() <= 18 {
            s.push_str(&format!("  {names:<18}  {}\n", f.help));
        } else {
            s.push_str(&format!("  {names}\n  {:<18}  {}\n", "", f.help));
        }
    }
}

/// The help of one subcommand.
pub fn help_of(spec: &Spec) -> String {
    let mut s = format!("usage: execctl {} {}\n\n", spec.name, spec.usage);
    s.push_str(spec.about);
    s.push_str(".\n\n");
    s.push_str(spec.details);
    s.push_str("\n\noptions:\n");
    flag_lines(&mut s, spec.flags.iter().chain(GLOBAL));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_has_help_and_no_flag_twice() {
        for s in ALL {
            let h = help_of(s);
            assert!(h.starts_with(&format!("usage: execctl {}", s.name)));
            let mut seen = std::collections::HashSet::new();
            for f in s.flags.iter().chain(GLOBAL) {
                assert!(seen.insert(f.long), "{} twice in {}", f.long, s.name);
                if let Some(short) = f.short {
                    assert!(seen.insert(short), "{short} twice in {}", s.name);
                }
            }
        }
    }
}
