//! ACP conformance: every `initialize` and `terminal/*` response execd sends is validated
//! against the JSON Schema generated from the official ACP v1 types (crate
//! `agent-client-protocol-schema`, via schemars) and deserialized into those types; and the
//! requests execd is sent are built from the same official types, so execd accepts exactly
//! what a real ACP client sends (PROTOCOL.md section 4).

use crate::util::*;

use std::path::PathBuf;

use agent_client_protocol_schema::v1::{
    ClientCapabilities, CreateTerminalRequest, CreateTerminalResponse, EnvVariable, Implementation,
    InitializeRequest, InitializeResponse, KillTerminalRequest, KillTerminalResponse, Meta,
    ReleaseTerminalRequest, ReleaseTerminalResponse, SessionId, TerminalExitStatus, TerminalId,
    TerminalOutputRequest, TerminalOutputResponse, WaitForTerminalExitRequest,
    WaitForTerminalExitResponse, AGENT_METHOD_NAMES, CLIENT_METHOD_NAMES,
};
use agent_client_protocol_schema::ProtocolVersion;
use serde::de::DeserializeOwned;
use serde::Serialize;

const SESSION: &str = "sess_abc123def456";

/// The JSON Schema of `T`, generated from the official type.
fn schema_of<T: schemars::JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).expect("schema serializes")
}

/// Every schema error of `instance` against `T`'s schema, one per line.
fn schema_errors<T: schemars::JsonSchema>(instance: &Value) -> Vec<String> {
    let schema = schema_of::<T>();
    let validator = jsonschema::validator_for(&schema).unwrap_or_else(|e| {
        panic!(
            "the schema of {} does not compile: {e}\n{schema:#}",
            std::any::type_name::<T>()
        )
    });
    validator
        .iter_errors(instance)
        .map(|e| {
            format!(
                "at {:?} (schema {:?}): {e}",
                e.instance_path().to_string(),
                e.schema_path().to_string()
            )
        })
        .collect()
}

/// Validates `instance` against `T`'s schema (printing every error), then deserializes it
/// into `T`.
#[track_caller]
fn conforms<T: schemars::JsonSchema + DeserializeOwned>(instance: &Value) -> T {
    let name = std::any::type_name::<T>();
    let errors = schema_errors::<T>(instance);
    assert!(
        errors.is_empty(),
        "{name}: {instance} does not match the ACP schema:\n  {}\nschema: {:#}",
        errors.join("\n  "),
        schema_of::<T>()
    );
    serde_json::from_value(instance.clone())
        .unwrap_or_else(|e| panic!("{name}: {instance} does not deserialize: {e}"))
}

/// Serializes an official request type, checks it against its own schema, and sends it as
/// the params of `method`; returns the result.
#[track_caller]
fn send_official<R: Serialize + schemars::JsonSchema>(
    c: &mut Client,
    method: &str,
    request: &R,
) -> Value {
    let params = serde_json::to_value(request).expect("request serializes");
    let errors = schema_errors::<R>(&params);
    assert!(
        errors.is_empty(),
        "{method} {params}: {}",
        errors.join("; ")
    );
    ok(c, method, params)
}

fn create_req(command: &str, args: &[&str]) -> CreateTerminalRequest {
    CreateTerminalRequest::new(SessionId::new(SESSION), command)
        .args(args.iter().map(|s| s.to_string()).collect())
}

#[track_caller]
fn create_official(c: &mut Client, req: &CreateTerminalRequest) -> TerminalId {
    let r = send_official(c, CLIENT_METHOD_NAMES.terminal_create, req);
    let resp: CreateTerminalResponse = conforms(&r);
    assert!(!resp.terminal_id.0.is_empty(), "{r}");
    resp.terminal_id
}

#[track_caller]
fn output_official(c: &mut Client, id: &TerminalId) -> TerminalOutputResponse {
    let req = TerminalOutputRequest::new(SessionId::new(SESSION), id.clone());
    let r = send_official(c, CLIENT_METHOD_NAMES.terminal_output, &req);
    conforms(&r)
}

