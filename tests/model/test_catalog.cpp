// The parameter catalogue and a rank's local shard: blocks tile every tensor exactly once in
// llm.c's layout, and unpacking blocks reproduces the canonical array.
#include <gtest/gtest.h>

#include <set>

#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/model/stage_params.hpp"

namespace pdtrain {
namespace {

// L=3, NH=4, C=16, V=50 padded to 128, maxT=10.
ModelShape three_layer_shape() {
  return resolve_model_shape({.n_layer = 3, .n_head = 4, .d_model = 16, .vocab_size = 50,
                              .seq_len = 8, .max_seq_len = 10});
}

TEST(Catalog, SizesFollowLlmc) {
  const ModelShape s = three_layer_shape();
  EXPECT_EQ(s.padded_vocab, 128);
  const ParamCatalog cat(s);
  const std::int64_t C = s.d_model, L = s.n_layer;
  // llm.c: Vp*C + maxT*C + L*(12 C^2 + 13 C) + 2 C
  EXPECT_EQ(cat.total_numel(), s.padded_vocab * C + s.max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C);
  EXPECT_EQ(cat.tensor(TensorId::qkvw).offset,
            s.padded_vocab * C + s.max_seq_len * C + 2 * L * C);
}

TEST(Catalog, BlocksTileEveryElementExactlyOnce) {
  const ParamCatalog cat(three_layer_shape());
  std::vector<int> hits(static_cast<std::size_t>(cat.total_numel()), 0);
  for (const BlockInfo& b : cat.blocks())
    for (std::int64_t r = 0; r < b.rows; ++r)
      for (std::int64_t c = 0; c < b.cols; ++c) ++hits[cat.canonical_index(b, r, c)];
  for (std::size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
}

TEST(Catalog, GatherScatterRoundTrip) {
  const ParamCatalog cat(three_layer_shape());
  std::vector<float> canon(static_cast<std::size_t>(cat.total_numel())), back(canon.size(), -1.f);
  for (std::size_t i = 0; i < canon.size(); ++i) canon[i] = static_cast<float>(i);
  for (const BlockInfo& b : cat.blocks()) {
    std::vector<float> packed(static_cast<std::size_t>(b.numel()));
    cat.gather_block(b, canon.data(), packed.data());
    cat.scatter_block(b, packed.data(), back.data());
  }
  EXPECT_EQ(canon, back);
}

TEST(Catalog, InitIsAPureFunctionOfTheElement) {
  const ParamCatalog cat(three_layer_shape());
  std::vector<float> canon(static_cast<std::size_t>(cat.total_numel()));
  for (const BlockInfo& b : cat.blocks()) {
    std::vector<float> packed(static_cast<std::size_t>(b.numel()));
    cat.init_block(b, 0.02, 42, packed.data());
    cat.scatter_block(b, packed.data(), canon.data());
  }
  const TensorInfo& wte = cat.tensor(TensorId::wte);
  const std::int64_t C = cat.shape().d_model;
  EXPECT_EQ(canon[wte.offset + cat.shape().vocab_size * C], 0.0f);  // padded rows are zero
  EXPECT_NE(canon[wte.offset], 0.0f);
  EXPECT_EQ(canon[cat.tensor(TensorId::ln1w).offset], 1.0f);
  EXPECT_EQ(canon[cat.tensor(TensorId::qkvb).offset], 0.0f);
  // A different seed changes the weights.
  std::vector<float> other(static_cast<std::size_t>(cat.block(0).numel()));
  cat.init_block(cat.block(0), 0.02, 43, other.data());
  EXPECT_NE(other[0], canon[wte.offset]);
}

TEST(StageParams, WholeModelLocalLayoutIsTheCanonicalArray) {
  const ParamCatalog cat(three_layer_shape());
  StageParams p(cat, StageSpec{0, cat.shape().n_layer, true, true, 1, 0});
  ASSERT_EQ(p.numel(), cat.total_numel());
  EXPECT_EQ(p.needed_blocks().size(), cat.blocks().size());
  std::vector<float> canon(static_cast<std::size_t>(cat.total_numel()));
  for (std::size_t i = 0; i < canon.size(); ++i) canon[i] = static_cast<float>(i) * 0.5f;
  for (int id : p.needed_blocks()) {
    const BlockInfo& b = cat.block(id);
    std::vector<float> packed(static_cast<std::size_t>(b.numel()));
    cat.gather_block(b, canon.data(), packed.data());
    p.unpack_param(b, packed.data());
  }
  for (std::size_t i = 0; i < canon.size(); ++i) ASSERT_EQ(p.params_host()[i], canon[i]) << i;
}

TEST(StageParams, TensorParallelShardsSplitHeadsAndReplicateTheRest) {
  const ParamCatalog cat(three_layer_shape());
  const std::int64_t tp = 2, C = cat.shape().d_model, HS = C / cat.shape().n_head;
  std::multiset<int> all;
  for (std::int64_t r = 0; r < tp; ++r) {
    StageParams p(cat, StageSpec{0, cat.shape().n_layer, true, true, tp, r});
    EXPECT_EQ(p.local_rows(TensorId::qkvw), 3 * C / tp);
    EXPECT_EQ(p.local_cols(TensorId::attprojw), C / tp);
    EXPECT_EQ(p.local_rows(TensorId::fcw), 4 * C / tp);
    for (int id : p.needed_blocks()) all.insert(id);
    // The k rows of this shard's first head land right after its q rows.
    std::vector<float> canon(static_cast<std::size_t>(cat.total_numel()));
    for (std::size_t i = 0; i < canon.size(); ++i) canon[i] = static_cast<float>(i);
    for (int id : p.needed_blocks()) {
      const BlockInfo& b = cat.block(id);
      std::vector<float> packed(static_cast<std::size_t>(b.numel()));
      cat.gather_block(b, canon.data(), packed.data());
      p.unpack_param(b, packed.data());
    }
    const TensorInfo& q = cat.tensor(TensorId::qkvw);
    const std::int64_t first_head_row = r * (C / tp);
    const float* local = p.param(TensorId::qkvw, 1);
    const std::int64_t layer_base = q.offset + 1 * q.rows * q.cols;
    EXPECT_EQ(local[0], canon[layer_base + first_head_row * C]);                          // q
    EXPECT_EQ(local[(C / tp) * C], canon[layer_base + (C + first_head_row) * C]);         // k
    EXPECT_EQ(local[2 * (C / tp) * C], canon[layer_base + (2 * C + first_head_row) * C]); // v
    // Row-parallel attprojw: local column 0 is global column r*C/tp.
    const TensorInfo& ap = cat.tensor(TensorId::attprojw);
    EXPECT_EQ(p.param(TensorId::attprojw, 0)[0], canon[ap.offset + first_head_row]);
    (void)HS;
  }
  for (const BlockInfo& b : cat.blocks())
    EXPECT_EQ(all.count(b.id), b.unit < 0 ? 2u : 1u) << cat.block_name(b);
}

TEST(StageParams, PipelineStagesTakeTheirLayersAndTheTiedEmbeddingAtBothEnds) {
  const ParamCatalog cat(three_layer_shape());
  StageParams first(cat, StageSpec{0, 1, true, false, 1, 0});
  StageParams last(cat, StageSpec{1, 3, false, true, 1, 0});
  auto has = [&](const StageParams& p, TensorId t, std::int64_t layer) {
    for (int id : p.needed_blocks())
      if (cat.block(id).tensor == t && cat.block(id).layer == layer) return true;
    return false;
  };
  EXPECT_TRUE(has(first, TensorId::wte, -1));
  EXPECT_TRUE(has(last, TensorId::wte, -1));
  EXPECT_TRUE(has(first, TensorId::wpe, -1));
  EXPECT_FALSE(has(last, TensorId::wpe, -1));
  EXPECT_TRUE(has(first, TensorId::qkvw, 0));
  EXPECT_FALSE(has(first, TensorId::qkvw, 1));
  EXPECT_TRUE(has(last, TensorId::qkvw, 2));
  EXPECT_TRUE(has(last, TensorId::lnfw, -1));
  EXPECT_FALSE(has(first, TensorId::lnfw, -1));
}

}  // namespace
}  // namespace pdtrain

namespace pdtrain {
namespace {

// Holders update their blocks by forward_need_rank (then id): that order must be the order in
// which a forward first uses the blocks' units, or the next step's forward waits for most of the
// update (catalogue ids are tensor-major: layer 0's last block comes near the end).
TEST(Catalog, ForwardNeedRankIsTheOrderTheForwardUsesTheBlocks) {
  const ModelShape s = three_layer_shape();
  const ParamCatalog cat(s);
  const StageParams whole(cat, StageSpec{0, s.n_layer, true, true, 1, 0});
  std::vector<std::int64_t> first_use(static_cast<std::size_t>(cat.blocks().size()), -1);
  std::int64_t use = 0;
  for (const std::vector<int>& units : StageProgram(whole).forward_uses()) {
    for (int u : units)
      for (int b : whole.unit_blocks(u))
        if (first_use[b] < 0) first_use[b] = use;
    ++use;
  }
  for (const BlockInfo& a : cat.blocks())
    for (const BlockInfo& b : cat.blocks()) {
      ASSERT_GE(first_use[a.id], 0) << cat.block_name(a) << " is never used";
      if (cat.forward_need_rank(a) < cat.forward_need_rank(b))
        EXPECT_LE(first_use[a.id], first_use[b.id]) << cat.block_name(a) << " before " << cat.block_name(b);
    }
  EXPECT_EQ(cat.forward_need_rank(cat.block(0)), 0);  // wte: the embedding, first
}

}  // namespace
}  // namespace pdtrain
