//! The C ABI the DWRecv kernel and the Python package call (see `lode_training.h` beside the
//! op's source). One training side per process, behind a mutex.
//!
//! Conventions: functions return a status ([`LODE_OK`], [`LODE_END_OF_DATA`],
//! [`LODE_CANCELLED`], [`LODE_ERROR`]); after [`LODE_ERROR`] the calling thread's message is
//! read with [`lode_error_message`]. Pointers handed out ([`LodePart`], [`LodeCancel`]) are
//! owned by the caller until given back to their `_free` function; views into a part are valid
//! while the part is.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lode_runtime::TensorData;
use lode_transfer::Step;

use crate::side::{JobConfig, Received, SideError, TrainingSide};

pub const LODE_OK: i32 = 0;
pub const LODE_END_OF_DATA: i32 = 1;
pub const LODE_CANCELLED: i32 = 2;
pub const LODE_ERROR: i32 = 3;
/// [`lode_try_recv`]: the run's step is not complete yet.
pub const LODE_WOULD_BLOCK: i32 = 4;

static SIDE: Mutex<Option<TrainingSide>> = Mutex::new(None);

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn fail(message: impl std::fmt::Display) -> i32 {
    let message = message.to_string();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    LODE_ERROR
}

fn side() -> MutexGuard<'static, Option<TrainingSide>> {
    SIDE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The process's training side, connected from the environment on first use.
fn with_side<T>(f: impl FnOnce(&mut TrainingSide) -> Result<T, SideError>) -> Result<T, SideError> {
    let mut guard = side();
    if guard.is_none() {
        *guard = Some(TrainingSide::connect(&JobConfig::from_env()?)?);
        crate::interrupt::install();
    }
    match guard.as_mut() {
        Some(s) => f(s),
        None => Err(SideError::NotConfigured),
    }
}

/// A cancellation flag a kernel fires when TensorFlow cancels its step.
#[derive(Debug, Default)]
pub struct LodeCancel(AtomicBool);

/// One stage's tensors of a step, handed to the DWRecv kernel.
#[derive(Debug)]
pub struct LodePart {
    step: Arc<Step>,
    part: usize,
    dims: Vec<Vec<i64>>,
}

/// A view of one tensor of a part: TensorFlow's dtype enum, the shape, and for every dtype but
/// strings the row-major values' bytes.
#[repr(C)]
#[derive(Debug)]
pub struct LodeTensorView {
    pub dtype: i32,
    pub rank: usize,
    pub dims: *const i64,
    /// Null for strings (read them with [`lode_part_string`]).
    pub data: *const u8,
    pub bytes: usize,
    pub elements: usize,
}

/// Connects the process to its job now (rather than at the first DWRecv), from `config_json`
/// (the keys of `side::JobConfig`: `dispatcher`, `token`, `job`, `tls_ca`, `tls_cert`,
/// `tls_key`, `patience_secs`, `capacity`, `pass_steps`, `endless`, `listen`, `advertise`), or
/// from the `LODE_*` environment when it is null. Connecting twice keeps the first connection.
///
/// # Safety
/// `config_json` is null or a NUL-terminated string valid for the call.
#[no_mangle]
pub unsafe extern "C" fn lode_connect(config_json: *const c_char) -> i32 {
    let config = if config_json.is_null() {
        JobConfig::from_env()
    } else {
        // SAFETY: the caller passes a NUL-terminated string that outlives this call.
        let text = unsafe { CStr::from_ptr(config_json) }.to_string_lossy();
        serde_json::from_str::<JobConfig>(&text).map_err(SideError::from)
    };
    let mut guard = side();
    if guard.is_some() {
        return LODE_OK;
    }
    match config.and_then(|c| TrainingSide::connect(&c)) {
        Ok(s) => {
            crate::interrupt::install();
            *guard = Some(s);
            LODE_OK
        }
        Err(e) => fail(e),
    }
}

/// Receives stage `stage`'s tensors of the step of TensorFlow run `run` into `*out`, blocking
/// until the step is complete, the data ends ([`LODE_END_OF_DATA`]) or `cancel` fires.
///
/// # Safety
/// `cancel` is null or a live pointer from [`lode_cancel_new`]; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn lode_recv(
    run: i64,
    stage: i64,
    cancel: *const LodeCancel,
    out: *mut *mut LodePart,
) -> i32 {
    if out.is_null() {
        return fail("lode_recv: out is null");
    }
    let Ok(stage) = u32::try_from(stage) else {
        return fail(format!("lode_recv: stage {stage} is not a stage number"));
    };
    // SAFETY: the caller keeps `cancel` alive for the call (or passes null).
    let cancel = unsafe { cancel.as_ref() };
    let interrupts = crate::interrupt::interrupts();
    let cancelled = || {
        cancel.is_some_and(|c| c.0.load(Ordering::Acquire))
            || crate::interrupt::interrupts() != interrupts
    };
    match with_side(|s| s.recv(run, stage, &cancelled)) {
        // SAFETY: `out` is non-null and valid for a write (the caller's contract).
        Ok(received) => unsafe { hand_out(received, out) },
        Err(SideError::Consumer(lode_train::consumer::ConsumerError::Cancelled)) => LODE_CANCELLED,
        Err(e) => fail(e),
    }
}

