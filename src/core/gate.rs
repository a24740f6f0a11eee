//! The gate (PROTOCOL 7): every command passes it once before anything starts. The policy
//! decides `allow`, `deny` or `ask`; an `ask` parks the request and goes to the approvers
//! as a Wire `ApprovalRequest`; the first answer (or the timeout, the requester leaving,
//! its session closing, shutdown) decides; every decision is audited. This room holds
//! that state machine whole: who may approve, what waits for an answer, what was approved
//! for a whole session, and the Wire messages that carry them.
//!
//! Invariants:
//! - Who may approve: by default a connection of the command's own uid, or root; with
//!   `--approver-uid`/`--approver-gid`, only connections of those uids or groups (for
//!   every uid). Never the connection that asked, nor any connection of the same peer
//!   process: `ask` must hold the agent it is meant to hold.
//! - Only the approvers that got a request may answer it; the first answer wins.
//!   Anything but a well-formed `approve` or `approve_for_session` is a `reject`.
//! - An approval for the session covers the set of ask rules the approved line matched,
//!   for that owner and session: a later line is let through only when every ask rule it
//!   matches is covered. An unparsed line is approved once, never for the session.
//! - What an approver is shown is what will run: each simple command with the rules it
//!   matched, every variable the request sets, cwd, uid and pid; text cut in the middle
//!   (never at the end, so a trailing command cannot hide) with what was left out counted,
//!   and in the texts a person reads every character that does not show as itself
//!   escaped (`wire::shown`).

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use crate::core::confine::Decided;
use crate::core::launch::{Admitted, LaunchRequest};
use crate::core::table::ConnId;
use crate::core::table::Peer;
use crate::core::timers::TimerId;
use crate::core::view::cut_middle;
use crate::core::vocab::Answer;
use crate::core::{Core, Effect, Timer};
use crate::policy::sandbox::Given;
use crate::policy::{self, Decision, Policy, Verdict};
use crate::wire::rpc::RpcError;
use crate::wire::rpc::{self, ReqNo};
use crate::wire::shown::escape_invisible;

/// What an approval is about, for the approver and the audit log.
#[derive(Debug, Clone)]
pub struct Asked {
    /// The policy rule that decided.
    pub rule: String,
    /// The ask rules an approval for the session covers; empty for an unparsed line,
    /// which is approved once only.
    pub covers: Vec<String>,
    /// The command line as asked, cut in the middle past `DESCRIPTION_MAX`.
    pub description: String,
    /// The Wire display blocks: what will run, as the approver is shown it.
    pub display: Value,
}

/// The longest command line an approver is sent; a longer one arrives cut in the middle,
/// with the count of bytes left out (the audit record keeps all of it).
pub const DESCRIPTION_MAX: usize = 16 << 10;
/// The longest simple command, variable name or value an approver is sent, in bytes.
const SHOWN_MAX: usize = 1 << 10;
/// The most simple commands (and, apart, variables) an approver is sent one by one: the
/// first and last halves, with how many were left out between them.
const SHOWN_ITEMS: usize = 64;

/// A request waiting for an approver.
#[derive(Debug)]
pub struct PendingApproval {
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

/// A connection that subscribed as an approver, and who it is.
#[derive(Debug, Clone)]
pub struct Approver {
    pub uid: u32,
    /// Its primary group and the groups it holds.
    pub gids: Vec<u32>,
    pub pid: i32,
}

/// Every approver, pending approval and session grant.
#[derive(Debug, Default)]
pub struct Approvals {
    /// Connected approvers.
    pub approvers: HashMap<ConnId, Approver>,
    /// Approvers not reading what they are sent (their outgoing buffer is full): they
    /// count as absent until it drains.
    pub deaf: HashSet<ConnId>,
    pub pending: HashMap<String, PendingApproval>,
    /// Approvals for the session: per owner and session, the ask rules they cover.
    pub grants: HashMap<(u32, String), HashSet<String>>,
    /// Requesters that asked in `initialize` (`_meta.execd.approvalNotices`) to be told
    /// when a request of theirs waits for an approver.
    pub notices: HashSet<ConnId>,
    pub(super) next: u64,
}

impl Approvals {
    /// A fresh approval id, `appr_N`.
    pub fn next_id(&mut self) -> String {
        self.next += 1;
        format!("appr_{}", self.next)
    }

    /// The approvers that may answer for a command of `owner` asked by connection
    /// `requester` of process `requester_pid`, and are reading what they are sent. With
    /// `named` uids or gids (`--approver-uid/gid`) only those; else the owner's own uid
    /// and root. Never the requester's connection or process.
    pub fn approvers_for(
        &self,
        owner: u32,
        requester: ConnId,
        requester_pid: i32,
        named: (&[u32], &[u32]),
    ) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self
            .approvers
            .iter()
            .filter(|(c, a)| {
                **c != requester
                    && a.pid != requester_pid
                    && !self.deaf.contains(c)
                    && may_approve(a, owner, named)
            })
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

    /// Whether connection `conn` is told when its requests wait for an approver.
    pub fn set_notices(&mut self, conn: ConnId, on: bool) {
        if on {
            self.notices.insert(conn);
        } else {
            self.notices.remove(&conn);
        }
    }

    /// Whether earlier approvals for this owner's session cover every one of `rules`.
    fn covered(&self, owner: u32, session: &str, rules: &[String]) -> bool {
        !rules.is_empty()
            && self
                .grants
                .get(&(owner, session.to_string()))
                .is_some_and(|g| rules.iter().all(|r| g.contains(r)))
    }

    /// Forgets every grant of a session (closed) of `owner`.
    pub fn end_session(&mut self, owner: u32, session: &str) {
        self.grants.remove(&(owner, session.to_string()));
    }

    /// Pending approvals of commands of `owner`.
    fn pending_of(&self, owner: u32) -> usize {
        self.pending
            .values()
            .filter(|p| p.launch.peer.uid == owner)
            .count()
    }
}

/// Whether approver `a` may answer for commands of `owner`: with `named` uids or gids
/// (`--approver-uid/gid`) only one of those, for every owner; else the owner or root.
pub fn may_approve(a: &Approver, owner: u32, (uids, gids): (&[u32], &[u32])) -> bool {
    if uids.is_empty() && gids.is_empty() {
        a.uid == owner || a.uid == 0
    } else {
        uids.contains(&a.uid) || a.gids.iter().any(|g| gids.contains(g))
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
                "display": asked.display,
            },
        },
    });
    let mut line = Vec::with_capacity(256);
    crate::wire::encode::write_json(&mut line, &msg);
    line.push(b'\n');
    line
}

/// The Wire event that tells an approver how request `id` ended; a request its requester
/// withdrew (it left, or cancelled) says so in `reason`, so an approver shows it as
/// withdrawn rather than as answered by someone else.
pub fn resolved_line(id: &str, answer: Answer, withdrawn: bool) -> Vec<u8> {
    let mut payload = json!({ "request_id": id, "response": answer.as_str() });
    if withdrawn {
        payload["reason"] = WITHDRAWN.into();
    }
    let mut line = Vec::with_capacity(128);
    rpc::write_event(&mut line, "ApprovalRequestResolved", &payload);
    line
}

