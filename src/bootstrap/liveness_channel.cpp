#include "bootstrap/liveness_channel.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bootstrap/host_addresses.hpp"
#include "bootstrap/socket_bootstrap.hpp"
#include "bootstrap/socket_io.hpp"
#include "epcomm/error.hpp"

namespace epcomm::bootstrap_detail {
namespace {

// Rank 0's announcement and each rank's verdict travel as fixed-size records through the
// caller's allgather: a version line, then fields one per line, NUL-padded.
constexpr size_t kAnnouncementBytes = 1024;
constexpr size_t kVerdictBytes = 256;
constexpr const char* kVersionLine = "epcomm-liveness-1";
constexpr const char* kOff = "off";
constexpr size_t kMaxAnnouncedAddresses = 16;
constexpr int kListenBacklog = 128;

std::vector<std::string> split_lines(const char* record, size_t bytes) {
  const std::string text(record, strnlen(record, bytes));
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::vector<char> to_record(const std::vector<std::string>& lines, size_t bytes) {
  std::string text;
  for (const std::string& line : lines) text += (text.empty() ? "" : "\n") + line;
  std::vector<char> record(bytes, '\0');
  std::memcpy(record.data(), text.data(), std::min(text.size(), bytes - 1));  // always NUL-terminated
  return record;
}

std::string as_host(const std::string& address) {
  return address.find(':') != std::string::npos && address.front() != '[' ? "[" + address + "]" : address;
}

// Rank 0: listens, and returns the announcement, or one saying why there is no channel. Never
// throws: the other ranks wait for this record in the caller's allgather.
std::vector<char> listen_and_announce(const LivenessOptions& options, std::unique_ptr<Listener>& listener) {
  if (options.address == kOff) return to_record({kVersionLine, kOff, ""}, kAnnouncementBytes);
  std::vector<std::string> hosts;
  try {
    if (!options.address.empty()) {
      hosts = {as_host(options.address)};
      listener = std::make_unique<Listener>(any_port_of(hosts.front()), kListenBacklog, Deadline(options.setup_budget));
    } else {
      // IPv4 where the host has it (every cluster network does), else IPv6.
      hosts = interface_addresses(AF_INET, kMaxAnnouncedAddresses);
      const bool v4 = !hosts.empty();
      if (!v4) hosts = interface_addresses(AF_INET6, kMaxAnnouncedAddresses);
      if (hosts.empty()) hosts = {"127.0.0.1"};  // no network: only this host's ranks could join
      listener = std::make_unique<Listener>(any_port_of(v4 || hosts.front() == "127.0.0.1" ? "0.0.0.0" : "[::]"),
                                            kListenBacklog, Deadline(options.setup_budget));
    }
    std::vector<std::string> lines = {kVersionLine, make_job_secret(), listener->port()};
    lines.insert(lines.end(), hosts.begin(), hosts.end());
    return to_record(lines, kAnnouncementBytes);
  } catch (const std::exception& error) {
    listener.reset();
    return to_record({kVersionLine, kOff, join_message("rank 0 cannot listen: ", error.what())}, kAnnouncementBytes);
  } catch (...) {
    listener.reset();
    return to_record({kVersionLine, kOff, "rank 0 cannot listen: an unexpected exception"}, kAnnouncementBytes);
  }
}

}  // namespace

LivenessOptions LivenessOptions::from_env() {
  LivenessOptions options;
  if (const char* value = std::getenv(kEnvLivenessAddress); value != nullptr) options.address = value;
  return options;
}

LivenessChannel make_liveness_channel(Bootstrap& carrier, const LivenessOptions& options) {
  const int rank = carrier.rank();
  const int num_ranks = carrier.num_ranks();
  LivenessChannel channel;
  if (num_ranks < 2) return channel;

  // 1. Rank 0 listens and announces; the others take its record.
  std::unique_ptr<Listener> listener;
  const std::vector<char> mine =
      rank == 0 ? listen_and_announce(options, listener) : std::vector<char>(kAnnouncementBytes, '\0');
  std::vector<char> all(kAnnouncementBytes * static_cast<size_t>(num_ranks));
  carrier.allgather(mine.data(), all.data(), kAnnouncementBytes);
  const std::vector<std::string> announced = split_lines(all.data(), kAnnouncementBytes);
  std::string failure;
  if (announced.size() < 3 || announced[0] != kVersionLine) {
    failure = "rank 0 announced no channel that this rank understands (ranks of different epcomm versions?)";
  } else if (announced[1] == kOff) {
    channel.why_not = announced[2];  // the same on every rank: nothing to agree on
    return channel;
  }

  // 2. Every rank meets rank 0, then all agree on the outcome.
  if (failure.empty()) {
    try {
      Rendezvous rendezvous;
      for (size_t line = 3; line < announced.size(); ++line) {
        rendezvous.addresses.push_back(parse_address(announced[line] + ":" + announced[2]));
      }
      rendezvous.listener = std::move(listener);
      channel.watch = make_socket_bootstrap(std::move(rendezvous), rank, num_ranks, options.setup_budget, announced[1]);
    } catch (const std::exception& error) {
      failure = error.what();  // names the rank that waited, and for whom
    } catch (...) {
      failure = join_message("rank ", rank, ": an unexpected exception while meeting rank 0");
    }
  }
  const std::vector<char> verdict = to_record({failure}, kVerdictBytes);
  std::vector<char> verdicts(kVerdictBytes * static_cast<size_t>(num_ranks));
  carrier.allgather(verdict.data(), verdicts.data(), kVerdictBytes);
  for (int other = 0; other < num_ranks; ++other) {
    const std::vector<std::string> said = split_lines(verdicts.data() + other * kVerdictBytes, kVerdictBytes);
    if (!said.front().empty()) {
      channel.watch.reset();
      channel.why_not = said.front();  // the same first failure on every rank
      break;
    }
  }
  return channel;
}

}  // namespace epcomm::bootstrap_detail
