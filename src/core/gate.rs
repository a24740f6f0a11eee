//! Approvals (PROTOCOL.md 7.3): who may approve, what waits for an answer, what was
//! approved for a whole session, and the Wire messages that carry them: an
//! `ApprovalRequest` sent as a JSON-RPC `request` to each approver, the answer it sends
//! back, and the `ApprovalRequestResolved` event. State and messages only; the core
//! decides when to ask and what an answer does.
//!
//! Invariants:
//! - An approver gets the requests of its own uid (root: of every uid), and only the
//!   approvers that got a request may answer it; the first answer wins.
//! - Anything but a well-formed `approve` or `approve_for_session` is a `reject`.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use crate::core::launch::LaunchRequest;
use crate::core::table::ConnId;
use crate::core::timers::TimerId;
use crate::wire::rpc::{self, ReqNo};

/// An approver's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Approve,
    ApproveForSession,
    Reject,
}

impl Answer {
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Approve => "approve",
            Answer::ApproveForSession => "approve_for_session",
            Answer::Reject => "reject",
        }
    }

    /// Reads a Wire response to request `id`: `{request_id, response, feedback?}`. An error
    /// response, a malformed result, another `request_id` or an unknown `response` is a
    /// reject. Returns the answer and the feedback.
    pub fn from_response(id: &str, result: &Result<Value, Value>) -> (Answer, Option<String>) {
        let Ok(r) = result else {
            return (Answer::Reject, None);
        };
        let feedback = r
            .get("feedback")
            .and_then(Value::as_str)
            .map(|f| f.chars().take(4096).collect());
        let same = r.get("request_id").and_then(Value::as_str) == Some(id);
        let answer = match r.get("response").and_then(Value::as_str) {
            Some("approve") if same => Answer::Approve,
            Some("approve_for_session") if same => Answer::ApproveForSession,
            _ => Answer::Reject,
        };
        (answer, feedback)
    }
}

/// What an approval is about, for the approver and the audit log.
#[derive(Debug, Clone)]
pub struct Asked {
    /// The policy rule that asked.
    pub rule: String,
    pub justification: Option<String>,
    /// The command line as asked.
    pub description: String,
    /// "rule push: ...; uid 1000 (pid 4242), cwd /home/u/repo, session s1"
    pub brief: String,
}

/// The longest command line an approver is sent; a longer one arrives cut, with a marker
/// saying how much (the audit record keeps all of it).
pub const DESCRIPTION_MAX: usize = 16 << 10;

/// A request waiting for an approver.
#[derive(Debug)]
pub struct Pending {
    pub id: String,
    /// The requester, and its request to answer (none for a notification).
    pub conn: ConnId,
    pub req: Option<ReqNo>,
    pub launch: Box<LaunchRequest>,
    pub asked: Asked,
    /// The approvers it was sent to: only they may answer, and they hear how it ended.
    pub sent_to: Vec<ConnId>,
    pub timer: TimerId,
}

/// A session approval: this owner, in this session, for this rule.
pub type Grant = (u32, String, String);

/// Every approver, pending approval and session grant.
#[derive(Debug, Default)]
pub struct Approvals {
    /// Connected approvers and the uid each one is.
    pub approvers: HashMap<ConnId, u32>,
    /// Approvers not reading what they are sent (their outgoing buffer is full): they
    /// count as absent until it drains.
    pub deaf: HashSet<ConnId>,
    pub pending: HashMap<String, Pending>,
    pub grants: HashSet<Grant>,
    next: u64,
}

impl Approvals {
    /// A fresh approval id, `appr_N`.
    pub fn next_id(&mut self) -> String {
        self.next += 1;
        format!("appr_{}", self.next)
    }

    /// Approvers that may answer for commands of `owner` (its own, and root's) and are
    /// reading what they are sent.
    pub fn approvers_for(&self, owner: u32) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self
            .approvers
            .iter()
            .filter(|(c, uid)| (**uid == owner || **uid == 0) && !self.deaf.contains(c))
            .map(|(c, _)| *c)
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether approver `conn` has room for what it is sent (no-op for other connections).
    pub fn set_listening(&mut self, conn: ConnId, listening: bool) {
        if !listening && self.approvers.contains_key(&conn) {
            self.deaf.insert(conn);
        } else if listening {
            self.deaf.remove(&conn);
        }
    }

    /// Removes an approver (unsubscribed, or gone).
    pub fn remove(&mut self, conn: ConnId) {
        self.approvers.remove(&conn);
        self.deaf.remove(&conn);
    }

    /// Forgets every grant of a session (closed) of `owner`.
    pub fn end_session(&mut self, owner: u32, session: &str) {
        self.grants
            .retain(|(o, s, _)| !(*o == owner && s == session));
    }
}

