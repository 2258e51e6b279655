#include "geometry.hpp"

#include <algorithm>

#include "pdtrain/ckpt/codec.hpp"
#include "pdtrain/ckpt/h5_check.hpp"

namespace pdtrain::ckpt::detail {

std::vector<TensorGeom> tensor_geometry(const ParamCatalog& catalog) {
  std::vector<TensorGeom> out(catalog.tensors().size());
  for (std::size_t t = 0; t < out.size(); ++t) out[t].info = &catalog.tensors()[t];
  for (const BlockInfo& b : catalog.blocks()) {
    TensorGeom& g = out[static_cast<int>(b.tensor)];
    if (g.n_blocks++ == 0) g.first_block = b.id;
    g.chunk_rows = std::max(g.chunk_rows, b.rows);
    g.chunk_cols = std::max(g.chunk_cols, b.cols);
    g.max_numel = std::max(g.max_numel, static_cast<std::size_t>(b.numel()));
  }
  for (TensorGeom& g : out) {
    const TensorInfo& t = *g.info;
    const bool matrix = t.cols > 1;
    int k = 0;
    if (t.per_layer) {
      g.dims[k] = static_cast<hsize_t>(t.layers);
      g.chunk[k++] = 1;
    }
    g.dims[k] = static_cast<hsize_t>(t.rows);
    g.chunk[k++] = static_cast<hsize_t>(g.chunk_rows);
    if (matrix) {
      g.dims[k] = static_cast<hsize_t>(t.cols);
      g.chunk[k++] = static_cast<hsize_t>(g.chunk_cols);
    }
    g.rank = k;
  }
  return out;
}

void block_slab(const TensorGeom& g, const BlockInfo& b, hsize_t start[3], hsize_t count[3]) {
  int k = 0;
  if (g.info->per_layer) {
    start[k] = static_cast<hsize_t>(b.layer);
    count[k++] = 1;
  }
  start[k] = static_cast<hsize_t>(b.row0);
  count[k++] = static_cast<hsize_t>(b.rows);
  if (g.info->cols > 1) {
    start[k] = static_cast<hsize_t>(b.col0);
    count[k++] = static_cast<hsize_t>(b.cols);
  }
}

bool block_is_chunk(const TensorGeom& g, const BlockInfo& b) {
  return b.rows == g.chunk_rows && b.cols == g.chunk_cols && b.row0 % g.chunk_rows == 0 &&
         b.col0 % g.chunk_cols == 0;
}

void select_blocks(hid_t space, const TensorGeom& g, const std::vector<const BlockInfo*>& blocks) {
  H5_CHECK(H5Sselect_none(space));
  for (const BlockInfo* b : blocks) {
    hsize_t start[3], count[3];
    block_slab(g, *b, start, count);
    H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_OR, start, nullptr, count, nullptr));
  }
}

namespace {

// A box in (layer, row, col) coordinates while merging; layer -1 for non-layered tensors.
struct Span {
  std::int64_t l0, l1, r0, r1, c0, c1;
  std::vector<const BlockInfo*> blocks;
};

bool full_slice(const Span& s, const TensorInfo& t) {
  return s.r0 == 0 && s.r1 == t.rows && s.c0 == 0 && s.c1 == t.cols;
}

}  // namespace

std::vector<Box> boxes_of(const TensorGeom& g, std::vector<const BlockInfo*> blocks) {
  std::sort(blocks.begin(), blocks.end(), [](const BlockInfo* a, const BlockInfo* b) {
    if (a->layer != b->layer) return a->layer < b->layer;
    if (a->row0 != b->row0) return a->row0 < b->row0;
    return a->col0 < b->col0;
  });
  // Within a layer: row-split blocks stack by rows, column-split ones by columns.
  std::vector<Span> spans;
  for (const BlockInfo* b : blocks) {
    if (!spans.empty()) {
      Span& s = spans.back();
      const bool same_layer = s.l0 == b->layer && s.l1 == b->layer + 1;
      if (same_layer && b->col0 == s.c0 && b->col0 + b->cols == s.c1 && b->row0 == s.r1) {
        s.r1 += b->rows;
        s.blocks.push_back(b);
        continue;
      }
      if (same_layer && b->row0 == s.r0 && b->row0 + b->rows == s.r1 && b->col0 == s.c1) {
        s.c1 += b->cols;
        s.blocks.push_back(b);
        continue;
      }
    }
    spans.push_back({b->layer, b->layer + 1, b->row0, b->row0 + b->rows, b->col0,
                     b->col0 + b->cols, {b}});
  }
  // Whole consecutive layers stack into one box.
  std::vector<Span> merged;
  for (Span& s : spans) {
    if (!merged.empty() && merged.back().l1 == s.l0 && g.info->per_layer &&
        full_slice(merged.back(), *g.info) && full_slice(s, *g.info)) {
      merged.back().l1 = s.l1;
      merged.back().blocks.insert(merged.back().blocks.end(), s.blocks.begin(), s.blocks.end());
      continue;
    }
    merged.push_back(std::move(s));
  }
  std::vector<Box> out;
  for (const Span& s : merged) {
    Box box;
    int k = 0;
    if (g.info->per_layer) {
      box.start[k] = static_cast<hsize_t>(s.l0);
      box.count[k++] = static_cast<hsize_t>(s.l1 - s.l0);
    }
    box.start[k] = static_cast<hsize_t>(s.r0);
    box.count[k++] = static_cast<hsize_t>(s.r1 - s.r0);
    if (g.info->cols > 1) {
      box.start[k] = static_cast<hsize_t>(s.c0);
      box.count[k++] = static_cast<hsize_t>(s.c1 - s.c0);
    }
    box.blocks = s.blocks;
    for (const BlockInfo* b : s.blocks) box.numel += static_cast<std::size_t>(b->numel());
    out.push_back(std::move(box));
  }
  return out;
}

std::vector<Box> row_boxes_of(const TensorGeom& g, std::vector<const BlockInfo*> blocks,
                              std::size_t width) {
  std::sort(blocks.begin(), blocks.end(),
            [](const BlockInfo* a, const BlockInfo* b) { return a->id < b->id; });
  std::vector<Box> out;
  for (const BlockInfo* b : blocks) {
    const auto row = static_cast<hsize_t>(b->id - g.first_block);
    if (out.empty() || out.back().start[0] + out.back().count[0] != row) {
      out.emplace_back();
      out.back().start[0] = row;
      out.back().count[1] = width;
    }
    Box& box = out.back();
    ++box.count[0];
    box.blocks.push_back(b);
    box.numel += width;  // elements of this dataset
  }
  return out;
}

void select_box(hid_t space, const Box& box) {
  H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, box.start, nullptr, box.count, nullptr));
}

hid_t memory_space_for(hid_t fspace, std::size_t n) {
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(fspace));
  if (n > 0 && rank > 0) {
    hsize_t lo[H5S_MAX_RANK], hi[H5S_MAX_RANK], dims[H5S_MAX_RANK];
    H5_CHECK(H5Sget_select_bounds(fspace, lo, hi));
    hsize_t box = 1;
    for (int i = 0; i < rank; ++i) box *= dims[i] = hi[i] - lo[i] + 1;
    if (box == n) return H5_CHECK(H5Screate_simple(rank, dims, nullptr));
  }
  const hsize_t count = std::max<std::size_t>(n, 1);
  const hid_t space = H5_CHECK(H5Screate_simple(1, &count, nullptr));
  if (n == 0) H5_CHECK(H5Sselect_none(space));
  return space;
}

}  // namespace pdtrain::ckpt::detail
