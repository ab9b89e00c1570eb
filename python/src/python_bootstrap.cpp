#include "python_bootstrap.hpp"

#include <cstring>
#include <utility>

#include "epcomm/error.hpp"
#include "python_errors.hpp"

namespace nb = nanobind;

namespace epcomm::python {

PythonBootstrap::PythonBootstrap(int rank, int num_ranks, nb::object allgather, nb::object barrier)
    : rank_(rank), num_ranks_(num_ranks), allgather_(std::move(allgather)), barrier_(std::move(barrier)) {
  if (num_ranks < 1 || rank < 0 || rank >= num_ranks) {
    fail(ErrorCode::kInvalidArgument, "Bootstrap: rank=", rank, " must be in [0, num_ranks=", num_ranks, ")");
  }
}

PythonBootstrap::~PythonBootstrap() {
  // The callables may be released from a thread without the GIL (the last Buffer reference).
  if (!nb::is_alive()) {
    allgather_.release();
    barrier_.release();
    return;
  }
  nb::gil_scoped_acquire gil;
  allgather_.reset();
  barrier_.reset();
}

void PythonBootstrap::allgather(const void* in, void* out, size_t bytes) {
  nb::gil_scoped_acquire gil;
  try {
    nb::object result = allgather_(nb::bytes(static_cast<const char*>(in), bytes));
    const nb::bytes gathered = nb::cast<nb::bytes>(result);
    const size_t expected = bytes * static_cast<size_t>(num_ranks_);
    if (gathered.size() != expected) {
      fail(ErrorCode::kBootstrapError, "Bootstrap: the Python allgather returned ", gathered.size(), " bytes, expected ",
           expected, " (", num_ranks_, " ranks x ", bytes, ")");
    }
    if (expected > 0) std::memcpy(out, gathered.c_str(), expected);
  } catch (const nb::python_error& error) {
    rethrow_if_interruption(error);
    fail(ErrorCode::kBootstrapError, "Bootstrap: rank ", rank_, ": the Python allgather failed: ", error.what());
  }
}

void PythonBootstrap::barrier() {
  nb::gil_scoped_acquire gil;
  try {
    barrier_();
  } catch (const nb::python_error& error) {
    rethrow_if_interruption(error);
    fail(ErrorCode::kBootstrapError, "Bootstrap: rank ", rank_, ": the Python barrier failed: ", error.what());
  }
}

}  // namespace epcomm::python