/// The Wire `request` carrying an `ApprovalRequest`, as one line.
pub fn request_line(id: &str, tool_call_id: &str, asked: &Asked) -> Vec<u8> {
    let msg = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "request",
        "params": {
            "type": "ApprovalRequest",
            "payload": {
                "id": id,
                "tool_call_id": tool_call_id,
                "sender": "execd",
                "action": "run command",
                "description": asked.description,
                "display": [{"type": "brief", "text": asked.brief}],
            },
        },
    });
    let mut line = Vec::with_capacity(256);
    crate::wire::encode::write_json(&mut line, &msg);
    line.push(b'\n');
    line
}

/// The Wire event that tells an approver how request `id` ended.
pub fn resolved_line(id: &str, answer: Answer) -> Vec<u8> {
    let mut line = Vec::with_capacity(128);
    rpc::write_event(
        &mut line,
        "ApprovalRequestResolved",
        &json!({ "request_id": id, "response": answer.as_str() }),
    );
    line
}

/// A command line as one string a person reads: the shell line itself, or an argv with
/// the words that need it quoted.
pub fn describe(launch: &LaunchRequest) -> String {
    match &launch.program {
        crate::types::Program::Shell { line, .. } => line.clone(),
        crate::types::Program::Direct { program, args } => std::iter::once(program)
            .chain(args)
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// `word` as a shell would need it written to mean itself.
fn shell_quote(word: &str) -> String {
    if !word.is_empty() && crate::core::launch::plain_word(word) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_strictly() {
        let ok = |r: Value| Answer::from_response("appr_1", &Ok(r));
        assert_eq!(
            ok(json!({"request_id": "appr_1", "response": "approve"})),
            (Answer::Approve, None)
        );
        assert_eq!(
            ok(json!({"request_id": "appr_1", "response": "approve_for_session"})).0,
            Answer::ApproveForSession
        );
        assert_eq!(
            ok(json!({"request_id": "appr_1", "response": "reject", "feedback": "no"})),
            (Answer::Reject, Some("no".into()))
        );
        for bad in [
            json!({"request_id": "appr_2", "response": "approve"}),
            json!({"response": "approve"}),
            json!({"request_id": "appr_1", "response": "yes"}),
            json!("approve"),
            Value::Null,
        ] {
            assert_eq!(ok(bad.clone()).0, Answer::Reject, "{bad}");
        }
        assert_eq!(
            Answer::from_response("appr_1", &Err(json!({"code": -1}))).0,
            Answer::Reject
        );
    }

    #[test]
    fn wire_request_and_resolved_event_have_the_documented_shape() {
        let asked = Asked {
            rule: "push".into(),
            justification: Some("pushes leave this machine".into()),
            description: "git push origin main".into(),
            brief: "rule push: pushes leave this machine; uid 1000 (pid 4242), cwd /r, session s1"
                .into(),
        };
        let v: Value = serde_json::from_slice(&request_line("appr_7", "cmd_12", &asked)).unwrap();
        assert_eq!(
            v,
            json!({"jsonrpc": "2.0", "id": "appr_7", "method": "request", "params": {
                "type": "ApprovalRequest", "payload": {
                    "id": "appr_7", "tool_call_id": "cmd_12", "sender": "execd",
                    "action": "run command", "description": "git push origin main",
                    "display": [{"type": "brief", "text": asked.brief}]}}})
        );
        let v: Value =
            serde_json::from_slice(&resolved_line("appr_7", Answer::ApproveForSession)).unwrap();
        assert_eq!(
            v,
            json!({"jsonrpc": "2.0", "method": "event", "params": {
                "type": "ApprovalRequestResolved",
                "payload": {"request_id": "appr_7", "response": "approve_for_session"}}})
        );
    }

    #[test]
    fn approvers_see_their_own_uid_and_root_sees_all() {
        let mut a = Approvals::default();
        a.approvers.insert(ConnId(1), 1000);
        a.approvers.insert(ConnId(2), 0);
        a.approvers.insert(ConnId(3), 1001);
        assert_eq!(a.approvers_for(1000), vec![ConnId(1), ConnId(2)]);
        assert_eq!(a.approvers_for(0), vec![ConnId(2)]);
        assert_eq!(a.next_id(), "appr_1");
        a.grants.insert((1000, "s".into(), "rm".into()));
        a.grants.insert((1000, "t".into(), "rm".into()));
        a.end_session(1000, "s");
        assert_eq!(a.grants.len(), 1);
    }

    #[test]
    fn descriptions_quote_what_needs_it() {
        assert_eq!(shell_quote("ls"), "ls");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
