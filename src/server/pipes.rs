//! The pipes of every command, and their tokens: output read ends, registered READABLE,
//! read into the command's rings by the loop; stdin write ends (and a shell session's
//! command channel, our end of a socket pair), registered WRITABLE only while input waits
//! for them.
//!
//! Invariants:
//! - Every descriptor here is non-blocking and close-on-exec (the spawner made it so).
//! - A token maps to a pipe only while that pipe is open; an event for a token no longer
//!   held is ignored by the loop.
//! - A pipe found full is grown once (to 1 MiB, if the system allows), so a chatty command
//!   needs fewer wakeups while quiet ones keep the default size.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use mio::net::UnixStream;
use mio::unix::pipe::{Receiver, Sender};
use mio::{Interest, Registry, Token};

use crate::core::table::{Key, Stdin};
use crate::wire::state::PipesImage;

/// A pipe's default capacity on Linux; a read this large means the pipe was full.
const DEFAULT_PIPE_SIZE: usize = 64 << 10;

/// What a token stands for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Source {
    Out {
        key: Key,
        stream: usize,
    },
    Stdin {
        key: Key,
    },
    /// A shell session's command channel.
    Commands {
        key: Key,
    },
}

/// What one read found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Got {
    Data(usize),
    /// Nothing to read now.
    Empty,
    /// The write end is closed everywhere (or the pipe failed): nothing more will come.
    Eof,
}

/// What flushing stdin came to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Flushed {
    /// Input still waits for room in the pipe.
    Waiting,
    /// Everything queued was written; the pipe stays open.
    Written,
    /// The pipe is closed now: drained after an `eof`, or broken (the command closed its
    /// stdin or exited). The caller marks the stdin closed.
    Closed,
}

#[derive(Debug)]
struct OutPipe {
    rx: Receiver,
    token: Token,
    grown: bool,
}

/// What the loop writes into: a stdin pipe (`Sender`) or a shell's command channel
/// (`UnixStream`).
#[derive(Debug)]
struct InPipe<W> {
    tx: W,
    token: Token,
    registered: bool,
}

#[derive(Debug, Default)]
struct ProcPipes {
    outs: Vec<Option<OutPipe>>,
    stdin: Option<InPipe<Sender>>,
    /// A shell session's command channel: only lines that passed the gate go there.
    commands: Option<InPipe<UnixStream>>,
}

/// Every command's pipes.
#[derive(Debug, Default)]
pub struct Pipes {
    sources: HashMap<Token, Source>,
    procs: HashMap<Key, ProcPipes>,
}

impl Pipes {
    /// Takes a started command's pipes: `outs` in stream order, its stdin, if a pipe, and
    /// a shell's command channel. Output pipes are registered READABLE at once; `token`
    /// hands out fresh tokens.
    pub fn add(
        &mut self,
        registry: &Registry,
        key: Key,
        outs: Vec<OwnedFd>,
        (stdin, commands): (Option<OwnedFd>, Option<OwnedFd>),
        mut token: impl FnMut() -> Token,
    ) -> io::Result<()> {
        let mut entry = ProcPipes::default();
        for (stream, fd) in outs.into_iter().enumerate() {
            let mut rx = Receiver::from(fd);
            let t = token();
            if let Err(e) = registry.register(&mut rx, t, Interest::READABLE) {
                self.procs.insert(key, entry);
                self.close_all(registry, key);
                return Err(e);
            }
            self.sources.insert(t, Source::Out { key, stream });
            entry.outs.push(Some(OutPipe {
                rx,
                token: t,
                grown: false,
            }));
        }
        if let Some(fd) = stdin {
            let t = token();
            self.sources.insert(t, Source::Stdin { key });
            entry.stdin = Some(InPipe {
                tx: Sender::from(fd),
                token: t,
                registered: false,
            });
        }
        if let Some(fd) = commands {
            let t = token();
            self.sources.insert(t, Source::Commands { key });
            entry.commands = Some(InPipe {
                tx: channel(fd),
                token: t,
                registered: false,
            });
        }
        self.procs.insert(key, entry);
        Ok(())
    }

    pub fn source(&self, token: Token) -> Option<Source> {
        self.sources.get(&token).copied()
    }

    /// Whether output stream `stream` of `key` is still open.
    /// A descriptor of `key`'s terminal, while the daemon holds one (its input end, or
    /// its output end once input was closed).
    pub fn terminal_fd(&self, key: Key) -> Option<RawFd> {
        let p = self.procs.get(&key)?;
        p.stdin
            .as_ref()
            .map(|s| s.tx.as_raw_fd())
            .or_else(|| p.outs.first()?.as_ref().map(|o| o.rx.as_raw_fd()))
    }

    pub fn is_open(&self, key: Key, stream: usize) -> bool {
        self.procs
            .get(&key)
            .and_then(|p| p.outs.get(stream))
            .is_some_and(Option::is_some)
    }