/// [`lode_recv`] without waiting: [`LODE_WOULD_BLOCK`] when the step of run `run` is not
/// complete yet (then nothing is written; wait with [`lode_recv`]). The DWRecv kernel calls
/// this first, on TensorFlow's op thread, so that a step already buffered costs no thread hop.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn lode_try_recv(run: i64, stage: i64, out: *mut *mut LodePart) -> i32 {
    if out.is_null() {
        return fail("lode_try_recv: out is null");
    }
    let Ok(stage) = u32::try_from(stage) else {
        return fail(format!(
            "lode_try_recv: stage {stage} is not a stage number"
        ));
    };
    match with_side(|s| s.try_recv(run, stage)) {
        // SAFETY: `out` is non-null and valid for a write (the caller's contract).
        Ok(Some(received)) => unsafe { hand_out(received, out) },
        Ok(None) => LODE_WOULD_BLOCK,
        Err(e) => fail(e),
    }
}

/// Writes a received part to `*out` (or says the data ended).
///
/// # Safety
/// `out` is non-null and valid for a write.
unsafe fn hand_out(received: Received, out: *mut *mut LodePart) -> i32 {
    let Received::Part { step, part } = received else {
        return LODE_END_OF_DATA;
    };
    let dims = step.parts[part]
        .tensors
        .iter()
        .map(|t| {
            t.shape()
                .iter()
                .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
                .collect()
        })
        .collect();
    let boxed = Box::new(LodePart { step, part, dims });
    // SAFETY: `out` is non-null and valid for a write (the caller's contract).
    unsafe { out.write(Box::into_raw(boxed)) };
    LODE_OK
}

/// How many tensors the part holds.
///
/// # Safety
/// `part` is a live pointer from [`lode_recv`].
#[no_mangle]
pub unsafe extern "C" fn lode_part_count(part: *const LodePart) -> usize {
    // SAFETY: a live part (the caller's contract).
    unsafe { part.as_ref() }.map_or(0, |p| p.step.parts[p.part].tensors.len())
}

/// Describes tensor `index` of the part in `*view`.
///
/// # Safety
/// `part` is a live pointer from [`lode_recv`]; `view` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn lode_part_tensor(
    part: *const LodePart,
    index: usize,
    view: *mut LodeTensorView,
) -> i32 {
    // SAFETY: a live part (the caller's contract).
    let Some(p) = (unsafe { part.as_ref() }) else {
        return fail("lode_part_tensor: part is null");
    };
    let tensors = &p.step.parts[p.part].tensors;
    let (Some(t), Some(dims)) = (tensors.get(index), p.dims.get(index)) else {
        return fail(format!(
            "lode_part_tensor: tensor {index} of {}",
            tensors.len()
        ));
    };
    fn raw<T>(v: &[T]) -> (*const u8, usize) {
        (v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
    }
    let (data, bytes) = match t.data() {
        TensorData::Bool(v) => raw(v),
        TensorData::Int8(v) => raw(v),
        TensorData::Int16(v) => raw(v),
        TensorData::Int32(v) => raw(v),
        TensorData::Int64(v) => raw(v),
        TensorData::UInt8(v) => raw(v),
        TensorData::UInt16(v) => raw(v),
        TensorData::UInt32(v) => raw(v),
        TensorData::UInt64(v) => raw(v),
        TensorData::Float16(v) | TensorData::BFloat16(v) => raw(v),
        TensorData::Float32(v) => raw(v),
        TensorData::Float64(v) => raw(v),
        TensorData::String(_) => (std::ptr::null(), 0),
    };
    let written = LodeTensorView {
        dtype: t.dtype().to_proto() as i32,
        rank: dims.len(),
        dims: dims.as_ptr(),
        data,
        bytes,
        elements: t.shape().iter().product(),
    };
    // SAFETY: `view` is valid for a write (the caller's contract).
    unsafe { view.write(written) };
    LODE_OK
}

/// Element `element` of string tensor `index`: its bytes in `*ptr`, `*len`.
///
/// # Safety
/// `part` is a live pointer from [`lode_recv`]; `ptr` and `len` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lode_part_string(
    part: *const LodePart,
    index: usize,
    element: usize,
    ptr: *mut *const u8,
    len: *mut usize,
) -> i32 {
    // SAFETY: a live part (the caller's contract).
    let Some(p) = (unsafe { part.as_ref() }) else {
        return fail("lode_part_string: part is null");
    };
    let value = p.step.parts[p.part]
        .tensors
        .get(index)
        .and_then(|t| match t.data() {
            TensorData::String(v) => v.get(element),
            _ => None,
        });
    let Some(value) = value else {
        return fail(format!(
            "lode_part_string: no string element {element} in tensor {index}"
        ));
    };
    // SAFETY: both are valid for writes (the caller's contract).
    unsafe {
        ptr.write(value.as_ptr());
        len.write(value.len());
    }
    LODE_OK
}

