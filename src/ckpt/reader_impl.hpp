#pragma once
// The checkpoint reader's internals, shared by read_checkpoint, find_latest_valid and inspect
// (private).
#include <hdf5.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "geometry.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/ckpt/h5_check.hpp"

namespace pdtrain::ckpt::detail {

std::string hex32(std::uint32_t x);
std::string shape_text(const ModelShape& s);
// The root attributes; throws Error(data) unless the file is a pdtrain checkpoint of a
// supported format version.
CheckpointMeta read_meta_of(hid_t file, const std::string& path);
// Throws Error(data) unless the checkpoint is complete and fits the catalogue's model.
void check_usable(const CheckpointMeta& m, const ParamCatalog& catalog);

// Damaged blocks found so far; when a reader has one, it lists problems instead of throwing
// at the first (inspect reports every damaged block).
using Problems = std::vector<std::string>;

// One open checkpoint file (read-only, POSIX driver), local to this process.
class BlockReader {
 public:
  BlockReader(std::string path, const ParamCatalog& catalog, Problems* problems);
  const CheckpointMeta& meta() const { return meta_; }
  hid_t file() const { return file_; }
  // Decodes and verifies blocks `ids` (resolving the anchor of a delta). Damaged blocks are
  // left out when collecting problems.
  std::map<int, BlockState> read(const std::vector<int>& ids);

 private:
  void report(const Error& e, int id);
  std::vector<std::uint32_t> read_small(const std::string& name, std::size_t n, H5T_class_t cls);
  std::map<int, std::vector<std::uint32_t>> read_state(int k, bool xored,
                                                       const std::vector<int>& ids);
  // A bitdelta per-block dataset group/<tensor> [blocks, width]: codes of `bits` bits (uint8),
  // or with bits = 0 the scale pairs (uint32); the rows of blocks `ids`.
  template <class T>
  std::map<int, std::vector<T>> read_rows(const std::string& group, std::size_t bits,
                                          const std::vector<int>& ids);

  std::string path_;
  const ParamCatalog& catalog_;
  std::vector<TensorGeom> geom_;
  Problems* problems_;
  H5Id file_;
  CheckpointMeta meta_;
  std::set<int> bad_;
};

}  // namespace pdtrain::ckpt::detail
