// DWRecv, DWIteratorInit, DWPassBegin and DWSeek for TensorFlow: thin kernels over Lode's training-side library.
//
// DWRecv has exactly the attributes the decoupler writes (T, shapes, from_stage). Its outputs
// take their static shapes from `shapes`, so shape inference and grappler see what they saw in
// the original graph. A step already buffered is taken and copied on the op's own thread (no
// hand-off: that is the common case, the workers ahead of training); waiting for one happens
// off TensorFlow's op threads (an AsyncOpKernel whose wait runs on a thread of its own) and
// observes the step's cancellation (a closed session). The end of the job's data is
// OutOfRange, as IteratorGetNext reports it.
//
// DWIteratorInit stands in for the program's MakeIterator: running it restarts the job's data
// order as re-initializing the iterator restarts the pipeline.
//
// DWPassBegin and DWSeek serve a TF2 program's stand-in dataset (python/lode/_tf2.py), whose
// elements are the job's step numbers: DWPassBegin begins a new iterator's pass and yields its
// first step; DWSeek, run before each element's DWRecv, tells the training side which step the
// iterator yields, so that an iterator restored from a checkpoint moves the receiver there.
//
// Every op has a `job` attribute: the program's job it serves (1 by default, the first, which
// is what a decoupler's graph names; a TF2 program's second dataset is job 2, and so on).

#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/env.h"

#include "lode_training.h"

namespace lode {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::CancellationManager;
using ::tensorflow::CancellationToken;
using ::tensorflow::DataType;
using ::tensorflow::DataTypeVector;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::tstring;
namespace errors = ::tensorflow::errors;
namespace shape_inference = ::tensorflow::shape_inference;

REGISTER_OP("DWRecv")
    .Output("output: T")
    .Attr("T: list(type) >= 0")
    .Attr("shapes: list(shape) >= 0")
    .Attr("from_stage: int")
    .Attr("job: int = 1")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return errors::InvalidArgument("DWRecv: ", shapes.size(), " shapes for ",
                                       c->num_outputs(), " outputs");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        shape_inference::ShapeHandle h;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &h));
        c->set_output(i, h);
      }
      return absl::OkStatus();
    });

REGISTER_OP("DWIteratorInit")
    .Attr("job: int = 1")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

REGISTER_OP("DWPassBegin")
    .Output("step: int64")
    .Attr("job: int = 1")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

REGISTER_OP("DWSeek")
    .Input("step: int64")
    .Attr("job: int = 1")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      return c->WithRank(c->input(0), 0, &unused);
    });

static std::string LastError() {
  size_t n = lode_error_message(nullptr, 0);
  std::string message(n + 1, '\0');
  lode_error_message(&message[0], message.size());
  message.resize(n);
  return message;
}

