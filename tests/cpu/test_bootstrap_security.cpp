// The socket rendezvous against processes that are not ranks of the job: strangers without the
// job's secret, another job on the same address, silent and garbage connections, a fake rank 0.
// None of them may join, learn anything about the job, or hold it up; the real ranks finish.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/handshake.hpp"
#include "bootstrap/socket_io.hpp"
#include "bootstrap/sha256.hpp"
#include "common/free_tcp_port.hpp"
#include "common/temp_dir.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"

// The sanitizers' runtimes intercept accept4 themselves: no interposer of ours under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EPCOMM_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define EPCOMM_UNDER_SANITIZER 1
#endif
#endif

#if !defined(EPCOMM_UNDER_SANITIZER)
#include <dlfcn.h>

// accept4 as this test binary sees it (the library's calls bind to the executable's definition):
// while `accept_short_of_memory_until` is in the future, every accept fails with ENOBUFS, as a
// kernel short of socket buffers answers, and is counted; otherwise libc's runs.
namespace {
std::atomic<int64_t> accept_short_of_memory_until{0};  // steady_clock nanoseconds since its epoch
std::atomic<int> accepts_refused{0};
}  // namespace

extern "C" int accept4(int fd, sockaddr* address, socklen_t* length, int flags) {
  using Accept4 = int (*)(int, sockaddr*, socklen_t*, int);
  static const auto real = reinterpret_cast<Accept4>(dlsym(RTLD_NEXT, "accept4"));
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now < accept_short_of_memory_until.load()) {
    accepts_refused.fetch_add(1);
    errno = ENOBUFS;
    return -1;
  }
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(fd, address, length, flags);
}
#endif

