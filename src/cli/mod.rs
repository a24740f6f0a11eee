//! execctl, the command-line client of execd: parse, hand over to a subcommand, print
//! its failure as one sentence and exit with docker's statuses.
//!
//! The rooms:
//! - `args`: the parser (options stop at a command's first operand; did you mean).
//! - `help`: the command table every subcommand, `--help` and `completions` come from.
//! - `errors`: `Fail`, the messages for daemon errors and the exit statuses.
//! - `output`: stdout/stderr, JSON, tables, the shared formats.
//! - `connect`: where the daemon is (`Host`, `-H`), the client's connection context
//!   (`Ctx`) and the one way to open a connection, paged listings, finding an id's family.
//! - `ssh`: `-H ssh://...`, a connection through the user's ssh to `execctl dial-stdio`
//!   on another host; `dial`: `dial-stdio` itself.
//! - `events`: the one reader of a command's output events (`run`, `exec`, `logs`).
//! - `run`: `run`, `exec`, `write` (a command in the foreground, its input and output);
//!   `foreground`: how such a command is ended (signals, timeouts, a closed stdout);
//!   `tty`: `run -t`, `exec -t` and `attach` (a PTY command on execctl's own terminal).
//! - One room per subcommand group: `ps`, `logs`, `wait`, `status`, `kill` (`kill`,
//!   `release`), `sessions`, `shell` (a shell session at the terminal; `shell_tty` when
//!   that is a terminal, raw), `policy` (`policy check`, `approve`).

mod args;
mod completions;
mod connect;
mod dial;
mod errors;
mod events;
mod foreground;
mod help;
mod kill;
mod logs;
mod mcp;
mod modes;
mod output;
mod policy;
mod ps;
mod run;
mod sessions;
mod shell;
mod shell_tty;
mod ssh;
mod status;
mod tty;
mod upgrade;
mod wait;

use std::ffi::OsString;

use serde_json::json;

use args::{Args, Spec};
use connect::{Ctx, Host};
use errors::{Fail, Res};

/// Runs execctl with its arguments (without the program name); returns the exit status.
pub fn main(argv: impl IntoIterator<Item = OsString>) -> u8 {
    match dispatch(argv) {
        Ok(code) => code,
        Err((f, json, verbose)) => {
            report(&f, json, verbose);
            f.code
        }
    }
}

/// Prints a failure on stderr: one line, or one JSON object with `--json`.
fn report(f: &Fail, json: bool, verbose: bool) {
    if f.message.is_empty() {
        return;
    }
    if json {
        let _ = output::write_stderr(format!("{}\n", output::json_line(&f.to_json())).as_bytes());
    } else {
        output::warn(&f.text(verbose));
    }
}

/// A failure, and whether `--json` and `--verbose` were known when it happened.
type Failed = (Fail, bool, bool);

fn dispatch(argv: impl IntoIterator<Item = OsString>) -> Result<u8, Failed> {
    let plain = |f: Fail| (f, false, false);
    let argv = args::utf8_args(argv).map_err(plain)?;
    let (globals, rest) = leading_globals(&argv).map_err(plain)?;
    let (json, verbose) = (globals.has("--json"), globals.has("--verbose"));
    let fail = |f: Fail| (f, json, verbose);
    if globals.has("--help") {
        output::print(&help::usage()).map_err(fail)?;
        return Ok(0);
    }
    if globals.has("--version") {
        output::print(&format!("execctl {}\n", env!("CARGO_PKG_VERSION"))).map_err(fail)?;
        return Ok(0);
    }
    let Some((name, rest)) = rest.split_first() else {
        // The usage is the message; nothing more to say.
        let _ = output::write_stderr(help::usage().as_bytes());
        return Err(fail(Fail::usage("")));
    };
    let (spec, rest) = find_spec(name, rest).map_err(fail)?;
    let (shorthand, rest) = if spec.name == "kill" {
        kill::signal_shorthand(rest)
    } else {
        (None, rest.to_vec())
    };
    let mut p = args::parse(spec, &rest).map_err(fail)?;
    p.absorb(globals);
    let (json, verbose) = (p.has("--json"), p.has("--verbose"));
    let failed = |f: Fail| (f, json, verbose);
    if p.has("--help") {
        output::print(&help::help_of(spec)).map_err(failed)?;
        return Ok(0);
    }
    // dial-stdio is what an ssh login runs on the daemon's own host: it never follows
    // EXECD_HOST elsewhere.
    let (host, tried) = Host::resolve(
        p.value("--host"),
        p.value("--socket"),
        &|k| std::env::var(k).ok(),
        spec.name != "dial-stdio",
        &crate::config::default_socket_candidates,
    )
    .map_err(failed)?;
    let ctx = Ctx {
        host,
        tried,
        json,
        verbose,
    };
    run(spec, &ctx, &p, shorthand).map_err(failed)
}

