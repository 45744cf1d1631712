//! Automatic compression on the link at hand: whether LZ4 makes a sender's frames arrive
//! faster, not only smaller.
//!
//! Compressing a frame costs the sender CPU time and saves link time. Which one wins depends
//! on the link: on a 1 Gbit/s link a worker that keeps the link busy waits on it, and fewer
//! bytes are fewer waits; on a fast link (loopback, a veth pair, 10 Gbit/s and up) the sender's
//! CPU is the limit, and compressing only adds to it. The size probe of [`super::StepEncoder`]
//! says how much LZ4 saves ([`AutoProbe`]: bytes before and after, and the time compressing
//! took); the sender says how its frames went ([`LinkSample`]: each burst's frames and bytes,
//! and the time it was blocked on the network since the one before, writing into the socket
//! or reading the receiver's answers). [`AutoState`] adds the samples up into windows of at
//! least [`AUTO_WINDOW`] and judges each one with [`decide`], a pure function:
//!
//! 1. LZ4 never, when the latest probe saved less than [`AUTO_MIN_SAVING_PERCENT`]%.
//! 2. Raw frames whose sender waited on the network less than [`LINK_BOUND_WAIT_PERCENT`]% of
//!    the window: the link drains faster than the sender fills it, so compressing cannot
//!    shorten anything and adds its CPU time: stay raw.
//! 3. Raw frames that waited on the network: LZ4's time per frame is predicted as the larger
//!    of the sender's busy time plus the compression time (from the probe) and the window's
//!    time per frame scaled by the probe's ratio (all of it link time when the link was busy
//!    throughout). Predicted at least [`AUTO_GAIN_PERCENT`]% faster: try LZ4.
//! 4. LZ4 frames: raw's time per frame is predicted as the largest of the busy time less the
//!    compression time, the window's wait scaled up to the raw bytes, and the raw bytes at the
//!    rate of the latest window that waited on the link (bytes over the time waited).
//!    Predicted at least [`AUTO_GAIN_PERCENT`]% faster: try raw.
//! 5. A trial window (the other setting, tried after the window before it) is compared with
//!    the window before it by measured time per frame: LZ4 is kept only when at least
//!    [`AUTO_TIE_PERCENT`]% faster than raw (raw costs less CPU on both ends, so it wins a tie).
//!
//! The predictions are lower bounds of the other setting's time whether the sender overlaps
//! its work with the link (short steps: a burst drains while the next is computed) or waits
//! for each answer (long steps: work, then the transfer): a setting that may be faster is
//! tried, and only a trial that measured it faster makes it the setting.//!
//! A window that waited on the link measured its rate (at most its bytes over the time it
//! waited); the rate is remembered for [`AUTO_MAX_HOLD_WINDOWS`] windows, so that on a link
//! whose rate is known raw is not tried against LZ4 again and again.
//!
//! A prediction only starts a trial; what a trial measured decides. A trial that confirms the
//! setting held before waits twice as many windows as the last before the next one
//! ([`AUTO_HOLD_WINDOWS`] at first, at most [`AUTO_MAX_HOLD_WINDOWS`]); a trial that changes
//! the setting starts again from the first hold. After every change the samples of the next
//! [`AUTO_SETTLE`] are left out: frames encoded before it are still in the socket's buffer.
//!
//! A sender that will report says so ([`super::StepEncoder::expect_link_reports`]): its
//! windows start from raw frames, and while they keep raw frames a probe compresses only
//! [`AUTO_LINK_PROBE_MESSAGES`] messages and sends them raw. Until a sender reports (or says
//! it will), `auto` chooses by size alone (LZ4 when the probe saved at least
//! [`AUTO_MIN_SAVING_PERCENT`]%), as it did before it measured the link, so that an encoder
//! whose sender never reports (gRPC `Push`, tools) behaves as before.
//! The choice is the encoder's alone: each frame says in its header how it is stored, so
//! receivers of every version read frames of either setting.

use std::time::{Duration, Instant};

use super::{AutoProbe, FrameCompression, AUTO_MIN_SAVING_PERCENT};

