// histogram.h: a log-linear latency histogram (the HdrHistogram layout), header-only.
//
// Design: Debian bookworm packages no C/C++ HdrHistogram (only Go and Java ones), so this
// is the same idea in ~80 lines. Values (nanoseconds) below 2^kSubBits are counted
// exactly; above, each power of two is split into 2^(kSubBits-1) equal buckets, so a
// bucket is at most 1/2^(kSubBits-1) of its value wide: with kSubBits = 8 every reported
// value is within 0.4% (half a bucket) of the recorded one. Recording is an index
// computation and an increment (no allocation, no floating point), so the load
// generator can record every response. Percentiles are nearest-rank, reported as the
// middle of the bucket that holds the rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kv {

class Histogram {
 public:
  static constexpr int kSubBits = 8;
  static constexpr uint64_t kSub = 1ULL << kSubBits;  // exact below this
  static constexpr uint64_t kHalf = kSub / 2;         // buckets per power of two above
  static constexpr int kMaxExp = 44;                  // ~4.9 hours in ns; larger values clamp

  Histogram() : counts_(index(~0ULL) + 1, 0) {}

  static size_t index(uint64_t v) {
    if (v < kSub) return static_cast<size_t>(v);
    int msb = 63 - __builtin_clzll(v);
    int e = msb - (kSubBits - 1);  // v >> e is in [kHalf, kSub)
    if (e > kMaxExp) return index((kSub - 1) << kMaxExp);
    return static_cast<size_t>(kSub + (e - 1) * kHalf + ((v >> e) - kHalf));
  }
  // The smallest value of bucket i and the bucket's width.
  static uint64_t lower(size_t i) {
    if (i < kSub) return i;
    uint64_t e = (i - kSub) / kHalf + 1, m = (i - kSub) % kHalf + kHalf;
    return m << e;
  }
  static uint64_t width(size_t i) { return i < kSub ? 1 : 1ULL << ((i - kSub) / kHalf + 1); }

  void record(uint64_t v) {
    counts_[index(v)]++;
    n_++;
    sum_ += static_cast<double>(v);
    max_ = std::max(max_, v);
    min_ = std::min(min_, v);
  }
  void merge(const Histogram& o) {
    for (size_t i = 0; i < counts_.size(); i++) counts_[i] += o.counts_[i];
    n_ += o.n_;
    sum_ += o.sum_;
    max_ = std::max(max_, o.max_);
    min_ = std::min(min_, o.min_);
  }

  uint64_t count() const { return n_; }
  uint64_t max() const { return n_ ? max_ : 0; }
  uint64_t min() const { return n_ ? min_ : 0; }
  double mean() const { return n_ ? sum_ / static_cast<double>(n_) : 0.0; }

  // Nearest-rank percentile, p in [0, 100]; 0 if empty. The exact maximum for p = 100.
  double percentile(double p) const {
    if (n_ == 0) return 0;
    if (p >= 100) return static_cast<double>(max_);
    uint64_t rank = static_cast<uint64_t>(std::ceil(p / 100.0 * static_cast<double>(n_)));
    rank = std::max<uint64_t>(rank, 1);
    uint64_t seen = 0;
    for (size_t i = 0; i < counts_.size(); i++) {
      seen += counts_[i];
      if (seen >= rank) {
        double mid = static_cast<double>(lower(i)) + static_cast<double>(width(i) - 1) / 2.0;
        // Never report outside what was recorded.
        return std::clamp(mid, static_cast<double>(min_), static_cast<double>(max_));
      }
    }
    return static_cast<double>(max_);
  }

 private:
  std::vector<uint64_t> counts_;
  uint64_t n_ = 0, max_ = 0, min_ = ~0ULL;
  double sum_ = 0;
};

}  // namespace kv
