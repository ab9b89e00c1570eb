#include "bootstrap/sha256.hpp"

#include <algorithm>
#include <cstring>

namespace epcomm::bootstrap_detail {
namespace {

constexpr size_t kBlockBytes = 64;
constexpr size_t kLengthBytes = 8;
constexpr uint8_t kPadFirstByte = 0x80;
constexpr uint8_t kHmacInnerPad = 0x36;
constexpr uint8_t kHmacOuterPad = 0x5c;

// FIPS 180-4, 4.2.2 and 5.3.3.
constexpr std::array<uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
constexpr std::array<uint32_t, 8> kInitialState = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

uint32_t rotate_right(uint32_t value, int bits) { return (value >> bits) | (value << (32 - bits)); }

}  // namespace

Sha256::Sha256() : state_(kInitialState) {}

void Sha256::compress(const uint8_t* block) {
  uint32_t schedule[64];
  for (int i = 0; i < 16; ++i) {
    schedule[i] = (uint32_t{block[4 * i]} << 24) | (uint32_t{block[4 * i + 1]} << 16) |
                  (uint32_t{block[4 * i + 2]} << 8) | uint32_t{block[4 * i + 3]};
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotate_right(schedule[i - 15], 7) ^ rotate_right(schedule[i - 15], 18) ^ (schedule[i - 15] >> 3);
    const uint32_t s1 = rotate_right(schedule[i - 2], 17) ^ rotate_right(schedule[i - 2], 19) ^ (schedule[i - 2] >> 10);
    schedule[i] = schedule[i - 16] + s0 + schedule[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t sum1 = rotate_right(e, 6) ^ rotate_right(e, 11) ^ rotate_right(e, 25);
    const uint32_t choice = (e & f) ^ (~e & g);
    const uint32_t t1 = h + sum1 + choice + kRoundConstants[i] + schedule[i];
    const uint32_t sum0 = rotate_right(a, 2) ^ rotate_right(a, 13) ^ rotate_right(a, 22);
    const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = sum0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  total_bytes_ += size;
  while (size > 0) {
    const size_t take = std::min(size, kBlockBytes - block_used_);
    std::memcpy(block_.data() + block_used_, bytes, take);
    block_used_ += take;
    bytes += take;
    size -= take;
    if (block_used_ == kBlockBytes) {
      compress(block_.data());
      block_used_ = 0;
    }
  }
}

Digest Sha256::finish() {
  const uint64_t bit_length = total_bytes_ * 8;
  block_[block_used_++] = kPadFirstByte;
  if (block_used_ > kBlockBytes - kLengthBytes) {
    std::memset(block_.data() + block_used_, 0, kBlockBytes - block_used_);
    compress(block_.data());
    block_used_ = 0;
  }
  std::memset(block_.data() + block_used_, 0, kBlockBytes - kLengthBytes - block_used_);
  for (size_t i = 0; i < kLengthBytes; ++i) {
    block_[kBlockBytes - 1 - i] = static_cast<uint8_t>(bit_length >> (8 * i));
  }
  compress(block_.data());
  Digest digest;
  for (size_t i = 0; i < state_.size(); ++i) {
    for (size_t j = 0; j < 4; ++j) digest[4 * i + j] = static_cast<uint8_t>(state_[i] >> (24 - 8 * j));
  }
  return digest;
}

Digest sha256(const void* data, size_t size) {
  Sha256 hash;
  hash.update(data, size);
  return hash.finish();
}

Digest hmac_sha256(const std::string& key, const void* data, size_t size) {
  std::array<uint8_t, kBlockBytes> block_key{};
  if (key.size() > kBlockBytes) {
    const Digest hashed = sha256(key.data(), key.size());
    std::memcpy(block_key.data(), hashed.data(), hashed.size());
  } else {
    std::memcpy(block_key.data(), key.data(), key.size());
  }
  std::array<uint8_t, kBlockBytes> pad;
  for (size_t i = 0; i < kBlockBytes; ++i) pad[i] = block_key[i] ^ kHmacInnerPad;
  Sha256 inner;
  inner.update(pad.data(), pad.size());
  inner.update(data, size);
  const Digest inner_digest = inner.finish();
  for (size_t i = 0; i < kBlockBytes; ++i) pad[i] = block_key[i] ^ kHmacOuterPad;
  Sha256 outer;
  outer.update(pad.data(), pad.size());
  outer.update(inner_digest.data(), inner_digest.size());
  return outer.finish();
}

std::string to_hex(const uint8_t* data, size_t size) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    text += kDigits[data[i] >> 4];
    text += kDigits[data[i] & 0xf];
  }
  return text;
}

bool equal_in_constant_time(const uint8_t* a, const uint8_t* b, size_t size) {
  uint8_t difference = 0;
  for (size_t i = 0; i < size; ++i) difference |= static_cast<uint8_t>(a[i] ^ b[i]);
  return difference == 0;
}

}  // namespace epcomm::bootstrap_detail
