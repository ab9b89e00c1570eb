#include "python_allocator.hpp"

#include <utility>

#include "epcomm/error.hpp"

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

}  // namespace

PythonAllocator::PythonAllocator(nb::object allocate) : allocate_(std::move(allocate)) {}

PythonAllocator::~PythonAllocator() {
  if (!nb::is_alive()) {
    allocate_.release();
    return;
  }
  nb::gil_scoped_acquire gil;
  allocate_.reset();
}

Tensor PythonAllocator::allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) {
  nb::gil_scoped_acquire gil;
  nb::list dims;
  for (int64_t extent : shape) dims.append(extent);
  Tensor tensor;
  try {
    const nb::tuple result = nb::cast<nb::tuple>(
        allocate_(static_cast<int>(dtype), nb::tuple(dims), reinterpret_cast<uintptr_t>(stream)));
    if (result.size() != 2) fail(ErrorCode::kInternal, "the Python allocator must return (data_ptr, owner)");
    tensor.view = TensorView::contiguous(reinterpret_cast<void*>(nb::cast<uintptr_t>(result[0])), dtype, shape);
    tensor.storage = std::make_shared<PythonOwner>(nb::borrow(result[1]));
  } catch (const nb::python_error& error) {
    fail(ErrorCode::kInternal, "the Python allocator failed for ", dtype_name(dtype), ": ", error.what());
  }
  return tensor;
}

nb::object owner_of(const Tensor& tensor) {
  if (!tensor.storage) return nb::none();
  return static_cast<const PythonOwner*>(tensor.storage.get())->object;
}

}  // namespace epcomm::python
