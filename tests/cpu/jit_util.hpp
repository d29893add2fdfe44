// Helpers of the JIT tests: a scratch cache directory for tests of the cache
// itself, and a check that a compiled image is a cubin (ELF).
//
// Tests that only need kernels compiled use the run's shared cache
// (jit::KernelCache with no directory: TESSERA_CACHE_DIR, else the user's
// cache), so `tessera compile`, the C++ tests and the Python tests of one run
// compile each kernel once. Tests that check what the cache does (cold vs
// warm, compile counts, error paths) need a directory of their own.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace tessera::test {

// An empty directory under the system temp dir, removed with the object.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("tessera_test_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline bool is_elf(const std::vector<char>& image) {
  return image.size() > 4 && image[0] == 0x7f && image[1] == 'E' && image[2] == 'L' && image[3] == 'F';
}

}  // namespace tessera::test
