// epcomm._C: the C++ API for the Python layer. Errors become Python exceptions by kind:
// InvalidArgument -> ValueError, Timeout -> TimeoutError, OutOfMemory -> torch.cuda.OutOfMemoryError
// (MemoryError where torch is not loaded), everything else -> RuntimeError; a KeyboardInterrupt or
// SystemExit from a Python callable (the bootstrap's, the allocator) is raised as itself.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "epcomm/buffer.hpp"
#include "epcomm/error.hpp"
#include "python_allocator.hpp"
#include "python_errors.hpp"

namespace nb = nanobind;

namespace epcomm::python {
void bind_buffer(nb::module_& module);
}

NB_MODULE(_C, module) {
  module.doc() = "epcomm's C++ runtime (no torch inside; see the epcomm package for the PyTorch API)";
  nb::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const epcomm::Error& failure) {
      nb::object kind = nb::borrow(PyExc_RuntimeError);
      if (failure.code() == epcomm::ErrorCode::kInvalidArgument) kind = nb::borrow(PyExc_ValueError);
      if (failure.code() == epcomm::ErrorCode::kTimeout) kind = nb::borrow(PyExc_TimeoutError);
      if (failure.code() == epcomm::ErrorCode::kOutOfMemory) kind = epcomm::python::out_of_memory_error_type();
      PyErr_SetString(kind.ptr(), failure.what());
    } catch (const epcomm::python::PythonInterruption& interruption) {
      interruption.raise();  // the KeyboardInterrupt (or SystemExit) itself, again at each raise
    }
  });
  module.def("version", &epcomm::Buffer::version, "Library version and the git revision it was built from.");
  module.def("cuda_architectures", &epcomm::Buffer::cuda_architectures,
             "The CUDA architectures the kernels were built for (CMake's list).");
  epcomm::python::bind_buffer(module);
}
