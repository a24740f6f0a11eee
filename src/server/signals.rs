//! The signals the loop handles but SIGCHLD (a signalfd, `sys::reap::ExitSignals`: it
//! needs no sender, and comes with every exit), as a pollable source that says who sent
//! each one:
//! signal-hook's self-pipe (a Unix socket pair, its read end registered with the loop)
//! with its `WithOrigin` exfiltrator, so SIGHUP and SIGUSR2 from a process execd runs can
//! be told apart and ignored (PROTOCOL 7.3). signal-hook-mio offers this pipe as a mio
//! source for signal numbers only; this is the same with the sender.
//!
//! Invariants:
//! - No handler of ours ever runs in signal context: signal-hook's stores the `siginfo_t`
//!   and writes a byte to the pipe; everything else happens on the loop.
//! - Signals of one number arriving together are one entry (the last sender's): the same
//!   merging the kernel does for standard signals.

use std::io;

use mio::event::Source;
use mio::net::UnixStream;
use mio::{Interest, Registry, Token};
use signal_hook::iterator::backend::{Pending, SignalDelivery};
use signal_hook::iterator::exfiltrator::WithOrigin;

/// The handled signals, each with its origin (`si_pid`, `si_uid`, cause).
pub struct Signals(SignalDelivery<UnixStream, WithOrigin>);

impl Signals {
    /// Installs signal-hook's handlers for `signals`.
    pub fn new(signals: &[i32]) -> io::Result<Signals> {
        let (read, write) = UnixStream::pair()?;
        let delivery = SignalDelivery::with_pipe(read, write, WithOrigin::default(), signals)?;
        Ok(Signals(delivery))
    }

    /// The signals that arrived since the last call, with their origins.
    pub fn pending(&mut self) -> Pending<WithOrigin> {
        self.0.pending()
    }
}

impl Source for Signals {
    fn register(
        &mut self,
        registry: &Registry,
        token: Token,
        interest: Interest,
    ) -> io::Result<()> {
        self.0.get_read_mut().register(registry, token, interest)
    }

    fn reregister(
        &mut self,
        registry: &Registry,
        token: Token,
        interest: Interest,
    ) -> io::Result<()> {
        self.0.get_read_mut().reregister(registry, token, interest)
    }

    fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        self.0.get_read_mut().deregister(registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signal sent to the daemon by a process arrives with that process's pid and uid.
    #[test]
    fn a_signal_arrives_with_its_sender() {
        let mut s = Signals::new(&[libc::SIGUSR1]).unwrap();
        let me = std::process::id() as i32;
        // SAFETY: kill of this process with a signal whose handler signal-hook installed.
        unsafe { libc::kill(me, libc::SIGUSR1) };
        // Another thread of the test binary may take it: wait for it (bounded).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let got = loop {
            let got: Vec<_> = s.pending().collect();
            if !got.is_empty() || std::time::Instant::now() > deadline {
                break got;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].signal, libc::SIGUSR1);
        let sender = got[0].process.expect("a sender");
        assert_eq!(sender.pid, me);
        // SAFETY: getuid cannot fail.
        assert_eq!(sender.uid, unsafe { libc::getuid() });
    }
}
