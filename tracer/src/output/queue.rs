//! A sink behind a bounded queue drained by a thread of its own, so that a slow reader (a
//! `| jq`, a terminal over `kubectl exec`) costs records at that sink, counted, and never
//! stalls the run loop that reads the ring buffer: decode, correlate and detect go on seeing
//! every packet.
//!
//! [`Queued`] is the one mechanism; what it writes is a [`Drain`]: any [`RecordWriter`]
//! ([`QueuedSink`]), or any byte stream of whole lines ([`QueuedLines`], e.g. the agent's
//! event stream). When the queue is full a handed-over item is dropped and counted, with one
//! warning on stderr; [`Queued::finish`] writes what is queued, waiting at most a bound for a
//! reader that never reads, and counts the rest as dropped.
use std::{
    collections::VecDeque,
    io::{self, Write},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub use super::record::SinkStats;
use super::{Record, RecordWriter};

/// Records a live run's text/NDJSON output holds in its queue: ~0.1 s of every packet at
/// 20k queries/s (about 10 packet records each), some 10–20 MB at most.
pub const RECORDS: usize = 32_768;

/// How much nicer than the process a queue's thread runs: under CPU contention (a 2-core
/// node, the DNS pods and the tracer) the scheduler gives the thread reading the ring buffer
/// the CPU first, so a sink that cannot keep up drops records at its queue instead of the
/// kernel dropping packets at a full ring buffer. On an idle CPU the thread runs as fast as
/// before.
pub const SINK_NICE: i32 = 10;

/// How long the end of a run waits for a sink's reader to take what is queued.
pub const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// The writing end of a queue: runs on the queue's thread.
pub trait Drain<T>: Send + 'static {
    fn write(&mut self, item: T) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}

