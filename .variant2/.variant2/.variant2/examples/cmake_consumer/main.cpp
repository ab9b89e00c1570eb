// The smallest program against an installed epcomm: it checks a set of options the way a Buffer
// would and reports the library's version. With a GPU and ranks (epcomm-launch -n N), the README's
// C++ example goes on from here.
#include <cstdio>

#include <epcomm/epcomm.hpp>

int main() {
  epcomm::BufferOptions options;
  options.num_nvl_bytes = 256 << 20;
  try {
    options.validate(/*num_ranks=*/8);
    options.num_nvl_bytes = 1000;  // not a multiple of 128: refused, naming the field and value
    options.validate(8);
  } catch (const epcomm::Error& error) {
    std::printf("epcomm %s: a bad option is refused: %s\n", epcomm::Buffer::version().c_str(), error.what());
    return 0;
  }
  std::printf("epcomm accepted num_nvl_bytes=1000\n");
  return 1;
}
