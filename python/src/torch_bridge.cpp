#include "torch_bridge.hpp"

#include <string>

namespace nb = nanobind;
using namespace nb::literals;

namespace epcomm::python {
namespace {

std::string text_of(nb::handle object) { return nb::str(object).c_str(); }

int64_t as_int(PyObject* object) {
  const int64_t value = PyLong_AsLongLong(object);
  if (value == -1 && PyErr_Occurred()) throw nb::python_error();
  return value;
}

}  // namespace

const TorchBridge& TorchBridge::get() {
  // The GIL guards it, not a function-local static's guard: importing torch may release the GIL,
  // and a thread that then came here would hold the GIL while waiting on that guard, which the
  // importing thread waits on the GIL to finish. Two threads may both build one; the first stays.
  // Never destroyed: its objects must not be released after the interpreter has gone.
  static TorchBridge* bridge = nullptr;
  if (bridge == nullptr) {
    TorchBridge* const made = new TorchBridge();
    if (bridge == nullptr) {
      bridge = made;
    } else {
      delete made;
    }
  }
  return *bridge;
}

TorchBridge::TorchBridge() {
  const nb::module_ torch = nb::module_::import_("torch");
  tensor_type_ = torch.attr("Tensor");
  empty_ = torch.attr("empty");
  // _C.DType names its values as torch does (bind_buffer.cpp's bind_types), as _torch.py also reads them.
  const nb::handle dtype_enum = nb::type<DType>();
  for (int code = 0; code < kNumDTypes; ++code) {
    dtypes_[code] = torch.attr(nb::str(dtype_enum(code).attr("name")));
  }
  // torch's own C accessors where this torch has them; epcomm._torch's Python ones otherwise.
  const nb::object internals = torch.attr("_C");
  if (nb::hasattr(internals, "_cuda_getDevice") && nb::hasattr(internals, "_cuda_getCurrentRawStream")) {
    current_device_ = internals.attr("_cuda_getDevice");
    raw_stream_ = internals.attr("_cuda_getCurrentRawStream");
  } else {
    current_device_ = torch.attr("cuda").attr("current_device");
    raw_stream_ = nb::module_::import_("epcomm._torch").attr("current_stream");
  }
}

TensorView TorchBridge::view(nb::handle tensor, const char* name) const {
  if (tensor.is_none()) return TensorView{};
  if (!nb::isinstance(tensor, tensor_type_)) {
    throw nb::type_error(("epcomm: " + std::string(name) + " must be a torch.Tensor or None, got " +
                          text_of(tensor.type().attr("__name__"))).c_str());
  }
  if (!nb::cast<bool>(tensor.attr("is_cuda"))) {
    throw nb::value_error(("epcomm: " + std::string(name) + " must be on a CUDA device, got " +
                           text_of(tensor.attr("device"))).c_str());
  }
  const nb::object dtype = tensor.attr("dtype");
  int code = 0;
  while (code < kNumDTypes && !dtype.is(dtypes_[code])) ++code;
  if (code == kNumDTypes) {
    throw nb::value_error(("epcomm: " + std::string(name) + " has dtype " + text_of(dtype) +
                           ", which epcomm does not take").c_str());
  }
  const nb::object shape = tensor.attr("shape");  // torch.Size, a tuple
  const nb::object strides = tensor.attr("stride")();
  const Py_ssize_t ndim = PyTuple_Size(shape.ptr());
  if (ndim < 0) throw nb::python_error();  // shape is no tuple: PyTuple_Size set the error
  if (!PyTuple_Check(strides.ptr()) || PyTuple_GET_SIZE(strides.ptr()) != ndim) {
    throw nb::type_error(("epcomm: " + std::string(name) + ".stride() gave " + text_of(strides) + " for shape " +
                          text_of(shape)).c_str());
  }
  if (ndim == 0) {  // a TensorView of no dimensions means "not given": a scalar would be dropped unseen
    throw nb::value_error(("epcomm: " + std::string(name) + " is a 0-dimensional tensor (a scalar); epcomm takes "
                           "tensors of 1 to " + std::to_string(TensorView::kMaxDims) + " dimensions").c_str());
  }
  if (ndim > TensorView::kMaxDims) {
    throw nb::value_error(("epcomm: " + std::string(name) + " has " + std::to_string(ndim) +
                           " dimensions; epcomm takes at most " + std::to_string(TensorView::kMaxDims)).c_str());
  }
  TensorView view;
  view.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(tensor.attr("data_ptr")()));
  view.dtype = static_cast<DType>(code);
  view.ndim = static_cast<int>(ndim);
  for (Py_ssize_t d = 0; d < ndim; ++d) {
    view.shape[d] = as_int(PyTuple_GET_ITEM(shape.ptr(), d));
    view.strides[d] = as_int(PyTuple_GET_ITEM(strides.ptr(), d));
  }
  return view;
}

int TorchBridge::device_of(nb::handle tensor) const { return nb::cast<int>(tensor.attr("get_device")()); }

cudaStream_t TorchBridge::current_stream() const { return current_stream(nb::cast<int>(current_device_())); }

cudaStream_t TorchBridge::current_stream(int device) const {
  return reinterpret_cast<cudaStream_t>(nb::cast<uintptr_t>(raw_stream_(device)));
}

nb::object TorchBridge::empty(TensorView& view, int device) const {
  nb::object extents = nb::steal(PyTuple_New(view.ndim));
  if (!extents.is_valid()) throw nb::python_error();
  for (int d = 0; d < view.ndim; ++d) {
    PyObject* extent = PyLong_FromLongLong(view.shape[d]);
    if (extent == nullptr) throw nb::python_error();
    PyTuple_SET_ITEM(extents.ptr(), d, extent);
  }
  nb::object tensor = empty_(extents, "dtype"_a = dtypes_[static_cast<int>(view.dtype)], "device"_a = device);
  view.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(tensor.attr("data_ptr")()));
  return tensor;
}

}  // namespace epcomm::python
