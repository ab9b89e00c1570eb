#include "python_allocator.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "epcomm/error.hpp"
#include "python_errors.hpp"
#include "torch_bridge.hpp"

namespace nb = nanobind;

namespace epcomm::python {
namespace {

// Keeps a Python object alive for as long as a Tensor's storage; the last release may happen on
// any thread (inside a C++ call that runs without the GIL), so it takes the GIL to let go.
struct PythonOwner {
  explicit PythonOwner(nb::object owned) : object(std::move(owned)) {}
  ~PythonOwner() {
    if (!nb::is_alive()) {
      object.release();
      return;
    }
    nb::gil_scoped_acquire gil;
    object.reset();
  }
  nb::object object;
};

// Whether the allocator's error means device memory ran out (GIL held).
bool is_out_of_memory(const nb::python_error& error) {
  return error.matches(PyExc_MemoryError) || error.matches(out_of_memory_error_type());
}

// Its failure keeps its kind: running out of memory is the caller's to handle (retry smaller), any
// other failure of the allocator is not epcomm's bug but has no kind of its own.
[[noreturn]] void fail_allocation(const nb::python_error& error, const char* who, const std::vector<TensorView>& shapes) {
  rethrow_if_interruption(error);
  fail(is_out_of_memory(error) ? ErrorCode::kOutOfMemory : ErrorCode::kInternal, who, " failed for ", shapes.size(),
       " outputs (the first ", shapes.empty() ? std::string("none") : shapes[0].describe(), "): ", error.what());
}

}  // namespace

nb::object out_of_memory_error_type() {
  const nb::dict modules = nb::borrow<nb::dict>(PyImport_GetModuleDict());
  if (modules.contains("torch")) {
    // Not an import: a process without torch loaded has no torch errors to raise.
    const nb::object cuda = nb::getattr(modules["torch"], "cuda", nb::none());
    nb::object type = cuda.is_none() ? nb::none() : nb::getattr(cuda, "OutOfMemoryError", nb::none());
    if (!type.is_none()) return type;
  }
  return nb::borrow(PyExc_MemoryError);
}

PythonAllocator::PythonAllocator(nb::object allocate, int device) : allocate_(std::move(allocate)), device_(device) {
  if (device_ >= 0) TorchBridge::get();  // imports torch now, at construction, not in the first call
}

PythonAllocator::~PythonAllocator() {
  if (!nb::is_alive()) {
    allocate_.release();
    return;
  }
  nb::gil_scoped_acquire gil;
  allocate_.reset();
}

Tensor PythonAllocator::allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) {
  // allocate_many returns one tensor per shape (it checks the callable's count).
  return std::move(allocate_many({TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape)}, stream)[0]);
}

std::vector<Tensor> PythonAllocator::allocate_many(const std::vector<TensorView>& shapes, cudaStream_t stream) {
  nb::gil_scoped_acquire gil;
  try {
    const TorchBridge* torch = device_ >= 0 ? &TorchBridge::get() : nullptr;
    if (torch == nullptr || stream != torch->current_stream(device_)) return call_allocate(shapes, stream);
    std::vector<Tensor> tensors(shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      tensors[i].view = shapes[i];
      tensors[i].storage = std::make_shared<PythonOwner>(torch->empty(tensors[i].view, device_));
    }
    return tensors;
  } catch (const nb::python_error& error) {
    fail_allocation(error, "torch.empty", shapes);
  }
}

// The callable's way (GIL held).
std::vector<Tensor> PythonAllocator::call_allocate(const std::vector<TensorView>& shapes, cudaStream_t stream) {
  nb::list requests;
  for (const TensorView& shape : shapes) {
    nb::list dims;
    for (int d = 0; d < shape.ndim; ++d) dims.append(shape.shape[d]);
    requests.append(nb::make_tuple(static_cast<int>(shape.dtype), nb::tuple(dims)));
  }
  std::vector<Tensor> tensors;
  tensors.reserve(shapes.size());
  try {
    const nb::list results = nb::cast<nb::list>(allocate_(requests, reinterpret_cast<uintptr_t>(stream)));
    if (results.size() != shapes.size()) {
      fail(ErrorCode::kInternal, "the Python allocator returned ", results.size(), " results for ", shapes.size(),
           " requests");
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      const nb::tuple result = nb::cast<nb::tuple>(results[i]);
      if (result.size() != 2) fail(ErrorCode::kInternal, "the Python allocator must return (data_ptr, owner) pairs");
      Tensor tensor;
      tensor.view = shapes[i];
      tensor.view.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(result[0]));
      tensor.storage = std::make_shared<PythonOwner>(nb::borrow(result[1]));
      tensors.push_back(std::move(tensor));
    }
  } catch (const nb::python_error& error) {
    fail_allocation(error, "the Python allocator", shapes);
  } catch (const nb::cast_error&) {
    fail(ErrorCode::kInternal, "the Python allocator must return a list of (data_ptr: int, owner) pairs, one per "
         "request; it returned something else for ", shapes.size(), " requests");
  }
  return tensors;
}

nb::object owner_of(const Tensor& tensor) {
  if (!tensor.storage) return nb::none();
  return static_cast<const PythonOwner*>(tensor.storage.get())->object;
}

}  // namespace epcomm::python