/// Gives a part back.
///
/// # Safety
/// `part` is null or a pointer from [`lode_recv`] not freed before.
#[no_mangle]
pub unsafe extern "C" fn lode_part_free(part: *mut LodePart) {
    if !part.is_null() {
        // SAFETY: it came from Box::into_raw in lode_recv and is freed once.
        drop(unsafe { Box::from_raw(part) });
    }
}

#[no_mangle]
pub extern "C" fn lode_cancel_new() -> *mut LodeCancel {
    Box::into_raw(Box::default())
}

/// Fires the flag; a `lode_recv` waiting with it returns [`LODE_CANCELLED`] within 100 ms.
///
/// # Safety
/// `cancel` is a live pointer from [`lode_cancel_new`].
#[no_mangle]
pub unsafe extern "C" fn lode_cancel_fire(cancel: *const LodeCancel) {
    // SAFETY: a live flag (the caller's contract).
    if let Some(c) = unsafe { cancel.as_ref() } {
        c.0.store(true, Ordering::Release);
    }
}

/// # Safety
/// `cancel` is null or a pointer from [`lode_cancel_new`] not freed before, and no call uses
/// it any more.
#[no_mangle]
pub unsafe extern "C" fn lode_cancel_free(cancel: *mut LodeCancel) {
    if !cancel.is_null() {
        // SAFETY: it came from Box::into_raw in lode_cancel_new and is freed once.
        drop(unsafe { Box::from_raw(cancel) });
    }
}

/// `session.run` returned: the step it took (if any) is consumed.
#[no_mangle]
pub extern "C" fn lode_run_finished() -> i32 {
    if let Some(s) = side().as_mut() {
        s.run_finished();
    }
    LODE_OK
}

/// The program's iterator initializer ran (the stand-in op of `MakeIterator` calls this).
#[no_mangle]
pub extern "C" fn lode_iterator_init() -> i32 {
    match with_side(TrainingSide::iterator_init) {
        Ok(()) => LODE_OK,
        Err(e) => fail(e),
    }
}

/// A new iterator of a TF2 dataset begins the next pass (DWPassBegin, or the package when
/// the program creates an eager iterator): the pass's first step, or -1 on error.
#[no_mangle]
pub extern "C" fn lode_pass_begin() -> i64 {
    match with_side(TrainingSide::pass_begin) {
        Ok(step) => i64::try_from(step).unwrap_or(i64::MAX),
        Err(e) => {
            fail(e);
            -1
        }
    }
}

/// The program's iterator yields job step `step` next (DWSeek, before the element's
/// DWRecv): the receiver moves there if it is elsewhere (the iterator was restored).
#[no_mangle]
pub extern "C" fn lode_seek(step: i64) -> i32 {
    with_step("lode_seek", step, TrainingSide::seek)
}

/// The next step the program receives (what a checkpoint saves); -1 when not connected.
#[no_mangle]
pub extern "C" fn lode_position() -> i64 {
    side()
        .as_ref()
        .map_or(-1, |s| i64::try_from(s.position()).unwrap_or(i64::MAX))
}

/// A checkpoint that consumed every step before `next` was restored.
#[no_mangle]
pub extern "C" fn lode_resume(next: i64) -> i32 {
    with_step("lode_resume", next, TrainingSide::resume)
}

/// Calls `f` with the step number `step` a C caller of `function` passed (a negative one is
/// an error).
fn with_step(
    function: &str,
    step: i64,
    f: impl FnOnce(&mut TrainingSide, u64) -> Result<(), SideError>,
) -> i32 {
    let Ok(step) = u64::try_from(step) else {
        return fail(format!("{function}: step {step} is negative"));
    };
    match with_side(|s| f(s, step)) {
        Ok(()) => LODE_OK,
        Err(e) => fail(e),
    }
}

/// Reports the consumed watermark now and disconnects (at the program's exit).
#[no_mangle]
pub extern "C" fn lode_shutdown() -> i32 {
    let taken = side().take();
    match taken.map(|mut s| {
        s.run_finished();
        s.flush()
    }) {
        Some(Err(e)) => fail(e),
        _ => LODE_OK,
    }
}

/// Copies this thread's last error message into `buf` (NUL-terminated, truncated to `cap`),
/// returning its full length.
///
/// # Safety
/// `buf` is null or valid for `cap` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn lode_error_message(buf: *mut c_char, cap: usize) -> usize {
    LAST_ERROR.with(|e| {
        let e = e.borrow();
        if !buf.is_null() && cap > 0 {
            let n = e.len().min(cap - 1);
            // SAFETY: `buf` holds `cap` bytes (the caller's contract) and n < cap.
            unsafe {
                std::ptr::copy_nonoverlapping(e.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
        e.len()
    })
}
