//! Framing: one message per line, `\r\n` accepted, blank lines ignored. A line longer
//! than the limit is discarded up to its newline and reported once as `TooLong`, so the
//! connection stays usable and the buffer never holds more than the limit plus one read.

/// One frame cut from a connection's byte stream.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A complete, non-blank line without its terminator.
    Line(Vec<u8>),
    /// A line longer than the limit was discarded.
    TooLong,
}

/// Cuts a byte stream into lines, bounded by `max` bytes a line.
#[derive(Debug)]
pub struct Framer {
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out as frames.
    consumed: usize,
    /// Bytes of `buf` after `consumed` already searched for `\n` without finding one.
    scanned: usize,
    max: usize,
    /// Discarding an overlong line until its newline.
    discarding: bool,
}

impl Framer {
    pub fn new(max: usize) -> Framer {
        Framer {
            buf: Vec::new(),
            consumed: 0,
            scanned: 0,
            max,
            discarding: false,
        }
    }

    /// Bytes buffered and not yet framed.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.consumed
    }

    /// Appends bytes read from the peer. Lines already handed out go first once they are
    /// half the buffer: a reader that takes only some of the whole lines before reading
    /// again (the loop's budget per turn) never runs the buffer dry, and would otherwise
    /// keep every line it took. Each byte is moved at most once on average.
    pub fn push(&mut self, data: &[u8]) {
        if self.consumed > 0 && self.consumed * 2 >= self.buf.len() {
            self.buf.drain(..self.consumed);
            self.consumed = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next frame, if a whole one is buffered (or an overlong line was detected).
    pub fn next_frame(&mut self) -> Option<Frame> {
        loop {
            let unread = &self.buf[self.consumed..];
            let newline = unread[self.scanned..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|i| i + self.scanned);
            match newline {
                None => {
                    self.scanned = unread.len();
                    if self.discarding {
                        self.drop_consumed_all();
                        return None;
                    }
                    if unread.len() > self.max {
                        self.discarding = true;
                        self.drop_consumed_all();
                        return Some(Frame::TooLong);
                    }
                    self.compact();
                    return None;
                }
                Some(nl) => {
                    let start = self.consumed;
                    self.consumed += nl + 1;
                    self.scanned = 0;
                    if self.discarding {
                        self.discarding = false;
                        continue;
                    }
                    let mut line = &self.buf[start..start + nl];
                    if line.last() == Some(&b'\r') {
                        line = &line[..line.len() - 1];
                    }
                    if line.len() > self.max {
                        return Some(Frame::TooLong);
                    }
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    return Some(Frame::Line(line.to_vec()));
                }
            }
        }
    }

    fn drop_consumed_all(&mut self) {
        self.buf.clear();
        self.consumed = 0;
        self.scanned = 0;
        self.release_memory();
    }

    /// Moves the unframed tail to the front so the buffer does not creep.
    fn compact(&mut self) {
        if self.consumed > 0 {
            self.buf.drain(..self.consumed);
            self.consumed = 0;
        }
        self.release_memory();
    }

    /// Gives back what a burst (a huge line, many lines at once) needed once the buffer is
    /// empty again: an idle connection keeps only a small buffer.
    fn release_memory(&mut self) {
        const KEEP: usize = 64 << 10;
        if self.buf.is_empty() && self.buf.capacity() > KEEP {
            self.buf.shrink_to(KEEP);
        }
    }
}

impl Framer {
    /// What an upgrade in place carries: the unframed bytes, how far they were searched,
    /// and whether an overlong line is being discarded.
    pub fn carry(&self) -> (&[u8], usize, bool) {
        (&self.buf[self.consumed..], self.scanned, self.discarding)
    }

    /// A framer resumed from what `carry` gave.
    pub fn resume(max: usize, unframed: &[u8], scanned: usize, discarding: bool) -> Framer {
        Framer {
            buf: unframed.to_vec(),
            consumed: 0,
            scanned: scanned.min(unframed.len()),
            max,
            discarding,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(f: &mut Framer) -> Vec<Frame> {
        std::iter::from_fn(|| f.next_frame()).collect()
    }
    #[test]
    fn lines_split_across_reads() {
        let mut f = Framer::new(100);
        f.push(b"{\"a\"");
        assert_eq!(frames(&mut f), vec![]);
        f.push(b":1}\n{\"b\":2}\n{\"c\"");
        assert_eq!(
            frames(&mut f),
            vec![
                Frame::Line(b"{\"a\":1}".to_vec()),
                Frame::Line(b"{\"b\":2}".to_vec())
            ]
        );
        f.push(b":3}\r\n");
        assert_eq!(frames(&mut f), vec![Frame::Line(b"{\"c\":3}".to_vec())]);
        assert_eq!(f.pending(), 0);
    }
    /// A reader that takes a few whole lines and then pushes more, never running the
    /// buffer dry (the loop's budget per turn against a client that keeps writing), keeps
    /// the buffer within what is unread plus what it has taken since the last push.
    #[test]
    fn taking_some_lines_between_reads_does_not_grow_the_buffer() {
        let mut f = Framer::new(1 << 10);
        let line = b"{\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n";
        f.push(&line.repeat(200));
        let read: Vec<u8> = line.repeat(64);
        for _ in 0..10_000 {
            f.push(&read);
            for _ in 0..64 {
                assert!(matches!(f.next_frame(), Some(Frame::Line(_))));
            }
            assert_eq!(f.pending(), 200 * line.len(), "as many unread as at first");
            // Never more than twice what is unread plus a read.
            assert!(
                f.buf.len() <= 2 * (f.pending() + read.len()),
                "{}",
                f.buf.len()
            );
        }
    }

    #[test]
    fn crlf_and_blank_lines() {
        let mut f = Framer::new(100);
        f.push(b"\n\r\n   \nx\r\n\n");
        assert_eq!(frames(&mut f), vec![Frame::Line(b"x".to_vec())]);
    }
    #[test]
    fn huge_line_is_discarded_and_the_next_one_works() {
        let mut f = Framer::new(10);
        f.push(b"0123456789ABCDEF");
        assert_eq!(frames(&mut f), vec![Frame::TooLong]);
        assert!(f.pending() == 0, "an overlong line is not kept");
        f.push(&[b'z'; 1000]);
        assert_eq!(frames(&mut f), vec![]);
        assert_eq!(f.pending(), 0);
        f.push(b"tail\nok\n");
        assert_eq!(frames(&mut f), vec![Frame::Line(b"ok".to_vec())]);
    }
    #[test]
    fn huge_line_arriving_whole_is_reported_once() {
        let mut f = Framer::new(4);
        f.push(b"123456\nab\n");
        assert_eq!(
            frames(&mut f),
            vec![Frame::TooLong, Frame::Line(b"ab".to_vec())]
        );
        // Exactly at the limit is fine.
        f.push(b"1234\n");
        assert_eq!(frames(&mut f), vec![Frame::Line(b"1234".to_vec())]);
    }
}
