#include "bootstrap/admission.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace epcomm::bootstrap_detail {

Admission::Admission(Listener& listener, const JobKey& key, std::chrono::milliseconds handshake_budget,
                     size_t max_candidates)
    : listener_(listener), key_(key), handshake_budget_(handshake_budget), max_candidates_(max_candidates) {}

void Admission::refuse(Candidate& candidate, const std::string& why) {
  candidate.fd.reset();
  ++refused_;
  last_refusal_ = why;
}

IoStatus Admission::accept_new() {
  accept_short_of_memory_ = false;
  while (candidates_.size() < max_candidates_) {
    IoStatus status;
    UniqueFd fd = listener_.accept(Deadline(std::chrono::milliseconds(0)), status);
    // Nobody else is waiting (a timeout at once), or accepting failed. Out of file descriptors
    // (or a broken listener) lasts: the connection stays queued and the listener readable, so it
    // is an error now, not a wait that spins until the deadline. Short of memory may pass: the
    // listener rests for kAcceptRetry, then accepting is tried again.
    if (!fd) {
      const bool short_of_memory = status.kind == IoStatus::kSystemError && (status.error == ENOBUFS || status.error == ENOMEM);
      accept_short_of_memory_ = short_of_memory;
      return status.kind == IoStatus::kSystemError && !short_of_memory ? status : IoStatus{};
    }
    candidates_.emplace_back(std::move(fd), handshake_budget_);
  }
  return {};
}

std::optional<Admitted> Admission::advance(Candidate& candidate) {
  while (candidate.have < candidate.buffer.size()) {
    const ssize_t got = recv(candidate.fd.get(), candidate.buffer.data() + candidate.have,
                             candidate.buffer.size() - candidate.have, 0);
    if (got > 0) {
      candidate.have += static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return std::nullopt;
    refuse(candidate, got == 0 ? "a connection closed before it finished the handshake"
                               : "a connection failed during the handshake");
    return std::nullopt;
  }
  if (!candidate.greeted) {
    candidate.hello = Hello::decode(candidate.buffer.data());
    if (candidate.hello.magic != kHelloMagic || candidate.hello.version != kProtocolVersion) {
      refuse(candidate, "a connection sent an unknown greeting (another program, or another epcomm version)");
      return std::nullopt;
    }
    if (!equal_in_constant_time(candidate.hello.job.data(), key_.id().data(), kJobIdBytes)) {
      refuse(candidate, "a connection belonged to another job (job id " +
                            to_hex(candidate.hello.job.data(), 6) + ", ours " + key_.id_text() + ")");
      return std::nullopt;
    }
    Challenge challenge;
    challenge.nonce = candidate.root_nonce = random_nonce();
    challenge.proof = key_.proof(Side::kRoot, candidate.hello.nonce, candidate.hello.rank, candidate.hello.num_ranks);
    const auto bytes = challenge.encode();
    if (!write_all(candidate.fd.get(), bytes.data(), bytes.size(), candidate.deadline).ok()) {
      refuse(candidate, "a connection did not take our challenge");
      return std::nullopt;
    }
    candidate.greeted = true;
    candidate.buffer.assign(kProofBytes, 0);
    candidate.have = 0;
    return advance(candidate);  // the proof may be there already
  }
  const Digest expected =
      key_.proof(Side::kPeer, candidate.root_nonce, candidate.hello.rank, candidate.hello.num_ranks);
  if (!equal_in_constant_time(candidate.buffer.data(), expected.data(), expected.size())) {
    refuse(candidate, "a connection could not prove it knows the job's secret");
    return std::nullopt;
  }
  Admitted admitted{std::move(candidate.fd), candidate.hello};
  return admitted;
}

std::optional<Admitted> Admission::next(const Deadline& deadline, IoStatus& status) {
  while (true) {
    if (const IoStatus accepted = accept_new(); !accepted.ok()) {
      status = accepted;
      return std::nullopt;
    }
    // Progress every candidate with data, drop the finished and the late.
    std::optional<Admitted> admitted;
    for (Candidate& candidate : candidates_) {
      // Once one is admitted the pass ends: the others are read, and only then judged, next time
      // (a rank 0 that stalled must not refuse a greeting it has not read yet).
      if (admitted || !candidate.fd) continue;
      admitted = advance(candidate);
      if (candidate.fd && !candidate.greeted && candidate.greeting_deadline.expired()) {
        refuse(candidate, "a connection did not send its whole greeting in time (a rank sends it as it connects)");
      }
      if (candidate.fd && candidate.deadline.expired()) refuse(candidate, "a connection stayed silent past its handshake deadline");
    }
    candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                     [](const Candidate& candidate) { return !candidate.fd; }),
                      candidates_.end());
    if (admitted) {
      status = {};
      return admitted;
    }
    if (deadline.expired()) {
      status = {IoStatus::kTimedOut, 0};
      return std::nullopt;
    }
    // Wait for a newcomer, a candidate's bytes, or the nearest deadline.
    std::vector<pollfd> watched;
    int wait_ms = deadline.remaining_ms();
    if (accept_short_of_memory_) {
      wait_ms = std::min(wait_ms, static_cast<int>(kAcceptRetry.count()));  // the listener is readable, but rests
    } else if (candidates_.size() < max_candidates_) {
      watched.push_back({listener_.fd(), POLLIN, 0});
    }
    for (const Candidate& candidate : candidates_) {
      watched.push_back({candidate.fd.get(), POLLIN, 0});
      wait_ms = std::min(wait_ms, candidate.deadline.remaining_ms());
      if (!candidate.greeted) wait_ms = std::min(wait_ms, candidate.greeting_deadline.remaining_ms());
    }
    const int ready = poll(watched.data(), watched.size(), wait_ms);
    if (ready < 0 && errno != EINTR) {
      status = {IoStatus::kSystemError, errno};
      return std::nullopt;
    }
    if (!watched.empty() && watched[0].fd == listener_.fd() && (watched[0].revents & (POLLERR | POLLNVAL))) {
      status = {IoStatus::kSystemError, EBADF};
      return std::nullopt;
    }
  }
}

}  // namespace epcomm::bootstrap_detail