    /// Reads what one output pipe holds into `buf` (one `read`).
    pub fn read(&mut self, key: Key, stream: usize, buf: &mut [u8]) -> Got {
        let Some(pipe) = self
            .procs
            .get_mut(&key)
            .and_then(|p| p.outs.get_mut(stream))
            .and_then(Option::as_mut)
        else {
            return Got::Eof;
        };
        loop {
            return match pipe.rx.read(buf) {
                Ok(0) => Got::Eof,
                Ok(n) => {
                    if n == DEFAULT_PIPE_SIZE && !pipe.grown {
                        pipe.grown = true;
                        crate::sys::spawn::grow_pipe(pipe.rx.as_raw_fd());
                    }
                    Got::Data(n)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Got::Empty,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => Got::Eof,
            };
        }
    }

    /// Deregisters and closes one output pipe.
    pub fn close_out(&mut self, registry: &Registry, key: Key, stream: usize) {
        let Some(slot) = self
            .procs
            .get_mut(&key)
            .and_then(|p| p.outs.get_mut(stream))
        else {
            return;
        };
        if let Some(mut pipe) = slot.take() {
            let _ = registry.deregister(&mut pipe.rx);
            self.sources.remove(&pipe.token);
        }
    }

    /// Writes pending stdin as far as the pipe takes it; closes the pipe once an `eof`
    /// has drained or the pipe broke. Registers WRITABLE while input still waits.
    pub fn flush_stdin(&mut self, registry: &Registry, key: Key, stdin: &mut Stdin) -> Flushed {
        let Some(pipe) = self.procs.get_mut(&key).and_then(|p| p.stdin.as_mut()) else {
            return Flushed::Closed;
        };
        let flushed = flush(registry, pipe, stdin);
        if flushed == Flushed::Closed {
            self.close_stdin(registry, key);
        }
        flushed
    }

    /// Writes what waits for a shell's command channel, as `flush_stdin` does for stdin.
    pub fn flush_commands(
        &mut self,
        registry: &Registry,
        key: Key,
        commands: &mut Stdin,
    ) -> Flushed {
        let Some(pipe) = self.procs.get_mut(&key).and_then(|p| p.commands.as_mut()) else {
            return Flushed::Closed;
        };
        let flushed = flush(registry, pipe, commands);
        if flushed == Flushed::Closed {
            self.close_commands(registry, key);
        }
        flushed
    }

    /// Closes a shell's command channel (the shell reads EOF and exits).
    pub fn close_commands(&mut self, registry: &Registry, key: Key) {
        let Some(mut pipe) = self.procs.get_mut(&key).and_then(|p| p.commands.take()) else {
            return;
        };
        if pipe.registered {
            let _ = registry.deregister(&mut pipe.tx);
        }
        self.sources.remove(&pipe.token);
    }

    /// Closes a command's stdin pipe.
    pub fn close_stdin(&mut self, registry: &Registry, key: Key) {
        let Some(mut pipe) = self.procs.get_mut(&key).and_then(|p| p.stdin.take()) else {
            return;
        };
        if pipe.registered {
            let _ = registry.deregister(&mut pipe.tx);
        }
        self.sources.remove(&pipe.token);
    }

    /// Closes every pipe of `key` and forgets it.
    pub fn close_all(&mut self, registry: &Registry, key: Key) {
        let n = self.procs.get(&key).map_or(0, |p| p.outs.len());
        for stream in 0..n {
            self.close_out(registry, key, stream);
        }
        self.close_stdin(registry, key);
        self.close_commands(registry, key);
        self.procs.remove(&key);
    }
}

impl Pipes {
    /// What an upgrade in place carries: every command's open descriptors by number, with
    /// their tokens (kept, so the loop's tokens stay what they were).
    pub fn carry(&self) -> Vec<PipesImage> {
        let mut v: Vec<PipesImage> = self
            .procs
            .iter()
            .map(|(key, p)| PipesImage {
                key: key.0,
                outs: p
                    .outs
                    .iter()
                    .map(|o| o.as_ref().map(|o| (o.rx.as_raw_fd(), o.token.0, o.grown)))
                    .collect(),
                stdin: p.stdin.as_ref().map(|s| (s.tx.as_raw_fd(), s.token.0)),
                commands: p.commands.as_ref().map(|s| (s.tx.as_raw_fd(), s.token.0)),
            })
            .collect();
        v.sort_by_key(|p| p.key);
        v
    }

