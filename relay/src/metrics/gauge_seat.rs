//! One party's share of a gauge that counts parties (workers connected, connections the broker
//! blocks): counted once while it holds its seat, uncounted when it lets go, and when it is
//! dropped, so a worker that ends in any state leaves the gauge right.

use prometheus::IntGauge;

#[derive(Debug)]
pub struct GaugeSeat {
    gauge: IntGauge,
    held: bool,
}

impl GaugeSeat {
    /// A seat not counted yet.
    pub fn new(gauge: IntGauge) -> Self {
        Self { gauge, held: false }
    }

    /// Counts this party (`held`) or not; whether that changed anything.
    pub fn hold(&mut self, held: bool) -> bool {
        if held == self.held {
            return false;
        }
        if held {
            self.gauge.inc();
        } else {
            self.gauge.dec();
        }
        self.held = held;
        true
    }
}

impl Drop for GaugeSeat {
    fn drop(&mut self) {
        self.hold(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seat_counts_once_and_is_given_back_when_dropped() {
        let gauge = IntGauge::new("seats", "seats").unwrap();
        let mut a = GaugeSeat::new(gauge.clone());
        let mut b = GaugeSeat::new(gauge.clone());
        assert!(a.hold(true));
        assert!(!a.hold(true));
        assert!(b.hold(true));
        assert_eq!(gauge.get(), 2);
        assert!(a.hold(false));
        assert_eq!(gauge.get(), 1);
        drop(b);
        drop(a);
        assert_eq!(gauge.get(), 0);
    }
}
