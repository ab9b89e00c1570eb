// A Bootstrap whose exchange is done by Python callables (the Python layer passes functions that
// use the torch.distributed group). Callable from any thread: it takes the GIL for each call.
#pragma once

#include <nanobind/nanobind.h>

#include "epcomm/bootstrap.hpp"

namespace epcomm::python {

class PythonBootstrap final : public Bootstrap {
 public:
  // allgather(data: bytes) -> bytes of num_ranks * len(data), rank r's at r * len(data);
  // barrier() -> None.
  PythonBootstrap(int rank, int num_ranks, nanobind::object allgather, nanobind::object barrier);
  ~PythonBootstrap() override;

  int rank() const override { return rank_; }
  int num_ranks() const override { return num_ranks_; }
  void allgather(const void* in, void* out, size_t bytes) override;
  void barrier() override;

 private:
  int rank_;
  int num_ranks_;
  nanobind::object allgather_;
  nanobind::object barrier_;
};

}  // namespace epcomm::python
