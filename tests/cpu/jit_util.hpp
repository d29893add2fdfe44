// Helpers of the JIT tests: a fresh cache directory per test and a check
// that a compiled image is a cubin (ELF).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace tessera::test {

inline std::filesystem::path fresh_dir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("tessera_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

inline bool is_elf(const std::vector<char>& image) {
  return image.size() > 4 && image[0] == 0x7f && image[1] == 'E' && image[2] == 'L' && image[3] == 'F';
}

}  // namespace tessera::test
