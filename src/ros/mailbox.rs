//! Newest-frame-wins hand-over from the subscription to the processing thread: a single slot
//! (`Mutex<Option<T>>` + `Condvar`). A frame put while another is waiting replaces it and the
//! replaced one is counted as skipped; the worker always takes the newest.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

struct Slot<T> {
    frame: Option<T>,
    closed: bool,
    skipped: u64,
}

pub struct Mailbox<T> {
    slot: Mutex<Slot<T>>,
    ready: Condvar,
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Mailbox {
            slot: Mutex::new(Slot {
                frame: None,
                closed: false,
                skipped: 0,
            }),
            ready: Condvar::new(),
        }
    }
}

impl<T> Mailbox<T> {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot<T>> {
        // A panic while holding this lock cannot leave the slot inconsistent: take the data.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `frame` in the slot; returns true when it replaced a waiting frame (now skipped).
    pub fn put(&self, frame: T) -> bool {
        let mut s = self.lock();
        let replaced = s.frame.replace(frame).is_some();
        if replaced {
            s.skipped += 1;
        }
        drop(s);
        self.ready.notify_one();
        replaced
    }

    /// Blocks until a frame is there (`Some`) or the mailbox is closed (`None`).
    pub fn take(&self) -> Option<T> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return None;
            }
            if let Some(f) = s.frame.take() {
                return Some(f);
            }
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// [`take`](Self::take) with a time limit (`None` also on timeout).
    pub fn take_timeout(&self, timeout: Duration) -> Option<T> {
        let mut s = self.lock();
        let until = std::time::Instant::now() + timeout;
        loop {
            if s.closed {
                return None;
            }
            if let Some(f) = s.frame.take() {
                return Some(f);
            }
            let now = std::time::Instant::now();
            if now >= until {
                return None;
            }
            s = self
                .ready
                .wait_timeout(s, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Frames replaced before the worker took them.
    pub fn skipped(&self) -> u64 {
        self.lock().skipped
    }

    /// Whether a frame is waiting.
    pub fn pending(&self) -> bool {
        self.lock().frame.is_some()
    }

    /// Wakes the worker and makes every later `take` return `None`; a waiting frame is dropped.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.frame = None;
        drop(s);
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn newest_wins_and_replaced_frames_are_counted() {
        let m = Mailbox::new();
        assert!(!m.put(1));
        assert!(m.put(2));
        assert!(m.put(3));
        assert_eq!(m.skipped(), 2);
        assert_eq!(m.take(), Some(3));
        assert!(!m.pending());
        assert_eq!(m.take_timeout(Duration::from_millis(10)), None);
    }

    #[test]
    fn close_wakes_a_waiting_worker() {
        let m = Arc::new(Mailbox::<u32>::new());
        let m2 = m.clone();
        let t = std::thread::spawn(move || m2.take());
        std::thread::sleep(Duration::from_millis(50));
        m.close();
        assert_eq!(t.join().unwrap(), None);
    }
}
