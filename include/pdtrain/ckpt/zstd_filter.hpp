#pragma once
// The Zstandard HDF5 filter, id 32015 (the id The HDF Group registered for Zstandard). A chunk
// is stored as one plain zstd frame with its content size in the header, so files written here
// decode with any standard H5Z-ZSTD plugin and vice versa. cd_values[0] is the compression
// level (3 when absent).
//
// The same source builds into pdtrain_ckpt (registered in-process with H5Zregister) and into
// the plugin libpdtrain_h5zstd.so (build/hdf5-plugins), so that
//   HDF5_PLUGIN_PATH=build/hdf5-plugins h5dump ckpt-00000100.h5
// shows checkpoints. The filter itself calls no HDF5 function (the plugin must not pull a
// second HDF5 into h5dump, which links the serial library).
#include <hdf5.h>  // types only: H5Zpublic.h needs H5public.h and H5Ipublic.h first

#include <cstddef>
#include <vector>

namespace pdtrain::ckpt {

constexpr H5Z_filter_t kZstdFilterId = 32015;
constexpr unsigned kDefaultZstdLevel = 3;

// The filter's class (version H5Z_CLASS_T_VERS).
const H5Z_class2_t* zstd_filter_class();

// Compresses `n` bytes into one zstd frame at `level` (what the filter stores for that input).
std::vector<char> zstd_compress_frame(const void* in, std::size_t n, int level);

// In-process hook: before compressing a chunk, the filter asks it for a frame prepared earlier
// (the asynchronous writer compresses in a background thread). It returns true and sets
// *frame/*frame_size (memory the hook keeps owning) when it has the frame for exactly these
// bytes. Null in the plugin.
using PrecompressedLookup = bool (*)(const void* in, std::size_t n, const void** frame,
                                     std::size_t* frame_size);
void set_precompressed_lookup(PrecompressedLookup lookup);

// Where this build put libpdtrain_h5zstd.so (for HDF5_PLUGIN_PATH); "" if unknown.
const char* built_plugin_dir();

}  // namespace pdtrain::ckpt
