// Rank 0's side of meeting the ranks: accepts connections and runs every newcomer's handshake
// (bootstrap/handshake.hpp) at once, each against a short deadline of its own (a second for its
// greeting), so a silent or hostile connection can neither hold up the ranks behind it for long
// nor fail the job: a rank that finds rank 0 busy that way connects again until its deadline.
// Whatever does not prove it belongs to this job is closed without a word: it learns nothing.
#pragma once

#include <algorithm>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/handshake.hpp"
#include "bootstrap/socket_io.hpp"

namespace epcomm::bootstrap_detail {

// A connection that proved it knows the job's secret, and what it said about itself. Its rank and
// num_ranks are not checked yet: that is the caller's (a real rank that disagrees fails the job).
struct Admitted {
  UniqueFd fd;
  Hello hello;
};

class Admission {
 public:
  // At most `max_candidates` handshakes run at once; more connections wait in the listen backlog.
  Admission(Listener& listener, const JobKey& key, std::chrono::milliseconds handshake_budget, size_t max_candidates);

  // The next admitted connection, or nothing when `deadline` passes (status kTimedOut) or the
  // listener or accepting fails (kSystemError, e.g. EMFILE: out of file descriptors).
  std::optional<Admitted> next(const Deadline& deadline, IoStatus& status);

  // Connections closed without admission, and why the last one was, for rank 0's messages.
  int refused() const { return refused_; }
  const std::string& last_refusal() const { return last_refusal_; }

 private:
  // A rank sends its greeting as soon as it connects: a connection silent this long after we took
  // it is no rank, and gives its handshake slot to the connections queued behind it.
  static constexpr std::chrono::milliseconds kGreetingBudget{1000};
  // After an accept that failed short of memory (the connection stays queued, the listener
  // readable), the listener rests this long instead of waking the loop again at once.
  static constexpr std::chrono::milliseconds kAcceptRetry{10};

  struct Candidate {
    Candidate(UniqueFd connection, std::chrono::milliseconds budget)
        : fd(std::move(connection)), deadline(budget), greeting_deadline(std::min(budget, kGreetingBudget)),
          buffer(Hello::kBytes) {}
    UniqueFd fd;
    Deadline deadline;
    Deadline greeting_deadline;  // for the whole Hello
    bool greeted = false;  // the Hello is in; waiting for the Proof
    Hello hello;
    Nonce root_nonce{};
    std::vector<uint8_t> buffer;
    size_t have = 0;
  };

  // Takes the waiting connections as candidates; a status other than ok when this process cannot.
  IoStatus accept_new();
  // Reads what is there; returns the admitted connection once its proof checks out.
  std::optional<Admitted> advance(Candidate& candidate);
  void refuse(Candidate& candidate, const std::string& why);

  Listener& listener_;
  const JobKey& key_;
  std::chrono::milliseconds handshake_budget_;
  size_t max_candidates_;
  std::vector<Candidate> candidates_;
  bool accept_short_of_memory_ = false;  // the last accept failed with ENOBUFS or ENOMEM
  int refused_ = 0;
  std::string last_refusal_;
};

}  // namespace epcomm::bootstrap_detail
