#include "runtime/validate.hpp"

#include <sstream>

#include "epcomm/error.hpp"
#include "common/cuda_check.hpp"

namespace epcomm::detail {
namespace {

std::string expected_description(std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape) {
  std::ostringstream out;
  int i = 0;
  for (DType dtype : dtypes) out << (i++ ? " or " : "") << dtype_name(dtype);
  out << "[";
  i = 0;
  for (int64_t extent : shape) {
    out << (i++ ? ", " : "");
    if (extent == kAnyExtent) out << "*"; else out << extent;
  }
  out << "]";
  return out.str();
}

// The device whose memory `pointer` points into; -1 when it is not device or managed memory.
int device_of(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();  // an unknown pointer is not a sticky error; clear it
    return -1;
  }
  const bool on_device = attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  return on_device ? attributes.device : -1;
}

}  // namespace

void require_stream_of_device(int device, const char* op, cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
  // cudaStreamGetDevice is refused during capture by some drivers (580 with CUDA 13.0: the H100s
  // and H200s here), and the refusal invalidates the capture: a capturing stream is not asked.
  if (is_capturing(stream)) return;
  int stream_device = -1;
  if (cudaStreamGetDevice(stream, &stream_device) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the launch on it reports a bad stream with CUDA's words
    return;
  }
  if (stream_device != device) {
    fail(ErrorCode::kInvalidArgument, op, ": the stream runs on cuda:", stream_device, ", but this Buffer's device is cuda:",
         device, " (pass a stream of cuda:", device, "; with torch, torch.cuda.current_stream(", device, "))");
  }
}

void require_device_tensor(int device, const char* op, const char* name, const TensorView& tensor,
                           std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape, Strides strides) {
  // Extents the calls hold in an int (rows, hidden): a negative one, or one past INT32_MAX that a
  // cast would cut (an 8 GiB row read as 8 bytes), is refused here.
  for (int d = 0; d < tensor.ndim; ++d) {
    if (tensor.shape[d] < 0 || tensor.shape[d] > INT32_MAX) {
      fail(ErrorCode::kInvalidArgument, op, ": ", name, " has extent ", tensor.shape[d], " in dimension ", d,
           "; epcomm takes 0 to ", INT32_MAX, ", got ", tensor.describe());
    }
  }
  bool dtype_ok = false;
  for (DType dtype : dtypes) dtype_ok = dtype_ok || tensor.dtype == dtype;
  bool shape_ok = tensor.ndim == static_cast<int>(shape.size());
  int dim = 0;
  for (int64_t extent : shape) {
    if (shape_ok && extent != kAnyExtent && tensor.shape[dim] != extent) shape_ok = false;
    ++dim;
  }
  if (!dtype_ok || !shape_ok) {
    fail(ErrorCode::kInvalidArgument, op, ": ", name, " must be ", expected_description(dtypes, shape), ", got ",
         tensor.describe());
  }
  if (strides == Strides::kContiguous && !tensor.is_contiguous()) {
    fail(ErrorCode::kInvalidArgument, op, ": ", name, " must be contiguous, got ", tensor.describe());
  }
  for (int d = 0; d < tensor.ndim; ++d) {
    if (tensor.strides[d] < 0) {
      fail(ErrorCode::kInvalidArgument, op, ": ", name, " has a negative stride, got ", tensor.describe());
    }
  }
  if (tensor.numel() == 0) return;
  if (tensor.data == nullptr) {
    fail(ErrorCode::kInvalidArgument, op, ": ", name, " (", tensor.describe(), ") has a null data pointer");
  }
  const int found = device_of(tensor.data);
  if (found < 0) {
    fail(ErrorCode::kInvalidArgument, op, ": ", name, " (", tensor.describe(), ") at ", tensor.data,
         " is not device memory");
  }
  if (found != device) {
    fail(ErrorCode::kInvalidArgument, op, ": ", name, " (", tensor.describe(), ") is on cuda:", found,
         ", but this Buffer's device is cuda:", device);
  }
}

void require_in_range(const char* op, const char* name, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    fail(ErrorCode::kInvalidArgument, op, ": ", name, "=", value, " must be in [", lo, ", ", hi, "]");
  }
}

}  // namespace epcomm::detail
