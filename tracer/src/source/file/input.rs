//! Buffered reading that knows the file offset of every byte it holds.
use super::*;

/// Buffered reader that knows the file offset of every byte it holds.
pub(super) struct Input<R> {
    pub(super) reader: R,
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// File offset of `buf[0]`.
    pub(super) base: u64,
    pub(super) eof: bool,
}

impl<R: Read> Input<R> {
    pub(super) fn new(reader: R) -> Self {
        Self {
            reader,
            buf: vec![0; FIRST_CHUNK],
            start: 0,
            end: 0,
            base: 0,
            eof: false,
        }
    }

    pub(super) fn avail(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or_default()
    }

    pub(super) fn offset(&self) -> u64 {
        self.base + self.start as u64
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.start = self.start.saturating_add(n).min(self.end);
    }

    /// Makes at least `n` (≤ [`MAX_RECORD`]) bytes available unless the file ends first;
    /// true when they are.
    pub(super) fn want(&mut self, n: usize) -> io::Result<bool> {
        if self.end - self.start >= n {
            return Ok(true);
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.base += self.start as u64;
            self.end -= self.start;
            self.start = 0;
        }
        // Small files stay cheap; long ones get fewer, larger reads.
        if self.base >= FIRST_CHUNK as u64 && self.buf.len() < READ_CHUNK {
            self.buf.resize(READ_CHUNK, 0);
        }
        while self.end < n && !self.eof {
            if self.end == self.buf.len() {
                // Grows with the data that arrives, not with what a length field claims.
                let len = self.buf.len();
                self.buf
                    .resize((len * 2).min(n.next_power_of_two()).max(len + 1), 0);
            }
            let Some(free) = self.buf.get_mut(self.end..) else {
                break;
            };
            match self.reader.read(free) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.end - self.start >= n)
    }
}
