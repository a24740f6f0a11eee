//! execctl: the command-line client of execd. Thin: everything is in `execd::cli`.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(execd::cli::main(std::env::args_os().skip(1)))
}
