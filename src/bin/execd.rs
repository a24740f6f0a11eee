//! execd: flags -> Config -> server::run(), or `--resume-from` -> the state an upgrade in
//! place carried -> server::run().

use std::ffi::OsString;
use std::process::ExitCode;

use execd::config::{flags_to_keep, parse_args, started_as, Invocation, USAGE};
use execd::server::{
    handed_back_flags, reader_main, refuse_unparsed, upgrade_check_line, Server, READER_FLAG,
};

fn main() -> ExitCode {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    let argv0 = if argv.is_empty() {
        OsString::new()
    } else {
        argv.remove(0)
    };
    // The daemon's off-loop reader: a process of its own, with nothing else to parse.
    if argv.len() == 1 && argv[0] == READER_FLAG {
        return ExitCode::from(reader_main().clamp(0, 255) as u8);
    }
    let resume_from = argv
        .iter()
        .position(|a| a == "--resume-from")
        .and_then(|i| argv.get(i + 1)?.to_str()?.parse::<i32>().ok());
    // An image handed its own state back by a new one that refused it takes the flags it
    // was started with from that state (PROTOCOL 13).
    if let Some(flags) = resume_from.and_then(handed_back_flags) {
        argv = flags;
    }
    let args: Result<Vec<String>, _> = argv.iter().map(|a| a.clone().into_string()).collect();
    let Ok(args) = args else {
        eprintln!("execd: arguments must be UTF-8");
        return ExitCode::from(2);
    };
    let invocation = match parse_args(args) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("execd: {e}");
            // A new image given an upgrade's state with flags it does not take hands the
            // state back to the old one, which resumes.
            if let Some(fd) = resume_from {
                let e = refuse_unparsed(fd, &e);
                eprintln!("execd: cannot resume after an upgrade: {e}");
                return ExitCode::FAILURE;
            }
            return ExitCode::from(2);
        }
    };
    let mut cfg = match invocation {
        Invocation::Help => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Invocation::Version => {
            println!("execd {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Invocation::PrintUnit(text) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Invocation::UpgradeCheck => {
            println!("{}", upgrade_check_line());
            return ExitCode::SUCCESS;
        }
        Invocation::CheckPolicy(path) => {
            return match execd::policy::Policy::load(&path) {
                Ok(p) => {
                    println!(
                        "{}: {} {}, every example agrees with its rule",
                        path.display(),
                        p.rule_count(),
                        if p.rule_count() == 1 { "rule" } else { "rules" }
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("execd: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Invocation::Run(cfg) => cfg,
    };
    // What an upgrade executes next, and with which flags (PROTOCOL 13).
    cfg.binary = started_as(&argv0).or_else(|| std::env::current_exe().ok());
    cfg.args = flags_to_keep(&argv);
    let resuming = cfg.resume_from.is_some();
    let server = if resuming {
        Server::resume(*cfg)
    } else {
        Server::new(*cfg)
    };
    let server = match server {
        Ok(s) => s,
        Err(e) if resuming => {
            eprintln!("execd: cannot resume after an upgrade: {e}");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("execd: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("execd: event loop failed: {e}");
            ExitCode::FAILURE
        }
    }
}
