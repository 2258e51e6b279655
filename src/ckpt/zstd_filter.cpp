// The zstd HDF5 filter (id 32015). Built into pdtrain_ckpt and into the h5dump plugin, so it
// uses no HDF5 function: buffers are malloc'ed/free'd, which is what HDF5's own allocator
// does in release builds and what every third-party filter plugin relies on.
#include "pdtrain/ckpt/zstd_filter.hpp"

#include <zstd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace pdtrain::ckpt {
namespace {

std::atomic<PrecompressedLookup> g_lookup{nullptr};

int level_of(std::size_t cd_nelmts, const unsigned cd_values[]) {
  if (cd_nelmts < 1) return static_cast<int>(kDefaultZstdLevel);
  const int level = static_cast<int>(cd_values[0]);
  return level < ZSTD_minCLevel() || level > ZSTD_maxCLevel() ? static_cast<int>(kDefaultZstdLevel)
                                                              : level;
}

// One compression context per thread: the background encoder and the writing thread may
// compress at the same time.
ZSTD_CCtx* thread_cctx() {
  struct Holder {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ~Holder() { ZSTD_freeCCtx(c); }
  };
  thread_local Holder h;
  return h.c;
}

// Replaces *buf by a new buffer holding `n` bytes of `data`.
std::size_t replace_buffer(const void* data, std::size_t n, std::size_t* buf_size, void** buf) {
  void* out = std::malloc(n == 0 ? 1 : n);
  if (!out) return 0;
  std::memcpy(out, data, n);
  std::free(*buf);
  *buf = out;
  *buf_size = n == 0 ? 1 : n;
  return n;
}

std::size_t compress(std::size_t cd_nelmts, const unsigned cd_values[], std::size_t nbytes,
                     std::size_t* buf_size, void** buf) {
  const PrecompressedLookup lookup = g_lookup.load(std::memory_order_acquire);
  const void* frame = nullptr;
  std::size_t frame_size = 0;
  if (lookup && lookup(*buf, nbytes, &frame, &frame_size))
    return replace_buffer(frame, frame_size, buf_size, buf);
  const std::size_t bound = ZSTD_compressBound(nbytes);
  void* out = std::malloc(bound);
  if (!out) return 0;
  const std::size_t n = ZSTD_compressCCtx(thread_cctx(), out, bound, *buf, nbytes,
                                          level_of(cd_nelmts, cd_values));
  if (ZSTD_isError(n)) {
    std::free(out);
    return 0;
  }
  std::free(*buf);
  *buf = out;
  *buf_size = bound;
  return n;
}

std::size_t decompress(std::size_t nbytes, std::size_t* buf_size, void** buf) {
  const unsigned long long size = ZSTD_getFrameContentSize(*buf, nbytes);
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return 0;
  void* out = std::malloc(size == 0 ? 1 : static_cast<std::size_t>(size));
  if (!out) return 0;
  const std::size_t n = ZSTD_decompress(out, static_cast<std::size_t>(size), *buf, nbytes);
  if (ZSTD_isError(n) || n != size) {  // damaged frame: HDF5 reports the read as failed
    std::free(out);
    return 0;
  }
  std::free(*buf);
  *buf = out;
  *buf_size = size == 0 ? 1 : static_cast<std::size_t>(size);
  return n;
}

// HDF5's filter callback: returns the new data size, 0 on failure.
std::size_t zstd_filter(unsigned flags, std::size_t cd_nelmts, const unsigned cd_values[],
                        std::size_t nbytes, std::size_t* buf_size, void** buf) {
  if (flags & H5Z_FLAG_REVERSE) return decompress(nbytes, buf_size, buf);
  return compress(cd_nelmts, cd_values, nbytes, buf_size, buf);
}

const H5Z_class2_t kClass = {
    H5Z_CLASS_T_VERS, kZstdFilterId, 1, 1, "zstd (pdtrain)", nullptr, nullptr, zstd_filter,
};

}  // namespace

const H5Z_class2_t* zstd_filter_class() { return &kClass; }

std::vector<char> zstd_compress_frame(const void* in, std::size_t n, int level) {
  std::vector<char> out(ZSTD_compressBound(n));
  const std::size_t k = ZSTD_compressCCtx(thread_cctx(), out.data(), out.size(), in, n, level);
  if (ZSTD_isError(k)) return {};
  out.resize(k);
  return out;
}

void set_precompressed_lookup(PrecompressedLookup lookup) {
  g_lookup.store(lookup, std::memory_order_release);
}

}  // namespace pdtrain::ckpt
