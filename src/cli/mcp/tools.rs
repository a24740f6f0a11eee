//! The seven tools `execctl mcp` offers (PROTOCOL 17): their descriptions, input and
//! output schemas as `tools/list` shows them, and their arguments read strictly into
//! typed requests. Pure: no I/O.
//!
//! A bad argument is said in one sentence naming the argument, for a tool result the
//! model reads (`isError: true`), as the MCP specification asks of input errors.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// `yield_ms` when a call names none.
pub const DEFAULT_YIELD_MS: u64 = 10_000;
/// The longest a call may hold its answer back (`yield_ms`, `wait_ms`): MCP clients time
/// requests out (the TypeScript SDK at 60 s), so an answer must come before.
pub const MAX_YIELD_MS: u64 = 50_000;
/// `--max-output-bytes` when none is given.
pub const DEFAULT_MAX_OUTPUT: usize = 30_000;

/// Every status a command's answer may carry.
const STATUSES: &[&str] = &[
    "completed",
    "running",
    "waiting_for_input",
    "waiting_for_approval",
    "killed",
    "timeout",
    "denied",
    "rejected",
];

/// The output schema of `run`, `read` and `shell`: a command as it stands.
fn command_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "the command's id (cmd_N), or the approval's (appr_N) while one is pending"},
            "session": {"type": "string", "description": "the shell session (shell)"},
            "status": {"type": "string", "enum": STATUSES},
            "exit_code": {"type": ["integer", "null"]},
            "signal": {"type": ["string", "null"]},
            "output": {"type": "string", "description": "plain text (stdout and stderr as they came), head and tail kept past max_output_bytes"},
            "truncated": {"type": "boolean"},
            "duration_ms": {"type": "integer", "minimum": 0},
            "approval": {"type": "string"},
            "rules": {"type": "array", "items": {"type": "string"}},
            "rule": {"type": "string"},
            "justification": {"type": "string"},
            "reason": {"type": "string"},
            "feedback": {"type": "string"}
        },
        "required": ["status", "output", "truncated", "duration_ms"]
    })
}

fn int(description: &str) -> Value {
    json!({"type": "integer", "minimum": 0, "description": description})
}

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn boolean(description: &str) -> Value {
    json!({"type": "boolean", "description": description})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required,
           "additionalProperties": false})
}

/// One tool as `tools/list` shows it; `structured` adds the output schema (MCP 2025-06-18
/// and later know it).
fn tool(
    name: &str,
    title: &str,
    about: &str,
    input: Value,
    output: Value,
    structured: bool,
) -> Value {
    let mut t = json!({"name": name, "description": about, "inputSchema": input});
    if structured {
        t["title"] = title.into();
        t["outputSchema"] = output;
    }
    t
}

