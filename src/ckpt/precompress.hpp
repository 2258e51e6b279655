#pragma once
// Chunks compressed ahead of the write (private to the checkpoint library).
//
// Debian's parallel HDF5 cannot write pre-compressed chunks in parallel (H5Dwrite_chunk is
// serial-only), and compression inside the collective H5Dwrite would put the expensive part of
// an asynchronous checkpoint back on the holder's critical path. So the background encoder
// shuffles and compresses every chunk that is exactly one of this holder's blocks, and during
// the collective write the zstd filter, handed the same shuffled bytes by HDF5, looks them up
// here and copies the frame instead of compressing. A hit is verified byte for byte against
// the block it came from, so a lookup can never substitute the wrong data.
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace pdtrain::ckpt::detail {

class PrecompressedChunks {
 public:
  // Shuffles `n` bytes of `source` (elements of `elem` bytes, as HDF5's shuffle filter would;
  // elem = 1 means no shuffle) and compresses them. `source` must stay valid and unchanged
  // while this object is active.
  void add(const void* source, std::size_t n, std::size_t elem, int level);
  std::size_t size() const { return count_; }

  // Makes this set the one the zstd filter consults (nullptr: none). Single writer thread.
  static void activate(const PrecompressedChunks* set);
  // Counters of the filter since the last reset, while a Counting lives: frames taken from the
  // active set, and chunks the filter had to compress itself. (Parallel HDF5 also runs the
  // filter on a fill-value chunk when it creates a dataset; that is not data and not counted.)
  struct Counting {
    Counting();
    ~Counting();
  };
  static void reset_counters();
  static std::int64_t hits();
  static std::int64_t misses();
  // Installs the lookup in the zstd filter (once, by ensure_hdf5_ready).
  static void install();

  bool find(const void* in, std::size_t n, const void** frame, std::size_t* frame_size) const;

 private:
  struct Entry {
    const unsigned char* source;
    std::size_t elem;
    std::vector<char> frame;
  };
  std::unordered_multimap<std::uint64_t, Entry> entries_;  // key: (size, crc32c of shuffled)
  std::size_t count_ = 0;
};

}  // namespace pdtrain::ckpt::detail
