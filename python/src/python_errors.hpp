// How a Python callable's failure crosses epcomm's C++ code.
#pragma once

#include <nanobind/nanobind.h>

namespace epcomm::python {

// KeyboardInterrupt, SystemExit and the like (BaseException, not Exception) ask the program to stop,
// not report a failure: they go back to Python as they are (the C++ code between unwinds as for
// any error), where other failures become epcomm errors that say which callable failed. GIL held.
inline bool is_interruption(const nanobind::python_error& error) { return !error.matches(PyExc_Exception); }

}  // namespace epcomm::python