#[track_caller]
fn wait_official(c: &mut Client, id: &TerminalId) -> WaitForTerminalExitResponse {
    let req = WaitForTerminalExitRequest::new(SessionId::new(SESSION), id.clone());
    let r = send_official(c, CLIENT_METHOD_NAMES.terminal_wait_for_exit, &req);
    conforms(&r)
}

#[track_caller]
fn release_official(c: &mut Client, id: &TerminalId) {
    let req = ReleaseTerminalRequest::new(SessionId::new(SESSION), id.clone());
    let r = send_official(c, CLIENT_METHOD_NAMES.terminal_release, &req);
    let _: ReleaseTerminalResponse = conforms(&r);
}

fn code(n: u32) -> TerminalExitStatus {
    TerminalExitStatus::new().exit_code(n)
}

fn signal(name: &str) -> TerminalExitStatus {
    TerminalExitStatus::new().signal(name.to_string())
}

#[test]
fn the_validator_catches_what_does_not_conform() {
    // Guards the checks below: malformed instances are reported, with the errors printed.
    let bad = json!({"output": 5});
    let errors = schema_errors::<TerminalOutputResponse>(&bad);
    assert!(
        errors.len() >= 2,
        "missing truncated and a non-string output: {errors:?}"
    );
    assert!(!schema_errors::<TerminalExitStatus>(&json!({"exitCode": -1})).is_empty());
    assert!(!schema_errors::<CreateTerminalResponse>(&json!({})).is_empty());
    assert!(!schema_errors::<WaitForTerminalExitResponse>(&json!({"exitCode": "0"})).is_empty());
    let fine =
        json!({"output": "x", "truncated": false, "exitStatus": {"exitCode": 0, "signal": null}});
    assert_eq!(
        schema_errors::<TerminalOutputResponse>(&fine),
        Vec::<String>::new()
    );
}

#[test]
fn initialize_conforms() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let req = InitializeRequest::new(ProtocolVersion::V1)
        .client_capabilities(ClientCapabilities::new().terminal(true))
        .client_info(Implementation::new("acp-schema-test", "0.0.1"));
    let r = send_official(&mut c, AGENT_METHOD_NAMES.initialize, &req);
    let resp: InitializeResponse = conforms(&r);
    assert_eq!(resp.protocol_version, ProtocolVersion::V1, "{r}");
    assert_eq!(r["clientCapabilities"]["terminal"], true, "{r}");
    assert_eq!(r["serverInfo"]["name"], "execd", "{r}");

    // The minimal request is accepted too.
    let r = send_official(
        &mut c,
        "initialize",
        &InitializeRequest::new(ProtocolVersion::V1),
    );
    let _: InitializeResponse = conforms(&r);
}

#[test]
fn terminal_lifecycle_conforms() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let cwd = std::fs::canonicalize(dir.path()).expect("canonical");
    let gate = cwd.join("gate");
    let mut c = d.client();

    // Every optional field of the official request, filled in.
    let script = "echo \"$ACP_VAR\"; pwd -P; while [ ! -e gate ]; do sleep 0.02; done; exit 3";
    let mut meta = Meta::new();
    meta.insert("client".into(), json!({"trace": "abc"}));
    let req = create_req("sh", &["-c", script])
        .env(vec![EnvVariable::new("ACP_VAR", "from ACP")])
        .cwd(PathBuf::from(&cwd))
        .output_byte_limit(1_048_576u64)
        .meta(meta);
    let id = create_official(&mut c, &req);

    let expected = format!("from ACP\n{}\n", cwd.display());
    wait_until("the first output", || {
        output_official(&mut c, &id).output == expected
    });
    // Running: no exitStatus.
    let out = output_official(&mut c, &id);
    assert_eq!(out.exit_status, None);
    assert!(!out.truncated);

    std::fs::write(&gate, b"go").expect("open gate");
    let waited = wait_official(&mut c, &id);
    assert_eq!(waited.exit_status, code(3));

    // Exited: exitStatus with the code.
    let out = output_official(&mut c, &id);
    assert_eq!(out.output, expected);
    assert!(!out.truncated);
    assert_eq!(out.exit_status, Some(code(3)));

    let kill = KillTerminalRequest::new(SessionId::new(SESSION), id.clone());
    let r = send_official(&mut c, CLIENT_METHOD_NAMES.terminal_kill, &kill);
    let _: KillTerminalResponse = conforms(&r);
    release_official(&mut c, &id);
}

