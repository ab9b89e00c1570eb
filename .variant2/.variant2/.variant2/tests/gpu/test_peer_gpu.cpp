// The IPC peer mapping: every rank writes a rank-specific pattern into every rank's buffer through
// copy_to_all_ranks (peer copy + barrier), then reads its own buffer back and checks every slot.
// Also checks that barriers alone run many rounds without drifting out of step.
#include <cstring>

#include "common/constants.hpp"
#include "support/device_bytes.hpp"
#include "epcomm/buffer.hpp"
#include "gpu/gpu_cases.hpp"

namespace epcomm::testing {
namespace {

constexpr int64_t kBufferBytes = 8 << 20;
constexpr int kBarrierRounds = 200;
constexpr unsigned char kPoisonByte = 0xEE;

uint32_t pattern(int writer, int round, size_t word) {
  return static_cast<uint32_t>(writer * 0x9E3779B1u) ^ static_cast<uint32_t>(round * 0x85EBCA77u) ^
         static_cast<uint32_t>(word * 2654435761u);
}

const char* path_name(Buffer::CopyPath path) {
  switch (path) {
    case Buffer::CopyPath::kSmKernel: return "SM kernel";
    case Buffer::CopyPath::kTma: return "TMA";
    case Buffer::CopyPath::kCopyEngine: return "copy engine";
  }
  return "?";
}

void check_round(RankHarness& harness, Buffer& buffer, size_t bytes_per_rank, int num_sms, int round,
                 Buffer::CopyPath path) {
  const int ranks = harness.num_ranks();
  const size_t words = bytes_per_rank / sizeof(uint32_t);
  std::vector<uint32_t> mine(words);
  for (size_t i = 0; i < words; ++i) mine[i] = pattern(harness.rank(), round, i);
  DeviceBytes source(bytes_per_rank);
  source.upload(mine);

  // Poison our buffer, and make sure no peer writes before everyone has poisoned.
  EPCOMM_CUDA_CHECK(cudaMemset(buffer.local_nvl_buffer(), kPoisonByte, static_cast<size_t>(kBufferBytes)));
  buffer.barrier(nullptr);
  buffer.copy_to_all_ranks(source.get(), bytes_per_rank, num_sms, nullptr, path);
  buffer.synchronize(nullptr);

  std::vector<uint32_t> received(words * ranks);
  EPCOMM_CUDA_CHECK(cudaMemcpy(received.data(), buffer.local_nvl_buffer(), words * ranks * sizeof(uint32_t),
                               cudaMemcpyDeviceToHost));
  for (int writer = 0; writer < ranks; ++writer) {
    size_t wrong = 0;
    for (size_t i = 0; i < words; ++i) wrong += received[writer * words + i] != pattern(writer, round, i);
    harness.check(wrong == 0, "round " + std::to_string(round) + ": " + std::to_string(wrong) + " of " +
                                   std::to_string(words) + " words from rank " + std::to_string(writer) + " wrong (" +
                                   std::to_string(bytes_per_rank) + " bytes, " + std::to_string(num_sms) + " SMs, " +
                                   path_name(path) + ")");
  }
  // Bytes past the last slot must be untouched.
  if (static_cast<int64_t>(bytes_per_rank * ranks) < kBufferBytes) {
    unsigned char after = 0;
    EPCOMM_CUDA_CHECK(cudaMemcpy(&after, static_cast<char*>(buffer.local_nvl_buffer()) + bytes_per_rank * ranks, 1,
                                 cudaMemcpyDeviceToHost));
    harness.check(after == kPoisonByte, std::string("copy wrote past the last rank's slot (") + path_name(path) + ")");
  }
  buffer.barrier(nullptr);  // nobody poisons again before everyone has read
}

}  // namespace

void run_peer_case(RankHarness& harness) {
  BufferOptions options;
  options.num_nvl_bytes = kBufferBytes;
  Buffer buffer(harness.bootstrap(), options);

  const size_t max_per_rank = static_cast<size_t>(kBufferBytes) / harness.num_ranks();
  const size_t sizes[] = {16, 4096 + 16, 1 << 20, max_per_rank / 16 * 16};
  const int sm_counts[] = {1, 3, 16};
  int round = 0;
  for (const Buffer::CopyPath path : {Buffer::CopyPath::kSmKernel, Buffer::CopyPath::kTma, Buffer::CopyPath::kCopyEngine}) {
    for (size_t bytes : sizes) {
      for (int num_sms : sm_counts) check_round(harness, buffer, bytes, num_sms, round++, path);
    }
  }

  for (int i = 0; i < kBarrierRounds; ++i) buffer.barrier(nullptr);
  buffer.synchronize(nullptr);
  harness.check(true, "barrier rounds completed");

  harness.expect_error(ErrorCode::kInvalidArgument, "bytes_per_rank=24", [&] {
    buffer.copy_to_all_ranks(buffer.local_nvl_buffer(), 24, 1, nullptr);
  }, "unaligned copy size");
  harness.expect_error(ErrorCode::kInvalidArgument, "exceeds num_nvl_bytes", [&] {
    const size_t one_slot_too_many = static_cast<size_t>(kBufferBytes) / harness.num_ranks() + kVectorBytes;
    buffer.copy_to_all_ranks(buffer.local_nvl_buffer(), one_slot_too_many, 1, nullptr);
  }, "copy larger than the buffer");
}

}  // namespace epcomm::testing
