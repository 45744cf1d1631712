//! The C ABI the DWRecv kernel and the Python package call (see `lode_training.h` beside the
//! op's source). One training side per job of the process, each behind its own mutex.
//!
//! # Jobs
//! A program may train on several jobs (`lode train` starts one per dataset a TF2 program
//! iterates: `lode_train::hook`). Every call names its job: `job` is the program's job index
//! (1, 2, …, at most `lode_train::hook::MAX_JOBS`; the ops' `job` attribute, 1 by default).
//! Job 1 is also the one the `LODE_*` environment configures: its first call connects it when
//! [`lode_connect`] did not. The sides are independent: a DWRecv waiting for job 1's data
//! holds job 1's side only, so job 2's ops run meanwhile.
//!
//! Conventions: functions return a status ([`LODE_OK`], [`LODE_END_OF_DATA`],
//! [`LODE_CANCELLED`], [`LODE_ERROR`]); after [`LODE_ERROR`] the calling thread's message is
//! read with [`lode_error_message`]. Pointers handed out ([`LodePart`], [`LodeCancel`]) are
//! owned by the caller until given back to their `_free` function; views into a part are valid
//! while the part is.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lode_train::hook::MAX_JOBS;

use lode_runtime::TensorData;
use lode_transfer::Step;

use crate::side::{JobConfig, Received, SideError, TrainingSide};

pub const LODE_OK: i32 = 0;
pub const LODE_END_OF_DATA: i32 = 1;
pub const LODE_CANCELLED: i32 = 2;
pub const LODE_ERROR: i32 = 3;
/// [`lode_try_recv`]: the run's step is not complete yet.
pub const LODE_WOULD_BLOCK: i32 = 4;

/// A job's training side.
type Side = Arc<Mutex<TrainingSide>>;

/// The process's training sides by job index (see the module documentation). The map's lock
/// is held only to look a side up or add one, never while a side works.
static SIDES: Mutex<BTreeMap<u64, Side>> = Mutex::new(BTreeMap::new());

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn fail(message: impl std::fmt::Display) -> i32 {
    let message = message.to_string();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    LODE_ERROR
}

fn sides() -> MutexGuard<'static, BTreeMap<u64, Side>> {
    SIDES.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock(side: &Side) -> MutexGuard<'_, TrainingSide> {
    side.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The job index a C caller passed, checked.
fn job_index(job: i64) -> Result<u64, SideError> {
    u64::try_from(job)
        .ok()
        .filter(|k| (1..=MAX_JOBS).contains(k))
        .ok_or(SideError::NoSuchJob { job, max: MAX_JOBS })
}

/// Held while a side connects: one connection per job, even when two of its ops ask at once
/// (a job's receiver registers once with its dispatcher). The map's lock is not held then, so
/// that the other jobs' calls go on.
static CONNECTING: Mutex<()> = Mutex::new(());

/// Job `job`'s side, connected with `config` unless it has one already.
fn connect(
    job: u64,
    config: impl FnOnce() -> Result<JobConfig, SideError>,
) -> Result<Side, SideError> {
    let _connecting = CONNECTING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(side) = sides().get(&job).cloned() {
        return Ok(side);
    }
    let side = Arc::new(Mutex::new(TrainingSide::connect(&config()?)?));
    crate::interrupt::install();
    sides().insert(job, side.clone());
    Ok(side)
}

/// Job `job`'s training side; job 1's is connected from the environment on first use.
fn side_of(job: i64) -> Result<Side, SideError> {
    let job = job_index(job)?;
    if let Some(side) = sides().get(&job).cloned() {
        return Ok(side);
    }
    if job != 1 {
        return Err(SideError::NotConnected { job });
    }
    connect(job, JobConfig::from_env)
}