/// The global options before the subcommand, and what follows them.
fn leading_globals(argv: &[String]) -> Res<(Args, &[String])> {
    let mut p = Args::default();
    let mut i = 0;
    while let Some(a) = argv.get(i) {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        match name {
            "-h" | "--help" => p.set("--help", None),
            "-V" | "--version" => p.set("--version", None),
            "--json" => p.set("--json", None),
            "-v" | "--verbose" => p.set("--verbose", None),
            "--socket" | "--host" | "-H" => {
                let long = if name == "--socket" {
                    "--socket"
                } else {
                    "--host"
                };
                let v = match inline {
                    Some(v) => v,
                    None => {
                        i += 1;
                        argv.get(i).cloned().ok_or_else(|| {
                            let meta = if long == "--socket" { "PATH" } else { "URL" };
                            Fail::usage(format!("{name} needs a value ({meta})"))
                        })?
                    }
                };
                p.set(long, Some(v));
            }
            n if n.starts_with('-') && n != "-" => {
                let known = args::GLOBAL
                    .iter()
                    .flat_map(|f| std::iter::once(f.long).chain(f.short))
                    .chain(["--version", "-V"]);
                let hint = match args::did_you_mean(n, known) {
                    Some(s) => format!("did you mean {s}?"),
                    None => "options of a command go after its name (execctl run --cwd DIR ...)"
                        .to_string(),
                };
                return Err(Fail::usage(format!("unknown option {n}; {hint}")));
            }
            _ => break,
        }
        i += 1;
    }
    Ok((p, &argv[i..]))
}

/// The spec of the subcommand named `name` (two words for `sessions close` and the
/// like), with the arguments that follow it.
fn find_spec<'a>(name: &str, rest: &'a [String]) -> Res<(&'static Spec, &'a [String])> {
    let second = rest.first().map(String::as_str);
    let two = |sub: &str| help::spec(&format!("{name} {sub}"));
    match (name, second) {
        ("sessions", Some("list" | "ls")) => return Ok((&help::SESSIONS, &rest[1..])),
        ("sessions", Some(s @ ("close" | "prune"))) | ("policy", Some(s @ "check")) => {
            if let Some(spec) = two(s) {
                return Ok((spec, &rest[1..]));
            }
        }
        ("policy", Some(s)) if !s.starts_with('-') => {
            let hint = args::did_you_mean(s, ["check"].into_iter())
                .map(|c| format!("did you mean {c}?"))
                .unwrap_or_else(|| "use: execctl policy check ...".into());
            return Err(Fail::usage(format!("unknown policy action {s:?}; {hint}")));
        }
        _ => {}
    }
    if let Some(spec) = help::COMMANDS.iter().copied().find(|s| s.name == name) {
        return Ok((spec, rest));
    }
    let names = help::COMMANDS.iter().map(|s| s.name);
    Err(match args::did_you_mean(name, names) {
        Some(s) => Fail::usage(format!("unknown command {name:?}; did you mean {s}?")),
        None => Fail::usage(format!(
            "unknown command {name:?}; see the list with: execctl help"
        )),
    })
}

