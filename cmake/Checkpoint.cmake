# Checkpoints: parallel HDF5, the codecs, and the zstd HDF5 filter (id 32015) both built in
# (pdtrain_ckpt) and as a plugin for HDF5's tools (build/hdf5-plugins/libpdtrain_h5zstd.so).
# Included by the top-level CMakeLists.txt after pdtrain_part() is defined.

set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "pdtrain: checkpoints need a parallel (MPI) HDF5; found a serial one "
                      "(${HDF5_C_INCLUDE_DIRS}). On Debian: apt-get install libhdf5-openmpi-dev")
endif()
# HDF5_IS_PARALLEL comes from h5pcc; check the header says so too (the library we compile against).
include(CheckSymbolExists)
set(CMAKE_REQUIRED_INCLUDES ${HDF5_C_INCLUDE_DIRS})
get_target_property(_pdt_mpi_inc MPI::MPI_CXX INTERFACE_INCLUDE_DIRECTORIES)
if(_pdt_mpi_inc)
  list(APPEND CMAKE_REQUIRED_INCLUDES ${_pdt_mpi_inc})
endif()
check_symbol_exists(H5_HAVE_PARALLEL "H5pubconf.h" PDTRAIN_HDF5_HAVE_PARALLEL)
unset(CMAKE_REQUIRED_INCLUDES)
if(NOT PDTRAIN_HDF5_HAVE_PARALLEL)
  message(FATAL_ERROR "pdtrain: ${HDF5_C_INCLUDE_DIRS}/H5pubconf.h lacks H5_HAVE_PARALLEL")
endif()
message(STATUS "pdtrain: parallel HDF5 ${HDF5_VERSION} from ${HDF5_C_INCLUDE_DIRS}")

add_library(pdtrain::hdf5 INTERFACE IMPORTED GLOBAL)
target_include_directories(pdtrain::hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS})
target_link_libraries(pdtrain::hdf5 INTERFACE ${HDF5_C_LIBRARIES} MPI::MPI_CXX)
target_compile_definitions(pdtrain::hdf5 INTERFACE ${HDF5_C_DEFINITIONS})

pdtrain_part(ckpt DEPS pdtrain_core pdtrain_io pdtrain_model pdtrain_optim pdtrain::hdf5 pdtrain::zstd)

# The plugin: the same filter source, exporting H5PLget_plugin_type/H5PLget_plugin_info only.
# It links zstd but not HDF5 (h5dump links the serial HDF5; a second HDF5 must not load).
set(PDTRAIN_HDF5_PLUGIN_DIR ${CMAKE_BINARY_DIR}/hdf5-plugins)
add_library(pdtrain_h5zstd MODULE ${CMAKE_CURRENT_SOURCE_DIR}/src/ckpt/zstd_filter.cpp
                                  ${CMAKE_CURRENT_SOURCE_DIR}/src/ckpt/plugin/h5zstd_plugin.cpp)
target_include_directories(pdtrain_h5zstd PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_include_directories(pdtrain_h5zstd SYSTEM PRIVATE ${HDF5_C_INCLUDE_DIRS} ${_pdt_mpi_inc})
target_link_libraries(pdtrain_h5zstd PRIVATE pdtrain::zstd)
target_compile_options(pdtrain_h5zstd PRIVATE -Wall -Wextra)
set_target_properties(pdtrain_h5zstd PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${PDTRAIN_HDF5_PLUGIN_DIR}
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON)

if(TARGET pdtrain_ckpt)
  target_compile_definitions(pdtrain_ckpt PRIVATE
    PDTRAIN_HDF5_PLUGIN_DIR="${PDTRAIN_HDF5_PLUGIN_DIR}")
  # Whatever links the checkpoint library can hand the plugin to h5dump.
  add_dependencies(pdtrain_ckpt pdtrain_h5zstd)
endif()
