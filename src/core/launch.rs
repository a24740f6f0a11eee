//! What a method family asks to start: the one `LaunchRequest` that policy, audit and the
//! spawner all read, and the validation every family applies to its parts (environment,
//! working directory, the plain-word rule for running without a shell).
//!
//! A family builds a `LaunchRequest` from its params and returns it as `Step::Launch`; the
//! loop then gates it, spawns it, and hands the new process to the family's `After` tail.
//! A family never spawns anything itself.

use std::path::PathBuf;

use crate::core::table::{ConnId, Family, Key, Peer, SubOpts};
use crate::core::vocab::After;
use crate::policy::sandbox::{Given, Partial};
use crate::types::CgroupLimits;
use crate::types::Program;
use crate::types::{Stdio3, WinSize};
use crate::wire::rpc::{Params, RpcError};

/// Everything about one command to start, and who asks.
#[derive(Debug, Clone)]
pub struct LaunchRequest {
    pub family: Family,
    /// The peer asking; the command is owned by `peer.uid`.
    pub peer: Peer,
    pub program: Program,
    /// What the client asked to run, for listings, logs and approvals.
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// The request field that named `cwd` (`cwd`, `exec_dir`): a directory that turns out
    /// not to exist when the command starts is `-32602` naming it.
    pub cwd_field: &'static str,
    pub stdio: Stdio3,
    pub ring_capacity: usize,
    /// `term` or `cmd`: the public id's prefix.
    pub prefix: &'static str,
    /// Subscribe this connection from the first byte, as the command starts.
    pub subscribe: Option<(ConnId, SubOpts)>,
    /// Kill the command when this connection (the creating one, which asked for
    /// `killOnDisconnect`) closes.
    pub kill_on_disconnect: Option<ConnId>,
    /// Its cgroup limits: the daemon's, or lower ones the request asked for.
    pub limits: CgroupLimits,
    pub after: After,
    /// Set by the gate: the key and public id the command will have (an approver sees
    /// the id before the command exists), and how it was let through.
    pub admitted: Option<Admitted>,
    /// Whence the request came, for whom its command runs as: the loop fills it in from
    /// the connection when the request does not carry it (a shell's restart does).
    pub origin: Option<Origin>,
    /// The sandbox the request asks for (PROTOCOL 16); none: the one in force.
    pub sandbox_asked: Option<Partial>,
    /// The sandbox it runs in: set by the gate (`core::confine`), or carried by a shell
    /// session for its shell.
    pub sandbox: Option<Given>,
    /// The most it may have (`core::confine`): what the request itself bounds it to
    /// (`sandbox_ceiling`, execctl mcp's `--sandbox`), met by the loop with what its
    /// peer's tie allows: the sandbox of the command the peer is tied to (with its
    /// `$CWD`), `read-only` for a descendant of the daemon tied to none. None: no bound.
    pub ceiling: Option<Box<Given>>,
    /// The front door it came through (the loop sets it before the gate), for the audit.
    pub via: super::vocab::Via,
}

/// Where a request came from, for whom its command runs as.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Origin {
    /// Through a TCP listener: it runs as `--http-run-as`.
    pub over_tcp: bool,
    /// The supplementary groups of the Unix peer.
    pub groups: Vec<u32>,
}

/// How the gate let a command through.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub key: Key,
    pub id: String,
    /// `allow`, `approve` (a person said yes) or `approve_for_session` (an earlier yes
    /// for the same rule and session).
    pub decision: &'static str,
    /// The rule that decided (`default` when none matched).
    pub rule: String,
}

impl LaunchRequest {
    /// Bytes the command's record will hold besides its output: its command line, cwd and
    /// ids, and a fixed allowance for the record itself.
    pub fn record_bytes(&self) -> usize {
        const RECORD: usize = 512;
        RECORD
            + self.command.len()
            + self.args.iter().map(String::len).sum::<usize>()
            + self.cwd.as_os_str().len()
            + self.family.session_id().len()
            + self.sandbox.as_ref().map_or(0, Given::json_len_bound)
    }

    /// The session a session approval is remembered for: the ACP session or the bash
    /// session, kept apart.
    pub fn session_ref(&self) -> String {
        match &self.family {
            Family::Terminal { session_id } => format!("acp:{session_id}"),
            Family::Bash { session_id } => format!("bash:{session_id}"),
            Family::Shell { session_id } => format!("shell:{session_id}"),
        }
    }
}

