// A fresh private directory for one test (sockets, files written by ranks), removed with
// everything in it when the test ends.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace epcomm::test_support {

class TempDir {
 public:
  TempDir() {
    // Unix socket paths must stay under 108 bytes, so prefer a short base directory.
    constexpr size_t kMaxBaseLength = 60;
    const char* tmpdir = std::getenv("TMPDIR");
    const std::string base = (tmpdir && *tmpdir && std::strlen(tmpdir) < kMaxBaseLength) ? tmpdir : "/tmp";
    std::string pattern = base + "/epcomm-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + pattern);
    }
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace epcomm::test_support
