// epcomm-check-env run as a real process, with every GPU hidden so the outcome does not depend on
// the machine: exit codes and what it prints.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/json_checker.hpp"
#include "common/temp_dir.hpp"

extern char** environ;

namespace epcomm::tools {
namespace {

using test_support::JsonChecker;
using test_support::TempDir;

constexpr const char* kCheckEnvPath = EPCOMM_CHECK_ENV_PATH;
constexpr int kExitCannotWork = 1;
constexpr int kExitUsage = 2;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs epcomm-check-env with `args` and this process's environment plus CUDA_VISIBLE_DEVICES=""
// (which hides every GPU, so the outcome is the same with or without one).
RunResult run_check_env(const std::vector<std::string>& args) {
  const TempDir dir;
  const std::string output_path = dir.file("output.txt");
  std::vector<std::string> strings = {kCheckEnvPath};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& text : strings) argv.push_back(text.data());
  argv.push_back(nullptr);
  std::vector<std::string> variables = {"CUDA_VISIBLE_DEVICES="};
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, "CUDA_VISIBLE_DEVICES=", std::strlen("CUDA_VISIBLE_DEVICES=")) != 0) {
      variables.emplace_back(*entry);
    }
  }
  std::vector<char*> envp;
  for (std::string& text : variables) envp.push_back(text.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, kCheckEnvPath, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  RunResult result;
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << kCheckEnvPath << ": " << std::strerror(rc);
    return result;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) == pid && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  std::ifstream in(output_path);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  return result;
}

TEST(CheckEnvBinary, NoGpuExitsOneAndSaysSo) {
  const RunResult run = run_check_env({});
  EXPECT_EQ(run.exit_code, kExitCannotWork) << run.output;
  EXPECT_TRUE(contains(run.output, "no CUDA GPU")) << run.output;
  EXPECT_TRUE(contains(run.output, "cannot work")) << run.output;
}

TEST(CheckEnvBinary, JsonOutput) {
  const RunResult run = run_check_env({"--json", "--ranks", "2"});
  EXPECT_EQ(run.exit_code, kExitCannotWork) << run.output;
  std::string json = run.output;
  while (!json.empty() && std::isspace(static_cast<unsigned char>(json.back()))) json.pop_back();
  EXPECT_TRUE(JsonChecker(json).is_one_object()) << run.output;
  EXPECT_TRUE(contains(json, "\"intended_ranks\": 2")) << json;
  EXPECT_TRUE(contains(json, "no CUDA GPU")) << json;
}

TEST(CheckEnvBinary, UsageErrorsExitTwo) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--ranks", "0"}, {"--ranks"}, {"--ranks=abc"}, {"--ranks", "1025"}, {"--bogus"}}) {
    const RunResult run = run_check_env(args);
    EXPECT_EQ(run.exit_code, kExitUsage) << args.front() << ": " << run.output;
    EXPECT_TRUE(contains(run.output, "Usage") || contains(run.output, "--help")) << run.output;
  }
  const RunResult help = run_check_env({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.output, "Usage: epcomm-check-env")) << help.output;
}

}  // namespace
}  // namespace epcomm::tools
