#pragma once
// How the catalogue's blocks map onto the file's datasets (private).
//
// Each tensor is one dataset with its global llm.c shape: [rows, cols] or [rows] for
// non-layered tensors, [L, rows, cols] or [L, rows] for per-layer ones. The chunk shape is the
// largest block tile ([1, rows, cols] per layer), so when a tensor's blocks are equal -- the
// usual case -- every chunk is exactly one block. When rows or columns do not divide evenly
// by the head count, blocks differ by one row/column and a chunk can straddle two blocks;
// HDF5 then assembles that chunk from both writers (collective filtered I/O allows it).
#include <hdf5.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pdtrain/ckpt/codec.hpp"
#include "pdtrain/model/catalog.hpp"

namespace pdtrain::ckpt::detail {

struct TensorGeom {
  const TensorInfo* info = nullptr;
  int first_block = 0, n_blocks = 0;  // the tensor's blocks are ids [first, first + n)
  int rank = 0;                       // dataset rank, 1..3
  hsize_t dims[3] = {0, 0, 0}, chunk[3] = {0, 0, 0};
  std::int64_t chunk_rows = 0, chunk_cols = 0;
  std::size_t max_numel = 0;          // values of the largest block (bitdelta row widths)
  // bitdelta: the row widths of the tensor's per-block datasets (each row one block, padded)
  std::size_t code_row(int bits) const { return code_bytes(max_numel, bits); }
  std::size_t scale_row() const { return 2 * quant_groups(max_numel); }
  const std::string& name() const { return info->name; }
};

std::vector<TensorGeom> tensor_geometry(const ParamCatalog& catalog);

// The block's hyperslab (start, count) in its tensor's dataset.
void block_slab(const TensorGeom& g, const BlockInfo& b, hsize_t start[3], hsize_t count[3]);

// True when the block fills exactly one whole chunk (so its chunk is written by one holder
// from one block, which is what the background compressor can prepare).
bool block_is_chunk(const TensorGeom& g, const BlockInfo& b);

// Visits the rows of `blocks` (all of one tensor) in the dataset's row-major order, which is
// the order HDF5 walks a union of hyperslabs: fn(block, row within the block). Memory buffers
// for one H5Dwrite/H5Dread of several blocks are laid out in this order.
template <class F>
void for_each_file_row(std::vector<const BlockInfo*> blocks, F fn);

// Selects the union of the blocks' hyperslabs in `space` (H5S_SELECT_NONE when empty).
void select_blocks(hid_t space, const TensorGeom& g, const std::vector<const BlockInfo*>& blocks);

// A box of adjacent blocks: one regular hyperslab. HDF5 1.10 maps an irregular selection (a
// union of hyperslabs) onto chunks element by element, which made writing ten times slower
// than the I/O; a box is mapped chunk by chunk. Holders own contiguous runs of blocks, so
// their blocks of a tensor form a few boxes (a partial layer, whole layers, a partial layer).
struct Box {
  hsize_t start[3] = {0, 0, 0}, count[3] = {0, 0, 0};
  std::vector<const BlockInfo*> blocks;
  std::size_t numel = 0;
};
// Merges blocks (all of tensor g) into boxes, in the dataset's order.
std::vector<Box> boxes_of(const TensorGeom& g, std::vector<const BlockInfo*> blocks);
// The same for a bitdelta per-block dataset [blocks of the tensor, width]: runs of
// consecutive block ids.
std::vector<Box> row_boxes_of(const TensorGeom& g, std::vector<const BlockInfo*> blocks,
                              std::size_t width);
// Selects exactly `box` in `space`.
void select_box(hid_t space, const Box& box);

// A memory dataspace for `n` elements selected in `fspace`: of the same shape when the
// selection is one box (HDF5 then maps memory onto chunks box-wise; a 1-D buffer against a 3-D
// box is mapped element by element), 1-D otherwise; "none" when n = 0.
hid_t memory_space_for(hid_t fspace, std::size_t n);

// ---- implementation of the template

template <class F>
void for_each_file_row(std::vector<const BlockInfo*> blocks, F fn) {
  std::sort(blocks.begin(), blocks.end(), [](const BlockInfo* a, const BlockInfo* b) {
    if (a->layer != b->layer) return a->layer < b->layer;
    return a->col0 < b->col0;
  });
  std::size_t i = 0;
  while (i < blocks.size()) {
    std::size_t j = i;
    std::int64_t r0 = blocks[i]->row0, r1 = blocks[i]->row0 + blocks[i]->rows;
    while (j < blocks.size() && blocks[j]->layer == blocks[i]->layer) {
      r0 = std::min(r0, blocks[j]->row0);
      r1 = std::max(r1, blocks[j]->row0 + blocks[j]->rows);
      ++j;
    }
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::size_t k = i; k < j; ++k)  // by column within the row
        if (r >= blocks[k]->row0 && r < blocks[k]->row0 + blocks[k]->rows)
          fn(*blocks[k], r - blocks[k]->row0);
    i = j;
  }
}

}  // namespace pdtrain::ckpt::detail