/// The reason of a request its requester took back (disconnect, `$/cancel_request`).
pub const WITHDRAWN: &str = "withdrawn";

/// The params of `_execd/approval_pending` (PROTOCOL 7.3) but the requester's own
/// `requestId`, which only its connection knows (the loop adds it).
pub fn pending_notice(appr: &str, rules: &[String], unparsed: bool, timeout_ms: u64) -> Value {
    json!({ "approval": appr, "rules": rules, "unparsed": unparsed, "timeoutMs": timeout_ms })
}

/// A command line as one string a person reads: the shell line itself, or an argv with
/// the words that need it quoted.
pub fn describe(launch: &LaunchRequest) -> String {
    match &launch.program {
        crate::types::Program::Shell { line, .. } => line.clone(),
        crate::types::Program::Direct { .. } => quoted(&launch.program.argv()),
    }
}

/// Words as a shell would need them written to mean themselves.
fn quoted(words: &[String]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` as a shell would need it written to mean itself.
fn shell_quote(word: &str) -> String {
    if !word.is_empty() && crate::core::launch::plain_word(word) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// At most `SHOWN_ITEMS` of `items`: the first and last halves, and how many were left
/// out between them.
fn first_and_last<T>(items: &[T]) -> (&[T], usize, &[T]) {
    if items.len() <= SHOWN_ITEMS {
        return (items, 0, &[]);
    }
    let half = SHOWN_ITEMS / 2;
    (
        &items[..half],
        items.len() - SHOWN_ITEMS,
        &items[items.len() - half..],
    )
}

/// One simple command as an approver sees it: the words (cut in the middle) and the
/// rules that matched it.
fn shown_command(argv: &[String], verdict: &Verdict) -> (String, Vec<Value>) {
    let rules = verdict
        .hits
        .iter()
        .filter(|h| h.argv == argv)
        .map(|h| json!({ "rule": h.rule, "decision": h.decision.as_str() }))
        .collect();
    (cut_middle(&quoted(argv), SHOWN_MAX), rules)
}

/// One `brief` display block: `text` with every character that does not show as itself
/// escaped (`\u{200b}`, `wire::shown`), so two lines that look alike read apart.
fn brief(text: &str) -> Value {
    json!({"type": "brief", "text": escape_invisible(text)})
}

/// What an approver is shown of a command the policy asks about (PROTOCOL 7.3): a first
/// `brief` as Wire clients expect it (rule, uid, pid, cwd, session), a `brief` per simple
/// command with the rules it matched, one per variable the request sets, and an `execd`
/// block with the same as data for programs. The `brief` texts are escaped for people;
/// the data stays exact, as `description` does.
fn approval_display(
    launch: &LaunchRequest,
    verdict: &Verdict,
    cwd: &str,
    outside: &[String],
) -> Value {
    let peer = launch.peer;
    let session = cut_middle(launch.family.session_id(), SHOWN_MAX);
    let why = verdict
        .justification
        .as_deref()
        .map_or(String::new(), |j| format!(": {j}"));
    // `rule NAME`, or what decided when no rule did (the default, `unparsed`).
    let decided = match verdict.rule.as_str() {
        "default" | "unparsed" => crate::wire::rpc::rule_words(&verdict.rule),
        name => format!("rule {name}"),
    };
    let mut blocks = vec![brief(&format!(
        "{decided}{why}; uid {} (pid {}), cwd {cwd}, session {session}",
        peer.uid, peer.pid
    ))];
    // What it may touch, and what an approval lets it touch beyond the sandbox in force.
    if !outside.is_empty() {
        blocks.push(brief(&format!(
            "outside the sandbox: {}",
            cut_middle(&outside.join(", "), SHOWN_MAX)
        )));
    }
    if let Some(g) = &launch.sandbox {
        blocks.push(brief(&format!(
            "sandbox {}",
            cut_middle(&g.brief(), SHOWN_MAX)
        )));
    }
    let (first, skipped, last) = first_and_last(&verdict.commands);
    let mut commands = Vec::new();
    for (i, argv) in first.iter().chain(last).enumerate() {
        if i == first.len() && skipped > 0 {
            blocks.push(brief(&format!("... {skipped} more simple commands ...")));
        }
        let (text, rules) = shown_command(argv, verdict);
        let said: Vec<String> = rules
            .iter()
            .map(|r| format!("rule {} ({})", r["rule"], r["decision"]).replace('"', ""))
            .collect();
        let said = if said.is_empty() {
            "no rule".to_string()
        } else {
            said.join(", ")
        };
        blocks.push(brief(&format!("runs: {text}  [{said}]")));
        commands.push(json!({ "command": text, "rules": rules }));
    }
    if verdict.unparsed {
        blocks.push(brief(
            "unparsed: the policy cannot read all that this runs; the command line is all \
             there is to see",
        ));
    }
    let (first, skipped_env, last) = first_and_last(&launch.env);
    let mut env = Vec::new();
    for (name, value) in first.iter().chain(last) {
        let (name, value) = (cut_middle(name, SHOWN_MAX), cut_middle(value, SHOWN_MAX));
        blocks.push(brief(&format!("sets {name}={value}")));
        env.push(json!({ "name": name, "value": value }));
    }
    if skipped_env > 0 {
        blocks.push(brief(&format!("... {skipped_env} more variables ...")));
    }
    blocks.push(json!({"type": "execd", "data": {
        "rule": verdict.rule,
        "justification": verdict.justification,
        "commands": commands,
        "commands_left_out": skipped,
        "unparsed": verdict.unparsed,
        "env": env,
        "env_left_out": skipped_env,
        "cwd": cwd,
        "uid": peer.uid,
        "pid": peer.pid,
        "session": session,
        "sandbox": launch.sandbox.as_ref().map(|g| g.to_json()),
        "outside": outside,
    }}));
    Value::Array(blocks)
}

/// What the gate made of a command.
#[derive(Debug)]
pub enum Gated {
    /// Start it now.
    Admitted(Box<LaunchRequest>),
    /// Answer the request with this error; nothing starts.
    Refused(RpcError),
    /// An approver was asked; the request waits.
    Asked,
}

impl Core {
    /// Passes a command through the policy, once, before anything starts (PROTOCOL 7):
    /// `allow` admits it, `deny` refuses it (`-32005`), `ask` sends it to the approvers
    /// it may go to and parks request `req` of `conn` until one answers, it times out or
    /// the requester leaves. Earlier approvals for the session that cover every ask rule
    /// the line matched admit it at once; no approver at all refuses it (`-32006`).
    pub fn gate(
        &mut self,
        mut launch: Box<LaunchRequest>,
        conn: ConnId,
        req: Option<ReqNo>,
    ) -> Gated {
        let (key, id) = self.table.next_ids(launch.prefix);
        let peer = launch.peer;
        // A shell session's own bash runs nothing but the lines typed into it, and each
        // of those is judged here on its own (`After::ShellLine`): the shell is not. Its
        // sandbox is the session's, decided once when the session is made (and asked
        // about here when that was wider than in force).
        if let crate::core::vocab::After::ShellStart(_) = launch.after {
            if launch.sandbox.is_none() {
                match self.sandbox_for(&launch, None) {
                    Err(e) => return self.sandbox_refused(&launch, &id, e),
                    Ok(Decided::Within(g)) => launch.sandbox = Some(g),
                    Ok(Decided::Wider { given, outside }) => {
                        launch.sandbox = Some(given);
                        let verdict = Verdict {
                            decision: Decision::Allow,
                            rule: "shell-session".into(),
                            justification: None,
                            hits: Vec::new(),
                            unparsed: false,
                            asked: Vec::new(),
                            commands: Vec::new(),
                            sandbox_rules: Vec::new(),
                            sandbox_top: true,
                        };
                        return self.escalate(launch, conn, req, (key, id), verdict, outside);
                    }
                }
            }
            launch.admitted = Some(Admitted {
                key,
                id,
                decision: "allow",
                rule: "shell-session".into(),
            });
            return Gated::Admitted(launch);
        }
        // A rule's `gids` match the peer's primary group and the groups it holds.
        let gids: Vec<u32> = std::iter::once(peer.gid)
            .chain(self.groups.get(&conn).into_iter().flatten().copied())
            .collect();
        let subject = policy::Subject {
            uid: peer.uid,
            gids: &gids,
        };
        let verdict = match (&launch.family, &launch.program) {
            // A line for a shell session is typed into an interactive shell.
            (
                crate::core::table::Family::Shell { .. },
                crate::types::Program::Shell { line, .. },
            ) => self.policy.judge_interactive(line, &subject),
            _ => self
                .policy
                .judge_program(&launch.program, &launch.env, &subject),
        };
        let admit = |launch: &mut LaunchRequest, decision, rule: &str| {
            launch.admitted = Some(Admitted {
                key,
                id: id.clone(),
                decision,
                rule: rule.to_string(),
            });
        };
        // The sandbox (PROTOCOL 16), unless the policy refuses the line anyway.
        let mut outside: Vec<String> = Vec::new();
        if verdict.decision != Decision::Deny {
            match self.line_sandbox(&launch, &verdict) {
                Err(e) => return self.sandbox_refused(&launch, &id, e),
                Ok(Decided::Within(g)) => launch.sandbox = Some(g),
                Ok(Decided::Wider { given, outside: o }) => {
                    launch.sandbox = Some(given);
                    outside = o;
                }
            }
        }
        if !outside.is_empty() {
            return self.escalate(launch, conn, req, (key, id), verdict, outside);
        }
        match verdict.decision {
            Decision::Allow => {
                admit(&mut launch, "allow", &verdict.rule);
                Gated::Admitted(launch)
            }
            Decision::Deny => {
                self.record(
                    "deny",
                    Some(peer),
                    json!({ "id": id, "rule": verdict.rule, "reason": "policy",
                            "command": describe(&launch), "via": launch.via.as_str() }),
                );
                self.log.line(format_args!(
                    "denied {id} of uid {}: {}",
                    peer.uid,
                    crate::wire::rpc::rule_words(&verdict.rule)
                ));
                self.launch_failed(&launch);
                Gated::Refused(RpcError::denied(
                    &verdict.rule,
                    verdict.justification.as_deref(),
                ))
            }
            Decision::Ask => self.ask(launch, conn, req, (key, id), verdict, Vec::new()),
        }
    }

    /// Parks `launch` for an approver (the policy asks, or it asks for more than the
    /// sandbox in force: `outside` says what). Earlier approvals for the session that
    /// cover every ask rule the line matched admit it at once (never an escalation or
    /// an unparsed line); no approver at all refuses it (`-32006`).
    fn ask(
        &mut self,
        mut launch: Box<LaunchRequest>,
        conn: ConnId,
        req: Option<ReqNo>,
        (key, id): (crate::core::table::Key, String),
        verdict: Verdict,
        outside: Vec<String>,
    ) -> Gated {
        let peer = launch.peer;
        let once = verdict.unparsed || !outside.is_empty();
        let admit = |launch: &mut LaunchRequest, decision, rule: &str| {
            launch.admitted = Some(Admitted {
                key,
                id: id.clone(),
                decision,
                rule: rule.to_string(),
            });
        };
        let session = launch.session_ref();
        if !once && self.approvals.covered(peer.uid, &session, &verdict.asked) {
            admit(&mut launch, "approve_for_session", &verdict.rule);
            return Gated::Admitted(launch);
        }
        let named = (
            self.cfg.approver_uids.as_slice(),
            self.cfg.approver_gids.as_slice(),
        );
        let approvers = self
            .approvals
            .approvers_for(peer.uid, conn, peer.pid, named);
        if approvers.is_empty() {
            self.record(
                "reject",
                Some(peer),
                json!({ "id": id, "rule": verdict.rule, "reason": "no approver" }),
            );
            self.launch_failed(&launch);
            return Gated::Refused(RpcError::not_approved(&verdict.rule, "no approver", None));
        }
        // The pending asks are bounded, and a shared uid's commands hold at most half of
        // them, all shared uids' seven eighths (PROTOCOL 8, fair shares).
        let max = self.cfg.max_pending_approvals;
        let shared = self
            .approvals
            .pending
            .values()
            .filter(|p| self.shares(p.launch.peer.uid))
            .count();
        let held = (self.approvals.pending_of(peer.uid), shared);
        let refused = if self.approvals.pending.len() >= max {
            Err(RpcError::limit("max-pending-approvals", max))
        } else {
            self.fair_share(peer.uid, held, ("max-pending-approvals", max))
        };
        if let Err(e) = refused {
            self.launch_failed(&launch);
            return Gated::Refused(e);
        }
        let appr = self.approvals.next_id();
        let command = describe(&launch);
        let cwd = cut_middle(&launch.cwd.display().to_string(), SHOWN_MAX);
        let asked = Asked {
            rule: verdict.rule.clone(),
            covers: if once {
                Vec::new()
            } else {
                verdict.asked.clone()
            },
            // The exact line (cut past 16 KiB): the display's texts are the ones
            // escaped for people (and execctl escapes what it prints).
            description: cut_middle(&command, DESCRIPTION_MAX),
            display: approval_display(&launch, &verdict, &cwd, &outside),
        };
        let line = request_line(&appr, &id, &asked);
        for a in &approvers {
            self.out.push(Effect::Send {
                conn: *a,
                line: line.clone(),
            });
        }
        if let Some(req) = req.filter(|_| self.approvals.notices.contains(&conn)) {
            // An unparsed line matched no ask rule of its own: the rule that asked is the
            // `unparsed` setting's.
            let rules = if verdict.asked.is_empty() {
                std::slice::from_ref(&verdict.rule)
            } else {
                verdict.asked.as_slice()
            };
            let timeout_ms = self.cfg.approval_timeout.as_millis() as u64;
            self.out.push(Effect::ApprovalPending {
                conn,
                req,
                params: pending_notice(&appr, rules, verdict.unparsed, timeout_ms),
            });
        }
        self.record(
            "ask",
            Some(peer),
            json!({ "id": id, "approval": appr, "rule": verdict.rule,
                    "rules": verdict.asked,
                    "reason": if !outside.is_empty() { "sandbox" }
                        else if verdict.unparsed { "unparsed" } else { "policy" },
                    "outside": outside,
                    "sandbox": launch.sandbox.as_ref().map(|g| g.to_json()),
                    "command": command, "via": launch.via.as_str() }),
        );
        admit(&mut launch, "approve", &verdict.rule);
        let timer = self.timers.add(
            self.now + self.cfg.approval_timeout,
            Timer::Approval(appr.clone()),
        );
        self.approvals.pending.insert(
            appr.clone(),
            PendingApproval {
                id: appr,
                conn,
                req,
                launch,
                asked,
                sent_to: approvers,
                timer,
            },
        );
        Gated::Asked
    }

    /// The sandbox of a line (`sandbox_for`), and for a shell session's line the
    /// session's: a line typed into a session runs in it, never wider, so each rule
    /// carrying a sandbox that matched the line must allow what the session's does.
    fn line_sandbox(&self, launch: &LaunchRequest, verdict: &Verdict) -> Result<Decided, RpcError> {
        let crate::core::vocab::After::ShellLine(exec) = &launch.after else {
            return self.sandbox_for(launch, Some(verdict));
        };
        let key = (launch.peer.uid, exec.session_id.clone());
        let session = match self.shells.map.get(&key) {
            // A caller bounded by a ceiling (PROTOCOL 16) asks for more when the
            // session's sandbox is wider than it.
            Some(s) => {
                let g = s.sandbox.clone().unwrap_or_else(Given::off);
                match launch.ceiling.as_deref() {
                    Some(c) if !g.sandbox.within(&c.sandbox) => {
                        let outside = g.sandbox.outside(&c.sandbox);
                        Decided::Wider { given: g, outside }
                    }
                    _ => Decided::Within(g),
                }
            }
            // The line makes the session: the session's sandbox is decided now, as for
            // its shell (the top-level one, narrowed by the request).
            None => self.sandbox_for(launch, None)?,
        };
        let (Decided::Within(g) | Decided::Wider { given: g, .. }) = &session;
        self.shell_line_within(launch, g, verdict)?;
        Ok(session)
    }

    /// A sandbox that cannot be given (`-32004`) or is refused (`-32005`): audited and
    /// answered; nothing starts.
    fn sandbox_refused(&mut self, launch: &LaunchRequest, id: &str, e: RpcError) -> Gated {
        let detail = e
            .data
            .as_ref()
            .and_then(|d| d.get("detail"))
            .cloned()
            .unwrap_or(Value::Null);
        let rule = e
            .data
            .as_ref()
            .and_then(|d| d.get("rule"))
            .cloned()
            .unwrap_or(Value::Null);
        self.record(
            "deny",
            Some(launch.peer),
            json!({ "id": id, "rule": rule, "reason": "sandbox", "detail": detail,
                    "command": describe(launch) }),
        );
        self.launch_failed(launch);
        Gated::Refused(e)
    }

    /// A request wider than the sandbox in force (`outside` says how): refused under
    /// `"escalation": "deny"` (`-32005`), else sent to an approver as an ask, shown so
    /// and approved once only (never for the session).
    fn escalate(
        &mut self,
        launch: Box<LaunchRequest>,
        conn: ConnId,
        req: Option<ReqNo>,
        (key, id): (crate::core::table::Key, String),
        mut verdict: Verdict,
        outside: Vec<String>,
    ) -> Gated {
        let why = format!("outside the sandbox: {}", outside.join(", "));
        if self.policy.escalation_denied() {
            let e = super::confine::refused("escalation", &why);
            return self.sandbox_refused(&launch, &id, e);
        }
        if verdict.decision != Decision::Ask {
            verdict.rule = "sandbox".into();
            verdict.justification = Some(why);
        }
        verdict.decision = Decision::Ask;
        self.ask(launch, conn, req, (key, id), verdict, outside)
    }

    /// An approver's answer to approval `id` (a Wire response). Only an approver that got
    /// the request may answer it; the first answer wins, later ones are ignored.
    pub fn approval_answer(&mut self, from: ConnId, id: &str, result: &Result<Value, Value>) {
        let may = self
            .approvals
            .pending
            .get(id)
            .is_some_and(|p| p.sent_to.contains(&from));
        if !may {
            return;
        }
        let (answer, feedback) = Answer::from_response(id, result);
        let approver = self.clients.get(&from).copied();
        self.resolve_approval_by(id, answer, "rejected", feedback, approver);
    }

    /// Ends approval `id` with `answer` (`reason` says why a reject happened).
    pub(super) fn resolve_approval(
        &mut self,
        id: &str,
        answer: Answer,
        reason: &str,
        feedback: Option<String>,
    ) {
        self.resolve_approval_by(id, answer, reason, feedback, None);
    }

    pub(super) fn resolve_approval_by(
        &mut self,
        id: &str,
        answer: Answer,
        reason: &str,
        feedback: Option<String>,
        approver: Option<Peer>,
    ) {
        let Some(p) = self.approvals.pending.remove(id) else {
            return;
        };
        self.timers.cancel(p.timer);
        let line = resolved_line(id, answer, reason == WITHDRAWN);
        for a in &p.sent_to {
            self.out.push(Effect::Send {
                conn: *a,
                line: line.clone(),
            });
        }
        let peer = p.launch.peer;
        let command_id = p.launch.admitted.as_ref().map(|a| a.id.clone());
        let mut fields = json!({ "id": command_id, "approval": id, "rule": p.asked.rule });
        if let Some(a) = approver {
            fields["approver"] = json!({ "uid": a.uid, "pid": a.pid });
        }
        // Nothing new starts once the daemon is stopping.
        let answer = if self.stopping {
            Answer::Reject
        } else {
            answer
        };
        match answer {
            Answer::Approve | Answer::ApproveForSession => {
                if answer == Answer::ApproveForSession {
                    // An unparsed line is approved this once: its words say too little
                    // of what it runs to stand for the lines after it.
                    let covers = &p.asked.covers;
                    fields["for_session"] = (!covers.is_empty()).into();
                    if !covers.is_empty() {
                        fields["rules"] = json!(covers);
                        self.approvals
                            .grants
                            .entry((peer.uid, p.launch.session_ref()))
                            .or_default()
                            .extend(covers.iter().cloned());
                    }
                }
                self.record("approve", Some(peer), fields);
                self.out.push(Effect::Launch {
                    conn: p.conn,
                    req: p.req,
                    launch: p.launch,
                });
            }
            Answer::Reject => {
                fields["reason"] = reason.into();
                if let Some(f) = &feedback {
                    fields["feedback"] = f.clone().into();
                }
                self.record("reject", Some(peer), fields);
                self.launch_failed(&p.launch);
                if let Some(req) = p.req {
                    self.out.push(Effect::Reply {
                        conn: p.conn,
                        req,
                        result: Err(RpcError::not_approved(&p.asked.rule, reason, feedback)),
                    });
                }
            }
        }
    }

    /// A command that will not start (refused by the gate or an approver, or its spawn
    /// failed): a bash session made for it alone is not kept.
    pub fn launch_failed(&mut self, launch: &LaunchRequest) {
        // A session made by `shell/sessions/create` whose first shell was refused (its
        // sandbox, or no approver for it) never had a shell: it is not kept.
        if let crate::core::vocab::After::ShellStart(crate::core::vocab::ShellThen::Create) =
            launch.after
        {
            let key = (launch.peer.uid, launch.family.session_id().to_string());
            if self
                .shells
                .map
                .get(&key)
                .is_some_and(|s| s.shell.is_none() && s.sandbox.is_none())
            {
                self.forget_shell(&key);
            }
        }
        if let crate::core::vocab::After::BashExec {
            created_session: true,
            ..
        } = launch.after
        {
            let key = (launch.peer.uid, launch.family.session_id().to_string());
            let unused = self
                .table
                .sessions
                .get(&key)
                .is_some_and(|s| s.commands.is_empty());
            if unused {
                self.forget_session(&key);
            }
        }
    }

    /// Replaces the policy (SIGHUP), or keeps the old one when the new one is refused.
    pub fn reload_policy(&mut self, loaded: Result<Policy, String>) {
        match loaded {
            Ok(p) => {
                self.log
                    .line(format_args!("policy reloaded: {} rule(s)", p.rule_count()));
                self.policy = p;
                self.record("policy_reload", None, json!({ "ok": true }));
            }
            Err(e) => {
                self.log
                    .line(format_args!("policy not reloaded, the old one stays: {e}"));
                self.record("policy_reload", None, json!({ "ok": false, "error": e }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::log::Log;
    use crate::core::table::Family;
    use crate::core::testkit::{self, later, replies, C1, C2};
    use std::time::Duration;

    const APPROVER: ConnId = ConnId(9);
    const OTHER_APPROVER: ConnId = ConnId(10);

    /// A core whose policy asks for `true` and `rm` (two rules) and allows the rest, with
    /// audit records in its log queue.
    fn gated() -> Core {
        let mut c = testkit::core();
        c.cfg.audit = Some(crate::config::AuditTarget::Stderr);
        c.cfg.approval_timeout = Duration::from_secs(60);
        c.cfg.max_pending_approvals = 16;
        let mut c = Core::new(c.cfg, c.now, c.wall, Log::new(false));
        c.policy = Policy::parse(
            r#"{"rules": [
                {"name": "true", "pattern": ["true"], "decision": "ask"},
                {"name": "rm", "pattern": ["rm"], "decision": "ask"},
                {"name": "no-shutdown", "pattern": ["shutdown"], "decision": "deny"}
            ]}"#,
        )
        .unwrap();
        c
    }

    /// An approver connection of `uid` (its pid: uid + 10000, its group: uid).
    fn approver(uid: u32) -> Approver {
        Approver {
            uid,
            gids: vec![uid],
            pid: uid as i32 + 10000,
        }
    }

    /// A bash line of uid `uid` in bash session `session`.
    fn line(uid: u32, session: &str, text: &str) -> Box<LaunchRequest> {
        let mut r = testkit::request(
            Family::Bash {
                session_id: session.into(),
            },
            crate::types::Stdio3::Separate,
        );
        r.peer.uid = uid;
        r.program = crate::types::Program::Shell {
            shell: "/bin/sh".into(),
            line: text.into(),
        };
        r.command = text.into();
        Box::new(r)
    }

    /// The approval requests and resolutions sent to each connection, as JSON.
    fn sent(c: &mut Core) -> Vec<(ConnId, Value)> {
        let mut v = Vec::new();
        for e in std::mem::take(&mut c.out) {
            if let Effect::Send { conn, line } = e {
                v.push((conn, serde_json::from_slice(&line).unwrap()));
            }
        }
        v
    }

    /// The commands the gate let through after an approval.
    fn launched(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Launch { launch, .. } => Some(launch.command.clone()),
                _ => None,
            })
            .collect()
    }

    /// A shared uid's connection churn fills only its half of a stalled audit queue:
    /// root's records still go in.
    #[test]
    fn a_shared_uids_connections_hold_only_its_share_of_the_audit_queue() {
        use crate::core::table::Peer;
        let mut c = gated();
        let shared = Peer {
            uid: 1000,
            gid: 1000,
            pid: 7,
        };
        let root = Peer {
            uid: 0,
            gid: 0,
            pid: 8,
        };
        let pad = "x".repeat(8000);
        for _ in 0..400 {
            c.record("connect", Some(shared), json!({ "pad": pad }));
        }
        let held = c.log.queue.pending().len();
        assert!(held <= crate::core::log::QUEUE_BYTES / 2, "{held}");
        c.record("connect", Some(root), json!({}));
        let records = audit(&mut c);
        assert_eq!(
            records.last().unwrap()["peer"]["uid"],
            0,
            "root's record went in"
        );
    }

    /// The audit records written so far, as JSON.
    fn audit(c: &mut Core) -> Vec<Value> {
        let text = String::from_utf8(c.log.queue.pending().to_vec()).unwrap();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Asks for `text` (uid 1000, session `s`) with one approver; returns the approval id.
    fn ask(c: &mut Core, text: &str, req: u64) -> String {
        match c.gate(line(1000, "s", text), C1, Some(ReqNo(req))) {
            Gated::Asked => {}
            other => panic!("{text}: {other:?}"),
        }
        let msgs = sent(c);
        let (to, msg) = msgs.last().expect("a request to the approver");
        assert_eq!(*to, APPROVER);
        assert_eq!(msg["method"], "request");
        msg["id"].as_str().unwrap().to_string()
    }

    fn answer(response: &str, id: &str) -> Result<Value, Value> {
        Ok(json!({ "request_id": id, "response": response }))
    }

    fn error_of(r: &(ConnId, ReqNo, Result<Value, RpcError>)) -> (i64, Value) {
        let e = r.2.as_ref().unwrap_err();
        (e.code, e.data.clone().unwrap_or_default())
    }

    #[test]
    fn an_ask_waits_for_the_approver_and_an_approve_starts_it() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let id = ask(&mut c, "true", 1);
        assert!(replies(&mut c).is_empty(), "the request waits");
        c.approval_answer(APPROVER, &id, &answer("approve", &id));
        let effects = std::mem::take(&mut c.out);
        assert_eq!(launched(&effects), ["true"]);
        let resolved = effects.iter().any(|e| matches!(e, Effect::Send { conn, line }
            if *conn == APPROVER && String::from_utf8_lossy(line).contains("ApprovalRequestResolved")));
        assert!(resolved, "the approver hears how it ended");
        let records = audit(&mut c);
        let events: Vec<&str> = records
            .iter()
            .map(|r| r["event"].as_str().unwrap())
            .collect();
        assert_eq!(events, ["ask", "approve"]);
        assert_eq!(
            records[1]["approver"]["uid"],
            Value::Null,
            "no client known for C9"
        );
        assert!(c.approvals.pending.is_empty());
    }

    #[test]
    fn a_reject_answers_not_approved_with_the_feedback_and_starts_nothing() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let id = ask(&mut c, "rm -rf /tmp/x", 1);
        let no = Ok(json!({"request_id": id, "response": "reject", "feedback": "not today"}));
        c.approval_answer(APPROVER, &id, &no);
        let effects = std::mem::take(&mut c.out);
        assert!(launched(&effects).is_empty());
        c.out = effects;
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(
            error_of(&r[0]),
            (
                -32006,
                json!({"rule": "rm", "reason": "rejected", "feedback": "not today"})
            )
        );
    }

    #[test]
    fn only_an_approver_that_was_asked_may_answer_and_the_first_answer_wins() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let id = ask(&mut c, "true", 1);
        // Another connection (not an approver when it was asked) cannot answer.
        c.approval_answer(C2, &id, &answer("approve", &id));
        assert!(c.out.is_empty() && c.approvals.pending.contains_key(&id));
        c.approval_answer(APPROVER, &id, &answer("reject", &id));
        c.approval_answer(APPROVER, &id, &answer("approve", &id));
        let effects = std::mem::take(&mut c.out);
        assert!(
            launched(&effects).is_empty(),
            "the later approve is ignored"
        );
    }

    #[test]
    fn an_unanswered_ask_times_out_as_a_reject() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        ask(&mut c, "true", 1);
        later(&mut c, Duration::from_secs(59));
        assert!(replies(&mut c).is_empty());
        later(&mut c, Duration::from_secs(1));
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(error_of(&r[0]).1["reason"], "timeout");
        assert!(c.approvals.pending.is_empty());
    }

    #[test]
    fn a_requester_that_leaves_withdraws_its_ask() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let id = ask(&mut c, "true", 1);
        c.disconnected(C1);
        let msgs = sent(&mut c);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].1["params"]["payload"]["request_id"], id.as_str());
        assert_eq!(msgs[0].1["params"]["payload"]["response"], "reject");
        assert_eq!(msgs[0].1["params"]["payload"]["reason"], "withdrawn");
        c.approval_answer(APPROVER, &id, &answer("approve", &id));
        assert!(launched(&std::mem::take(&mut c.out)).is_empty(), "too late");
        let reasons: Vec<Value> = audit(&mut c).iter().map(|r| r["reason"].clone()).collect();
        assert!(reasons.contains(&json!("withdrawn")), "{reasons:?}");
    }

    #[test]
    fn closing_the_session_rejects_its_asks() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        c.open_session(1000, Some("s"), None, true).unwrap();
        ask(&mut c, "true", 1);
        c.close_session(&(1000, "s".to_string()));
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(error_of(&r[0]).1["reason"], "session closed");
    }

    #[test]
    fn approve_for_session_admits_the_same_rule_in_the_same_session_only() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(0));
        let id = ask(&mut c, "true", 1);
        c.approval_answer(APPROVER, &id, &answer("approve_for_session", &id));
        std::mem::take(&mut c.out);
        // The same rule, owner and session: admitted without asking.
        match c.gate(line(1000, "s", "true x"), C1, Some(ReqNo(2))) {
            Gated::Admitted(l) => {
                assert_eq!(l.admitted.unwrap().decision, "approve_for_session")
            }
            other => panic!("{other:?}"),
        }
        // Another rule, another session, another owner: asked again.
        for (uid, session, text) in [
            (1000, "s", "rm x"),
            (1000, "t", "true"),
            (1001, "s", "true"),
        ] {
            let asked = c.gate(line(uid, session, text), C2, Some(ReqNo(3)));
            assert!(matches!(asked, Gated::Asked), "{uid} {session} {text}");
        }
    }

    #[test]
    fn a_session_approval_covers_only_the_ask_rules_it_was_given() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(0));
        let id = ask(&mut c, "true", 1);
        c.approval_answer(APPROVER, &id, &answer("approve_for_session", &id));
        std::mem::take(&mut c.out);
        // `true` again: covered. `true; rm -rf V` also matches `rm`: asked.
        assert!(matches!(
            c.gate(line(1000, "s", "true; true"), C1, None),
            Gated::Admitted(_)
        ));
        assert!(matches!(
            c.gate(line(1000, "s", "true; rm -rf V"), C1, None),
            Gated::Asked
        ));
        // Approving both for the session covers the pair.
        let id = sent(&mut c).last().unwrap().1["id"]
            .as_str()
            .unwrap()
            .to_string();
        c.approval_answer(APPROVER, &id, &answer("approve_for_session", &id));
        std::mem::take(&mut c.out);
        assert!(matches!(
            c.gate(line(1000, "s", "rm -rf W && true"), C1, None),
            Gated::Admitted(_)
        ));
    }

    #[test]
    fn an_unparsed_line_is_approved_once_never_for_the_session() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(0));
        let id = ask(&mut c, "echo $(true)", 1);
        c.approval_answer(APPROVER, &id, &answer("approve_for_session", &id));
        assert_eq!(launched(&std::mem::take(&mut c.out)), ["echo $(true)"]);
        for later in ["echo $(true)", "x=$(rm -rf V)", "true"] {
            assert!(
                matches!(c.gate(line(1000, "s", later), C1, None), Gated::Asked),
                "{later}"
            );
        }
        let approve = audit(&mut c)
            .into_iter()
            .find(|r| r["event"] == "approve")
            .unwrap();
        assert_eq!(approve["for_session"], false);
    }

    #[test]
    fn the_requester_never_approves_its_own_command() {
        let mut c = gated();
        // The requesting connection itself, then another connection of the same process.
        c.approvals.approvers.insert(C1, approver(1000));
        let mut same_process = approver(1000);
        same_process.pid = 42; // the requester's pid (testkit's peer)
        c.approvals.approvers.insert(C2, same_process);
        let Gated::Refused(e) = c.gate(line(1000, "s", "true"), C1, Some(ReqNo(1))) else {
            panic!("asked its own connection");
        };
        assert_eq!(e.data.unwrap()["reason"], "no approver");
        assert!(sent(&mut c).is_empty(), "nobody was sent the request");
        // A named approver uid takes it; the owner's own uid no longer does.
        c.cfg.approver_uids = vec![2000];
        c.approvals.approvers.insert(APPROVER, approver(1000));
        assert!(matches!(
            c.gate(line(1000, "s", "true"), C1, None),
            Gated::Refused(_)
        ));
        c.approvals.approvers.insert(OTHER_APPROVER, approver(2000));
        assert!(matches!(
            c.gate(line(1000, "s", "true"), C1, None),
            Gated::Asked
        ));
        assert_eq!(sent(&mut c)[0].0, OTHER_APPROVER);
    }

    #[test]
    fn approvers_see_each_command_its_rules_and_every_variable() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let mut l = line(1000, "s", "true --version");
        l.env = vec![("BASH_ENV".into(), "evil.sh".into())];
        assert!(matches!(c.gate(l, C1, Some(ReqNo(1))), Gated::Asked));
        let msg = sent(&mut c).remove(0).1;
        let display = msg["params"]["payload"]["display"].to_string();
        assert!(
            display.contains("runs: true --version  [rule true (ask)]"),
            "{display}"
        );
        assert!(display.contains("sets BASH_ENV=evil.sh"), "{display}");
        assert!(
            display.contains("unparsed"),
            "BASH_ENV makes it unparsed: {display}"
        );
        // A 17 KB comment before a trailing command: cut in the middle, the end shown.
        let long = format!("true #{}\nrm -rf V", "x".repeat(17 << 10));
        assert!(matches!(
            c.gate(line(1000, "s", &long), C1, Some(ReqNo(2))),
            Gated::Asked
        ));
        let msg = sent(&mut c).remove(0).1;
        let description = msg["params"]["payload"]["description"].as_str().unwrap();
        assert!(
            description.ends_with("\nrm -rf V"),
            "{}",
            &description[description.len() - 40..]
        );
        assert!(description.contains("bytes left out"));
        assert!(description.len() < 17 << 10);
        let data = &msg["params"]["payload"]["display"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["data"];
        assert_eq!(data["commands"][1]["command"], "rm -rf V");
        assert_eq!(data["commands"][1]["rules"][0]["rule"], "rm");
    }

    /// Two paths that look alike read apart: what does not show as itself is escaped in
    /// the texts an approver reads, and the description and data stay exact.
    #[test]
    fn invisible_characters_are_escaped_in_what_approvers_read() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let mut l = line(1000, "s\u{2060}", "");
        l.program = crate::types::Program::Direct {
            program: "rm".into(),
            args: vec!["-rf".into(), "/tmp/a\u{200b}b".into(), "\u{feff}c".into()],
        };
        l.env = vec![("X\u{200b}".into(), "\u{3164}".into())];
        assert!(matches!(c.gate(l, C1, Some(ReqNo(1))), Gated::Asked));
        let msg = sent(&mut c).remove(0).1;
        let payload = &msg["params"]["payload"];
        let texts: Vec<&str> = payload["display"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect();
        let all = texts.join("\n");
        assert!(
            all.contains(r"runs: rm -rf '/tmp/a\u{200b}b' '\u{feff}c'"),
            "{all}"
        );
        assert!(all.contains(r"sets X\u{200b}=\u{3164}"), "{all}");
        assert!(all.contains(r"session s\u{2060}"), "{all}");
        assert!(!all.contains(['\u{200b}', '\u{feff}', '\u{2060}', '\u{3164}']));
        assert_eq!(
            payload["description"], "rm -rf '/tmp/a\u{200b}b' '\u{feff}c'",
            "the exact words"
        );
        let data = &payload["display"].as_array().unwrap().last().unwrap()["data"];
        assert_eq!(data["env"][0]["name"], "X\u{200b}");
    }

    /// One uid's flood of 900 KB denied lines: each record is cut to 16 KiB, the uid
    /// holds at most half of the audit queue, another uid's denial and root's command
    /// are still recorded, and a command whose `start` record has no room is not started.
    #[test]
    fn a_flood_of_denials_loses_only_its_own_records_and_nothing_runs_unrecorded() {
        let mut c = gated();
        c.cfg.audit = Some(crate::config::AuditTarget::File("/audit".into()));
        let policy = std::mem::take(&mut c.policy);
        let mut c = Core::new(c.cfg, c.now, c.wall, Log::new(false));
        c.policy = policy;
        c.daemon_uid = 0;
        let huge = format!("shutdown {}", "x".repeat(100_000));
        for _ in 0..50 {
            assert!(matches!(
                c.gate(line(1000, "s", &huge), C1, None),
                Gated::Refused(_)
            ));
        }
        let q = c.audit.as_ref().unwrap();
        assert!(q.pending().len() <= super::super::log::QUEUE_BYTES / 2);
        assert!(q.pending().len() > super::super::log::QUEUE_BYTES / 4);
        // Another uid's denial and root's command still go in.
        assert!(matches!(
            c.gate(line(2000, "t", "shutdown now"), C2, None),
            Gated::Refused(_)
        ));
        let mut root = line(0, "r", "true");
        root.prefix = "cmd";
        let (k, id) = c.table.next_ids("cmd");
        c.promise_start(&root, k, &id)
            .expect("room for root's start");
        c.started(&root, k, id.clone(), 4242, 0);
        let text = String::from_utf8(c.audit.as_ref().unwrap().pending().to_vec()).unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(records.iter().all(|r| r.to_string().len() < 16 << 10));
        let of = |uid: u32, event: &str| {
            records
                .iter()
                .filter(|r| r["peer"]["uid"] == uid && r["event"] == event)
                .count()
        };
        assert!(of(1000, "deny") < 50, "its flood lost its own records");
        assert_eq!(of(2000, "deny"), 1);
        assert_eq!(of(0, "start"), 1);
        let first = records.iter().find(|r| r["peer"]["uid"] == 1000).unwrap();
        assert_eq!(first["line_bytes"], huge.len());
        // The target stalls and the queue fills: no command starts unrecorded.
        while c.audit.as_ref().unwrap().pending().len() < super::super::log::QUEUE_BYTES - 200 {
            c.record("exit", None, json!({ "id": "x".repeat(100) }));
        }
        let (k2, id2) = c.table.next_ids("cmd");
        let e = c.promise_start(&root, k2, &id2).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::LIMIT_REACHED);
        assert_eq!(e.data.unwrap()["limit"], "audit");
    }

    #[test]
    fn with_no_approver_an_ask_is_refused_at_once() {
        let mut c = gated();
        let Gated::Refused(e) = c.gate(line(1000, "s", "true"), C1, Some(ReqNo(1))) else {
            panic!("not refused");
        };
        assert_eq!(e.code, -32006);
        assert_eq!(e.data.unwrap()["reason"], "no approver");
        // An approver of another uid does not count; root's does.
        c.approvals.approvers.insert(APPROVER, approver(1001));
        assert!(matches!(
            c.gate(line(1000, "s", "true"), C1, Some(ReqNo(2))),
            Gated::Refused(_)
        ));
        c.approvals.approvers.insert(OTHER_APPROVER, approver(0));
        assert!(matches!(
            c.gate(line(1000, "s", "true"), C1, Some(ReqNo(3))),
            Gated::Asked
        ));
    }

    #[test]
    fn an_approver_that_stops_reading_counts_as_absent_until_it_drains() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        c.approvals.set_listening(APPROVER, false);
        assert!(matches!(
            c.gate(line(1000, "s", "true"), C1, Some(ReqNo(1))),
            Gated::Refused(_)
        ));
        c.approvals.set_listening(APPROVER, true);
        ask(&mut c, "true", 2);
    }

    #[test]
    fn shutdown_answers_pending_asks_and_starts_nothing() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let id = ask(&mut c, "true", 1);
        c.begin_shutdown();
        c.answer_all_parked();
        let effects = std::mem::take(&mut c.out);
        assert!(launched(&effects).is_empty());
        c.out = effects;
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(error_of(&r[0]).0, -32007);
        // An approve that arrives after is ignored.
        c.approval_answer(APPROVER, &id, &answer("approve", &id));
        assert!(launched(&std::mem::take(&mut c.out)).is_empty());
    }

    /// Fair shares of the pending asks: one shared uid at most half, all shared uids
    /// seven eighths, so two of them cannot lock root out.
    #[test]
    fn pending_asks_are_bounded_and_a_non_root_uid_holds_at_most_half() {
        let mut c = gated();
        c.approvals.approvers.clear();
        c.cfg.max_pending_approvals = 4;
        c.approvals.approvers.insert(APPROVER, approver(0));
        let refused = |c: &mut Core, uid: u32| match c.gate(line(uid, "s", "true"), C1, None) {
            Gated::Refused(e) => {
                assert_eq!(e.code, -32003);
                e.data.unwrap()["limit"].clone()
            }
            other => panic!("uid {uid}: {other:?}"),
        };
        // uid 1000 holds its half (2 of 4); another uid still has room.
        ask(&mut c, "true", 1);
        ask(&mut c, "true", 2);
        assert_eq!(refused(&mut c, 1000), "max-pending-approvals-per-uid");
        assert!(matches!(
            c.gate(line(1001, "s", "true"), C1, None),
            Gated::Asked
        ));
        // Shared uids hold 3, seven eighths of 4: the last is root's.
        assert_eq!(refused(&mut c, 1001), "max-pending-approvals-shared");
        assert!(matches!(
            c.gate(line(0, "s", "true"), C2, None),
            Gated::Asked
        ));
        // All 4 taken: root too is refused.
        assert_eq!(refused(&mut c, 0), "max-pending-approvals");
    }

    #[test]
    fn deny_refuses_with_the_rule_and_allow_admits() {
        let mut c = gated();
        let Gated::Refused(e) = c.gate(line(1000, "s", "shutdown now"), C1, Some(ReqNo(1))) else {
            panic!("not refused");
        };
        assert_eq!(e.code, -32005);
        assert_eq!(e.data.unwrap()["rule"], "no-shutdown");
        assert!(matches!(
            c.gate(line(1000, "s", "ls"), C1, Some(ReqNo(2))),
            Gated::Admitted(_)
        ));
        let events: Vec<Value> = audit(&mut c).iter().map(|r| r["event"].clone()).collect();
        assert_eq!(events, [json!("deny")]);
    }

    #[test]
    fn a_cancelled_ask_is_withdrawn_and_answered_cancelled() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        ask(&mut c, "true", 7);
        c.cancel(C1, ReqNo(7));
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(error_of(&r[0]).0, -32800);
        assert!(c.approvals.pending.is_empty());
    }

    #[test]
    fn a_cancelled_ask_is_resolved_as_withdrawn_for_the_approvers() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let id = ask(&mut c, "true", 7);
        c.cancel(C1, ReqNo(7));
        let msgs = sent(&mut c);
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert_eq!(msgs[0].0, APPROVER);
        assert_eq!(
            msgs[0].1["params"]["payload"],
            json!({"request_id": id, "response": "reject", "reason": "withdrawn"})
        );
    }

    #[test]
    fn an_answered_or_timed_out_ask_carries_no_withdrawn_reason() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        let id = ask(&mut c, "true", 1);
        c.approval_answer(APPROVER, &id, &answer("reject", &id));
        let msgs = sent(&mut c);
        assert_eq!(msgs[0].1["params"]["payload"].get("reason"), None);
        ask(&mut c, "true", 2);
        later(&mut c, Duration::from_secs(60));
        let msgs = sent(&mut c);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].1["params"]["payload"]["response"], "reject");
        assert_eq!(msgs[0].1["params"]["payload"].get("reason"), None);
    }

    /// The `_execd/approval_pending` notices the core asked the loop to send.
    fn notices(effects: &[Effect]) -> Vec<(ConnId, ReqNo, Value)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::ApprovalPending { conn, req, params } => {
                    Some((*conn, *req, params.clone()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_requester_that_asked_is_told_at_once_that_it_waits_and_for_what() {
        let mut c = gated();
        c.approvals.approvers.insert(APPROVER, approver(1000));
        // Not asked for: nothing beyond the request to the approver.
        assert!(matches!(
            c.gate(line(1000, "s", "rm -rf x"), C1, Some(ReqNo(1))),
            Gated::Asked
        ));
        assert!(notices(&std::mem::take(&mut c.out)).is_empty());
        c.approvals.set_notices(C1, true);
        assert!(matches!(
            c.gate(line(1000, "s", "true; rm x"), C1, Some(ReqNo(2))),
            Gated::Asked
        ));
        let effects = std::mem::take(&mut c.out);
        let n = notices(&effects);
        let appr = c
            .approvals
            .pending
            .values()
            .find(|p| p.req == Some(ReqNo(2)))
            .unwrap()
            .id
            .clone();
        assert_eq!(
            n,
            [(
                C1,
                ReqNo(2),
                json!({"approval": appr, "rules": ["rm", "true"], "unparsed": false,
                       "timeoutMs": 60000})
            )]
        );
        // An unparsed line names the rule that asked; a notification (no request id) and
        // another connection get no notice; a disconnect forgets the wish.
        assert!(matches!(
            c.gate(line(1000, "s", "echo $(true)"), C1, Some(ReqNo(3))),
            Gated::Asked
        ));
        let n = notices(&std::mem::take(&mut c.out));
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].2["unparsed"], true);
        assert_eq!(n[0].2["rules"].as_array().map(Vec::len), Some(1));
        assert!(matches!(
            c.gate(line(1000, "s", "true"), C1, None),
            Gated::Asked
        ));
        assert!(matches!(
            c.gate(line(1000, "s", "true"), C2, Some(ReqNo(4))),
            Gated::Asked
        ));
        assert!(notices(&std::mem::take(&mut c.out)).is_empty());
        c.disconnected(C1);
        assert!(!c.approvals.notices.contains(&C1));
    }

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
        let brief = "rule push: pushes leave this machine; uid 1000 (pid 4242), cwd /r, session s1";
        let asked = Asked {
            rule: "push".into(),
            covers: vec!["push".into()],
            description: "git push origin main".into(),
            display: json!([{"type": "brief", "text": brief}]),
        };
        let v: Value = serde_json::from_slice(&request_line("appr_7", "cmd_12", &asked)).unwrap();
        assert_eq!(
            v,
            json!({"jsonrpc": "2.0", "id": "appr_7", "method": "request", "params": {
                "type": "ApprovalRequest", "payload": {
                    "id": "appr_7", "tool_call_id": "cmd_12", "sender": "execd",
                    "action": "run command", "description": "git push origin main",
                    "display": [{"type": "brief", "text": brief}]}}})
        );
        let v: Value =
            serde_json::from_slice(&resolved_line("appr_7", Answer::ApproveForSession, false))
                .unwrap();
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
        a.approvers.insert(ConnId(1), approver(1000));
        a.approvers.insert(ConnId(2), approver(0));
        a.approvers.insert(ConnId(3), approver(1001));
        let none = (&[][..], &[][..]);
        assert_eq!(
            a.approvers_for(1000, ConnId(99), 1, none),
            vec![ConnId(1), ConnId(2)]
        );
        assert_eq!(a.approvers_for(0, ConnId(99), 1, none), vec![ConnId(2)]);
        // Never the requesting connection, nor another connection of its process.
        assert_eq!(a.approvers_for(1000, ConnId(1), 1, none), vec![ConnId(2)]);
        assert_eq!(
            a.approvers_for(1000, ConnId(99), 11000, none),
            vec![ConnId(2)]
        );
        // Named approvers approve for every uid, and no one else does (root included).
        assert_eq!(
            a.approvers_for(1000, ConnId(99), 1, (&[1001], &[])),
            vec![ConnId(3)]
        );
        assert_eq!(
            a.approvers_for(0, ConnId(99), 1, (&[], &[1000])),
            vec![ConnId(1)]
        );
        assert_eq!(a.next_id(), "appr_1");
        a.grants
            .entry((1000, "s".into()))
            .or_default()
            .insert("rm".into());
        a.grants
            .entry((1000, "t".into()))
            .or_default()
            .insert("rm".into());
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