/// Every tool, in the order `tools/list` gives them.
pub fn list(structured: bool) -> Vec<Value> {
    let max_output =
        int("most bytes of output to answer with (head and tail kept); capped by the server");
    let run_input = object(
        json!({
            "command": string("a shell line (bash), judged by execd's policy before it runs"),
            "cwd": string("directory to run in (absolute, or relative to the server's directory)"),
            "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "variables to set"},
            "timeout_ms": int("kill the command after this long (status timeout)"),
            "yield_ms": int("answer after this long if it still runs (default 10000); read goes on"),
            "tty": boolean("run it in a pseudo-terminal (24x80), for programs that want one"),
            "stdin": string("input to give it, then end of input; absent: stdin stays open for write"),
            "background": boolean("keep it running when this client goes away"),
            "sandbox": {"description": "run it in a narrower sandbox: a preset (workspace, read-only, off) or {write, read, exec, network, protect}; never wider than the server's --sandbox", "type": ["string", "object"]},
            "max_output_bytes": max_output.clone(),
        }),
        &["command"],
    );
    let read_input = object(
        json!({
            "id": string("a command id from run (cmd_N) or a pending approval (appr_N)"),
            "wait_ms": int("wait up to this long for more output (or for the exit); default 0"),
            "until": {"type": "string", "enum": ["output", "exit"], "description": "what ends the wait early: new output (default) or the exit"},
            "max_output_bytes": max_output.clone(),
        }),
        &["id"],
    );
    let write_input = object(
        json!({
            "id": string("a running command (cmd_N) or a shell session"),
            "input": string("text to type; \\n for Enter, \\u0003 for Ctrl-C on a tty"),
            "eof": boolean("end its input afterwards"),
        }),
        &["id", "input"],
    );
    let kill_input = object(
        json!({
            "id": string("a command (cmd_N), a pending approval (appr_N, withdrawn), or a shell session"),
            "signal": {"type": "string", "enum": ["SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGSTOP", "SIGCONT"]},
        }),
        &["id"],
    );
    let shell_input = object(
        json!({
            "command": string("a line for the shell session, judged by execd's policy"),
            "session": string("a named session (kept); absent: this client's own, closed when it goes away"),
            "yield_ms": int("answer after this long if it still runs (default 10000); shell_view shows more"),
            "max_output_bytes": max_output.clone(),
        }),
        &["command"],
    );
    let view_input = object(
        json!({"session": string("a named session; absent: this client's own")}),
        &[],
    );
    let write_output = json!({
        "type": "object",
        "properties": {"id": {"type": "string"}, "written": {"type": "integer", "minimum": 0},
                       "status": {"type": "string"}},
        "required": ["id", "written"]
    });
    let kill_output = json!({
        "type": "object",
        "properties": {"id": {"type": "string"}, "status": {"type": "string"},
                       "exit_code": {"type": ["integer", "null"]}, "signal": {"type": ["string", "null"]}},
        "required": ["id", "status"]
    });
    let list_output = json!({
        "type": "object",
        "properties": {
            "commands": {"type": "array", "items": {"type": "object", "properties": {
                "id": {"type": "string"}, "command": {"type": "string"},
                "status": {"type": "string", "enum": STATUSES},
                "exit_code": {"type": ["integer", "null"]}, "signal": {"type": ["string", "null"]},
                "background": {"type": "boolean"}, "tty": {"type": "boolean"},
                "unread_output": {"type": "boolean"}, "approval": {"type": "string"}},
                "required": ["id", "command", "status"]}},
            "shell_sessions": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["commands", "shell_sessions"]
    });
    let view_output = json!({
        "type": "object",
        "properties": {
            "session": {"type": "string"}, "status": {"type": "string"},
            "command": {"type": ["string", "null"]}, "exit_code": {"type": ["integer", "null"]},
            "output": {"type": "string"}, "truncated": {"type": "boolean"},
            "working_dir": {"type": "string"}, "waiting_for_input": {"type": "boolean"}
        },
        "required": ["session", "status", "output", "truncated"]
    });
    vec![
        tool(
            "run",
            "Run a shell command",
            "Runs a shell line through execd (its policy, approvals, audit and limits apply). \
             Answers when it ends, after yield_ms if it still runs (status running: use read), \
             at once when it waits for input (use write), or after yield_ms while a person is \
             still asked to approve it (status waiting_for_approval: use read later). A denied \
             or rejected line is an error naming the rule.",
            run_input,
            command_schema(),
            structured,
        ),
        tool(
            "read",
            "Read a command's output",
            "What a command wrote since you last read it, and its state; waits up to wait_ms \
             for more output or (until: exit) for its end, answering early when it waits for \
             input or its approval is decided.",
            read_input,
            command_schema(),
            structured,
        ),
        tool(
            "write",
            "Write to a command's input",
            "Types input into a running command (its stdin, or its terminal with tty) or into \
             the program running in a shell session; eof ends its input.",
            write_input,
            write_output,
            structured,
        ),
        tool(
            "kill",
            "Stop a command",
            "Sends a signal (SIGTERM by default) to a command's process group; withdraws a \
             pending approval; interrupts a shell session's command.",
            kill_input,
            kill_output,
            structured,
        ),
        tool(
            "list",
            "List commands",
            "This client's commands and their states, and its shell sessions.",
            object(json!({}), &[]),
            list_output,
            structured,
        ),
        tool(
            "shell",
            "Run in a shell session",
            "Runs a line in a persistent interactive bash whose cd, variables and functions \
             carry over from call to call. Answers when it ends or after yield_ms (then \
             shell_view shows more).",
            shell_input,
            command_schema(),
            structured,
        ),
        tool(
            "shell_view",
            "View a shell session",
            "What a shell session shows now: the running or last command, its output and \
             status, and the session's directory.",
            view_input,
            view_output,
            structured,
        ),
    ]
}

/// A tool's arguments, read.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Run(Run),
    Read {
        id: String,
        wait_ms: u64,
        until_exit: bool,
        max_output: Option<usize>,
    },
    Write {
        id: String,
        input: String,
        eof: bool,
    },
    Kill {
        id: String,
        signal: String,
    },
    List,
    Shell {
        command: String,
        session: Option<String>,
        yield_ms: u64,
        max_output: Option<usize>,
    },
    ShellView {
        session: Option<String>,
    },
}

