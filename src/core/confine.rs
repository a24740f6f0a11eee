//! Which sandbox a command runs in (PROTOCOL 16), decided as data before it starts: the
//! sandbox in force for its line (the top-level one, else `--sandbox`, for the simple
//! commands no rule carrying a sandbox matched, intersected with those rules' own), at
//! most the caller's ceiling, narrowed by what the request asks; wider than in force is
//! an escalation, which the gate sends to an approver or refuses. The core only carries
//! the outcome (`Given`); `sys::sandbox` makes it real.
//!
//! `$CWD` is chosen from the words of the command's directory (`workspace_of`): nothing
//! here looks at a path, and the child checks the choice on the directory it entered.
//!
//! The peer tie bounds it (`LaunchRequest::ceiling`, set by the loop from the
//! connection's tie with `ceiling_of`): a request whose peer is tied to a sandboxed
//! command carries that command's `Given` (its sandbox and `$CWD`); a peer that descends
//! from the daemon but is tied to no command (or to one no longer known) carries
//! `read-only`. The decision below treats it as the upper bound of everything else, and
//! `$CWD` is the ceiling's. A line for an existing shell session whose sandbox is wider
//! than the ceiling is an escalation, as a request for more would be.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::launch::LaunchRequest;
use super::Core;
use crate::policy::sandbox::{
    workspace_of, Base, Given, Kernel, Names, Partial, Resolved, Template,
};
use crate::policy::Verdict;
use crate::wire::rpc::{RpcError, DENIED, SPAWN_FAILED};

/// What the daemon knows about sandboxes, set at start (and at a policy reload): the
/// default, the workspaces, what the names stand for and what the kernel offers.
#[derive(Debug, Clone)]
pub struct Sandboxing {
    /// `--sandbox` (`off` when not given).
    pub default: Template,
    /// Every workspace: as named, and its real path.
    pub workspaces: Vec<(PathBuf, PathBuf)>,
    /// The real `--tmpdir`.
    pub tmpdir: PathBuf,
    /// Homes by uid, looked up at start.
    pub homes: HashMap<u32, PathBuf>,
    /// Operator paths -> their real paths.
    pub real: HashMap<PathBuf, PathBuf>,
    /// `--run-as`'s uid, for a root daemon.
    pub run_as: Option<u32>,
    pub kernel: Kernel,
}

impl Default for Sandboxing {
    fn default() -> Sandboxing {
        Sandboxing {
            default: Template::off(),
            workspaces: Vec::new(),
            tmpdir: PathBuf::from(crate::config::DEFAULT_TMPDIR),
            homes: HashMap::new(),
            real: HashMap::new(),
            run_as: None,
            kernel: Kernel::default(),
        }
    }
}

/// How a command's sandbox compares with the one in force.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// Within it: the command runs so.
    Within(Given),
    /// Wider: only an approver may let it run so (`outside`: what is wider, in words).
    Wider { given: Given, outside: Vec<String> },
}

/// `-32004` "sandbox unavailable: ...".
pub fn unavailable(why: &str) -> RpcError {
    RpcError::new(SPAWN_FAILED, format!("sandbox unavailable: {why}"))
        .with_data(json!({ "reason": "sandbox unavailable", "detail": why }))
}

/// `-32005` for a sandbox the policy does not allow: `rule` and `reason: "sandbox"`.
pub fn refused(rule: &str, why: &str) -> RpcError {
    RpcError::new(DENIED, format!("denied by policy rule {rule}: {why}"))
        .with_data(json!({ "rule": rule, "reason": "sandbox", "detail": why }))
}

/// `dir` without `.` components or a trailing slash (its words only).
fn words(dir: &Path) -> PathBuf {
    dir.components().collect()
}

impl Core {
    /// The top-level sandbox: the policy's (its omitted fields from `--sandbox`), else
    /// `--sandbox`.
    pub fn top_sandbox(&self) -> Template {
        let default = &self.sandboxing.default;
        match self.policy.sandbox() {
            Some(p) => p.over(default),
            None => default.clone(),
        }
    }

    /// The most a caller tied as `tie` may have (PROTOCOL 16): none for a peer outside
    /// the daemon (or a TCP peer, which has no process here); the sandbox of the command
    /// it is tied to, none when that runs unsandboxed; `read-only` for a descendant tied
    /// to no command known now (fail closed: never unsandboxed).
    ///
    /// `asked` is the bound the request set itself (`declared_ceiling`): the two meet,
    /// with the tied command's `$CWD`.
    pub fn ceiling_of(
        &self,
        tie: &super::tie::Tie,
        asked: Option<Box<Given>>,
    ) -> Option<Box<Given>> {
        let tied = self.tie_ceiling(tie);
        match (tied, asked) {
            (None, a) => a,
            (t, None) => t,
            (Some(mut t), Some(a)) => {
                t.sandbox = t.sandbox.meet(&a.sandbox);
                t.name = "custom".into();
                Some(t)
            }
        }
    }