/// The least wall time of samples a window adds up before it is judged.
pub const AUTO_WINDOW: Duration = Duration::from_millis(200);

/// The fewest frames a window holds before it is judged.
pub const AUTO_WINDOW_FRAMES: u64 = 4;

/// Samples left out after a change of setting: the frames encoded before it are still in the
/// socket's buffer and on the link (a worker's two bursts of 2 MiB are 34 ms at 1 Gbit/s).
pub const AUTO_SETTLE: Duration = Duration::from_millis(50);

/// A window whose sender was blocked on the network for at least this share of its wall time
/// waited on the link (or on the receiver behind it).
pub const LINK_BOUND_WAIT_PERCENT: u64 = 10;

/// A trial of the other setting starts only when predicted at least this much faster.
pub const AUTO_GAIN_PERCENT: u64 = 5;

/// LZ4 wins a trial's comparison only when at least this much faster than raw.
pub const AUTO_TIE_PERCENT: u64 = 3;

/// Windows between a trial and the next one, at first.
pub const AUTO_HOLD_WINDOWS: u32 = 4;

/// The most windows between two trials (the hold doubles each time a trial confirms the
/// setting held).
pub const AUTO_MAX_HOLD_WINDOWS: u32 = 64;

/// Messages a probe compresses while the windows chose raw frames for a sender that reports
/// (to follow the ratio and the compression time; they go raw): on a fast link each costs
/// the sender its compression, which over the full probe was several percent of its time.
pub const AUTO_LINK_PROBE_MESSAGES: u64 = 2;

/// How a burst of frames went, as its sender saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkSample {
    /// Frames in the burst.
    pub frames: u64,
    /// Their bytes on the wire.
    pub bytes: u64,
    /// The time the sender was blocked on the network since its previous sample: writing this
    /// burst into the socket and reading the answers to earlier ones.
    pub waited: Duration,
}

/// Samples of one setting added up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    pub frames: u64,
    pub bytes: u64,
    /// The time the samples span.
    pub wall: Duration,
    /// The part of it the sender was blocked on the network.
    pub waited: Duration,
}

impl Window {
    /// Whether the sender waited on the network for at least [`LINK_BOUND_WAIT_PERCENT`]% of
    /// the window.
    pub fn waited_on_link(&self) -> bool {
        ns(self.waited) * 100 >= ns(self.wall) * u128::from(LINK_BOUND_WAIT_PERCENT)
    }

    fn add(&mut self, sample: LinkSample, span: Duration) {
        self.frames = self.frames.saturating_add(sample.frames);
        self.bytes = self.bytes.saturating_add(sample.bytes);
        self.wall = self.wall.saturating_add(span);
        self.waited = self.waited.saturating_add(sample.waited.min(span));
    }
}

/// What [`decide`] judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evidence {
    /// The setting the window ran with.
    pub current: FrameCompression,
    pub window: Window,
    /// The latest size probe (its ratio and its compression time).
    pub probe: AutoProbe,
    /// When the window was a trial of `current`: the window of the other setting before it.
    pub baseline: Option<Window>,
    /// The latest recent window that waited on the link (either setting): its bytes over the
    /// time it waited bound the link's rate.
    pub link: Option<Window>,
}

/// What to run the next window with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The same setting.
    Keep,
    /// A trial of the other setting.
    Trial,
    /// This setting (the end of a trial, or the size rule).
    Choose(FrameCompression),
}

/// Whether a probe saved at least [`AUTO_MIN_SAVING_PERCENT`]% of the bytes.
pub fn worth_compressing(probe: &AutoProbe) -> bool {
    let saved = probe.raw_bytes.saturating_sub(probe.lz4_bytes);
    u128::from(saved) * 100 >= u128::from(probe.raw_bytes) * u128::from(AUTO_MIN_SAVING_PERCENT)
        && probe.raw_bytes > 0
}