/// `run`'s arguments.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Run {
    pub command: String,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub timeout_ms: Option<u64>,
    pub yield_ms: u64,
    pub tty: bool,
    pub stdin: Option<String>,
    pub background: bool,
    /// The sandbox asked for (checked as a shape; the daemon judges it).
    pub sandbox: Option<Value>,
    pub max_output: Option<usize>,
}

/// Why a tool's arguments were refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Bad {
    /// No such tool (a protocol error, `-32602`).
    Tool(String),
    /// A bad argument (a tool error the model reads).
    Argument(String),
}

/// The arguments of one call, checked against the tool's schema.
struct Args<'a> {
    tool: &'a str,
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    fn bad(&self, field: &str, why: &str) -> Bad {
        Bad::Argument(format!("{}: argument {field:?} {why}", self.tool))
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    fn str(&self, field: &str) -> Result<String, Bad> {
        self.opt_str(field)?
            .ok_or_else(|| self.bad(field, "is required (a string)"))
    }

    fn opt_str(&self, field: &str) -> Result<Option<String>, Bad> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.bad(field, "must be a string")),
        }
    }

    fn opt_u64(&self, field: &str) -> Result<Option<u64>, Bad> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .or_else(|| {
                    // 1000.0 is an integer too, as JSON Schema counts.
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e15)
                        .map(|f| f as u64)
                })
                .map(Some)
                .ok_or_else(|| self.bad(field, "must be a whole number, 0 or more")),
        }
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>, Bad> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.bad(field, "must be true or false")),
        }
    }

    /// No argument the tool does not take (its schema says `additionalProperties:
    /// false`: a misspelt `timeout` must not be silently ignored).
    fn only(&self, known: &[&str]) -> Result<(), Bad> {
        match self.map.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(Bad::Argument(format!(
                "{}: no argument {k:?}; it takes {}",
                self.tool,
                known.join(", ")
            ))),
            None => Ok(()),
        }
    }

    fn yield_ms(&self, field: &str) -> Result<u64, Bad> {
        Ok(self
            .opt_u64(field)?
            .unwrap_or(DEFAULT_YIELD_MS)
            .min(MAX_YIELD_MS))
    }

    fn max_output(&self) -> Result<Option<usize>, Bad> {
        Ok(self.opt_u64("max_output_bytes")?.map(|n| n as usize))
    }

    fn nonempty(&self, field: &str) -> Result<String, Bad> {
        let s = self.str(field)?;
        if s.trim().is_empty() {
            return Err(self.bad(field, "is empty"));
        }
        Ok(s)
    }
}

