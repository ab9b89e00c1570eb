// The NVSHMEM plugin's entry (libepcomm_nvshmem.so): the NVSHMEM transport and the kernel table
// of this library's own copies of the kernels, compiled against NVSHMEM's device API.
#include "runtime/nvshmem_plugin.hpp"

#include <nvshmem.h>

#include "transport/nvshmem/nvshmem_transport.hpp"

namespace epcomm::detail {
namespace {

std::unique_ptr<Transport> make_nvshmem_transport(Bootstrap& bootstrap, const TransportOptions& options,
                                                  const std::vector<RankCensus>& census) {
  return std::make_unique<NvshmemTransport>(bootstrap, options, census);
}

}  // namespace
}  // namespace epcomm::detail

#define EPCOMM_STRINGIFY_(x) #x
#define EPCOMM_STRINGIFY(x) EPCOMM_STRINGIFY_(x)

extern "C" __attribute__((visibility("default"))) const epcomm::detail::NvshmemPlugin* epcomm_nvshmem_plugin() {
  using namespace epcomm::detail;
  static const NvshmemPlugin plugin{
      kNvshmemPluginAbi, EPCOMM_VERSION_STRING,
      EPCOMM_STRINGIFY(NVSHMEM_VENDOR_MAJOR_VERSION) "." EPCOMM_STRINGIFY(NVSHMEM_VENDOR_MINOR_VERSION) "." EPCOMM_STRINGIFY(
          NVSHMEM_VENDOR_PATCH_VERSION),
      make_nvshmem_transport, &epcomm::kernels::builtin_kernels()};
  return &plugin;
}