/// Judges a window (see the module documentation for the rules).
pub fn decide(e: &Evidence) -> Next {
    if !worth_compressing(&e.probe) {
        return Next::Choose(FrameCompression::None);
    }
    let w = &e.window;
    if w.frames == 0 || w.wall.is_zero() {
        return Next::Keep;
    }
    if let Some(base) = &e.baseline {
        let (lz4, raw) = match e.current {
            FrameCompression::Lz4 => (w, base),
            FrameCompression::None => (base, w),
        };
        if raw.frames == 0 || lz4.frames == 0 {
            return Next::Choose(FrameCompression::None);
        }
        // Time per frame, cross-multiplied: lz4.wall / lz4.frames against raw's.
        let lz4_wins = ns(lz4.wall).saturating_mul(u128::from(raw.frames) * 100)
            < ns(raw.wall)
                .saturating_mul(u128::from(lz4.frames) * u128::from(100 - AUTO_TIE_PERCENT));
        return Next::Choose(if lz4_wins {
            FrameCompression::Lz4
        } else {
            FrameCompression::None
        });
    }
    let frames = u128::from(w.frames);
    let per_frame = ns(w.wall) / frames;
    let busy = ns(w.wall.saturating_sub(w.waited)) / frames;
    let raw_total = u128::from(e.probe.raw_bytes);
    let lz4_total = u128::from(e.probe.lz4_bytes.min(e.probe.raw_bytes));
    let bytes = u128::from(w.bytes) / frames;
    // The payload a frame of this window compresses from, and the time that takes.
    let raw_bytes = match e.current {
        FrameCompression::None => bytes,
        FrameCompression::Lz4 => bytes.saturating_mul(raw_total) / lz4_total.max(1),
    };
    let compress = u128::from(e.probe.compress_ns).saturating_mul(raw_bytes) / raw_total;
    let worth_a_trial = |predicted: u128| {
        predicted.saturating_mul(100) <= per_frame * u128::from(100 - AUTO_GAIN_PERCENT)
    };
    match e.current {
        FrameCompression::None => {
            if !w.waited_on_link() {
                return Next::Keep;
            }
            let link = per_frame.saturating_mul(lz4_total) / raw_total;
            if worth_a_trial(busy.saturating_add(compress).max(link)) {
                Next::Trial
            } else {
                Next::Keep
            }
        }
        FrameCompression::Lz4 => {
            let raw_wait = (ns(w.waited) / frames).saturating_mul(raw_bytes) / bytes.max(1);
            let raw_link = e.link.filter(|l| l.bytes > 0).map_or(0, |l| {
                ns(l.waited).saturating_mul(raw_bytes) / u128::from(l.bytes)
            });
            let predicted = busy.saturating_sub(compress).max(raw_wait).max(raw_link);
            if worth_a_trial(predicted) {
                Next::Trial
            } else {
                Next::Keep
            }
        }
    }
}

fn ns(d: Duration) -> u128 {
    d.as_nanos()
}

fn other(c: FrameCompression) -> FrameCompression {
    match c {
        FrameCompression::None => FrameCompression::Lz4,
        FrameCompression::Lz4 => FrameCompression::None,
    }
}

/// The windows of automatic compression and its trials (see the module documentation): a
/// state machine with time passed in, fed by the encoder's probes and the sender's samples.
#[derive(Debug, Clone, Default)]
pub struct AutoState {
    /// What frames are compressed with outside probes; None before the first probe.
    setting: Option<FrameCompression>,
    /// Whether the sender has reported a sample (before, the size rule alone decides).
    observed: bool,
    /// The window being added up.
    window: Window,
    /// The previous sample's time.
    last: Option<Instant>,
    /// What is still to be left out after a change.
    settle: Duration,
    /// During a trial: the window of the other setting before it.
    baseline: Option<Window>,
    /// The latest window that waited on the link, and windows judged since.
    link: Option<(Window, u32)>,
    /// Windows between trials now, and still to go before the next.
    hold: u32,
    hold_left: u32,
    /// Windows judged, and trials made.
    windows: u64,
    trials: u64,
}

impl AutoState {
    pub fn new() -> Self {
        AutoState {
            hold: AUTO_HOLD_WINDOWS,
            ..AutoState::default()
        }
    }

    /// What frames are compressed with outside probes (None before the first probe).
    pub fn setting(&self) -> Option<FrameCompression> {
        self.setting
    }

