// The one place that says where each region of a rank's buffer starts. Every rank allocates the
// same layout (the options are agreed at creation), so an offset means the same place in every
// rank's buffer: kernels hand offsets to the transport window, never addresses of their own.
//
//   [ barrier control block ][ normal-mode control block ][ normal-mode rings: num_nvl_bytes ]
//     Buffer::barrier           common/nvl_layout.hpp        common/nvl_layout.hpp (RingLayout)
//   [ rail stage: control block and rings: num_rdma_bytes ][ low-latency region: num_rdma_bytes ]
//     hierarchical normal mode, without low_latency_mode     common/low_latency_layout.hpp, with it
//
// A control block and the rings after it form a normal-mode region, laid out by NvlLayout from the
// region's start: a stage runs through a window whose bases point there (subgroup_window). Each
// region's barrier and counters belong to the ranks of one stage, so the whole-world barrier has
// a control block of its own (the node stage's ranks are a subset that counts its own barriers).
#pragma once

#include <cstddef>

#include "common/host_device.hpp"
#include "common/nvl_layout.hpp"

namespace epcomm {

struct BufferLayout {
  size_t nvl_bytes = 0;          // the rings' region (BufferOptions::num_nvl_bytes)
  size_t rail_ring_bytes = 0;    // the rail stage's rings; 0: no rail region
  size_t low_latency_bytes = 0;  // the low-latency region (BufferOptions::num_rdma_bytes)

  // Where normal mode's region (its control block, then the rings) starts.
  EPCOMM_HOST_DEVICE static constexpr size_t normal_offset() { return NvlLayout::kDataOffset; }
  // Where the rings start (deep_ep's NVLink buffer, Buffer::local_nvl_buffer).
  EPCOMM_HOST_DEVICE static constexpr size_t nvl_offset() { return normal_offset() + NvlLayout::kDataOffset; }
  // Where the rail region (its own control block, then its rings) starts.
  EPCOMM_HOST_DEVICE constexpr size_t rail_offset() const { return nvl_offset() + nvl_bytes; }
  EPCOMM_HOST_DEVICE constexpr size_t rail_region_bytes() const {
    return rail_ring_bytes > 0 ? NvlLayout::kDataOffset + rail_ring_bytes : 0;
  }
  EPCOMM_HOST_DEVICE constexpr size_t low_latency_offset() const { return rail_offset() + rail_region_bytes(); }
  EPCOMM_HOST_DEVICE constexpr size_t total_bytes() const { return low_latency_offset() + low_latency_bytes; }
};

}  // namespace epcomm
