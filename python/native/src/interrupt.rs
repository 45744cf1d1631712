//! Ctrl-C while DWRecv waits: TensorFlow's `session.run` holds the program's main thread in C++
//! and Python only raises KeyboardInterrupt once the run returns, so a run waiting for data
//! would not stop. A SIGINT handler chained in front of the program's own counts interrupts;
//! a wait that sees the count change returns (the op fails as cancelled) and the program's
//! handler, which ran too, raises KeyboardInterrupt as usual.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

static INTERRUPTS: AtomicU64 = AtomicU64::new(0);
/// The handler installed before ours (a `sa_sigaction`/`sa_handler` value), 0 when none.
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_SIGINFO: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

/// How many SIGINTs the process received since ours was installed.
pub fn interrupts() -> u64 {
    INTERRUPTS.load(Ordering::Acquire)
}

extern "C" fn on_sigint(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    INTERRUPTS.fetch_add(1, Ordering::AcqRel);
    let previous = PREVIOUS.load(Ordering::Acquire);
    if previous == libc::SIG_DFL || previous == libc::SIG_IGN || previous == 0 {
        if previous == libc::SIG_DFL {
            // No handler of the program's: the default action (terminate), as before.
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(130) };
        }
        return;
    }
    if PREVIOUS_SIGINFO.load(Ordering::Acquire) != 0 {
        // SAFETY: `previous` is the `sa_sigaction` the program installed with SA_SIGINFO, a
        // function of this signature; it is called with the arguments the kernel gave us.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(previous) };
        f(sig, info, context);
    } else {
        // SAFETY: `previous` is the `sa_handler` the program installed, `fn(c_int)`.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(previous) };
        f(sig);
    }
}

/// Installs the chained handler once per process.
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sigaction with a zeroed struct (a valid all-defaults value), our handler
        // (an `extern "C"` fn of the SA_SIGINFO signature, async-signal-safe: it touches only
        // atomics and calls the previous handler), and out-pointers to live locals.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGINT, std::ptr::null(), &mut old) != 0 {
                return;
            }
            PREVIOUS.store(old.sa_sigaction, Ordering::Release);
            PREVIOUS_SIGINFO.store(
                usize::from(old.sa_flags & libc::SA_SIGINFO != 0),
                Ordering::Release,
            );
            let mut new: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                on_sigint;
            new.sa_sigaction = handler as usize;
            new.sa_flags = (old.sa_flags | libc::SA_SIGINFO) & !libc::SA_RESETHAND;
            new.sa_mask = old.sa_mask;
            libc::sigaction(libc::SIGINT, &new, std::ptr::null_mut());
        }
    });
}
