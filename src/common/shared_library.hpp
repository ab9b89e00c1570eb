// A library opened with dlopen, closed when this goes out of scope. Code that probes optional
// libraries (NVML, NVSHMEM) must not fail when they are absent, so opening never throws: check
// `ok()`, and `error()` says why not.
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <string>

namespace epcomm::detail {

class SharedLibrary {
 public:
  explicit SharedLibrary(const std::string& name) : handle_(dlopen(name.c_str(), RTLD_LAZY | RTLD_LOCAL)) {
    if (handle_ == nullptr) {
      const char* message = dlerror();
      error_ = message != nullptr ? message : name + ": cannot be loaded";
    }
  }
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  ~SharedLibrary() {
    if (handle_ != nullptr) dlclose(handle_);
  }

  bool ok() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }

  // The function `name`, or nullptr if the library does not export it.
  template <typename Function>
  Function symbol(const char* name) const {
    return handle_ != nullptr ? reinterpret_cast<Function>(dlsym(handle_, name)) : nullptr;
  }

  // The file the loader actually opened (the soname alone does not say where it was found).
  std::string path() const {
    link_map* map = nullptr;
    if (handle_ == nullptr || dlinfo(handle_, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr) {
      return "";
    }
    return map->l_name;
  }

 private:
  void* handle_ = nullptr;
  std::string error_;
};

}  // namespace epcomm::detail