    fn tie_ceiling(&self, tie: &super::tie::Tie) -> Option<Box<Given>> {
        if !tie.descends || tie.by == super::tie::TieSource::Remote {
            return None;
        }
        if let Some(p) = tie.command.and_then(|k| self.table.get(k)) {
            // Its `$CWD` stands; where the new command runs is not checked against it.
            return p.sandbox.clone().map(|g| {
                Box::new(Given {
                    verify_cwd: false,
                    ..g
                })
            });
        }
        let names = self.names(None, 0);
        let (sandbox, _) = Template::read_only().resolve(&names);
        Some(Box::new(Given {
            name: "read-only".into(),
            sandbox,
            cwd_root: None,
            verify_cwd: false,
            escalated: false,
        }))
    }

    /// Whether `caller` may give input to a program running in sandbox `target` (none:
    /// unsandboxed): a caller bounded by its tie (PROTOCOL 16) types only into what runs
    /// within its ceiling, since typing into a wider program (a shell, an interpreter's
    /// prompt) would step outside as a request for one would. `-32005` otherwise.
    ///
    /// `bound` is what the request bounds itself to (`sandbox_ceiling`), `$CWD` in it the
    /// target's own.
    pub fn may_feed(
        &self,
        caller: &super::Caller,
        target: Option<&Given>,
        bound: Option<&Partial>,
    ) -> Result<(), RpcError> {
        let declared = bound.map(|b| {
            let names = self.names(
                target.and_then(|g| g.cwd_root.as_deref()),
                self.runs_as(caller.uid),
            );
            b.over(&Template::off()).resolve(&names).0
        });
        let ceiling = match (self.tie_ceiling(&caller.tie), declared) {
            (None, None) => return Ok(()),
            (Some(t), None) => t.sandbox,
            (None, Some(d)) => d,
            (Some(t), Some(d)) => t.sandbox.meet(&d),
        };
        let off = Resolved::off();
        let target = target.map_or(&off, |g| &g.sandbox);
        let outside = target.outside(&ceiling);
        if outside.is_empty() {
            return Ok(());
        }
        Err(refused(
            "sandbox",
            &format!(
                "it runs wider than the most this caller may have ({})",
                outside.join(", ")
            ),
        ))
    }

    /// The bound a request sets itself (`sandbox_ceiling`: fields left out bound
    /// nothing) for a command of `peer` in `cwd`: `$CWD` is the workspace `cwd` lies in
    /// (checked by the child), and in none it stands for nothing, so a bound naming it
    /// lets nothing be written there; a `$HOME` execd does not know is left out too.
    /// Either way what is left out only narrows it.
    pub fn declared_ceiling(&self, asked: &Partial, cwd: &Path, peer: u32) -> Box<Given> {
        let ws = workspace_of(cwd, &self.sandboxing.workspaces).map(Path::to_path_buf);
        let names = self.names(ws.as_deref(), self.runs_as(peer));
        let (sandbox, _) = asked.over(&Template::off()).resolve(&names);
        Box::new(Given {
            name: Core::name_of(&sandbox, &names),
            sandbox,
            verify_cwd: ws.is_some(),
            cwd_root: ws,
            escalated: false,
        })
    }

    /// The uid a command of `launch` runs as (whose home `$HOME` is): the daemon's own
    /// unless a root daemon runs a non-root peer's command as the peer or `--run-as`.
    fn runs_as(&self, peer: u32) -> u32 {
        if self.daemon_uid != 0 {
            self.daemon_uid
        } else if peer == 0 {
            0
        } else {
            self.sandboxing.run_as.unwrap_or(peer)
        }
    }

    /// What the names stand for, for a command whose `$CWD` is `cwd`.
    fn names<'a>(&'a self, cwd: Option<&'a Path>, uid: u32) -> Names<'a> {
        let s = &self.sandboxing;
        Names {
            cwd,
            home: s.homes.get(&uid).map(PathBuf::as_path),
            tmpdir: Some(&s.tmpdir),
            real: Some(&s.real),
        }
    }

    /// The preset `r` is under `names`, or `custom`.
    fn name_of(r: &Resolved, names: &Names) -> String {
        for name in crate::policy::sandbox::PRESETS {
            if let Some(t) = Template::preset(name) {
                if &t.resolve(names).0 == r {
                    return name.to_string();
                }
            }
        }
        "custom".into()
    }

