// kv_db.h: the RocksDB side of kv_server: create and load the database, serve GET and
// SCAN from it, and calibrate the SCAN length against the cost of a GET.
//
// Design: the database is built once (keys 0..n-1, see kv_proto.h for keys and values),
// flushed and compacted into sorted tables, then closed and reopened READ-ONLY for
// serving: a read-only RocksDB has no background flush or compaction threads that could
// steal the server's CPU in the middle of a measurement, takes no lock (tests and other
// readers can open it at the same time), and several server processes can serve the same
// files one after another without reloading. Everything is warmed into a block cache big
// enough for the whole data set, so a GET costs CPU, not I/O.
// Functions return 0 or -errno; a RocksDB failure is -EIO with its message in *err.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace rocksdb {
class DB;
class Cache;
}  // namespace rocksdb

namespace kv {

struct DbConfig {
  std::string path;
  uint64_t keys = 200000;
  uint64_t cache_mb = 256;
};

// What calibrate() measured (all times in nanoseconds, single-threaded, on the calling
// thread's CPU).
struct Calibration {
  double get_ns = 0;      // one GET: RocksDB Get of a random key
  double key_ns = 0;      // one step of a SCAN: Next(), key and value read, digest
  double scan_base_ns = 0;  // a SCAN's fixed part: NewIterator + Seek
  double io_ns = 0;       // the per-request socket work: recv + send of a loopback datagram
  uint32_t scan_len = 0;  // keys per SCAN for the requested ratio
  double scan_ns = 0;     // a SCAN of scan_len keys, measured
  double ratio = 0;       // (scan_ns + io_ns) / (get_ns + io_ns), measured
};

class Db {
 public:
  Db();
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Creates and loads the database if it is missing or holds another key count, then
  // opens it read-only and warms the cache. *loaded tells whether it was (re)built.
  int open(const DbConfig& cfg, bool* loaded, std::string* err);
  void close();
  uint64_t keys() const { return keys_; }

  // GET: copies the value (at most cap bytes) to out; *len is the value's full length.
  // 0, -ENOENT (no such key) or -EIO.
  int get(uint64_t key, char* out, size_t cap, uint32_t* len, uint64_t* digest) const;
  // SCAN: visits up to n keys from key on, in order; *visited and the digest of every
  // key and value visited (kv_proto.h). after_key, if set, runs after every key visited:
  // the server's way to give up the core in the middle of a long SCAN (yielding on a
  // shared core, or pacing to an emulated slow core's budget). 0 or -EIO.
  int scan(uint64_t key, uint32_t n, uint32_t* visited, uint64_t* digest,
           const std::function<void()>& after_key = {}) const;

  // Measures the costs above and picks scan_len so that a SCAN request costs `ratio`
  // GET requests, socket work included on both sides.
  int calibrate(double ratio, Calibration* out) const;

 private:
  int build(const DbConfig& cfg, std::string* err);

  rocksdb::DB* db_ = nullptr;
  std::shared_ptr<rocksdb::Cache> cache_;
  uint64_t keys_ = 0;
};

}  // namespace kv
