//! Server-sent events for `shell/exec` and `shell/view` (PROTOCOL 12.5): while such a
//! request is parked on a command of a session, the lines the command completes are sent
//! as they come, as plain text (12.1: a line redrawn in place in its final state); the
//! line not finished yet is left for the result.
//!
//! Invariants: a follow hands out each completed line once and in order, from the
//! command's first output byte; it ends when its request is answered (`follow_end` hands
//! out the last completed lines first), its session closes or its connection does.

use crate::core::table::{ConnId, SessionKey};
use crate::core::{Core, Effect};
use crate::wire::rpc::ReqNo;

/// A request that streams a command's lines.
#[derive(Debug, Clone)]
pub struct Follow {
    pub conn: ConnId,
    pub req: ReqNo,
    pub session: SessionKey,
    pub seq: u64,
    /// The next byte of the shell's output not handed out yet (none before the command's
    /// output began).
    next: Option<u64>,
}

impl Core {
    /// Request `req` of `conn`, parked on command `seq` of `session`, answers with
    /// server-sent events: at once with the lines the command completed before it came
    /// (a view of a command that runs quietly now still shows what it printed).
    pub fn follow(&mut self, conn: ConnId, req: ReqNo, session: &SessionKey, seq: u64) {
        let mut f = Follow {
            conn,
            req,
            session: session.clone(),
            seq,
            next: None,
        };
        if let Some(data) = self.lines_for(&mut f, None) {
            self.out.push(Effect::Event {
                conn,
                req,
                name: "output",
                data,
            });
        }
        self.shells.follows.push(f);
    }

    /// The hook on output of session `sk` (before its markers move the session on; `end`
    /// where an end marker among them begins): each follow of it gets the lines completed
    /// since, so they go out before the answer the end marker brings.
    pub(super) fn follow_output(&mut self, sk: &SessionKey, end: Option<u64>) {
        if !self.shells.follows.iter().any(|f| f.session == *sk) {
            return;
        }
        let mut follows = std::mem::take(&mut self.shells.follows);
        for f in follows.iter_mut().filter(|f| f.session == *sk) {
            if let Some(data) = self.lines_for(f, end) {
                self.out.push(Effect::Event {
                    conn: f.conn,
                    req: f.req,
                    name: "output",
                    data,
                });
            }
        }
        follows.append(&mut self.shells.follows);
        self.shells.follows = follows;
    }

    /// Request `req` of `conn` is being answered: the lines it has not had (one event's
    /// `data`), and it follows no more.
    pub fn follow_end(&mut self, conn: ConnId, req: ReqNo) -> Option<Vec<u8>> {
        let i = self
            .shells
            .follows
            .iter()
            .position(|f| f.conn == conn && f.req == req)?;
        let mut f = self.shells.follows.remove(i);
        self.lines_for(&mut f, None)
    }

    /// Connection `conn` closed: its follows end.
    pub(crate) fn unfollow(&mut self, conn: ConnId) {
        self.shells.follows.retain(|f| f.conn != conn);
    }

    /// The lines `f`'s command completed since its last ones (before `end`, if its end is
    /// not known yet), as an event's `data` (a JSON string).
    fn lines_for(&self, f: &mut Follow, end: Option<u64>) -> Option<Vec<u8>> {
        let s = self.shells.map.get(&f.session)?;
        let r = s.record(f.seq)?;
        let (Some(from), Some(p)) = (r.from, r.shell.and_then(|k| self.table.get(k))) else {
            return None;
        };
        let st = &p.streams[0];
        let ring = &st.ring;
        let next = f.next.unwrap_or(from).max(ring.start());
        let end = r.to.or(end).unwrap_or_else(|| ring.end()).min(ring.end());
        if end <= next {
            return None;
        }
        // The last line end among the bytes not handed out: what comes before it is whole.
        let (a, b) = ring.slices(next, end);
        let last = match b.iter().rposition(|&c| c == b'\n') {
            Some(i) => Some(a.len() + i),
            None => a.iter().rposition(|&c| c == b'\n'),
        };
        let upto = next + last? as u64 + 1;
        let text = st.text(next, upto);
        f.next = Some(upto);
        if text.is_empty() {
            return None;
        }
        let mut data = Vec::with_capacity(text.len() + 2);
        crate::wire::encode::write_json_str(&mut data, &text);
        Some(data)
    }
}
