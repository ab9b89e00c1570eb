#include "python_errors.hpp"

namespace nb = nanobind;

namespace epcomm::python {

PythonInterruption::PythonInterruption(const nb::python_error& error) {
  PyObject* exception = error.value().ptr();
  Py_XINCREF(exception);
  exception_ = std::shared_ptr<PyObject>(exception, [](PyObject* object) {
    if (object == nullptr || !nb::is_alive()) return;  // at exit: left to the interpreter
    nb::gil_scoped_acquire gil;
    Py_DECREF(object);
  });
}

void PythonInterruption::raise() const {
  PyObject* exception = exception_.get();
  if (exception == nullptr) {
    PyErr_SetString(PyExc_SystemError, what());
    return;
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception)), exception);
}

}  // namespace epcomm::python
