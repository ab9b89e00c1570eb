// What a process holds that a leak would grow: device memory in use, open file descriptors and
// memory mappings. For tests that create and destroy or call many times (not part of the library).
#pragma once

#include <cuda_runtime_api.h>
#include <dirent.h>

#include <cstddef>
#include <fstream>
#include <string>

#include "common/cuda_check.hpp"

namespace epcomm::testing {

// Free memory of the current device (device-wide: other processes on the GPU count too).
inline size_t free_device_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  EPCOMM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

// Open file descriptors of this process (CUDA IPC, sockets, the driver's own).
inline int open_descriptors() {
  int count = 0;
  if (DIR* directory = opendir("/proc/self/fd")) {
    while (const dirent* entry = readdir(directory)) count += entry->d_name[0] != '.';
    closedir(directory);
  }
  return count;
}

// Memory mappings of this process (each peer buffer opened by CUDA IPC adds some).
inline int memory_mappings() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) ++count;
  return count;
}

// Device memory, descriptors and mappings may drift by a little (allocator slack, the driver's
// pools), never by one buffer or one descriptor per cycle.
inline constexpr size_t kAllowedDeviceDriftBytes = 256 << 20;
inline constexpr int kAllowedDescriptorDrift = 8;
inline constexpr int kAllowedMappingDrift = 32;

}  // namespace epcomm::testing