/// The limits a request asks for (`names`: its field names for memory, pids and cpu, as
/// its family spells them), within the daemon's: a request may lower a limit, never
/// raise it or lift one the daemon sets (`-32003` naming it).
pub fn request_limits(
    asked: Option<&Params>,
    names: [&str; 3],
    daemon: &CgroupLimits,
) -> Result<CgroupLimits, RpcError> {
    let Some(p) = asked else {
        return Ok(*daemon);
    };
    let memory = p.opt_u64(names[0])?;
    let pids = p.opt_u64(names[1])?;
    let cpu = p
        .opt_u64(names[2])?
        .map(|c| u32::try_from(c).map_err(|_| RpcError::invalid_params(names[2], "too large")))
        .transpose()?;
    if cpu == Some(0) {
        return Err(RpcError::invalid_params(
            names[2],
            "a CPU limit of 0 % lets nothing run",
        ));
    }
    fn lower<T: Ord + Copy + Into<serde_json::Value>>(
        asked: Option<T>,
        daemon: Option<T>,
        flag: &str,
    ) -> Result<Option<T>, RpcError> {
        match (asked, daemon) {
            (Some(a), Some(d)) if a > d => Err(RpcError::limit(flag, d)),
            (Some(a), _) => Ok(Some(a)),
            (None, d) => Ok(d),
        }
    }
    Ok(CgroupLimits {
        memory_max: lower(memory, daemon.memory_max, "memory-max")?,
        pids_max: lower(pids, daemon.pids_max, "pids-max")?,
        cpu_max: lower(cpu, daemon.cpu_max, "cpu-max")?,
    })
}

/// Whether `command` may be executed directly without a shell: one plain word of letters,
/// digits and `_ . / + - , : @ %`.
pub fn plain_word(command: &str) -> bool {
    !command.is_empty()
        && command
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./+-,:@%".contains(&b))
}

/// The most bytes of names and values a request's environment may hold (PROTOCOL 8).
pub const MAX_ENV_BYTES: usize = 256 << 10;
/// The longest working directory a request may name.
pub const MAX_CWD: usize = 4096;

/// Checks request environment variables: a name must be non-empty and hold no `=` or NUL,
/// a value no NUL, and all of them together at most `MAX_ENV_BYTES`.
pub fn validate_env(field: &str, vars: &[(String, String)]) -> Result<(), RpcError> {
    let total: usize = vars.iter().map(|(n, v)| n.len() + v.len()).sum();
    if total > MAX_ENV_BYTES {
        return Err(RpcError::invalid_params(
            field,
            format!("at most {MAX_ENV_BYTES} bytes of names and values, not {total}"),
        ));
    }
    for (name, value) in vars {
        if name.is_empty() {
            return Err(RpcError::invalid_params(field, "empty variable name"));
        }
        if name.contains('=') || name.contains('\0') {
            return Err(RpcError::invalid_params(
                field,
                format!("variable name {name:?} holds '=' or NUL"),
            ));
        }
        if value.contains('\0') {
            return Err(RpcError::invalid_params(
                field,
                format!("value of {name:?} holds NUL"),
            ));
        }
    }
    Ok(())
}

/// Checks a working directory as far as the request alone says: absolute, and bounded.
/// Whether it exists and is a directory is seen where the command starts (the child's
/// `chdir`, which answers `-32602` naming the field): a peer-chosen path is never looked
/// at on the loop, where a hung network mount would freeze the daemon.
pub fn validate_dir(field: &str, dir: &str) -> Result<PathBuf, RpcError> {
    if dir.len() > MAX_CWD {
        return Err(RpcError::invalid_params(
            field,
            format!("a path of at most {MAX_CWD} bytes, not {}", dir.len()),
        ));
    }
    if dir.contains('\0') {
        return Err(RpcError::invalid_params(
            field,
            "holds a NUL byte, which no path can",
        ));
    }
    let path = PathBuf::from(dir);
    if !path.is_absolute() {
        return Err(RpcError::invalid_params(
            field,
            format!("{dir:?} is not an absolute path"),
        ));
    }
    Ok(path)
}

/// The sandbox a request asks for in `field` (PROTOCOL 16): a preset or an object of
/// the known keys; anything else `-32602` naming the key (fail closed).
pub fn requested_sandbox(
    field: &str,
    value: Option<&serde_json::Value>,
) -> Result<Option<Partial>, RpcError> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => crate::policy::sandbox::parse(v).map(Some).map_err(|e| {
            let name = if e.key.is_empty() {
                field.to_string()
            } else {
                format!("{field}.{}", e.key)
            };
            RpcError::invalid_params(&name, e.reason)
        }),
    }
}

/// The door a request says relayed it (`via`, PROTOCOL 7.4): only `mcp` may be named
/// (execctl mcp says so); none: the door it came through.
pub fn requested_via(value: Option<&str>) -> Result<super::vocab::Via, RpcError> {
    match value {
        None => Ok(super::vocab::Via::Rpc),
        Some("mcp") => Ok(super::vocab::Via::Mcp),
        Some(other) => Err(RpcError::invalid_params(
            "via",
            format!("only \"mcp\" may be named, not {other:?}"),
        )),
    }
}