/// Calls `f` on job `job`'s training side.
fn with_side<T>(
    job: i64,
    f: impl FnOnce(&mut TrainingSide) -> Result<T, SideError>,
) -> Result<T, SideError> {
    let side = side_of(job)?;
    let mut guard = lock(&side);
    f(&mut guard)
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

/// Connects the process's job `job` now (rather than at its first DWRecv), from
/// `config_json` (the keys of `side::JobConfig`: `dispatcher`, `token`, `job` (the
/// dispatcher's job id), `tls_ca`, `tls_cert`, `tls_key`, `patience_secs`, `capacity`,
/// `pass_steps`, `endless`, `listen`, `advertise`), or from the `LODE_*` environment when it
/// is null. Connecting a job twice keeps the first connection.
///
/// # Safety
/// `config_json` is null or a NUL-terminated string valid for the call.
#[no_mangle]
pub unsafe extern "C" fn lode_connect(job: i64, config_json: *const c_char) -> i32 {
    let job = match job_index(job) {
        Ok(job) => job,
        Err(e) => return fail(e),
    };
    let config = || {
        if config_json.is_null() {
            return JobConfig::from_env();
        }
        // SAFETY: the caller passes a NUL-terminated string that outlives this call (the
        // closure runs within it).
        let text = unsafe { CStr::from_ptr(config_json) }.to_string_lossy();
        serde_json::from_str::<JobConfig>(&text).map_err(SideError::from)
    };
    match connect(job, config) {
        Ok(_) => LODE_OK,
        Err(e) => fail(e),
    }
}

/// Receives stage `stage`'s tensors of job `job`'s step of TensorFlow run `run` into `*out`,
/// blocking until the step is complete, the data ends ([`LODE_END_OF_DATA`]) or `cancel`
/// fires.
///
/// # Safety
/// `cancel` is null or a live pointer from [`lode_cancel_new`]; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn lode_recv(
    job: i64,
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
    match with_side(job, |s| s.recv(run, stage, &cancelled)) {
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
pub unsafe extern "C" fn lode_try_recv(
    job: i64,
    run: i64,
    stage: i64,
    out: *mut *mut LodePart,
) -> i32 {
    if out.is_null() {
        return fail("lode_try_recv: out is null");
    }
    let Ok(stage) = u32::try_from(stage) else {
        return fail(format!(
            "lode_try_recv: stage {stage} is not a stage number"
        ));
    };
    match with_side(job, |s| s.try_recv(run, stage)) {
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

/// `session.run` returned: the step it took of job `job` (if any) is consumed.
#[no_mangle]
pub extern "C" fn lode_run_finished(job: i64) -> i32 {
    let side = job_index(job).ok().and_then(|k| sides().get(&k).cloned());
    if let Some(side) = side {
        lock(&side).run_finished();
    }
    LODE_OK
}

/// The program's iterator initializer of job `job` ran (the stand-in op of `MakeIterator`
/// calls this).
#[no_mangle]
pub extern "C" fn lode_iterator_init(job: i64) -> i32 {
    match with_side(job, TrainingSide::iterator_init) {
        Ok(()) => LODE_OK,
        Err(e) => fail(e),
    }
}

/// A new iterator of the TF2 dataset of job `job` begins the next pass (DWPassBegin, or the
/// package when the program creates an eager iterator): the pass's first step, or -1 on
/// error.
#[no_mangle]
pub extern "C" fn lode_pass_begin(job: i64) -> i64 {
    match with_side(job, TrainingSide::pass_begin) {
        Ok(step) => i64::try_from(step).unwrap_or(i64::MAX),
        Err(e) => {
            fail(e);
            -1
        }
    }
}

/// The program's iterator of job `job` yields the job's step `step` next (DWSeek, before the
/// element's DWRecv): the receiver moves there if it is elsewhere (the iterator was restored).
#[no_mangle]
pub extern "C" fn lode_seek(job: i64, step: i64) -> i32 {
    with_step("lode_seek", job, step, TrainingSide::seek)
}

/// The next step the program receives of job `job` (what a checkpoint saves); -1 when the job
/// is not connected.
#[no_mangle]
pub extern "C" fn lode_position(job: i64) -> i64 {
    let side = job_index(job).ok().and_then(|k| sides().get(&k).cloned());
    side.map_or(-1, |s| {
        i64::try_from(lock(&s).position()).unwrap_or(i64::MAX)
    })
}

/// A checkpoint that consumed every step of job `job` before `next` was restored.
#[no_mangle]
pub extern "C" fn lode_resume(job: i64, next: i64) -> i32 {
    with_step("lode_resume", job, next, TrainingSide::resume)
}

/// Calls `f` on job `job`'s side with the step number `step` a C caller of `function` passed
/// (a negative one is an error).
fn with_step(
    function: &str,
    job: i64,
    step: i64,
    f: impl FnOnce(&mut TrainingSide, u64) -> Result<(), SideError>,
) -> i32 {
    let Ok(step) = u64::try_from(step) else {
        return fail(format!("{function}: step {step} is negative"));
    };
    match with_side(job, |s| f(s, step)) {
        Ok(()) => LODE_OK,
        Err(e) => fail(e),
    }
}

/// Reports every job's consumed watermark now and disconnects them (at the program's exit);
/// the first failure is the one reported.
#[no_mangle]
pub extern "C" fn lode_shutdown() -> i32 {
    let taken = std::mem::take(&mut *sides());
    let mut status = LODE_OK;
    for side in taken.into_values() {
        let mut guard = lock(&side);
        guard.run_finished();
        if let Err(e) = guard.flush() {
            if status == LODE_OK {
                status = fail(e);
            }
        }
    }
    status
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

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        LAST_ERROR.with(|e| e.borrow().clone())
    }

    #[test]
    fn a_call_names_a_job_of_the_program_and_an_unconnected_one_is_an_error() {
        assert!(job_index(0).is_err());
        assert!(job_index(-1).is_err());
        assert_eq!(job_index(1).ok(), Some(1));
        assert_eq!(job_index(16).ok(), Some(16));
        assert!(job_index(17).is_err());
        // Job 2 was never connected: no side is made up for it (only job 1 connects from the
        // environment), and nothing is said about a position it does not have.
        assert_eq!(lode_position(2), -1);
        assert_eq!(lode_seek(2, 0), LODE_ERROR);
        assert!(
            last_error().contains("job 2 of this process is not connected"),
            "{}",
            last_error()
        );
        assert_eq!(lode_pass_begin(99), -1);
        assert!(last_error().contains("1 to 16"), "{}", last_error());
        assert_eq!(
            lode_run_finished(3),
            LODE_OK,
            "a run of an unconnected job has nothing to finish"
        );
    }
}
