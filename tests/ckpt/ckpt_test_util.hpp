#pragma once
// Helpers shared by the checkpoint tests: small model shapes, deterministic holder states, a
// scratch directory, and byte surgery on checkpoint files.
#include <hdf5.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/core/rng.hpp"
#include "pdtrain/model/catalog.hpp"

#include "../support/model_shapes.hpp"
#include "../support/scratch_dir.hpp"

namespace pdtrain::ckpt::test {

// tiny_shape(): two layers, 4 heads, maxT 10 (wpe's blocks unequal, chunks straddling blocks).
using pdtrain::test::tiny_shape;

// Three heads: the padded vocabulary (128) splits 42/43/43, so wte's blocks are unequal too.
inline ModelShape uneven_shape() {
  return resolve_model_shape({.n_layer = 2, .n_head = 3, .d_model = 12, .vocab_size = 100,
                              .seq_len = 8, .max_seq_len = 11});
}

using State = std::map<int, BlockState>;

// Parameters ~ N(0, 0.02), m ~ N(0, 1e-3), v ~ |N(0, 1e-5)|: every bit pattern differs.
inline State random_state(const ParamCatalog& cat, std::uint64_t seed) {
  State s;
  const std::uint64_t key = rng_key(seed, 77);
  for (const BlockInfo& b : cat.blocks()) {
    BlockState& st = s[b.id];
    const auto n = static_cast<std::size_t>(b.numel());
    st.param.resize(n);
    st.m.resize(n);
    st.v.resize(n);
    st.decay = cat.tensor(b.tensor).weight_decay;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t c = 3 * (static_cast<std::uint64_t>(b.id) * 1000003ull + i);
      st.param[i] = static_cast<float>(0.02 * rng_normal(key, c));
      st.m[i] = static_cast<float>(1e-3 * rng_normal(key, c + 1));
      st.v[i] = static_cast<float>(std::abs(1e-5 * rng_normal(key, c + 2)));
    }
  }
  return s;
}

// A few AdamW-like steps later: params move by ~lr per step, the moments drift.
inline State trained_like(const State& s0, std::uint64_t seed, double step_size = 1e-3) {
  State s = s0;
  const std::uint64_t key = rng_key(seed, 91);
  for (auto& [id, st] : s)
    for (std::size_t i = 0; i < st.param.size(); ++i) {
      const std::uint64_t c = 3 * (static_cast<std::uint64_t>(id) * 1000003ull + i);
      st.param[i] += static_cast<float>(step_size * rng_normal(key, c));
      st.m[i] = static_cast<float>(0.35 * st.m[i] + 0.65e-3 * rng_normal(key, c + 1));
      st.v[i] = static_cast<float>(0.6 * st.v[i] + 0.4e-5 * std::abs(rng_normal(key, c + 2)));
    }
  return s;
}

// What a bitdelta file of state `s` against its anchor `a` decodes to (each quantized state
// through the codec's own quantizer, the others exact), and each block's error bounds.
struct Lossy {
  State decoded;
  std::map<int, std::array<float, 3>> bounds;  // by block: params, adam_m, adam_v
};
inline Lossy bitdelta_of(const State& s, const State& a, BitDeltaBits bits) {
  Lossy out{s, {}};
  for (auto& [id, st] : out.decoded) {
    std::vector<float>* dst[3] = {&st.param, &st.m, &st.v};
    const std::vector<float>* src[3] = {&s.at(id).param, &s.at(id).m, &s.at(id).v};
    const std::vector<float>* ref[3] = {&a.at(id).param, &a.at(id).m, &a.at(id).v};
    out.bounds[id] = {0, 0, 0};
    for (int k = 0; k < 3; ++k) {
      const auto q = state_quant(Codec::bitdelta, bits, k);
      if (!q) continue;
      const std::size_t n = src[k]->size();
      std::vector<std::uint8_t> codes(code_bytes(n, q->bits));
      std::vector<std::uint32_t> scales(2 * quant_groups(n));
      out.bounds[id][k] = quantize(q->q, q->bits, src[k]->data(), ref[k]->data(), n,
                                   codes.data(), scales.data(), dst[k]->data());
    }
  }
  return out;
}

inline BlockRefs refs(const State& s) {
  BlockRefs r;
  for (const auto& [id, st] : s) r[id] = &st;
  return r;
}

inline std::vector<int> all_ids(const ParamCatalog& cat) {
  std::vector<int> ids(cat.blocks().size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  return ids;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using pdtrain::ScratchDir;  // tests/support/scratch_dir.hpp

// Byte offset and size in the file of the chunk holding element `coord` of `dataset`, or of a
// contiguous dataset's data (coord ignored).
inline std::pair<std::uint64_t, std::uint64_t> data_location(const std::string& file,
                                                             const std::string& dataset,
                                                             const std::vector<hsize_t>& coord) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  const hid_t dcpl = H5Dget_create_plist(d);
  std::pair<std::uint64_t, std::uint64_t> loc{0, 0};
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    unsigned mask = 0;
    haddr_t addr = 0;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(d, coord.data(), &mask, &addr, &size) >= 0) loc = {addr, size};
  } else {
    loc = {H5Dget_offset(d), H5Dget_storage_size(d)};
  }
  H5Pclose(dcpl);
  H5Dclose(d);
  H5Fclose(f);
  return loc;
}

inline void flip_byte(const std::string& file, std::uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace pdtrain::ckpt::test
