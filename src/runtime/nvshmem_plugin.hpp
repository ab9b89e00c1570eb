// The NVSHMEM plugin's interface: libepcomm_nvshmem.so, built when NVSHMEM is found
// (CMake option EPCOMM_WITH_NVSHMEM) and loaded only when a Buffer picks the NVSHMEM transport,
// so that libepcomm itself never needs NVSHMEM. It holds the NVSHMEM transport and the kernels of
// the kernel table compiled against NVSHMEM's device API (kernels/kernel_table.hpp).
#pragma once

#include <memory>
#include <vector>

#include "kernels/kernel_table.hpp"
#include "transport/rank_census.hpp"
#include "transport/transport.hpp"

namespace epcomm::detail {

inline constexpr int kNvshmemPluginAbi = 11;  // bumped whenever this struct or what it points to changes
inline constexpr const char* kNvshmemPluginFile = "libepcomm_nvshmem.so";
inline constexpr const char* kNvshmemPluginEntry = "epcomm_nvshmem_plugin";

struct NvshmemPlugin {
  int abi = 0;                          // kNvshmemPluginAbi of the build that made it
  const char* epcomm_version = nullptr;  // EPCOMM_VERSION_STRING of that build
  const char* nvshmem_version = nullptr;  // of the NVSHMEM it was built against
  // Collective, as make_transport: NVSHMEM initialised (unique-id bootstrap through `bootstrap`),
  // one symmetric allocation of the layout's size, direct peers by nvshmem_ptr.
  std::unique_ptr<Transport> (*make_transport)(Bootstrap& bootstrap, const TransportOptions& options,
                                               const std::vector<RankCensus>& census) = nullptr;
  const kernels::KernelTable* kernels = nullptr;
};

}  // namespace epcomm::detail

// The plugin's one exported symbol.
extern "C" const epcomm::detail::NvshmemPlugin* epcomm_nvshmem_plugin();