/// Runs one parsed subcommand.
fn run(spec: &Spec, ctx: &Ctx, p: &Args, shorthand: Option<String>) -> Res<u8> {
    match spec.name {
        "run" => run::run(ctx, p),
        "exec" => run::exec(ctx, p),
        "write" => run::write(ctx, p),
        "attach" => tty::attach(ctx, p),
        "ps" => ps::ps(ctx, p),
        "logs" => logs::logs(ctx, p),
        "wait" => wait::wait(ctx, p),
        "status" => status::status(ctx, p),
        "upgrade" => upgrade::upgrade(ctx, p),
        "kill" => kill::kill(ctx, p, shorthand),
        "release" => kill::release(ctx, p),
        "sessions" => sessions::list(ctx, p),
        "sessions close" => sessions::close(ctx, p),
        "sessions prune" => sessions::prune(ctx, p),
        "shell" => shell::shell(ctx, p),
        "policy check" => policy::check(ctx, p),
        "policy" => Err(Fail::usage(
            "policy needs an action: execctl policy check [--policy FILE] -- COMMAND...",
        )),
        "approve" => policy::approve(ctx, p),
        "call" => call(ctx, p),
        "dial-stdio" => dial::dial_stdio(ctx, p),
        "mcp" => mcp::mcp(ctx, p),
        "help" => help_cmd(p),
        "completions" => completions(p),
        other => Err(Fail::usage(format!("unknown command {other:?}"))),
    }
}

/// `execctl help [COMMAND]`.
fn help_cmd(p: &Args) -> Res<u8> {
    if p.operands.is_empty() {
        output::print(&help::usage())?;
        return Ok(0);
    }
    let name = p.operands.join(" ");
    match help::spec(&name) {
        Some(spec) => {
            output::print(&help::help_of(spec))?;
            Ok(0)
        }
        None => {
            let names = help::ALL.iter().map(|s| s.name);
            Err(match args::did_you_mean(&name, names) {
                Some(s) => Fail::usage(format!("no command {name:?}; did you mean {s}?")),
                None => Fail::usage(format!(
                    "no command {name:?}; see the list with: execctl help"
                )),
            })
        }
    }
}

/// `execctl completions bash|zsh|fish`.
fn completions(p: &Args) -> Res<u8> {
    let shell = match p.operands.as_slice() {
        [s] => s.as_str(),
        _ => {
            return Err(Fail::usage(
                "completions needs one shell: execctl completions bash|zsh|fish",
            ))
        }
    };
    match completions::script(shell) {
        Some(script) => {
            output::print(&script)?;
            Ok(0)
        }
        None => Err(Fail::usage(format!(
            "no completions for {shell:?}; execctl has them for bash, zsh and fish"
        ))),
    }
}

/// `execctl call METHOD [JSON]`: the raw tool; its errors keep their code and data.
fn call(ctx: &Ctx, p: &Args) -> Res<u8> {
    let (method, params) = match p.operands.as_slice() {
        [m] => (m.as_str(), json!({})),
        [m, text] => (
            m.as_str(),
            serde_json::from_str(text).map_err(|e| {
                Fail::usage(format!(
                    "the params are not JSON ({e}); quote them: '{{\"k\": 1}}'"
                ))
            })?,
        ),
        _ => {
            return Err(Fail::usage(
                "call takes METHOD and at most one JSON argument",
            ))
        }
    };
    let mut c = ctx.connect()?;
    match c.call(method, params) {
        Ok(r) => {
            output::print_json(&r)?;
            Ok(0)
        }
        Err(e) => {
            let mut f = Fail::from(e);
            if let Some(r) = &f.rpc {
                // The raw tool shows the raw error (-v has nothing to add to it).
                let data = r.data.as_ref().map(|d| format!(" {d}")).unwrap_or_default();
                f.message = format!("execd answered error {}: {}{data}", r.code, r.message);
            }
            Err(f)
        }
    }
}
