use std::{
    io,
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use super::*;

/// Keeps what it writes; each write first waits for a go from the test (`None`: never).
struct Gated {
    written: Arc<Mutex<Vec<u32>>>,
    go: Option<mpsc::Receiver<()>>,
    flushes: Arc<Mutex<u32>>,
}

impl Drain<u32> for Gated {
    fn write(&mut self, item: u32) -> io::Result<()> {
        match &self.go {
            Some(go) => {
                let _ = go.recv();
            }
            None => std::thread::sleep(Duration::from_secs(3600)),
        }
        self.written.lock().unwrap().push(item);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        *self.flushes.lock().unwrap() += 1;
        Ok(())
    }
}

type Handles = (Arc<Mutex<Vec<u32>>>, Arc<Mutex<u32>>);

fn gated(go: Option<mpsc::Receiver<()>>) -> (Gated, Handles) {
    let written = Arc::new(Mutex::new(Vec::new()));
    let flushes = Arc::new(Mutex::new(0));
    (
        Gated {
            written: Arc::clone(&written),
            go,
            flushes: Arc::clone(&flushes),
        },
        (written, flushes),
    )
}

/// A reader that does not keep up: what does not fit is dropped and counted at once (the
/// caller never waits); what was queued is written at the end, in order, and flushed, the
/// last item beyond the capacity.
#[test]
fn full_queue_drops_and_counts_and_finish_drains() {
    let (go_tx, go_rx) = mpsc::channel();
    let (drain, (written, flushes)) = gated(Some(go_rx));
    let mut q = Queued::spawn("test", 4, drain).unwrap();
    let started = Instant::now();
    let mut items: Vec<u32> = (0..10).collect();
    q.push_all(&mut items).unwrap();
    assert!(items.is_empty());
    q.push(10).unwrap();
    // One item taken by the thread still counts against the capacity: 4 queued, 7 dropped.
    assert_eq!(
        q.stats(),
        SinkStats {
            name: "test",
            written: 0,
            dropped: 7
        }
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "handing over blocked"
    );
    q.push_last(99).unwrap();
    for _ in 0..5 {
        go_tx.send(()).unwrap();
    }
    let (stats, result) = q.finish(Duration::from_secs(10));
    result.unwrap();
    assert_eq!(
        stats,
        SinkStats {
            name: "test",
            written: 5,
            dropped: 7
        }
    );
    assert_eq!(*written.lock().unwrap(), [0, 1, 2, 3, 99]);
    assert!(*flushes.lock().unwrap() >= 1);
}

/// A reader that keeps up loses nothing, and `wait_written` sees it all written.
#[test]
fn a_reader_that_keeps_up_gets_everything() {
    let (go_tx, go_rx) = mpsc::channel();
    let (drain, (written, _)) = gated(Some(go_rx));
    for _ in 0..1000 {
        go_tx.send(()).unwrap();
    }
    let mut q = Queued::spawn("test", 16, drain).unwrap();
    for i in 0..1000u32 {
        // Never more than the capacity ahead of the reader.
        while q.stats().written + 16 <= u64::from(i) {
            std::thread::yield_now();
        }
        q.push(i).unwrap();
    }
    assert!(q.wait_written(Duration::from_secs(10)));
    assert_eq!(q.stats().written, 1000);
    let (stats, result) = q.finish(Duration::from_secs(10));
    result.unwrap();
    assert_eq!(stats.dropped, 0);
    assert_eq!(*written.lock().unwrap(), (0..1000).collect::<Vec<_>>());
}

/// A reader that never reads: the end waits the bound, no more, and counts what is left.
#[test]
fn finish_waits_a_bounded_time_for_a_reader_that_never_reads() {
    let (drain, (written, _)) = gated(None);
    let mut q = Queued::spawn("test", 8, drain).unwrap();
    let mut items: Vec<u32> = (0..20).collect();
    q.push_all(&mut items).unwrap();
    q.push_last(99).unwrap();
    let started = Instant::now();
    assert!(!q.wait_written(Duration::from_millis(50)));
    let (stats, result) = q.finish(Duration::from_millis(200));
    let took = started.elapsed();
    result.unwrap();
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(stats.written, 0);
    // 12 for a full queue, then the 8 queued and the last item at the end.
    assert_eq!(stats.dropped, 21);
    assert!(written.lock().unwrap().is_empty());
}

struct Broken;

impl Drain<u32> for Broken {
    fn write(&mut self, _: u32) -> io::Result<()> {
        Err(io::ErrorKind::BrokenPipe.into())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reader went away (`| head`): the next hand-over says so, as a direct write would.
#[test]
fn a_write_error_comes_back_to_the_caller() {
    let mut q = Queued::spawn("test", 8, Broken).unwrap();
    q.push(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match q.push(2) {
            Err(e) => break e,
            Ok(()) => {
                assert!(Instant::now() < deadline, "no error");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(q.error().unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    let (_, result) = q.finish(Duration::from_secs(1));
    assert_eq!(result.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Lines are items: a line goes over when it is whole, however it was written.
#[test]
fn queued_lines_hand_over_whole_lines() {
    use std::io::Write as _;
    let out = Shared::default();
    let mut w = QueuedLines::spawn("events", 8, out.clone()).unwrap();
    w.write_all(b"{\"a\":1}\n{\"b\"").unwrap();
    w.write_all(b":2}").unwrap();
    w.flush().unwrap();
    assert!(w.queue().wait_written(Duration::from_secs(10)));
    assert_eq!(w.queue().stats().written, 1);
    w.write_all(b"\n").unwrap();
    let (stats, result) = w.queue().finish(Duration::from_secs(10));
    result.unwrap();
    assert_eq!(stats.written, 2);
    assert_eq!(*out.0.lock().unwrap(), b"{\"a\":1}\n{\"b\":2}\n");
}

/// Reports the nice value of the thread that writes.
struct NiceProbe(mpsc::Sender<(i32, i32)>);

impl Drain<u32> for NiceProbe {
    fn write(&mut self, _item: u32) -> io::Result<()> {
        // SAFETY: plain integer calls.
        let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        // The process's main thread (its id is the process id) keeps its priority.
        let main = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::getpid() as libc::id_t) };
        let _ = self.0.send((own, main));
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The queue's thread, and only it, yields the CPU to the pipeline: a sink that cannot keep
/// up loses records at its queue before the ring buffer loses packets.
#[test]
fn the_queue_thread_runs_at_a_lower_priority_than_the_process() {
    // SAFETY: plain integer call.
    let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::getpid() as libc::id_t) };
    let (tx, rx) = mpsc::channel();
    let mut q = Queued::spawn("test", 4, NiceProbe(tx)).unwrap();
    q.push(1).unwrap();
    let (own, main) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(own, (before + SINK_NICE).min(19));
    assert_eq!(main, before);
    let _ = q.finish(Duration::from_secs(1));
}