namespace epcomm {
namespace {

using namespace std::chrono_literals;
using test_support::TempDir;
using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kGenerousTimeout = 30s;
constexpr auto kPromptly = 3s;  // well under the 5 s a handshake may take

std::string hex_of(const bootstrap_detail::Digest& digest) { return bootstrap_detail::to_hex(digest.data(), digest.size()); }

TEST(Sha256, MatchesFips180Vectors) {
  using bootstrap_detail::sha256;
  EXPECT_EQ(hex_of(sha256("abc", 3)), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex_of(sha256("", 0)), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(hex_of(sha256(two_blocks.data(), two_blocks.size())),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(hex_of(sha256(million.data(), million.size())),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Padding at the edges of a block: 55 bytes fit one block, 64 need two.
  const std::string x55(55, 'x'), x64(64, 'x');
  EXPECT_EQ(hex_of(sha256(x55.data(), x55.size())), "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072");
  EXPECT_EQ(hex_of(sha256(x64.data(), x64.size())), "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c");
  // Fed in pieces, the same digest.
  bootstrap_detail::Sha256 pieces;
  for (size_t i = 0; i < two_blocks.size(); i += 5) pieces.update(two_blocks.data() + i, std::min<size_t>(5, two_blocks.size() - i));
  EXPECT_EQ(hex_of(pieces.finish()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(HmacSha256, MatchesRfc4231Vectors) {
  using bootstrap_detail::hmac_sha256;
  const std::string hi = "Hi There";
  EXPECT_EQ(hex_of(hmac_sha256(std::string(20, '\x0b'), hi.data(), hi.size())),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  const std::string question = "what do ya want for nothing?";
  EXPECT_EQ(hex_of(hmac_sha256("Jefe", question.data(), question.size())),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::string long_key_text = "Test Using Larger Than Block-Size Key - Hash Key First";
  EXPECT_EQ(hex_of(hmac_sha256(std::string(131, '\xaa'), long_key_text.data(), long_key_text.size())),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(JobKey, ProofsDependOnSecretSideNonceAndRank) {
  const bootstrap_detail::JobKey a("secret a"), b("secret b");
  EXPECT_NE(a.id(), b.id());
  EXPECT_EQ(a.id(), bootstrap_detail::JobKey("secret a").id());
  const bootstrap_detail::Nonce nonce = bootstrap_detail::random_nonce();
  EXPECT_NE(nonce, bootstrap_detail::random_nonce());
  using bootstrap_detail::Side;
  EXPECT_EQ(a.proof(Side::kPeer, nonce, 1, 4), bootstrap_detail::JobKey("secret a").proof(Side::kPeer, nonce, 1, 4));
  EXPECT_NE(a.proof(Side::kPeer, nonce, 1, 4), b.proof(Side::kPeer, nonce, 1, 4));
  EXPECT_NE(a.proof(Side::kPeer, nonce, 1, 4), a.proof(Side::kRoot, nonce, 1, 4));
  EXPECT_NE(a.proof(Side::kPeer, nonce, 1, 4), a.proof(Side::kPeer, nonce, 2, 4));
  EXPECT_NE(a.proof(Side::kPeer, nonce, 1, 4), a.proof(Side::kPeer, bootstrap_detail::random_nonce(), 1, 4));
}

SocketBootstrapOptions with_secret(const std::string& secret, std::chrono::milliseconds timeout = kGenerousTimeout) {
  SocketBootstrapOptions options;
  options.timeout = timeout;
  options.job_secret = secret;
  return options;
}

// One rank of a job: rendezvous, one allgather of its rank, checked.
void run_rank(const std::string& address, int rank, int num_ranks, const SocketBootstrapOptions& options) {
  auto bootstrap = make_socket_bootstrap(address, rank, num_ranks, options);
  std::vector<int> all(static_cast<size_t>(num_ranks), -1);
  bootstrap->allgather(&rank, all.data(), sizeof(int));
  for (int peer = 0; peer < num_ranks; ++peer) EXPECT_EQ(all[static_cast<size_t>(peer)], peer);
}

struct Result {
  bool ok = true;
  std::string message;
};

Result attempt(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& error) {
    return {false, error.what()};
  }
  return {};
}

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
  return addr;
}

// A raw client of a unix-socket address, connected once rank 0 listens.
int connect_when_listening(const std::string& path) {
  const sockaddr_un addr = unix_address(path);
  for (auto deadline = Clock::now() + kGenerousTimeout; Clock::now() < deadline; std::this_thread::sleep_for(5ms)) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    close(fd);
  }
  return -1;
}

// A raw listener on a unix-socket path (no rank 0 behind it), or -1.
int listen_on(const std::string& path, int backlog) {
  const int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  const sockaddr_un addr = unix_address(path);
  if (bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener, backlog) != 0) {
    close(listener);
    return -1;
  }
  return listener;
}

// Everything the connection receives until the other side closes it (or `wait` passes).
std::string drain(int fd, std::chrono::milliseconds wait) {
  std::string received;
  const auto deadline = Clock::now() + wait;
  while (Clock::now() < deadline) {
    pollfd watched{fd, POLLIN, 0};
    if (poll(&watched, 1, 50) <= 0) continue;
    char buffer[256];
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got <= 0) break;
    received.append(buffer, static_cast<size_t>(got));
  }
  return received;
}

TEST(BootstrapSecurity, RanksWithTheSecretMeet) {
  const TempDir dir;
  const std::string address = "unix:" + dir.file("job.sock");
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 4; ++rank) ranks.emplace_back([&, rank] { run_rank(address, rank, 4, with_secret("s3cret")); });
  for (std::thread& thread : ranks) thread.join();
}

TEST(BootstrapSecurity, StrangerWithAnotherSecretIsRefusedAndTheJobFinishes) {
  const TempDir dir;
  const std::string address = "unix:" + dir.file("job.sock");
  Result stranger, job[3];
  // The stranger claims rank 1 and gets there first; with the right secret it would be a duplicate.
  std::thread intruder([&] { stranger = attempt([&] { run_rank(address, 1, 3, with_secret("guess", 3s)); }); });
  std::thread root([&] { job[0] = attempt([&] { run_rank(address, 0, 3, with_secret("job secret")); }); });
  std::this_thread::sleep_for(200ms);
  std::thread one([&] { job[1] = attempt([&] { run_rank(address, 1, 3, with_secret("job secret")); }); });
  std::thread two([&] { job[2] = attempt([&] { run_rank(address, 2, 3, with_secret("job secret")); }); });
  for (std::thread* thread : {&intruder, &root, &one, &two}) thread->join();
  for (const Result& result : job) EXPECT_TRUE(result.ok) << result.message;
  EXPECT_FALSE(stranger.ok);
  EXPECT_NE(stranger.message.find("did not answer our greeting"), std::string::npos) << stranger.message;
  EXPECT_NE(stranger.message.find("another job's"), std::string::npos) << stranger.message;
}

TEST(BootstrapSecurity, AnotherJobOnTheSameTcpAddressDoesNotMix) {
  // Job A (2 ranks) and job B's rank 1 on one TCP address: B's rank is refused, A finishes.
  const int port = test_support::free_tcp_port();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  Result other_job, a0, a1;
  std::thread root([&] { a0 = attempt([&] { run_rank(address, 0, 2, with_secret("job A")); }); });
  std::thread intruder([&] { other_job = attempt([&] { run_rank(address, 1, 2, with_secret("job B", 3s)); }); });
  intruder.join();
  std::thread one([&] { a1 = attempt([&] { run_rank(address, 1, 2, with_secret("job A")); }); });
  root.join();
  one.join();
  EXPECT_TRUE(a0.ok) << a0.message;
  EXPECT_TRUE(a1.ok) << a1.message;
  EXPECT_FALSE(other_job.ok);
}

// A job of three ranks (secret "s") at `path`: rank 0 first, then `meanwhile` (strangers
// connecting), then ranks 1 and 2. Each rank's result, and how long the job took after `meanwhile`.
struct JobRun {
  Result ranks[3];
  Clock::duration after_strangers{};
};
JobRun run_job_after(const std::string& path, const std::function<void()>& meanwhile) {
  const std::string address = "unix:" + path;
  JobRun run;
  std::thread root([&] { run.ranks[0] = attempt([&] { run_rank(address, 0, 3, with_secret("s")); }); });
  meanwhile();
  const auto start = Clock::now();
  std::thread one([&] { run.ranks[1] = attempt([&] { run_rank(address, 1, 3, with_secret("s")); }); });
  std::thread two([&] { run.ranks[2] = attempt([&] { run_rank(address, 2, 3, with_secret("s")); }); });
  one.join();
  two.join();
  root.join();
  run.after_strangers = Clock::now() - start;
  return run;
}

TEST(BootstrapSecurity, SilentAndGarbageConnectionsNeitherStallNorFailTheJobNorLearnAnything) {
  const TempDir dir;
  const std::string path = dir.file("job.sock");
  int silent = -1, garbage = -1;
  const JobRun run = run_job_after(path, [&] {
    silent = connect_when_listening(path);
    garbage = connect_when_listening(path);
    const std::string noise(bootstrap_detail::Hello::kBytes, 'G');
    EXPECT_EQ(write(garbage, noise.data(), noise.size()), static_cast<ssize_t>(noise.size()));
  });
  ASSERT_GE(silent, 0);
  ASSERT_GE(garbage, 0);
  EXPECT_LT(run.after_strangers, kPromptly);  // the silent connection held nobody up
  for (const Result& result : run.ranks) EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(drain(garbage, 1s), "");  // closed without a word: no abort text, no job details
  close(garbage);
  close(silent);
}

TEST(BootstrapSecurity, MoreSilentConnectionsThanHandshakeSlotsDoNotFailTheJob) {
  // 80 silent connections, more than rank 0's 64 handshake slots, before the real ranks: each
  // slot is given back after a second without a greeting, and a rank whose greeting went
  // unanswered meanwhile connects again. The job finishes, well inside its timeout.
  const TempDir dir;
  const std::string path = dir.file("job.sock");
  std::vector<int> silent;
  const JobRun run = run_job_after(path, [&] {
    for (int i = 0; i < 80; ++i) silent.push_back(connect_when_listening(path));
  });
  for (const int fd : silent) EXPECT_GE(fd, 0);
  EXPECT_LT(run.after_strangers, 15s);
  for (const Result& result : run.ranks) EXPECT_TRUE(result.ok) << result.message;
  for (const int fd : silent) close(fd);
}

TEST(BootstrapSecurity, ASecondJobCannotTakeOverALiveUnixSocket) {
  const TempDir dir;
  const std::string path = dir.file("job.sock");
  const std::string address = "unix:" + path;
  Result first[2], second;
  std::thread root([&] { first[0] = attempt([&] { run_rank(address, 0, 2, with_secret("first")); }); });
  const int probe = connect_when_listening(path);  // rank 0 of the first job listens now
  ASSERT_GE(probe, 0);
  close(probe);
  second = attempt([&] { run_rank(address, 0, 2, with_secret("second", 2s)); });
  std::thread one([&] { first[1] = attempt([&] { run_rank(address, 1, 2, with_secret("first")); }); });
  one.join();
  root.join();
  EXPECT_FALSE(second.ok);
  EXPECT_NE(second.message.find("another process (another job?) is listening on it"), std::string::npos)
      << second.message;
  for (const Result& result : first) EXPECT_TRUE(result.ok) << result.message;
}

// Two jobs whose rank 0 start at once on one path, where an earlier run left a socket file: one
// takes the path, the other is refused; never both (the second unlinking the first's new socket,
// whose ranks would then reach the second job). Many rounds, since the window is short.
TEST(BootstrapSecurity, TwoJobsStartingAtOnceOnAStaleSocketPathDoNotBothTakeIt) {
  using bootstrap_detail::Deadline;
  using bootstrap_detail::Listener;
  constexpr int kRounds = 200;
  const TempDir dir;
  const std::string path = dir.file("job.sock");
  const auto address = bootstrap_detail::parse_address("unix:" + path);
  int both = 0, neither = 0;
  for (int round = 0; round < kRounds; ++round) {
    close(listen_on(path, 1));  // a stale file: bound, then its process gone
    std::unique_ptr<Listener> listeners[2];
    std::thread starts[2];
    std::atomic<int> ready{0};
    for (int job = 0; job < 2; ++job) {
      starts[job] = std::thread([&, job] {
        ready.fetch_add(1);
        while (ready.load() < 2) {
        }
        try {
          listeners[job] = std::make_unique<Listener>(address, 4, Deadline(kGenerousTimeout));
        } catch (const Error&) {
        }
      });
    }
    for (std::thread& start : starts) start.join();
    const int taken = (listeners[0] ? 1 : 0) + (listeners[1] ? 1 : 0);
    both += taken == 2;
    neither += taken == 0;
  }
  EXPECT_EQ(both, 0) << "rounds of " << kRounds << " where both jobs took the path";
  EXPECT_EQ(neither, 0) << "rounds of " << kRounds << " where neither did";
}

TEST(BootstrapSecurity, AListenerWithAFullBacklogCountsAsLiveAtOnce) {
  // A live job's rank 0 that does not accept (hung, suspended) with its backlog full: a second job
  // on its socket is told at once that someone listens there, where its probe used to block.
  const TempDir dir;
  const std::string path = dir.file("job.sock");
  const int listener = listen_on(path, 0);
  ASSERT_GE(listener, 0);
  const sockaddr_un addr = unix_address(path);
  std::vector<int> queued;
  for (int i = 0; i < 64; ++i) {
    const int client = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (connect(client, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(client);
      break;  // EAGAIN: the backlog is full
    }
    queued.push_back(client);
  }
  ASSERT_FALSE(queued.empty());
  const auto start = Clock::now();
  const Result second = attempt([&] { run_rank("unix:" + path, 0, 2, with_secret("second", 2s)); });
  EXPECT_LT(Clock::now() - start, kPromptly);
  EXPECT_FALSE(second.ok);
  EXPECT_NE(second.message.find("another process (another job?) is listening on it"), std::string::npos)
      << second.message;
  for (const int fd : queued) close(fd);
  close(listener);
}

TEST(BootstrapSecurity, AFakeRankZeroGetsNoProof) {
  const TempDir dir;
  const std::string path = dir.file("job.sock");
  const int listener = listen_on(path, 4);
  ASSERT_GE(listener, 0);
  std::string after_challenge;
  std::thread fake([&] {
    const int fd = accept(listener, nullptr, nullptr);
    char hello[bootstrap_detail::Hello::kBytes];
    ASSERT_EQ(read(fd, hello, sizeof(hello)), static_cast<ssize_t>(sizeof(hello)));
    const std::string challenge(bootstrap_detail::Challenge::kBytes, 'C');  // a made-up proof
    ASSERT_EQ(write(fd, challenge.data(), challenge.size()), static_cast<ssize_t>(challenge.size()));
    after_challenge = drain(fd, 2s);
    close(fd);
  });
  const Result peer = attempt([&] { run_rank("unix:" + path, 1, 2, with_secret("real", 5s)); });
  fake.join();
  close(listener);
  EXPECT_FALSE(peer.ok);
  EXPECT_NE(peer.message.find("could not prove it knows this job's secret"), std::string::npos) << peer.message;
  EXPECT_EQ(after_challenge, "");  // the peer sent no proof to a process that could not prove itself
}

// Rank 0 out of file descriptors when a rank connects: it fails at once, saying so and naming the
// limit, where it used to spin on the listener (the connection stays queued, so it stays readable)
// until its deadline and then blame the ranks for not connecting. In a child process, whose
// open-file limit can be lowered and then used up without touching the test's own.
TEST(BootstrapErrors, RankZeroOutOfFileDescriptorsSaysSoAtOnce) {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizers' runtimes cannot report with every descriptor taken (UBSan misreads the
  // stream objects of the child's error message then): the plain build runs this.
  GTEST_SKIP() << "not under the sanitizers: they need file descriptors of their own";
#endif
  const TempDir dir;
  const std::string path = dir.file("job.sock");
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_cur, 256);
    setrlimit(RLIMIT_NOFILE, &limit);
    std::string message = "rank 0 did not fail";
    const auto start = Clock::now();
    std::thread root([&] {
      const Result result = attempt([&] { run_rank("unix:" + path, 0, 3, with_secret("s", 20s)); });
      if (!result.ok) message = result.message;
    });
    const int early = connect_when_listening(path);  // rank 0 listens (this one is a silent candidate)
    const int client = socket(AF_UNIX, SOCK_STREAM, 0);
    const sockaddr_un addr = unix_address(path);
    std::vector<int> fillers;
    for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) fillers.push_back(fd);  // every descriptor taken
    const bool connected =
        early >= 0 && client >= 0 && connect(client, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
    root.join();
    for (const int fd : fillers) close(fd);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string text = (connected ? "" : "the test could not connect; ") + message + " | " + std::to_string(seconds);
    (void)!write(report[1], text.data(), text.size());
    _exit(0);
  }
  close(report[1]);
  std::string text;
  char buffer[1024];
  for (ssize_t got; (got = read(report[0], buffer, sizeof(buffer))) > 0;) text.append(buffer, static_cast<size_t>(got));
  close(report[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const size_t bar = text.rfind(" | ");
  ASSERT_NE(bar, std::string::npos) << text;
  const std::string message = text.substr(0, bar);
  EXPECT_NE(message.find("rank 0 cannot accept connections"), std::string::npos) << message;
  EXPECT_NE(message.find("Too many open files"), std::string::npos) << message;
  EXPECT_NE(message.find("RLIMIT_NOFILE) is 256"), std::string::npos) << message;
  EXPECT_LT(std::stod(text.substr(bar + 3)), std::chrono::duration<double>(kPromptly).count()) << "not at once: " << text;
}

// An accept that fails short of memory leaves the connection queued and the listener readable:
// rank 0 rests between tries instead of spinning on it, and admits the rank once memory is back.
TEST(BootstrapErrors, RankZeroShortOfMemoryToAcceptRestsThenAdmits) {
#if defined(EPCOMM_UNDER_SANITIZER)
  GTEST_SKIP() << "not under the sanitizers: their runtime intercepts accept4 itself";
#else
  constexpr auto kShortOfMemory = 300ms;
  const TempDir dir;
  const std::string address = "unix:" + dir.file("job.sock");
  accepts_refused = 0;
  accept_short_of_memory_until = (Clock::now() + kShortOfMemory).time_since_epoch().count();
  Result root, peer;
  std::thread rank0([&] { root = attempt([&] { run_rank(address, 0, 2, with_secret("s")); }); });
  std::thread rank1([&] { peer = attempt([&] { run_rank(address, 1, 2, with_secret("s")); }); });
  rank0.join();
  rank1.join();
  accept_short_of_memory_until = 0;
  EXPECT_TRUE(root.ok) << root.message;
  EXPECT_TRUE(peer.ok) << peer.message;
  // One try per 10 ms rest (with slack for a slow machine), not one per turn of a busy loop.
  EXPECT_LE(accepts_refused.load(), 2 * (kShortOfMemory / 10ms) + 10);
#endif
}

}  // namespace
}  // namespace epcomm