class DWRecvOp : public AsyncOpKernel {
 public:
  explicit DWRecvOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("from_stage", &stage_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &types_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("job", &job_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int64_t run = ctx->step_id();
    LodePart* ready = nullptr;
    const int32_t now = lode_try_recv(job_, run, stage_, &ready);
    if (now != LODE_WOULD_BLOCK) {
      absl::Status status = Take(ctx, now, ready);
      if (!status.ok()) ctx->SetStatus(status);
      done();
      return;
    }
    LodeCancel* cancel = lode_cancel_new();
    CancellationManager* cm = ctx->cancellation_manager();
    CancellationToken token = CancellationManager::kInvalidToken;
    if (cm != nullptr) {
      token = cm->get_cancellation_token();
      if (!cm->RegisterCallback(token, [cancel]() { lode_cancel_fire(cancel); })) {
        lode_cancel_free(cancel);
        ctx->SetStatus(errors::Cancelled(name(), ": the step was cancelled"));
        done();
        return;
      }
    }
    ctx->env()->SchedClosure([this, ctx, done = std::move(done), cancel, cm, token, run]() {
      absl::Status status = Receive(ctx, run, cancel);
      if (cm != nullptr) cm->DeregisterCallback(token);
      lode_cancel_free(cancel);
      if (!status.ok()) ctx->SetStatus(status);
      done();
    });
  }

 private:
  absl::Status Receive(OpKernelContext* ctx, int64_t run, const LodeCancel* cancel) {
    LodePart* part = nullptr;
    const int32_t answer = lode_recv(job_, run, stage_, cancel, &part);  // before `part` is read
    return Take(ctx, answer, part);
  }

  // The outputs from what lode_recv or lode_try_recv answered (`part` is set on LODE_OK).
  absl::Status Take(OpKernelContext* ctx, int32_t answer, LodePart* part) {
    switch (answer) {
      case LODE_OK:
        break;
      case LODE_END_OF_DATA:
        return errors::OutOfRange("End of sequence");
      case LODE_CANCELLED:
        return errors::Cancelled(name(), ": cancelled while waiting for data");
      default:
        return errors::Unavailable(name(), ": ", LastError());
    }
    absl::Status status = Fill(ctx, part);
    lode_part_free(part);
    return status;
  }

  absl::Status Fill(OpKernelContext* ctx, const LodePart* part) {
    const size_t count = lode_part_count(part);
    if (count != types_.size()) {
      return errors::InvalidArgument(name(), ": stage ", stage_, " sent ", count,
                                     " tensors, the graph expects ", types_.size());
    }
    for (size_t i = 0; i < count; ++i) {
      LodeTensorView view;
      if (lode_part_tensor(part, i, &view) != LODE_OK) {
        return errors::Internal(name(), ": ", LastError());
      }
      if (view.dtype != static_cast<int32_t>(types_[i])) {
        return errors::InvalidArgument(name(), ": output ", i, " arrived as dtype ",
                                       view.dtype, ", the graph expects ",
                                       static_cast<int>(types_[i]));
      }
      TensorShape shape;
      for (size_t d = 0; d < view.rank; ++d) {
        TF_RETURN_IF_ERROR(shape.AddDimWithStatus(view.dims[d]));
      }
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(static_cast<int>(i), shape, &out));
      if (types_[i] == ::tensorflow::DT_STRING) {
        auto flat = out->flat<tstring>();
        for (size_t j = 0; j < view.elements; ++j) {
          const uint8_t* ptr = nullptr;
          size_t len = 0;
          if (lode_part_string(part, i, j, &ptr, &len) != LODE_OK) {
            return errors::Internal(name(), ": ", LastError());
          }
          flat(j).assign(reinterpret_cast<const char*>(ptr), len);
        }
      } else {
        if (out->TotalBytes() != view.bytes) {
          return errors::InvalidArgument(name(), ": output ", i, " holds ", view.bytes,
                                         " bytes for a shape of ", out->TotalBytes());
        }
        if (view.bytes > 0) std::memcpy(out->data(), view.data, view.bytes);
      }
    }
    return absl::OkStatus();
  }

  int64_t stage_ = 0;
  int64_t job_ = 1;
  DataTypeVector types_;
};

class DWIteratorInitOp : public OpKernel {
 public:
  explicit DWIteratorInitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("job", &job_));
  }

  void Compute(OpKernelContext* ctx) override {
    if (lode_iterator_init(job_) != LODE_OK) {
      ctx->SetStatus(errors::Unavailable(name(), ": ", LastError()));
    }
  }

 private:
  int64_t job_ = 1;
};

class DWPassBeginOp : public OpKernel {
 public:
  explicit DWPassBeginOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("job", &job_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int64_t step = lode_pass_begin(job_);
    if (step < 0) {
      ctx->SetStatus(errors::Unavailable(name(), ": ", LastError()));
      return;
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = step;
  }

 private:
  int64_t job_ = 1;
};

class DWSeekOp : public OpKernel {
 public:
  explicit DWSeekOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("job", &job_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& step = ctx->input(0);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(step.shape()),
                errors::InvalidArgument(name(), ": the step is not a scalar but of shape ",
                                        step.shape().DebugString()));
    if (lode_seek(job_, step.scalar<int64_t>()()) != LODE_OK) {
      ctx->SetStatus(errors::Unavailable(name(), ": ", LastError()));
    }
  }

 private:
  int64_t job_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("DWRecv").Device(::tensorflow::DEVICE_CPU), DWRecvOp);
REGISTER_KERNEL_BUILDER(Name("DWIteratorInit").Device(::tensorflow::DEVICE_CPU), DWIteratorInitOp);
REGISTER_KERNEL_BUILDER(Name("DWPassBegin").Device(::tensorflow::DEVICE_CPU), DWPassBeginOp);
REGISTER_KERNEL_BUILDER(Name("DWSeek").Device(::tensorflow::DEVICE_CPU), DWSeekOp);

}  // namespace lode