/// Reads the arguments of tool `name`.
pub fn parse(name: &str, arguments: Option<&Value>) -> Result<Call, Bad> {
    let empty = Map::new();
    let map = match arguments {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(Bad::Argument(format!(
                "{name}: the arguments must be an object"
            )))
        }
    };
    let a = Args { tool: name, map };
    match name {
        "run" => {
            a.only(&[
                "command",
                "cwd",
                "env",
                "timeout_ms",
                "yield_ms",
                "tty",
                "stdin",
                "background",
                "sandbox",
                "max_output_bytes",
            ])?;
            let sandbox = match a.get("sandbox") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    crate::policy::sandbox::parse(v).map_err(|e| {
                        let key = if e.key.is_empty() {
                            String::new()
                        } else {
                            format!(".{}", e.key)
                        };
                        a.bad(&format!("sandbox{key}"), &e.reason)
                    })?;
                    Some(v.clone())
                }
            };
            let mut env = BTreeMap::new();
            match a.get("env") {
                None => {}
                Some(Value::Object(m)) => {
                    for (k, v) in m {
                        let Value::String(v) = v else {
                            return Err(a.bad("env", &format!("value of {k:?} must be a string")));
                        };
                        env.insert(k.clone(), v.clone());
                    }
                }
                Some(_) => return Err(a.bad("env", "must be an object of strings")),
            }
            Ok(Call::Run(Run {
                command: a.nonempty("command")?,
                cwd: a.opt_str("cwd")?,
                env,
                timeout_ms: a.opt_u64("timeout_ms")?.filter(|t| *t > 0),
                yield_ms: a.yield_ms("yield_ms")?,
                tty: a.opt_bool("tty")?.unwrap_or(false),
                stdin: a.opt_str("stdin")?,
                background: a.opt_bool("background")?.unwrap_or(false),
                sandbox,
                max_output: a.max_output()?,
            }))
        }
        "read" => {
            a.only(&["id", "wait_ms", "until", "max_output_bytes"])?;
            let until_exit = match a.opt_str("until")?.as_deref() {
                None | Some("output") => false,
                Some("exit") => true,
                Some(_) => return Err(a.bad("until", "must be \"output\" or \"exit\"")),
            };
            Ok(Call::Read {
                id: a.nonempty("id")?,
                wait_ms: a.opt_u64("wait_ms")?.unwrap_or(0).min(MAX_YIELD_MS),
                until_exit,
                max_output: a.max_output()?,
            })
        }
        "write" => {
            a.only(&["id", "input", "eof"])?;
            Ok(Call::Write {
                id: a.nonempty("id")?,
                input: a.str("input")?,
                eof: a.opt_bool("eof")?.unwrap_or(false),
            })
        }
        "kill" => {
            a.only(&["id", "signal"])?;
            Ok(Call::Kill {
                id: a.nonempty("id")?,
                signal: a.opt_str("signal")?.unwrap_or_else(|| "SIGTERM".into()),
            })
        }
        "list" => {
            a.only(&[])?;
            Ok(Call::List)
        }
        "shell" => {
            a.only(&["command", "session", "yield_ms", "max_output_bytes"])?;
            Ok(Call::Shell {
                command: a.nonempty("command")?,
                session: a.opt_str("session")?.filter(|s| !s.is_empty()),
                yield_ms: a.yield_ms("yield_ms")?,
                max_output: a.max_output()?,
            })
        }
        "shell_view" => {
            a.only(&["session"])?;
            Ok(Call::ShellView {
                session: a.opt_str("session")?.filter(|s| !s.is_empty()),
            })
        }
        other => Err(Bad::Tool(format!(
            "unknown tool {other:?}; the tools are run, read, write, kill, list, shell and shell_view"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_both_schemas_and_they_are_objects() {
        let tools = list(true);
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "run",
                "read",
                "write",
                "kill",
                "list",
                "shell",
                "shell_view"
            ]
        );
        for t in &tools {
            assert_eq!(t["inputSchema"]["type"], "object", "{t}");
            assert_eq!(t["outputSchema"]["type"], "object", "{t}");
            let required = t["inputSchema"]["required"].as_array().unwrap();
            for r in required {
                assert!(t["inputSchema"]["properties"]
                    .get(r.as_str().unwrap())
                    .is_some());
            }
        }
        // Before 2025-06-18 a tool has neither an output schema nor a title.
        assert!(list(false).iter().all(|t| t.get("outputSchema").is_none()));
    }

    #[test]
    fn arguments_are_read_strictly_and_named_when_wrong() {
        let run = parse(
            "run",
            Some(&json!({"command": "ls", "yield_ms": 500.0, "env": {"A": "b"}})),
        )
        .unwrap();
        let Call::Run(r) = run else { panic!() };
        assert_eq!(
            (r.command.as_str(), r.yield_ms, r.env["A"].as_str()),
            ("ls", 500, "b")
        );
        assert_eq!(r.timeout_ms, None);
        let bad = |name: &str, args: Value| match parse(name, Some(&args)) {
            Err(Bad::Argument(m)) => m,
            other => panic!("{args}: {other:?}"),
        };
        assert!(bad("run", json!({})).contains("\"command\" is required"));
        assert!(bad("run", json!({"command": "  "})).contains("empty"));
        assert!(bad("run", json!({"command": "ls", "yield_ms": -1})).contains("yield_ms"));
        assert!(
            bad("run", json!({"command": "ls", "timeout": 5})).contains("no argument \"timeout\"")
        );
        assert!(bad("run", json!({"command": "ls", "env": {"A": 1}})).contains("env"));
        assert!(bad("read", json!({"id": "cmd_1", "until": "later"})).contains("until"));
        assert!(bad("write", json!({"id": "cmd_1"})).contains("\"input\" is required"));
        assert!(matches!(parse("nope", None), Err(Bad::Tool(_))));
        assert_eq!(parse("list", None), Ok(Call::List));
        // A wait is capped below the clients' request timeouts.
        let Ok(Call::Read { wait_ms, .. }) =
            parse("read", Some(&json!({"id": "x", "wait_ms": 600000})))
        else {
            panic!()
        };
        assert_eq!(wait_ms, MAX_YIELD_MS);
    }
}
