// How a rank proves it belongs to a job when it meets rank 0, and rank 0 proves it back, without
// sending the job's secret: a mutual challenge-response with HMAC-SHA-256 keyed by the secret.
//
//   peer -> rank 0   Hello     {magic, version, rank, num_ranks, job id, peer nonce}
//   rank 0 -> peer   Challenge {root nonce, HMAC(secret, "root" | job id | peer nonce | rank | num_ranks)}
//   peer -> rank 0   Proof     {HMAC(secret, "peer" | job id | root nonce | rank | num_ranks)}
//
// The job id (derived from the secret) tells jobs that share an address apart before anything
// else; the nonces make every proof single-use; the labels keep one side's proof from serving as
// the other's. A job without a secret (an empty one) still runs the exchange, so ranks of such
// jobs only tell each other apart by the id, which is then the same for all of them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "bootstrap/sha256.hpp"

namespace epcomm::bootstrap_detail {

inline constexpr uint32_t kHelloMagic = 0x45504342;  // "EPCB"
inline constexpr uint32_t kProtocolVersion = 2;      // 2: job id and mutual proofs
inline constexpr size_t kJobIdBytes = 16;
inline constexpr size_t kNonceBytes = 16;

using JobId = std::array<uint8_t, kJobIdBytes>;
using Nonce = std::array<uint8_t, kNonceBytes>;

// Random bytes from the operating system (getrandom through std::random_device).
Nonce random_nonce();

enum class Side { kRoot, kPeer };

class JobKey {
 public:
  explicit JobKey(std::string secret);
  const JobId& id() const { return id_; }
  std::string id_text() const;  // the first bytes in hex, for messages
  bool has_secret() const { return !secret_.empty(); }
  // What `side` sends to prove it knows the secret, answering the other side's `nonce`.
  Digest proof(Side side, const Nonce& nonce, int rank, int num_ranks) const;

 private:
  std::string secret_;
  JobId id_{};
};

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  int32_t rank = 0;
  int32_t num_ranks = 0;
  JobId job{};
  Nonce nonce{};

  static constexpr size_t kBytes = 16 + kJobIdBytes + kNonceBytes;
  std::array<uint8_t, kBytes> encode() const;
  static Hello decode(const uint8_t* bytes);
};

struct Challenge {
  Nonce nonce{};
  Digest proof{};

  static constexpr size_t kBytes = kNonceBytes + sizeof(Digest);
  std::array<uint8_t, kBytes> encode() const;
  static Challenge decode(const uint8_t* bytes);
};

inline constexpr size_t kProofBytes = sizeof(Digest);

// Big-endian integers on the wire.
void store_u32(uint8_t* out, uint32_t value);
void store_u64(uint8_t* out, uint64_t value);
uint32_t load_u32(const uint8_t* in);
uint64_t load_u64(const uint8_t* in);

}  // namespace epcomm::bootstrap_detail
