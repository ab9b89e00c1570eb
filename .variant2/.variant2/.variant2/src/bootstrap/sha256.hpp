// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the bootstrap's job authentication: a
// few hundred bytes per rank per job, so a small portable implementation beats a dependency.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace epcomm::bootstrap_detail {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  Digest finish();  // the object is spent afterwards

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> block_{};
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest sha256(const void* data, size_t size);
Digest hmac_sha256(const std::string& key, const void* data, size_t size);
std::string to_hex(const uint8_t* data, size_t size);

// Compares in time independent of where the first difference is.
bool equal_in_constant_time(const uint8_t* a, const uint8_t* b, size_t size);

}  // namespace epcomm::bootstrap_detail
