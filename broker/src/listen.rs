//! What every listener (HTTP, Kafka) holds its clients to: at most so many connections from one
//! client address at once (`--max-connections-per-ip`), so that one client cannot take every
//! slot of `--max-connections`; and logs of what clients do wrong at a bounded rate
//! ([`LogLimit`]), so that a client sending garbage in a loop cannot fill the disk with them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// Connections held per client address, for one listener.
pub struct PerAddress {
    cap: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in its address's count, given back when dropped.
pub struct AddressShare {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    /// A table allowing `cap` connections per address.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// A place for a connection from `ip`, or `None` when the address holds the cap. The
    /// table holds only addresses with a connection open: it is as large as the connections.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<AddressShare> {
        // An IPv4 client of a dual-stack listener is `::ffff:a.b.c.d`: counted as `a.b.c.d`.
        let ip = ip.to_canonical();
        let mut held = self.held.lock();
        let n = held.entry(ip).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(AddressShare {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for AddressShare {
    fn drop(&mut self) {
        let mut held = self.table.held.lock();
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Lets through at most [`LogLimit::PER_WINDOW`] log lines a window; the first line of the
/// next window says how many were left out.
pub struct LogLimit {
    window: std::time::Duration,
    state: Mutex<(std::time::Instant, usize, u64)>,
}

impl LogLimit {
    /// Lines let through per window.
    pub const PER_WINDOW: usize = 10;

    /// A limit of [`LogLimit::PER_WINDOW`] lines per `window`.
    pub fn new(window: std::time::Duration) -> Self {
        Self {
            window,
            state: Mutex::new((std::time::Instant::now(), 0, 0)),
        }
    }

    /// `Some(lines left out since the last one let through)` when this line may be logged.
    pub fn allow(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let (start, used, suppressed) = &mut *state;
        if start.elapsed() >= self.window {
            *start = std::time::Instant::now();
            *used = 0;
        }
        if *used >= Self::PER_WINDOW {
            *suppressed += 1;
            return None;
        }
        *used += 1;
        Some(std::mem::take(suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_the_cap_and_gets_its_places_back() {
        let table = PerAddress::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let one = table.take(a).unwrap();
        let _two = table.take(mapped).expect("the same address, counted once");
        assert!(table.take(a).is_none());
        assert!(table.take("10.0.0.2".parse().unwrap()).is_some());
        drop(one);
        assert!(table.take(a).is_some());
    }

    #[test]
    fn a_log_limit_lets_ten_a_window_through_and_counts_the_rest() {
        let limit = LogLimit::new(std::time::Duration::from_millis(50));
        for _ in 0..LogLimit::PER_WINDOW {
            assert_eq!(limit.allow(), Some(0));
        }
        assert_eq!(limit.allow(), None);
        assert_eq!(limit.allow(), None);
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(
            limit.allow(),
            Some(2),
            "the next window's first says how many"
        );
        assert_eq!(limit.allow(), Some(0));
    }
}
