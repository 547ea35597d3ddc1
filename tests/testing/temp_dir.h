// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_TESTS_TESTING_TEMP_DIR_H_
#define REPVAR_TESTS_TESTING_TEMP_DIR_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace repvar::testing {

// A fresh directory under $TMPDIR (real files, real fsync), removed on
// destruction unless $REPVAR_KEEP_TEST_DIRS is set.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "repvar-test-XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    path_ = p != nullptr ? p : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    if (std::getenv("REPVAR_KEEP_TEST_DIRS") != nullptr) return;
    if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_TEMP_DIR_H_
