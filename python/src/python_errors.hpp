// How a Python callable's failure crosses epcomm's C++ code.
#pragma once

#include <exception>
#include <memory>

#include <nanobind/nanobind.h>

namespace epcomm::python {

// KeyboardInterrupt, SystemExit and the like (BaseException, not Exception) ask the program to stop,
// not report a failure: they go back to Python as they are (the C++ code between unwinds as for
// any error), where other failures become epcomm errors that say which callable failed. GIL held.
inline bool is_interruption(const nanobind::python_error& error) { return !error.matches(PyExc_Exception); }

// Such an exception on its way through epcomm's C++ code. Not the python_error itself: a failed
// background start keeps its exception and raises it at every later call, and a python_error can
// be raised once only (nanobind aborts on the second). This holds the exception object, raised
// again as it is each time (module.cpp), and releases it under the GIL from any thread.
class PythonInterruption final : public std::exception {
 public:
  explicit PythonInterruption(const nanobind::python_error& error);  // GIL held
  const char* what() const noexcept override { return "a Python exception (KeyboardInterrupt, SystemExit) stopped the call"; }
  void raise() const;  // GIL held: sets it as Python's current exception
 private:
  std::shared_ptr<PyObject> exception_;
};

// Rethrows `error` (the one being handled) as a PythonInterruption when it is one. GIL held.
inline void rethrow_if_interruption(const nanobind::python_error& error) {
  if (is_interruption(error)) throw PythonInterruption(error);
}

}  // namespace epcomm::python
