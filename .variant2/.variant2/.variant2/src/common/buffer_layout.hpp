// The one place that says where each region of a rank's buffer starts. Every rank allocates the
// same layout (the options are agreed at creation), so an offset means the same place in every
// rank's buffer: kernels hand offsets to the transport window, never addresses of their own.
//
//   [ normal-mode control block ][ normal-mode rings: num_nvl_bytes ][ low-latency region: num_rdma_bytes ]
//     common/nvl_layout.hpp        common/nvl_layout.hpp (RingLayout)   common/low_latency_layout.hpp
#pragma once

#include <cstddef>

#include "common/host_device.hpp"
#include "common/nvl_layout.hpp"

namespace epcomm {

struct BufferLayout {
  size_t nvl_bytes = 0;          // the rings' region (BufferOptions::num_nvl_bytes)
  size_t low_latency_bytes = 0;  // the low-latency region (BufferOptions::num_rdma_bytes)

  EPCOMM_HOST_DEVICE static constexpr size_t nvl_offset() { return NvlLayout::kDataOffset; }
  EPCOMM_HOST_DEVICE constexpr size_t low_latency_offset() const { return nvl_offset() + nvl_bytes; }
  EPCOMM_HOST_DEVICE constexpr size_t total_bytes() const { return low_latency_offset() + low_latency_bytes; }
};

}  // namespace epcomm
