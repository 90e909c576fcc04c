//! The autoscaler: every interval it looks at the last window and changes the number of
//! live user threads. `qos` mode holds storage saturation (the window's read P95 against
//! 100 ms) near a target: two windows above 110 % of it take a fifth of the users away
//! (then three windows of calm), a window below 90 % adds a fifth. `capacity` mode searches
//! for the user count with the highest throughput: +40 % first, +20 % while tokens per
//! second improve by more than 1 %, and the run ends after two windows without improvement,
//! reporting the peak.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoscaleMode {
    Qos,
    Capacity,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoscaleConfig {
    pub mode: AutoscaleMode,
    /// Saturation the qos mode aims at, 0–1.
    pub target_saturation: f64,
    pub interval_s: f64,
    pub max_users: u32,
}

/// What one window measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub t_s: f64,
    pub users: u32,
    pub tokens_per_s: f64,
    /// P95 of storage reads in the window, in ms (0 without reads, which the qos mode
    /// takes as no evidence).
    pub read_p95_ms: f64,
}

/// A change of the user count, for the timeline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaleEvent {
    pub t_s: f64,
    pub action: &'static str,
    pub from_users: u32,
    pub to_users: u32,
    pub saturation: f64,
    pub tokens_per_s: f64,
    pub reason: String,
}

/// What to do after a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    Keep,
    Scale(u32),
    /// Capacity found: end the run.
    Stop,
}

/// Read P95 that counts as full saturation.
const SATURATED_READ_P95_MS: f64 = 100.0;

pub struct Autoscaler {
    config: AutoscaleConfig,
    windows: u32,
    above: u32,
    cooldown: u32,
    best_tokens_per_s: f64,
    best_users: u32,
    flat: u32,
    pub events: Vec<ScaleEvent>,
}

impl Autoscaler {
    pub fn new(config: AutoscaleConfig) -> Autoscaler {
        Autoscaler {
            config,
            windows: 0,
            above: 0,
            cooldown: 0,
            best_tokens_per_s: 0.0,
            best_users: 0,
            flat: 0,
            events: Vec::new(),
        }
    }

    pub fn mode(&self) -> AutoscaleMode {
        self.config.mode
    }

    pub fn interval_s(&self) -> f64 {
        self.config.interval_s
    }

    /// The user count with the best throughput seen (capacity mode).
    pub fn peak(&self) -> (u32, f64) {
        (self.best_users, self.best_tokens_per_s)
    }

    pub fn saturation(w: &Window) -> f64 {
        (w.read_p95_ms / SATURATED_READ_P95_MS).min(1.0)
    }

    pub fn decide(&mut self, w: &Window) -> Decision {
        self.windows += 1;
        let saturation = Self::saturation(w);
        let (decision, reason) = match self.config.mode {
            AutoscaleMode::Qos => self.qos(w, saturation),
            AutoscaleMode::Capacity => self.capacity(w),
        };
        let (action, to) = match decision {
            Decision::Keep => return decision,
            Decision::Scale(to) if to > w.users => ("scale_up", to),
            Decision::Scale(to) => ("scale_down", to),
            Decision::Stop => ("stop", w.users),
        };
        self.events.push(ScaleEvent {
            t_s: w.t_s,
            action,
            from_users: w.users,
            to_users: to,
            saturation,
            tokens_per_s: w.tokens_per_s,
            reason,
        });
        decision
    }

    fn qos(&mut self, w: &Window, saturation: f64) -> (Decision, String) {
        let target = self.config.target_saturation;
        if self.cooldown > 0 {
            self.cooldown -= 1;
            return (Decision::Keep, String::new());
        }
        if w.read_p95_ms == 0.0 {
            // No storage reads yet: no evidence either way.
            return (Decision::Keep, String::new());
        }
        if saturation > 1.1 * target {
            self.above += 1;
            if self.above >= 2 {
                self.above = 0;
                self.cooldown = 3;
                let to = ((f64::from(w.users) * 0.8) as u32).max(1);
                if to < w.users {
                    return (
                        Decision::Scale(to),
                        format!("saturation {saturation:.2} above {:.2} twice", 1.1 * target),
                    );
                }
            }
            return (Decision::Keep, String::new());
        }
        self.above = 0;
        if saturation < 0.9 * target && w.users < self.config.max_users {
            let to = ((f64::from(w.users) * 1.2).ceil() as u32)
                .max(w.users + 1)
                .min(self.config.max_users);
            return (
                Decision::Scale(to),
                format!("saturation {saturation:.2} below {:.2}", 0.9 * target),
            );
        }
        (Decision::Keep, String::new())
    }

    fn capacity(&mut self, w: &Window) -> (Decision, String) {
        let step = |share: f64| ((f64::from(w.users) * share) as u32).clamp(5, 100);
        let grow = |by: u32| (w.users + by).min(self.config.max_users);
        if self.windows == 1 {
            self.best_tokens_per_s = w.tokens_per_s;
            self.best_users = w.users;
            return (Decision::Scale(grow(step(0.4))), "first step +40 %".into());
        }
        if w.tokens_per_s > self.best_tokens_per_s * 1.01 {
            self.best_tokens_per_s = w.tokens_per_s;
            self.best_users = w.users;
            self.flat = 0;
            if w.users >= self.config.max_users {
                return (Decision::Stop, "user limit reached".into());
            }
            return (
                Decision::Scale(grow(step(0.2))),
                format!("{:.1} tok/s, still improving", w.tokens_per_s),
            );
        }
        self.flat += 1;
        if self.flat >= 2 {
            return (
                Decision::Stop,
                format!(
                    "no improvement twice; peak {:.1} tok/s at {} users",
                    self.best_tokens_per_s, self.best_users
                ),
            );
        }
        (Decision::Keep, String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(users: u32, tps: f64, p95: f64) -> Window {
        Window {
            t_s: 0.0,
            users,
            tokens_per_s: tps,
            read_p95_ms: p95,
        }
    }

    #[test]
    fn qos_mode_backs_off_after_two_saturated_windows_and_grows_when_calm() {
        let mut a = Autoscaler::new(AutoscaleConfig {
            mode: AutoscaleMode::Qos,
            target_saturation: 0.5,
            interval_s: 1.0,
            max_users: 500,
        });
        assert_eq!(a.decide(&window(10, 0.0, 90.0)), Decision::Keep);
        assert_eq!(a.decide(&window(10, 0.0, 90.0)), Decision::Scale(8));
        for _ in 0..3 {
            assert_eq!(a.decide(&window(8, 0.0, 10.0)), Decision::Keep, "cooldown");
        }
        assert_eq!(a.decide(&window(8, 0.0, 10.0)), Decision::Scale(10));
        assert_eq!(a.events.len(), 2);
        assert_eq!(a.events[0].action, "scale_down");
    }

    #[test]
    fn capacity_mode_climbs_while_throughput_improves_then_stops_at_the_peak() {
        let mut a = Autoscaler::new(AutoscaleConfig {
            mode: AutoscaleMode::Capacity,
            target_saturation: 0.8,
            interval_s: 1.0,
            max_users: 500,
        });
        assert_eq!(a.decide(&window(10, 100.0, 0.0)), Decision::Scale(15));
        assert_eq!(a.decide(&window(15, 150.0, 0.0)), Decision::Scale(20));
        assert_eq!(a.decide(&window(20, 150.5, 0.0)), Decision::Keep);
        assert_eq!(a.decide(&window(20, 149.0, 0.0)), Decision::Stop);
        assert_eq!(a.peak(), (15, 150.0));
    }
}
