#include "epcomm/error.hpp"

namespace epcomm {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kUnsupported: return "Unsupported";
    case ErrorCode::kCudaError: return "CudaError";
    case ErrorCode::kBootstrapError: return "BootstrapError";
    case ErrorCode::kDeviceError: return "DeviceError";
    case ErrorCode::kTimeout: return "Timeout";
    case ErrorCode::kPeerFailed: return "PeerFailed";
    case ErrorCode::kInternal: return "Internal";
    case ErrorCode::kOutOfMemory: return "OutOfMemory";
  }
  return "Unknown";  // only reachable through a value cast from outside the enum
}

}  // namespace epcomm