    /// The pipes `carry` described, their descriptors from `take`: output ends registered
    /// READABLE (a pipe that holds bytes already is reported at once); stdin ends and a
    /// shell's command channel registered when input waits for them. A command channel
    /// carried from an image that made it a pipe is written as one all the same (a write
    /// is a write); the core restarts such a shell before it sends it a line.
    pub fn resume(
        registry: &Registry,
        imgs: &[PipesImage],
        take: &mut dyn FnMut(RawFd) -> Result<OwnedFd, String>,
    ) -> Result<Pipes, String> {
        let mut pipes = Pipes::default();
        for img in imgs {
            let key = Key(img.key);
            let mut entry = ProcPipes::default();
            for (stream, out) in img.outs.iter().enumerate() {
                let Some((fd, token, grown)) = *out else {
                    entry.outs.push(None);
                    continue;
                };
                let mut rx = Receiver::from(take(fd)?);
                let token = Token(token);
                registry
                    .register(&mut rx, token, Interest::READABLE)
                    .map_err(|e| format!("registering a pipe of command {}: {e}", img.key))?;
                pipes.sources.insert(token, Source::Out { key, stream });
                entry.outs.push(Some(OutPipe { rx, token, grown }));
            }
            if let Some((fd, token)) = img.stdin {
                let token = Token(token);
                pipes.sources.insert(token, Source::Stdin { key });
                entry.stdin = Some(InPipe {
                    tx: Sender::from(take(fd)?),
                    token,
                    registered: false,
                });
            }
            if let Some((fd, token)) = img.commands {
                let token = Token(token);
                pipes.sources.insert(token, Source::Commands { key });
                entry.commands = Some(InPipe {
                    tx: channel(take(fd)?),
                    token,
                    registered: false,
                });
            }
            pipes.procs.insert(key, entry);
        }
        Ok(pipes)
    }
}

/// Our end of a shell's command channel, as mio writes it.
fn channel(fd: OwnedFd) -> UnixStream {
    UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}

/// Writes what `buf` holds into `pipe` as far as it takes it. `Closed` once an `eof` has
/// drained or the pipe broke (the caller closes it); registers WRITABLE while input still
/// waits.
fn flush<W>(registry: &Registry, pipe: &mut InPipe<W>, buf: &mut Stdin) -> Flushed
where
    W: Write + mio::event::Source,
{
    let mut broken = false;
    while !buf.buf.is_empty() {
        let (a, _) = buf.buf.as_slices();
        match pipe.tx.write(a) {
            Ok(n) => {
                buf.buf.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // EPIPE: the command closed its stdin or exited. Not a crash: the
                // input is counted as undelivered and reported.
                broken = true;
                break;
            }
        }
    }
    if broken || (buf.buf.is_empty() && buf.eof_requested) {
        return Flushed::Closed;
    }
    let want = !buf.buf.is_empty();
    if want != pipe.registered {
        let r = if want {
            registry.register(&mut pipe.tx, pipe.token, Interest::WRITABLE)
        } else {
            registry.deregister(&mut pipe.tx)
        };
        if r.is_ok() {
            pipe.registered = want;
        }
    }
    if want {
        Flushed::Waiting
    } else {
        Flushed::Written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::BorrowedFd;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let (tx, rx) = mio::unix::pipe::new().expect("pipe");
        (OwnedFd::from(rx), OwnedFd::from(tx))
    }

    /// A command's pipes carried by an upgrade come back under the same tokens: an output
    /// pipe closed already stays closed, and bytes in a pipe during the swap are there to
    /// read after it.
    #[test]
    fn pipes_carried_by_an_upgrade_come_back_under_their_tokens() {
        let (out_r, out_w) = pipe();
        let (in_r, in_w) = pipe();
        let (cmd_w, cmd_r) = crate::sys::spawn::command_channel().expect("socket pair");
        let img = vec![PipesImage {
            key: 12,
            outs: vec![Some((out_r.as_raw_fd(), 40, true)), None],
            stdin: Some((in_w.as_raw_fd(), 41)),
            commands: Some((cmd_w.as_raw_fd(), 42)),
        }];
        let json = serde_json::to_vec(&img).expect("encode");
        let read: Vec<PipesImage> = serde_json::from_slice(&json).expect("decode");
        assert_eq!(read, img);
        // Written by the command while the daemon was between two images.
        let mut w = std::fs::File::from(out_w);
        w.write_all(b"during the swap").expect("write");
        let poll = mio::Poll::new().expect("poll");
        let mut map = Vec::new();
        let mut take = |fd: RawFd| {
            // SAFETY: every descriptor the image names is one the test holds open.
            let dup = unsafe { BorrowedFd::borrow_raw(fd) }
                .try_clone_to_owned()
                .map_err(|e| e.to_string())?;
            map.push((fd, dup.as_raw_fd()));
            Ok(dup)
        };
        let mut back = Pipes::resume(poll.registry(), &read, &mut take).expect("resume");
        let mut again = back.carry();
        let old = |fd: RawFd| map.iter().find(|(_, d)| *d == fd).map_or(-1, |(o, _)| *o);
        for p in &mut again {
            for o in p.outs.iter_mut().flatten() {
                o.0 = old(o.0);
            }
            p.stdin = p.stdin.map(|(fd, t)| (old(fd), t));
            p.commands = p.commands.map(|(fd, t)| (old(fd), t));
        }
        assert_eq!(again, img, "carried again, it is the same");
        let entry = back.procs.get_mut(&Key(12)).expect("the command's pipes");
        let mut got = [0u8; 64];
        let n = entry.outs[0]
            .as_mut()
            .expect("its stdout")
            .rx
            .read(&mut got)
            .expect("read");
        assert_eq!(&got[..n], b"during the swap");
        drop((in_r, cmd_r));
    }
}