#[test]
fn signal_exits_and_kill_conform() {
    let d = Daemon::start(&[]);
    let mut c = d.client();

    let id = create_official(&mut c, &create_req("sh", &["-c", "kill -KILL $$"]));
    assert_eq!(wait_official(&mut c, &id).exit_status, signal("SIGKILL"));
    let out = output_official(&mut c, &id);
    assert_eq!(out.exit_status, Some(signal("SIGKILL")));
    release_official(&mut c, &id);

    let id = create_official(&mut c, &create_req("sleep", &["60"]));
    let kill = KillTerminalRequest::new(SessionId::new(SESSION), id.clone());
    let r = send_official(&mut c, CLIENT_METHOD_NAMES.terminal_kill, &kill);
    let _: KillTerminalResponse = conforms(&r);
    assert_eq!(r, json!({}));
    let out = output_official(&mut c, &id);
    assert_eq!(out.exit_status, Some(signal("SIGTERM")));
    assert_eq!(wait_official(&mut c, &id).exit_status, signal("SIGTERM"));
    release_official(&mut c, &id);

    // Releasing a running command conforms too.
    let id = create_official(&mut c, &create_req("sleep", &["60"]));
    release_official(&mut c, &id);
}

#[test]
fn truncated_output_conforms() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let printed: String = std::iter::repeat_n('€', 100).collect();
    let req = create_req("printf", &["%s", &printed]).output_byte_limit(50u64);
    let id = create_official(&mut c, &req);
    assert_eq!(wait_official(&mut c, &id).exit_status, code(0));
    let out = output_official(&mut c, &id);
    assert!(out.truncated);
    assert!(
        out.output.len() <= 50 && printed.ends_with(&out.output),
        "{:?}",
        out.output
    );
    release_official(&mut c, &id);
}

#[test]
fn list_exit_status_conforms_to_terminal_exit_status() {
    // terminal/list is an extension, but the exitStatus it carries is ACP's, with execd's
    // usage under `_meta`.
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let a = create_official(&mut c, &create_req("sh", &["-c", "exit 7"]));
    let b = create_official(&mut c, &create_req("sh", &["-c", "kill -TERM $$"]));
    wait_official(&mut c, &a);
    wait_official(&mut c, &b);
    let r = ok(&mut c, "terminal/list", json!({"sessionId": SESSION}));
    let terminals = r["terminals"].as_array().expect("terminals");
    assert_eq!(terminals.len(), 2, "{r}");
    for t in terminals {
        let status: TerminalExitStatus = conforms(&t["exitStatus"]);
        let want = if t["terminalId"] == a.0.as_ref() {
            code(7)
        } else {
            signal("SIGTERM")
        };
        assert_eq!(
            (status.exit_code, status.signal),
            (want.exit_code, want.signal),
            "{t}"
        );
        let meta = status.meta.expect("_meta");
        assert!(meta["execd"]["durationMs"].is_u64(), "{t}");
    }
}

#[test]
fn requests_with_null_and_empty_optionals_from_other_clients_are_accepted() {
    // Real clients serialize optional fields differently: as null, as empty arrays, or not
    // at all. Every form must deserialize into the official request and be accepted.
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for params in [
        json!({"sessionId": SESSION, "command": "true"}),
        json!({"sessionId": SESSION, "command": "true", "args": [], "env": []}),
        json!({"sessionId": SESSION, "command": "true", "args": null, "env": null,
               "cwd": null, "outputByteLimit": null, "_meta": null}),
    ] {
        let _: CreateTerminalRequest = serde_json::from_value(params.clone())
            .unwrap_or_else(|e| panic!("{params} is not an ACP request: {e}"));
        let r = ok(&mut c, CLIENT_METHOD_NAMES.terminal_create, params);
        let resp: CreateTerminalResponse = conforms(&r);
        assert_eq!(
            wait_official(&mut c, &resp.terminal_id).exit_status,
            code(0)
        );
        release_official(&mut c, &resp.terminal_id);
    }
}
