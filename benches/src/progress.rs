//! The progress bar on stderr: one bar per test, one slot of 1000 steps per message size.
//! Hidden with `--no-progress` and when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Steps per size.
const STEPS: u64 = 1000;

/// Progress of one test across its sizes.
pub struct Progress {
    bar: ProgressBar,
    slot: std::cell::Cell<u64>,
}

impl Progress {
    /// A bar for `sizes` sizes of `test`; hidden unless `visible`.
    pub fn new(test: &str, sizes: usize, visible: bool) -> Self {
        let bar = ProgressBar::with_draw_target(Some(sizes as u64 * STEPS), ProgressDrawTarget::stderr());
        if !visible {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix:>10} {msg:>10} [{elapsed_precise}] {wide_bar} {percent:>3}%",
        ) {
            bar.set_style(style);
        }
        bar.set_prefix(test.to_string());
        Progress { bar, slot: std::cell::Cell::new(0) }
    }

    /// A bar that never draws.
    pub fn hidden() -> Self {
        Self::new("", 1, false)
    }

    /// Starts the size with index `slot` (0-based).
    pub fn start_size(&self, slot: usize, bytes: usize) {
        self.slot.set(slot as u64);
        self.bar.set_message(format!("{bytes} B"));
        self.bar.set_position(slot as u64 * STEPS);
    }

    /// The current size is `done` (0.0..=1.0) finished.
    #[inline]
    pub fn fraction(&self, done: f64) {
        let step = (done.clamp(0.0, 1.0) * STEPS as f64) as u64;
        self.bar.set_position(self.slot.get() * STEPS + step);
    }

    /// Prints a line on stdout without tearing the bar.
    pub fn println(&self, line: &str) {
        self.bar.suspend(|| println!("{line}"));
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