    /// The sandbox `launch` runs in (PROTOCOL 16): the one in force for its line (the
    /// rules that carry one and `verdict` names, the top-level one for the rest; only
    /// the top-level one without a verdict: a shell session's own shell), within the
    /// ceiling, narrowed by what the request asks. `Wider` when the request asks for
    /// more than in force; an error when the kernel cannot give it (`-32004`).
    pub fn sandbox_for(
        &self,
        launch: &LaunchRequest,
        verdict: Option<&Verdict>,
    ) -> Result<Decided, RpcError> {
        let uid = self.runs_as(launch.peer.uid);
        let ceiling = launch.ceiling.as_deref();
        let ws: Option<PathBuf> = match ceiling {
            Some(c) => c.cwd_root.clone(),
            None => workspace_of(&launch.cwd, &self.sandboxing.workspaces).map(Path::to_path_buf),
        };
        let names = self.names(ws.as_deref(), uid);
        let top = self.top_sandbox();
        let mut parts: Vec<Template> = Vec::new();
        match verdict {
            Some(v) => {
                if v.sandbox_top {
                    parts.push(top.clone());
                }
                for rule in &v.sandbox_rules {
                    if let Some(p) = self.policy.rule_sandbox(rule) {
                        parts.push(p.over(&top));
                    }
                }
            }
            None => parts.push(top.clone()),
        }
        if parts.is_empty() {
            parts.push(top);
        }
        let mut in_force: Option<Resolved> = None;
        for t in &parts {
            let (r, missing) = t.resolve(&names);
            if missing.contains(&Base::Home) {
                return Err(unavailable(&format!(
                    "$HOME of uid {uid} is not known to execd (homes are looked up at start)"
                )));
            }
            in_force = Some(match in_force {
                None => r,
                Some(f) => f.meet(&r),
            });
        }
        let mut in_force = in_force.unwrap_or_else(Resolved::off);
        if let Some(c) = ceiling {
            in_force = in_force.meet(&c.sandbox);
        }
        let verify = ws.is_some() && ceiling.is_none_or(|c| c.verify_cwd);
        let decided = match &launch.sandbox_asked {
            None => Decided::Within(Given {
                name: Core::name_of(&in_force, &names),
                sandbox: in_force,
                cwd_root: ws,
                verify_cwd: verify,
                escalated: false,
            }),
            Some(p) => {
                let (asked, missing) = p.resolve_over(&in_force, &names);
                if missing.contains(&Base::Home) {
                    return Err(unavailable(&format!(
                        "$HOME of uid {uid} is not known to execd (homes are looked up at start)"
                    )));
                }
                if missing.contains(&Base::Cwd) {
                    // In no workspace `$CWD` can only stand for the directory itself,
                    // and only an approver can let it.
                    let dir = words(&launch.cwd);
                    let here = Names {
                        cwd: Some(&dir),
                        ..names.clone()
                    };
                    let (asked, _) = p.resolve_over(&in_force, &here);
                    let mut outside = vec![format!("cwd {}", dir.display())];
                    outside.extend(asked.outside(&in_force));
                    Decided::Wider {
                        given: Given {
                            name: Core::name_of(&asked, &here),
                            sandbox: asked,
                            cwd_root: Some(dir),
                            verify_cwd: false,
                            escalated: true,
                        },
                        outside,
                    }
                } else {
                    let outside = asked.outside(&in_force);
                    let given = Given {
                        name: Core::name_of(&asked, &names),
                        sandbox: asked,
                        cwd_root: ws,
                        verify_cwd: verify,
                        escalated: !outside.is_empty(),
                    };
                    if outside.is_empty() {
                        Decided::Within(given)
                    } else {
                        Decided::Wider { given, outside }
                    }
                }
            }
        };
        let given = match &decided {
            Decided::Within(g) | Decided::Wider { given: g, .. } => g,
        };
        if let Some(why) = self.sandboxing.kernel.unavailable(given) {
            return Err(unavailable(&why));
        }
        Ok(decided)
    }

    /// A line for a shell session runs in the session's sandbox, never wider: every rule
    /// carrying a sandbox that matched it must allow at least what the session's does
    /// (`-32005` naming the first that does not, `reason: "sandbox"`).
    pub fn shell_line_within(
        &self,
        launch: &LaunchRequest,
        session: &Given,
        verdict: &Verdict,
    ) -> Result<(), RpcError> {
        let uid = self.runs_as(launch.peer.uid);
        let names = self.names(session.cwd_root.as_deref(), uid);
        let top = self.top_sandbox();
        for rule in &verdict.sandbox_rules {
            let Some(p) = self.policy.rule_sandbox(rule) else {
                continue;
            };
            let (r, _) = p.over(&top).resolve(&names);
            let outside = session.sandbox.outside(&r);
            if !outside.is_empty() {
                return Err(refused(
                    rule,
                    &format!(
                        "the shell session's sandbox is wider than the rule's ({}); run it \
                         with bash/exec",
                        outside.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The sandbox a later `shell/exec` asks for, resolved over the session's: it must
    /// be the session's (`-32602` naming `sandbox` otherwise).
    pub fn same_as_session(
        &self,
        peer_uid: u32,
        session: &Given,
        asked: &crate::policy::sandbox::Partial,
    ) -> Result<(), RpcError> {
        let uid = self.runs_as(peer_uid);
        let names = self.names(session.cwd_root.as_deref(), uid);
        let (r, missing) = asked.resolve_over(&session.sandbox, &names);
        if r != session.sandbox || !missing.is_empty() {
            return Err(RpcError::invalid_params(
                "sandbox",
                format!(
                    "a shell session's sandbox is fixed when it is made ({}); open another \
                     session for another",
                    session.brief()
                ),
            ));
        }
        Ok(())
    }
}
