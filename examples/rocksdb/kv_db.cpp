// kv_db.cpp: see kv_db.h. RocksDB's C++ API (Debian's librocksdb-dev 7.8).
#include "kv_db.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <vector>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include "kv_clock.h"
#include "kv_proto.h"

namespace kv {
namespace {

// The key that records what was loaded. "0..." sorts before every "k..." key, so no SCAN
// ever reaches it.
const char kMetaKey[] = "0meta:keys";

rocksdb::Options make_options(const std::shared_ptr<rocksdb::Cache>& cache) {
  rocksdb::Options o;
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = cache;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  // One background job is plenty for a one-off load, and keeps the load from taking
  // both cores of a small machine.
  o.max_background_jobs = 1;
  o.compression = rocksdb::kNoCompression;  // CPU per GET should be RocksDB's lookup, not zlib
  o.info_log_level = rocksdb::WARN_LEVEL;
  o.keep_log_file_num = 1;
  return o;
}

}  // namespace

Db::Db() = default;
Db::~Db() { close(); }

void Db::close() {
  delete db_;
  db_ = nullptr;
}

int Db::build(const DbConfig& cfg, std::string* err) {
  rocksdb::Options o = make_options(cache_);
  o.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, cfg.path, &raw);
  if (!s.ok()) {
    *err = "cannot open " + cfg.path + ": " + s.ToString();
    return -EIO;
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string meta;
  if (db->Get(rocksdb::ReadOptions(), kMetaKey, &meta).ok() && meta == std::to_string(cfg.keys))
    return 0;  // already loaded with this key count
  // A DB with another key count: drop everything before loading (a range delete covers
  // the "k..." keys; the meta key is rewritten at the end).
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;  // the load is followed by a flush; a crash just reloads
  db->DeleteRange(wo, db->DefaultColumnFamily(), "k", "l");
  char key[KV_KEY_LEN + 1], value[KV_VALUE_LEN];
  rocksdb::WriteBatch batch;
  for (uint64_t i = 0; i < cfg.keys; i++) {
    kv_key(i, key);
    kv_value(i, value);
    batch.Put(rocksdb::Slice(key, KV_KEY_LEN), rocksdb::Slice(value, KV_VALUE_LEN));
    if (batch.Count() == 1000 || i + 1 == cfg.keys) {
      s = db->Write(wo, &batch);
      if (!s.ok()) {
        *err = "load: " + s.ToString();
        return -EIO;
      }
      batch.Clear();
    }
  }
  s = db->Flush(rocksdb::FlushOptions());
  if (s.ok()) s = db->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr);
  // The meta key goes last and durably: it says the load completed.
  if (s.ok()) s = db->Put(rocksdb::WriteOptions(), kMetaKey, std::to_string(cfg.keys));
  if (s.ok()) s = db->Flush(rocksdb::FlushOptions());
  if (!s.ok()) {
    *err = "load: " + s.ToString();
    return -EIO;
  }
  return 1;
}

int Db::open(const DbConfig& cfg, bool* loaded, std::string* err) {
  close();
  cache_ = rocksdb::NewLRUCache(cfg.cache_mb << 20);
  int r = build(cfg, err);
  if (r < 0) return r;
  if (loaded) *loaded = r == 1;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(make_options(cache_), cfg.path, &raw);
  if (!s.ok()) {
    *err = "cannot open " + cfg.path + " read-only: " + s.ToString();
    return -EIO;
  }
  db_ = raw;
  keys_ = cfg.keys;
  // Warm the block cache with every block, so a GET never waits for the disk.
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  uint64_t n = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) n++;
  if (!it->status().ok()) {
    *err = "warm-up: " + it->status().ToString();
    return -EIO;
  }
  if (n != cfg.keys + 1) {
    *err = cfg.path + " holds " + std::to_string(n) + " entries, expected " + std::to_string(cfg.keys + 1);
    return -EIO;
  }
  return 0;
}

int Db::get(uint64_t key, char* out, size_t cap, uint32_t* len, uint64_t* digest) const {
  char k[KV_KEY_LEN + 1];
  kv_key(key, k);
  rocksdb::PinnableSlice v;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), db_->DefaultColumnFamily(),
                               rocksdb::Slice(k, KV_KEY_LEN), &v);
  if (s.IsNotFound()) return -ENOENT;
  if (!s.ok()) return -EIO;
  *len = static_cast<uint32_t>(v.size());
  memcpy(out, v.data(), std::min(cap, v.size()));
  *digest = kv_digest(KV_FNV_BASIS, v.data(), v.size());
  return 0;
}