/// The terminal a request asks for: `Some(size)` when `tty` is true, `size` being
/// `{rows, cols}` (1..1000 each, default 24 x 80, PROTOCOL 12.1); `-32602` naming the
/// field otherwise. A size without `tty` is refused rather than ignored.
pub fn requested_tty(
    tty: Option<bool>,
    size: Option<&Params>,
) -> Result<Option<WinSize>, RpcError> {
    if !tty.unwrap_or(false) {
        if size.is_some() {
            return Err(RpcError::invalid_params("size", "a size needs tty: true"));
        }
        return Ok(None);
    }
    match size {
        None => Ok(Some(WinSize::DEFAULT)),
        Some(s) => {
            let side = |name: &str| match s.opt_u64(name) {
                Ok(Some(n)) => Ok(n),
                _ => Err(RpcError::invalid_params(
                    "size",
                    format!("{name} must be an integer, 1..{}", WinSize::MAX_SIDE),
                )),
            };
            window_size(side("rows")?, side("cols")?, "size").map(Some)
        }
    }
}

/// The size a resize asks for: its `rows` and `cols`, 1..1000 each (`-32602` naming
/// `rows` otherwise).
pub fn resize_to(p: &Params) -> Result<WinSize, RpcError> {
    window_size(
        p.opt_u64("rows")?.unwrap_or(0),
        p.opt_u64("cols")?.unwrap_or(0),
        "rows",
    )
}

/// `rows` by `cols` as a window size: 1..1000 each, else `-32602` naming `field`.
fn window_size(rows: u64, cols: u64, field: &str) -> Result<WinSize, RpcError> {
    let side = 1..=u64::from(WinSize::MAX_SIDE);
    if !side.contains(&rows) || !side.contains(&cols) {
        return Err(RpcError::invalid_params(
            field,
            format!(
                "{rows} x {cols}: rows and cols must be 1..{} each",
                WinSize::MAX_SIDE
            ),
        ));
    }
    Ok(WinSize {
        rows: rows as u16,
        cols: cols as u16,
    })
}

/// A command given a terminal gets `TERM=xterm-256color` unless the request sets `TERM`.
pub fn default_term(env: &mut Vec<(String, String)>) {
    if !env.iter().any(|(k, _)| k == "TERM") {
        env.push(("TERM".into(), "xterm-256color".into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_run_without_a_shell() {
        for w in [
            "ls",
            "/bin/true",
            "cargo-nextest",
            "a_b.c+d,e:f@g%h",
            "x86_64",
        ] {
            assert!(plain_word(w), "{w}");
        }
        for w in ["", "ls -l", "echo $HOME", "a;b", "a|b", "a'b", "é"] {
            assert!(!plain_word(w), "{w}");
        }
    }

    #[test]
    fn environment_names_and_values_are_checked() {
        let ok = vec![("A".to_string(), "x=y".to_string())];
        assert!(validate_env("env", &ok).is_ok());
        for (k, v) in [("", "x"), ("A=B", "x"), ("A\0", "x"), ("A", "x\0y")] {
            let e = validate_env("env", &[(k.into(), v.into())]).unwrap_err();
            assert_eq!(e.data.unwrap()["field"], "env");
        }
        let big = vec![("A".to_string(), "x".repeat(MAX_ENV_BYTES))];
        assert!(validate_env("env", &big).is_err());
    }

    #[test]
    fn a_request_may_lower_limits_but_never_raise_them() {
        let daemon = CgroupLimits {
            memory_max: Some(100),
            pids_max: None,
            cpu_max: Some(50),
        };
        let names = ["m", "p", "c"];
        assert_eq!(request_limits(None, names, &daemon).unwrap(), daemon);
        let asked = serde_json::json!({"m": 60, "p": 10});
        let got =
            request_limits(Some(&Params(asked.as_object().unwrap())), names, &daemon).unwrap();
        assert_eq!(
            got,
            CgroupLimits {
                memory_max: Some(60),
                pids_max: Some(10),
                cpu_max: Some(50)
            }
        );
        let asked = serde_json::json!({"m": 200});
        let e =
            request_limits(Some(&Params(asked.as_object().unwrap())), names, &daemon).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::LIMIT_REACHED);
        assert_eq!(e.data.unwrap()["limit"], "memory-max");
        let asked = serde_json::json!({"c": 0});
        assert!(request_limits(Some(&Params(asked.as_object().unwrap())), names, &daemon).is_err());
    }

    #[test]
    fn working_directories_are_checked() {
        assert!(validate_dir("cwd", "/").is_ok());
        let long = format!("/{}", "a/".repeat(MAX_CWD));
        // Existence is the child's to find out (see `validate_dir`).
        assert!(validate_dir("cwd", "/no/such/dir/here").is_ok());
        for bad in ["relative", "", &long, "/tmp\0x"] {
            let e = validate_dir("cwd", bad).unwrap_err();
            assert_eq!(e.code, crate::wire::rpc::INVALID_PARAMS, "{bad}");
            assert_eq!(e.data.unwrap()["field"], "cwd", "{bad}");
        }
    }
}