    /// Whether a trial is running.
    pub fn in_trial(&self) -> bool {
        self.baseline.is_some()
    }

    /// Windows judged so far, and trials started.
    pub fn counts(&self) -> (u64, u64) {
        (self.windows, self.trials)
    }

    /// Says that the sender will report its bursts: the windows decide from the first probe
    /// on, starting from raw frames (the cheaper mistake: on a fast link LZ4 frames can take
    /// three times as long as raw ones, where on a slow link raw ones take under twice as
    /// long as LZ4's), and later probes only measure (see [`AutoState::measures_only`]).
    pub fn expect_reports(&mut self) {
        self.observed = true;
    }

    /// Whether a probe now only measures LZ4 (its frames go raw, and it is
    /// [`AUTO_LINK_PROBE_MESSAGES`] long): the sender reports, and the windows chose raw.
    pub fn measures_only(&self) -> bool {
        self.observed && self.setting == Some(FrameCompression::None)
    }

    /// At the end of a size probe: what to compress with until the next one. Not worth it:
    /// raw. Else the setting the windows chose (raw at first), or, while the sender has not
    /// reported anything, LZ4.
    pub fn probed(&mut self, worth_it: bool) -> FrameCompression {
        let chosen = match self.setting {
            _ if !worth_it => FrameCompression::None,
            Some(setting) if self.observed => setting,
            None if self.observed => FrameCompression::None,
            _ => FrameCompression::Lz4,
        };
        if self.setting != Some(chosen) {
            if self.setting.is_some() {
                self.changed();
            }
            self.setting = Some(chosen);
        }
        chosen
    }

    /// Adds a sample taken at `now`; `probe` is the latest finished size probe. Returns the
    /// new setting when this sample's window changed it.
    pub fn observe(
        &mut self,
        sample: LinkSample,
        now: Instant,
        probe: Option<&AutoProbe>,
    ) -> Option<FrameCompression> {
        self.observed = true;
        // The first sample starts the clock: what came before it is not known.
        let prev = self.last.replace(now)?;
        let span = now.saturating_duration_since(prev);
        if !self.settle.is_zero() {
            self.settle = self.settle.saturating_sub(span);
            return None;
        }
        self.window.add(sample, span);
        if self.window.wall < AUTO_WINDOW || self.window.frames < AUTO_WINDOW_FRAMES {
            return None;
        }
        let window = std::mem::take(&mut self.window);
        let (Some(current), Some(probe)) = (self.setting, probe) else {
            return None;
        };
        self.windows += 1;
        self.link = if window.waited_on_link() {
            Some((window, 0))
        } else {
            self.link
                .map(|(l, age)| (l, age + 1))
                .filter(|&(_, age)| age <= AUTO_MAX_HOLD_WINDOWS)
        };
        let next = decide(&Evidence {
            current,
            window,
            probe: *probe,
            baseline: self.baseline,
            link: self.link.map(|(l, _)| l),
        });
        let chosen = match next {
            Next::Keep => {
                self.hold_left = self.hold_left.saturating_sub(1);
                current
            }
            Next::Trial if self.hold_left > 0 => {
                self.hold_left -= 1;
                current
            }
            Next::Trial => {
                self.baseline = Some(window);
                self.trials += 1;
                other(current)
            }
            Next::Choose(chosen) => {
                if self.baseline.take().is_some() {
                    // The trial of `current` against the setting before it ended.
                    self.hold = if chosen == current {
                        AUTO_HOLD_WINDOWS
                    } else {
                        self.hold.saturating_mul(2).min(AUTO_MAX_HOLD_WINDOWS)
                    };
                    self.hold_left = self.hold;
                }
                chosen
            }
        };
        if chosen == current {
            return None;
        }
        self.setting = Some(chosen);
        self.changed();
        Some(chosen)
    }

    /// After a change of setting: the window starts again, past the settling time.
    fn changed(&mut self) {
        self.window = Window::default();
        self.settle = AUTO_SETTLE;
    }
}

#[cfg(test)]
#[path = "codec_auto_tests.rs"]
mod tests;