int Db::scan(uint64_t key, uint32_t n, uint32_t* visited, uint64_t* digest,
             const std::function<void()>& after_key) const {
  char k[KV_KEY_LEN + 1];
  kv_key(key, k);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  uint64_t h = KV_FNV_BASIS;
  uint32_t count = 0;
  for (it->Seek(rocksdb::Slice(k, KV_KEY_LEN)); it->Valid() && count < n; it->Next()) {
    rocksdb::Slice kk = it->key(), vv = it->value();
    if (kk.size() == 0 || kk[0] != 'k') break;  // past the data keys
    h = kv_digest(h, kk.data(), kk.size());
    h = kv_digest(h, vv.data(), vv.size());
    count++;
    if (after_key) after_key();
  }
  if (!it->status().ok()) return -EIO;
  *visited = count;
  *digest = h;
  return 0;
}

int Db::calibrate(double ratio, Calibration* out) const {
  if (!db_ || keys_ == 0 || ratio < 1) return -EINVAL;
  uint64_t rng = 12345;
  char buf[KV_VALUE_LEN];
  uint32_t len;
  uint64_t dig, sink = 0;

  // The median of several rounds, so a preemption in one round does not skew it.
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> rounds;
  for (int r = 0; r < 7; r++) {
    const int n = 5000;
    uint64_t t0 = kv_now_ns();
    for (int i = 0; i < n; i++) {
      if (get(kv_mix64(&rng) % keys_, buf, sizeof buf, &len, &dig) == 0) sink += dig;
    }
    rounds.push_back(static_cast<double>(kv_now_ns() - t0) / n);
  }
  out->get_ns = median_of(rounds);

  // Per-key cost of a long SCAN, and the fixed cost (iterator, seek) of a 1-key SCAN.
  uint32_t long_n = static_cast<uint32_t>(std::min<uint64_t>(20000, keys_));
  rounds.clear();
  for (int r = 0; r < 7; r++) {
    uint32_t vis;
    uint64_t t0 = kv_now_ns();
    scan(kv_mix64(&rng) % (keys_ - long_n + 1), long_n, &vis, &dig);
    rounds.push_back(static_cast<double>(kv_now_ns() - t0));
    sink += dig;
  }
  double long_ns = median_of(rounds);
  rounds.clear();
  for (int r = 0; r < 7; r++) {
    const int n = 2000;
    uint32_t vis;
    uint64_t t0 = kv_now_ns();
    for (int i = 0; i < n; i++) scan(kv_mix64(&rng) % keys_, 1, &vis, &dig);
    rounds.push_back(static_cast<double>(kv_now_ns() - t0) / n);
    sink += dig;
  }
  out->scan_base_ns = median_of(rounds);
  out->key_ns = std::max(1.0, (long_ns - out->scan_base_ns) / long_n);

  // The socket work of a request, as the server does it: a datagram in, one out.
  int a = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), b = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (a < 0 || b < 0 || bind(b, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 ||
      getsockname(b, reinterpret_cast<sockaddr*>(&addr), &alen) < 0) {
    int e = -errno;
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
    return e;
  }
  rounds.clear();
  char msg[sizeof(kv_response) + KV_VALUE_LEN] = {};
  for (int r = 0; r < 7; r++) {
    const int n = 1000;
    uint64_t t0 = kv_now_ns();
    for (int i = 0; i < n; i++) {
      sendto(a, msg, sizeof(kv_request), 0, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      recv(b, msg, sizeof msg, 0);
    }
    rounds.push_back(static_cast<double>(kv_now_ns() - t0) / n);
  }
  ::close(a);
  ::close(b);
  out->io_ns = median_of(rounds);

  // scan_base + scan_len * key + io = ratio * (get + io)
  double want = ratio * (out->get_ns + out->io_ns) - out->io_ns - out->scan_base_ns;
  out->scan_len = static_cast<uint32_t>(
      std::clamp(std::llround(want / out->key_ns), 1LL, static_cast<long long>(keys_)));

  rounds.clear();
  for (int r = 0; r < 9; r++) {
    uint32_t vis;
    uint64_t t0 = kv_now_ns();
    scan(kv_mix64(&rng) % (keys_ - std::min<uint64_t>(keys_, out->scan_len) + 1), out->scan_len, &vis, &dig);
    rounds.push_back(static_cast<double>(kv_now_ns() - t0));
    sink += dig;
  }
  out->scan_ns = median_of(rounds);
  out->ratio = (out->scan_ns + out->io_ns) / (out->get_ns + out->io_ns);
  asm volatile("" ::"r"(sink));  // keep the measured work
  return 0;
}

}  // namespace kv
