// Codec primitives: names, CRC32C combination and the canonical params CRC, HDF5's shuffle
// reproduced byte for byte, the zstd frame, BitDelta's decode and error.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "ckpt_test_util.hpp"
#include "pdtrain/ckpt/canonical_crc.hpp"
#include "pdtrain/ckpt/codec.hpp"
#include "pdtrain/ckpt/h5_check.hpp"
#include "pdtrain/ckpt/zstd_filter.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/error.hpp"

namespace pdtrain::ckpt::test {
namespace {

TEST(Codec, NamesRoundTripAndUnknownIsADeckError) {
  for (Codec c : {Codec::raw, Codec::zstd, Codec::xor_delta, Codec::bitdelta})
    EXPECT_EQ(parse_codec(codec_name(c)), c);
  EXPECT_EQ(parse_codec("xor"), Codec::xor_delta);
  EXPECT_FALSE(codec_from_string("lz4"));
  try {
    parse_codec("zstd9");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck);
    EXPECT_NE(std::string(e.what()).find("'zstd9'"), std::string::npos) << e.what();
  }
}

TEST(CanonicalCrc, CombineEqualsCrcOfConcatenation) {
  std::vector<unsigned char> data(1000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(rng_bits(5, i));
  for (std::size_t cut : {0, 1, 7, 500, 999, 1000}) {
    const auto a = crc32c(data.data(), cut);
    const auto b = crc32c(data.data() + cut, data.size() - cut);
    EXPECT_EQ(crc32c_combine(a, b, data.size() - cut), crc32c(data.data(), data.size())) << cut;
  }
}

TEST(CanonicalCrc, BlockPiecesGiveTheCrcOfTheCanonicalArray) {
  for (const ModelShape& shape : {tiny_shape(), uneven_shape()}) {
    const ParamCatalog cat(shape);
    const State s = random_state(cat, 3);
    std::vector<float> canonical(static_cast<std::size_t>(cat.total_numel()));
    std::vector<CrcPiece> pieces;
    for (const auto& [id, st] : s) {
      cat.scatter_block(cat.block(id), st.param.data(), canonical.data());
      append_crc_pieces(cat, cat.block(id), st.param.data(), pieces);
    }
    std::reverse(pieces.begin(), pieces.end());  // order must not matter
    const auto crc = combine_crc_pieces(pieces, cat.total_numel());
    ASSERT_TRUE(crc);
    EXPECT_EQ(*crc, crc32c(canonical.data(), canonical.size() * 4));
    pieces.pop_back();  // a missing piece is detected, not silently combined
    EXPECT_FALSE(combine_crc_pieces(pieces, cat.total_numel()));
  }
}

// The background compressor must produce the very bytes HDF5's shuffle filter hands to zstd.
TEST(Shuffle, MatchesHdf5sShuffleFilterByteForByte) {
  ensure_hdf5_ready();
  ScratchDir dir;
  const std::string path = dir / "shuffle.h5";
  std::vector<std::uint32_t> data(37);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint32_t>(rng_bits(9, i));
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t n = data.size();
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &n);
  H5Pset_shuffle(dcpl);
  const hid_t d = H5Dcreate2(f, "x", H5T_STD_U32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
  H5Dflush(d);
  std::vector<unsigned char> stored(data.size() * 4), mine(data.size() * 4);
  const hsize_t origin = 0;
  std::uint32_t filters = 0;
  ASSERT_GE(H5Dread_chunk(d, H5P_DEFAULT, &origin, &filters, stored.data()), 0);
  shuffle_bytes(data.data(), data.size() * 4, 4, mine.data());
  EXPECT_EQ(stored, mine);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
}

TEST(ZstdFrame, DecodesWithLibzstdAndShrinksRedundantData) {
  std::vector<float> zeros(4096, 0.0f);
  const auto frame = zstd_compress_frame(zeros.data(), zeros.size() * 4, 3);
  ASSERT_FALSE(frame.empty());
  EXPECT_LT(frame.size(), 200u);
}

TEST(Xor, IsItsOwnInverse) {
  std::vector<std::uint32_t> a{1, 0xdeadbeef, 7}, b{3, 0xdeadbeef, 0}, x(3), back(3);
  xor_bits(a.data(), b.data(), x.data(), 3);
  EXPECT_EQ(x[1], 0u);
  xor_bits(x.data(), b.data(), back.data(), 3);
  EXPECT_EQ(back, a);
}

// Decode is anchor + scale * sign exactly, the scale is mean |delta|, and the squared error
// is what the estimator predicts: sum (|d| - s)^2 = sum d^2 - n s^2.
TEST(BitDelta, DecodeAndErrorMatchTheEstimator) {
  const std::size_t n = 1001;
  std::vector<float> anchor(n), param(n), out(n);
  for (std::size_t i = 0; i < n; ++i) {
    anchor[i] = static_cast<float>(0.02 * rng_normal(11, i));
    param[i] = i % 10 == 0 ? anchor[i] : anchor[i] + static_cast<float>(1e-3 * rng_normal(12, i));
  }
  std::vector<std::uint8_t> signs(sign_bytes(n));
  const float scale = bitdelta_encode(param.data(), anchor.data(), n, signs.data());
  double sum_abs = 0, sum_sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(param[i]) - anchor[i];
    sum_abs += std::fabs(d);
    sum_sq += d * d;
  }
  EXPECT_EQ(scale, static_cast<float>(sum_abs / n));
  bitdelta_decode(anchor.data(), signs.data(), scale, n, out.data());
  double err_sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(param[i]) - anchor[i];
    const float expect = anchor[i] + (d < 0 ? -scale : scale);  // sign of 0 is +
    ASSERT_EQ(out[i], expect) << i;
    const double e = static_cast<double>(param[i]) - out[i];
    err_sq += e * e;
  }
  const double predicted = sum_sq - n * static_cast<double>(scale) * scale;
  EXPECT_NEAR(err_sq, predicted, 1e-3 * predicted);
  // The mean |delta| scale minimizes the error for these signs.
  auto error_with = [&](float s) {
    double e2 = 0;
    bitdelta_decode(anchor.data(), signs.data(), s, n, out.data());
    for (std::size_t i = 0; i < n; ++i) e2 += std::pow(static_cast<double>(param[i]) - out[i], 2);
    return e2;
  };
  EXPECT_GT(error_with(scale * 1.05f), err_sq);
  EXPECT_GT(error_with(scale * 0.95f), err_sq);
}

}  // namespace
}  // namespace pdtrain::ckpt::test
