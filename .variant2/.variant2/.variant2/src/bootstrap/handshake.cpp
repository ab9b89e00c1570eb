#include "bootstrap/handshake.hpp"

#include "epcomm/bootstrap.hpp"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

namespace epcomm::bootstrap_detail {
namespace {

constexpr char kJobIdLabel[] = "epcomm job id";
constexpr char kRootLabel[] = "epcomm root proof";
constexpr char kPeerLabel[] = "epcomm peer proof";
constexpr size_t kJobIdTextBytes = 6;  // 12 hex digits are plenty to tell jobs apart in a message

}  // namespace

Nonce random_nonce() {
  std::random_device device;  // the OS's random source on Linux (getrandom / /dev/urandom)
  Nonce nonce;
  for (size_t i = 0; i < nonce.size(); i += sizeof(uint32_t)) {
    const uint32_t word = device();
    std::memcpy(nonce.data() + i, &word, std::min(sizeof(word), nonce.size() - i));
  }
  return nonce;
}

JobKey::JobKey(std::string secret) : secret_(std::move(secret)) {
  const Digest digest = hmac_sha256(secret_, kJobIdLabel, sizeof(kJobIdLabel) - 1);
  std::memcpy(id_.data(), digest.data(), id_.size());
}

std::string JobKey::id_text() const { return to_hex(id_.data(), kJobIdTextBytes); }

Digest JobKey::proof(Side side, const Nonce& nonce, int rank, int num_ranks) const {
  const char* label = side == Side::kRoot ? kRootLabel : kPeerLabel;
  std::vector<uint8_t> message(label, label + std::strlen(label));
  message.insert(message.end(), id_.begin(), id_.end());
  message.insert(message.end(), nonce.begin(), nonce.end());
  uint8_t numbers[8];
  store_u32(numbers, static_cast<uint32_t>(rank));
  store_u32(numbers + 4, static_cast<uint32_t>(num_ranks));
  message.insert(message.end(), numbers, numbers + sizeof(numbers));
  return hmac_sha256(secret_, message.data(), message.size());
}

std::array<uint8_t, Hello::kBytes> Hello::encode() const {
  std::array<uint8_t, kBytes> out{};
  store_u32(out.data(), magic);
  store_u32(out.data() + 4, version);
  store_u32(out.data() + 8, static_cast<uint32_t>(rank));
  store_u32(out.data() + 12, static_cast<uint32_t>(num_ranks));
  std::memcpy(out.data() + 16, job.data(), job.size());
  std::memcpy(out.data() + 16 + job.size(), nonce.data(), nonce.size());
  return out;
}

Hello Hello::decode(const uint8_t* bytes) {
  Hello hello;
  hello.magic = load_u32(bytes);
  hello.version = load_u32(bytes + 4);
  hello.rank = static_cast<int32_t>(load_u32(bytes + 8));
  hello.num_ranks = static_cast<int32_t>(load_u32(bytes + 12));
  std::memcpy(hello.job.data(), bytes + 16, hello.job.size());
  std::memcpy(hello.nonce.data(), bytes + 16 + hello.job.size(), hello.nonce.size());
  return hello;
}

std::array<uint8_t, Challenge::kBytes> Challenge::encode() const {
  std::array<uint8_t, kBytes> out{};
  std::memcpy(out.data(), nonce.data(), nonce.size());
  std::memcpy(out.data() + nonce.size(), proof.data(), proof.size());
  return out;
}

Challenge Challenge::decode(const uint8_t* bytes) {
  Challenge challenge;
  std::memcpy(challenge.nonce.data(), bytes, challenge.nonce.size());
  std::memcpy(challenge.proof.data(), bytes + challenge.nonce.size(), challenge.proof.size());
  return challenge;
}

void store_u32(uint8_t* out, uint32_t value) {
  for (int i = 3; i >= 0; --i, value >>= 8) out[i] = static_cast<uint8_t>(value & 0xff);
}
void store_u64(uint8_t* out, uint64_t value) {
  for (int i = 7; i >= 0; --i, value >>= 8) out[i] = static_cast<uint8_t>(value & 0xff);
}
uint32_t load_u32(const uint8_t* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value = (value << 8) | in[i];
  return value;
}
uint64_t load_u64(const uint8_t* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | in[i];
  return value;
}

}  // namespace epcomm::bootstrap_detail

namespace epcomm {

std::string make_job_secret() {
  using namespace bootstrap_detail;
  const Nonce first = random_nonce();
  const Nonce second = random_nonce();
  return to_hex(first.data(), first.size()) + to_hex(second.data(), second.size());
}

}  // namespace epcomm
