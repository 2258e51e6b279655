// Entry points of libpdtrain_h5zstd.so, the zstd filter as an HDF5 dynamic plugin: HDF5
// tools (h5dump, h5ls -d, h5repack) load it from HDF5_PLUGIN_PATH to decode zstd checkpoints.
// Everything else in the library is hidden (-fvisibility=hidden).
#include <H5PLextern.h>

#include "pdtrain/ckpt/zstd_filter.hpp"

extern "C" {
H5PLUGIN_DLL H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }
H5PLUGIN_DLL const void* H5PLget_plugin_info(void) { return pdtrain::ckpt::zstd_filter_class(); }
}
