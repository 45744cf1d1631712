// The C ABI of Lode's training-side library (python/native, Rust). See python/native/src/ffi.rs
// for each function's contract. `job` is the program's job index (1, 2, ...: one per dataset a
// TF2 program iterates; 1 is the first, and the one the LODE_* environment configures).
#ifndef LODE_TRAINING_H_
#define LODE_TRAINING_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LODE_OK 0
#define LODE_END_OF_DATA 1
#define LODE_CANCELLED 2
#define LODE_ERROR 3
#define LODE_WOULD_BLOCK 4

typedef struct LodePart LodePart;
typedef struct LodeCancel LodeCancel;

typedef struct LodeTensorView {
  int32_t dtype;        // TensorFlow's DataType enum value
  size_t rank;
  const int64_t* dims;
  const uint8_t* data;  // null for strings
  size_t bytes;
  size_t elements;
} LodeTensorView;

int32_t lode_connect(int64_t job, const char* config_json);
int32_t lode_recv(int64_t job, int64_t run, int64_t stage, const LodeCancel* cancel,
                  LodePart** out);
int32_t lode_try_recv(int64_t job, int64_t run, int64_t stage, LodePart** out);
size_t lode_part_count(const LodePart* part);
int32_t lode_part_tensor(const LodePart* part, size_t index, LodeTensorView* view);
int32_t lode_part_string(const LodePart* part, size_t index, size_t element,
                         const uint8_t** ptr, size_t* len);
void lode_part_free(LodePart* part);
LodeCancel* lode_cancel_new(void);
void lode_cancel_fire(const LodeCancel* cancel);
void lode_cancel_free(LodeCancel* cancel);
int32_t lode_run_finished(int64_t job);
int32_t lode_iterator_init(int64_t job);
int64_t lode_position(int64_t job);
int32_t lode_resume(int64_t job, int64_t next);
int64_t lode_pass_begin(int64_t job);
int32_t lode_seek(int64_t job, int64_t step);
int32_t lode_shutdown(void);
size_t lode_error_message(char* buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif  // LODE_TRAINING_H_
