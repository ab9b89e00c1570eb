// epcomm's error model: every failure is an epcomm::Error (a std::runtime_error) with a code
// and a message that names the operation, the argument and the offending value. Destructors never
// throw; GPU-side failures (bad ids, wait timeouts) are recorded on the device and raised as an
// Error at the next host call that checks them (see Buffer::check_device_errors).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace epcomm {

enum class ErrorCode {
  kInvalidArgument,  // the caller passed a value the operation cannot accept
  kUnsupported,      // valid request, but not supported by this build or machine
  kCudaError,        // a CUDA runtime call failed
  kBootstrapError,   // the rank-to-rank byte exchange failed or timed out
  kDeviceError,      // a kernel reported bad input it found on the device
  kTimeout,          // a bounded GPU wait expired (a peer never answered)
  kPeerFailed,       // another rank's process died (killed, crashed) during the job
  kInternal,         // an invariant of epcomm itself was broken: a bug
  kOutOfMemory,      // device memory ran out: CUDA, or the caller's allocator, refused an allocation
};

const char* error_code_name(ErrorCode code);

// Visible by default even where a library hides its symbols: the NVSHMEM plugin, a shared object
// of its own, throws it, and a catch elsewhere must see the same type.
class __attribute__((visibility("default"))) Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string(error_code_name(code)) + ": " + message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Builds a message from any streamable parts: join_message("hidden=", h, " must be ...").
template <typename... Parts>
std::string join_message(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <typename... Parts>
[[noreturn]] void fail(ErrorCode code, Parts&&... parts) {
  throw Error(code, join_message(std::forward<Parts>(parts)...));
}

}  // namespace epcomm
