#include "precompress.hpp"

#include <algorithm>
#include <atomic>

#include "pdtrain/ckpt/codec.hpp"
#include "pdtrain/ckpt/zstd_filter.hpp"
#include "pdtrain/core/crc32c.hpp"

namespace pdtrain::ckpt::detail {
namespace {

std::atomic<const PrecompressedChunks*> g_active{nullptr};
std::atomic<std::int64_t> g_hits{0}, g_misses{0};
std::atomic<bool> g_counting{false};

std::uint64_t key_of(std::size_t n, std::uint32_t crc) {
  return (static_cast<std::uint64_t>(n) << 32) ^ crc;
}

// True if `shuffled` is HDF5's shuffle of `source` (compared in place, no second buffer).
bool equals_shuffled(const unsigned char* shuffled, const unsigned char* source, std::size_t n,
                     std::size_t elem) {
  const std::size_t count = elem == 0 ? 0 : n / elem;
  if (elem <= 1 || count <= 1) return std::equal(source, source + n, shuffled);
  for (std::size_t j = 0; j < elem; ++j) {
    const unsigned char* row = shuffled + j * count;
    for (std::size_t i = 0; i < count; ++i)
      if (row[i] != source[i * elem + j]) return false;
  }
  const std::size_t done = count * elem;
  return std::equal(source + done, source + n, shuffled + done);
}

bool lookup(const void* in, std::size_t n, const void** frame, std::size_t* frame_size) {
  const PrecompressedChunks* set = g_active.load(std::memory_order_acquire);
  const bool found = set && set->find(in, n, frame, frame_size);
  if (g_counting.load(std::memory_order_relaxed)) ++(found ? g_hits : g_misses);
  return found;
}

}  // namespace

void PrecompressedChunks::add(const void* source, std::size_t n, std::size_t elem, int level) {
  std::vector<unsigned char> shuffled(n);
  shuffle_bytes(source, n, elem, shuffled.data());
  const std::uint32_t crc = crc32c(shuffled.data(), n);
  Entry e{static_cast<const unsigned char*>(source), elem,
          zstd_compress_frame(shuffled.data(), n, level)};
  if (e.frame.empty()) return;  // compression failed: the filter will compress it at write time
  entries_.emplace(key_of(n, crc), std::move(e));
  ++count_;
}

bool PrecompressedChunks::find(const void* in, std::size_t n, const void** frame,
                               std::size_t* frame_size) const {
  if (entries_.empty()) return false;
  const auto* bytes = static_cast<const unsigned char*>(in);
  auto [lo, hi] = entries_.equal_range(key_of(n, crc32c(in, n)));
  for (auto it = lo; it != hi; ++it) {
    if (!equals_shuffled(bytes, it->second.source, n, it->second.elem)) continue;
    *frame = it->second.frame.data();
    *frame_size = it->second.frame.size();
    return true;
  }
  return false;
}

void PrecompressedChunks::activate(const PrecompressedChunks* set) {
  g_active.store(set, std::memory_order_release);
}
void PrecompressedChunks::reset_counters() {
  g_hits = 0;
  g_misses = 0;
}
PrecompressedChunks::Counting::Counting() { g_counting = true; }
PrecompressedChunks::Counting::~Counting() { g_counting = false; }
std::int64_t PrecompressedChunks::hits() { return g_hits.load(); }
std::int64_t PrecompressedChunks::misses() { return g_misses.load(); }
void PrecompressedChunks::install() { set_precompressed_lookup(&lookup); }

}  // namespace pdtrain::ckpt::detail