struct State<T> {
    items: VecDeque<T>,
    /// Items queued or taken by the thread and not yet written: at most the capacity.
    pending: usize,
    /// No more items will come: the thread writes what is left, flushes and ends.
    closed: bool,
    /// The wait at the end ran out: the thread writes nothing more.
    abandoned: bool,
    /// The thread has ended (an error, closed and drained, or abandoned).
    done: bool,
    /// The first write error (e.g. a broken pipe): nothing is written after it.
    error: Option<(io::ErrorKind, String)>,
    written: u64,
    dropped: u64,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Items came, or the queue was closed or abandoned.
    work: Condvar,
    /// `pending` fell to 0, or the thread ended.
    idle: Condvar,
    /// [`State::abandoned`], read by the thread before each write without the lock.
    abandoned: AtomicBool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic in the thread while holding the lock leaves counters that are still
        // counters: go on with them.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Items the thread takes from the queue at once.
const CHUNK: usize = 512;

/// A bounded queue of items and the thread that writes them to a [`Drain`].
pub struct Queued<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    capacity: usize,
    name: &'static str,
    warned: bool,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Queued<T> {
    /// Starts the thread writing to `drain`; at most `capacity` items wait.
    pub fn spawn(name: &'static str, capacity: usize, drain: impl Drain<T>) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                items: VecDeque::new(),
                pending: 0,
                closed: false,
                abandoned: false,
                done: false,
                error: None,
                written: 0,
                dropped: 0,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            abandoned: AtomicBool::new(false),
        });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("dnspath-{name}"))
            .spawn(move || write_loop(&theirs, drain))?;
        Ok(Self {
            shared,
            capacity: capacity.max(1),
            name,
            warned: false,
            thread: Some(thread),
        })
    }

    /// Hands `items` over (emptying it) without waiting: what does not fit is dropped and
    /// counted. Errs with the thread's write error once there was one (the items are then
    /// not taken).
    pub fn push_all(&mut self, items: &mut Vec<T>) -> io::Result<()> {
        if items.is_empty() {
            return self.error();
        }
        let dropped = {
            let mut s = self.shared.lock();
            if let Some(e) = error_of(&s) {
                items.clear();
                return Err(e);
            }
            let room = self.capacity.saturating_sub(s.pending);
            let take = room.min(items.len());
            let dropped = items.len() - take;
            s.pending += take;
            s.items.extend(items.drain(..take));
            s.dropped += dropped as u64;
            dropped
        };
        items.clear();
        self.shared.work.notify_one();
        if dropped > 0 {
            self.warn_once();
        }
        Ok(())
    }

    /// Hands one item over, as [`Queued::push_all`].
    pub fn push(&mut self, item: T) -> io::Result<()> {
        let full = {
            let mut s = self.shared.lock();
            if let Some(e) = error_of(&s) {
                return Err(e);
            }
            if s.pending < self.capacity {
                s.pending += 1;
                s.items.push_back(item);
                false
            } else {
                s.dropped += 1;
                true
            }
        };
        if full {
            self.warn_once();
        } else {
            self.shared.work.notify_one();
        }
        Ok(())
    }

    /// Hands over the last item of a run (the final `stats` record), beyond the capacity:
    /// it is never dropped for a full queue (only if the wait at the end runs out).
    pub fn push_last(&mut self, item: T) -> io::Result<()> {
        {
            let mut s = self.shared.lock();
            if let Some(e) = error_of(&s) {
                return Err(e);
            }
            s.pending += 1;
            s.items.push_back(item);
        }
        self.shared.work.notify_one();
        Ok(())
    }

    /// The thread's write error, if there was one.
    pub fn error(&self) -> io::Result<()> {
        match error_of(&self.shared.lock()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The queue holds as many items as it may: the next one handed over would be dropped.
    pub fn is_full(&self) -> bool {
        self.shared.lock().pending >= self.capacity
    }

    /// `n` items were not even made because the queue was full ([`Queued::is_full`]):
    /// counted as dropped, with the same warning.
    pub fn count_dropped(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.shared.lock().dropped += n;
        self.warn_once();
    }

    /// Items written and dropped so far.
    pub fn stats(&self) -> SinkStats {
        let s = self.shared.lock();
        SinkStats {
            name: self.name,
            written: s.written,
            dropped: s.dropped,
        }
    }

    /// Waits up to `wait` for the thread to have written everything queued so far (e.g.
    /// before the counts go into the final `stats`); returns whether it has.
    pub fn wait_written(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut s = self.shared.lock();
        while s.pending > 0 && !s.done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .shared
                .idle
                .wait_timeout(s, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        s.pending == 0
    }

    /// Takes nothing more, and waits up to `wait` for the thread to write what is queued and
    /// flush. What is still queued then is counted as dropped and the thread is left to
    /// itself (it writes nothing more once its current write returns). Returns the final
    /// counts, and the write error if there was one.
    pub fn finish(&mut self, wait: Duration) -> (SinkStats, io::Result<()>) {
        let deadline = Instant::now() + wait;
        let mut s = self.shared.lock();
        s.closed = true;
        self.shared.work.notify_one();
        while !s.done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self
                .shared
                .idle
                .wait_timeout(s, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let ended = s.done;
        // Still queued: the wait ran out, or a write error ended the thread.
        let left = s.pending as u64;
        s.dropped += left;
        s.pending = 0;
        s.items.clear();
        if !ended {
            s.abandoned = true;
            self.shared.abandoned.store(true, Ordering::Relaxed);
            eprintln!(
                "dnspath: {}: the reader did not take what was queued within {:.0} s of the stop: {left} record(s) not written",
                self.name,
                wait.as_secs_f64()
            );
        }
        let stats = SinkStats {
            name: self.name,
            written: s.written,
            dropped: s.dropped,
        };
        let result = match error_of(&s) {
            Some(e) => Err(e),
            None => Ok(()),
        };
        drop(s);
        self.shared.work.notify_one();
        if ended {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        (stats, result)
    }

    fn warn_once(&mut self) {
        if !self.warned {
            self.warned = true;
            eprintln!(
                "dnspath: {}: its reader is not keeping up: records are dropped there and counted (`stats.sinks`, the agent's `dnspath_sink_dropped_total`); every packet is still traced",
                self.name
            );
        }
    }
}

impl<T: Send + 'static> Drop for Queued<T> {
    /// Never waits: a queue not finished is abandoned.
    fn drop(&mut self) {
        if self.thread.is_some() {
            let mut s = self.shared.lock();
            s.closed = true;
            s.abandoned = true;
            self.shared.abandoned.store(true, Ordering::Relaxed);
            drop(s);
            self.shared.work.notify_one();
        }
    }
}

fn error_of<T>(s: &State<T>) -> Option<io::Error> {
    s.error
        .as_ref()
        .map(|(kind, msg)| io::Error::new(*kind, msg.clone()))
}

/// Lowers the calling thread (only it: `PRIO_PROCESS` with a thread id) by [`SINK_NICE`]
/// from the priority it has (a process started with `nice` keeps its queue threads below
/// it, never above), at most to 19. Best effort: raising one's own nice value needs no
/// privilege, and if it fails the thread just keeps the process's priority.
pub fn yield_to_pipeline() {
    // SAFETY: gettid, getpriority and setpriority take and return plain integers; no memory
    // is shared.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid, (now + SINK_NICE).min(19));
    }
}

/// The thread: takes chunks of items and writes them; flushes whenever the queue runs empty.
fn write_loop<T: Send>(shared: &Shared<T>, mut drain: impl Drain<T>) {
    yield_to_pipeline();
    let mut chunk: Vec<T> = Vec::with_capacity(CHUNK);
    let mut flushed = true;
    loop {
        {
            let mut s = shared.lock();
            loop {
                if s.abandoned || s.error.is_some() {
                    s.done = true;
                    drop(s);
                    shared.idle.notify_all();
                    return;
                }
                if !s.items.is_empty() || s.closed || !flushed {
                    break;
                }
                s = shared.work.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            let n = s.items.len().min(CHUNK);
            chunk.extend(s.items.drain(..n));
        }
        if chunk.is_empty() {
            // The queue ran empty: what was written reaches the reader now.
            let r = drain.flush();
            flushed = true;
            let mut s = shared.lock();
            if let Err(e) = r {
                s.error.get_or_insert((e.kind(), e.to_string()));
            }
            if s.closed && s.items.is_empty() {
                s.done = true;
                drop(s);
                shared.idle.notify_all();
                return;
            }
            continue;
        }
        flushed = false;
        let mut written = 0u64;
        let mut failed = None;
        for item in chunk.drain(..) {
            if failed.is_some() || shared.abandoned.load(Ordering::Relaxed) {
                continue;
            }
            match drain.write(item) {
                Ok(()) => written += 1,
                Err(e) => failed = Some(e),
            }
        }
        let mut s = shared.lock();
        if s.abandoned {
            continue;
        }
        s.written += written;
        s.pending = s.pending.saturating_sub(written as usize);
        if let Some(e) = failed {
            s.error.get_or_insert((e.kind(), e.to_string()));
        }
        if s.pending == 0 {
            drop(s);
            shared.idle.notify_all();
        }
    }
}

/// A [`RecordWriter`] behind a [`Queued`]: the thread serialises and writes them.
pub struct QueuedSink(Queued<Record>);

struct SinkDrain(Box<dyn RecordWriter + Send>);

impl Drain<Record> for SinkDrain {
    fn write(&mut self, item: Record) -> io::Result<()> {
        self.0.write(&item)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl QueuedSink {
    pub fn spawn(
        name: &'static str,
        capacity: usize,
        sink: Box<dyn RecordWriter + Send>,
    ) -> io::Result<Self> {
        Queued::spawn(name, capacity, SinkDrain(sink)).map(Self)
    }

    pub fn queue(&mut self) -> &mut Queued<Record> {
        &mut self.0
    }

    /// See [`Queued::is_full`].
    pub fn is_full(&self) -> bool {
        self.0.is_full()
    }
}

impl RecordWriter for QueuedSink {
    fn write(&mut self, record: &Record) -> io::Result<()> {
        self.0.push(record.clone())
    }
    fn write_owned(&mut self, record: Record) -> io::Result<()> {
        self.0.push(record)
    }
    /// The thread flushes whenever its queue runs empty; this only reports its error.
    fn flush(&mut self) -> io::Result<()> {
        self.0.error()
    }
}

/// A byte stream of lines (NDJSON) behind a [`Queued`]: each whole line is one item, written
/// to `W` by the thread. `flush` hands nothing partial over: a line goes when it is whole.
pub struct QueuedLines {
    queue: Queued<Vec<u8>>,
    line: Vec<u8>,
}

struct WriteDrain<W>(W);

impl<W: Write + Send + 'static> Drain<Vec<u8>> for WriteDrain<W> {
    fn write(&mut self, item: Vec<u8>) -> io::Result<()> {
        self.0.write_all(&item)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl QueuedLines {
    pub fn spawn<W: Write + Send + 'static>(
        name: &'static str,
        capacity: usize,
        out: W,
    ) -> io::Result<Self> {
        Ok(Self {
            queue: Queued::spawn(name, capacity, WriteDrain(out))?,
            line: Vec::new(),
        })
    }

    pub fn queue(&mut self) -> &mut Queued<Vec<u8>> {
        &mut self.queue
    }
}

impl Write for QueuedLines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let (line, after) = rest.split_at(i + 1);
            self.line.extend_from_slice(line);
            let whole = std::mem::take(&mut self.line);
            self.queue.push(whole)?;
            rest = after;
        }
        self.line.extend_from_slice(rest);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.queue.error()
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
