// A Kubernetes ConfigMap volume, updated on a real directory exactly as the kubelet's
// AtomicWriter (pkg/volume/util/atomic_writer.go) updates it: the files of a version go
// into a new timestamped directory `..2026_11_26_16_00_00.N`, a symlink `..data_tmp` to
// it is renamed over `..data` (the one atomic step), the keys' symlinks `KEY ->
// ..data/KEY` are made for new keys and removed for gone ones, and the old timestamped
// directory is removed. For syrupd's --config_watch tests and the config-swap benchmark.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

namespace syrup::test {

class ConfigMapDir {
 public:
  explicit ConfigMapDir(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }
  std::string path(const std::string& key) const { return dir_ + "/" + key; }

  // Publishes a version (key -> contents). Returns the time of the swap, or the epoch if
  // a step failed (errno set).
  std::chrono::steady_clock::time_point publish(const std::map<std::string, std::string>& files) {
    namespace fs = std::filesystem;
    char ts[64];
    std::snprintf(ts, sizeof ts, "..2026_11_26_16_00_00.%09d", ++n_);
    std::string ts_dir = dir_ + "/" + ts;
    if (mkdir(ts_dir.c_str(), 0755) < 0) return {};
    for (auto& [key, text] : files) std::ofstream(ts_dir + "/" + key, std::ios::binary) << text;
    std::string tmp = dir_ + "/..data_tmp";
    unlink(tmp.c_str());
    if (symlink(ts, tmp.c_str()) < 0) return {};
    if (rename(tmp.c_str(), (dir_ + "/..data").c_str()) < 0) return {};
    auto swapped = std::chrono::steady_clock::now();
    std::set<std::string> keys;
    for (auto& [key, text] : files) {
      keys.insert(key);
      struct stat st;
      if (lstat(path(key).c_str(), &st) < 0 && symlink(("..data/" + key).c_str(), path(key).c_str()) < 0) return {};
    }
    for (auto& old : keys_)
      if (!keys.count(old)) unlink(path(old).c_str());
    keys_ = std::move(keys);
    std::error_code ec;
    if (!old_.empty()) fs::remove_all(dir_ + "/" + old_, ec);
    old_ = ts;
    return swapped;
  }

 private:
  std::string dir_, old_;
  std::set<std::string> keys_;
  int n_ = 0;
};

}  // namespace syrup::test
