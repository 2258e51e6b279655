// Codec primitives: names, CRC32C combination and the canonical params CRC, HDF5's shuffle
// reproduced byte for byte, the zstd frame, the bitdelta quantizers' decode and error bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

// A block of n values of a bitdelta quantizer, as the writer encodes it.
struct Encoded {
  std::vector<std::uint8_t> codes;
  std::vector<std::uint32_t> scales;
  std::vector<float> decoded;
  float bound = 0;
};
Encoded encode(Quantizer q, int bits, const std::vector<float>& x, const std::vector<float>& ref) {
  Encoded e;
  e.codes.assign(code_bytes(x.size(), bits), 0xff);  // quantize must clear what it does not set
  e.scales.assign(2 * quant_groups(x.size()), 0);
  e.decoded.resize(x.size());
  e.bound = quantize(q, bits, x.data(), ref.data(), x.size(), e.codes.data(), e.scales.data(),
                     e.decoded.data());
  return e;
}

// Trained-like values: the anchor, a delta of a few steps' size (some exactly zero), a first
// moment of gradient size, a second moment spanning decades, with zeros (padded rows).
struct Values {
  std::vector<float> anchor, param, m, v;
};
Values values(std::size_t n) {
  Values s;
  for (std::size_t i = 0; i < n; ++i) {
    s.anchor.push_back(static_cast<float>(0.02 * rng_normal(11, i)));
    s.param.push_back(i % 10 == 0 ? s.anchor[i]
                                  : s.anchor[i] + static_cast<float>(1e-3 * rng_normal(12, i)));
    s.m.push_back(static_cast<float>(1e-4 * rng_normal(13, i)));
    s.v.push_back(i % 97 == 0 ? 0.0f
                              : static_cast<float>(1e-8 * std::exp(3.0 * rng_normal(14, i))));
  }
  return s;
}

// 1 bit is BitDelta per group of kQuantGroup values: decode = anchor + scale * sign exactly,
// the scale is the group's mean |delta|, the squared error is what the estimator predicts,
// sum (|d| - s)^2 = sum d^2 - n s^2, and that scale minimizes it for these signs.
TEST(BitDelta, OneBitIsSignTimesMeanDeltaPerGroup) {
  const std::size_t n = 1001;  // three whole groups and a partial one
  const Values s = values(n);
  const Encoded e = encode(Quantizer::delta, 1, s.param, s.anchor);
  for (std::size_t g = 0; g * kQuantGroup < n; ++g) {
    const std::size_t lo = g * kQuantGroup, hi = std::min(n, lo + kQuantGroup);
    double sum_abs = 0, sum_sq = 0, err_sq = 0;
    for (std::size_t i = lo; i < hi; ++i) {
      const double d = static_cast<double>(s.param[i]) - s.anchor[i];
      sum_abs += std::fabs(d);
      sum_sq += d * d;
    }
    const float scale = static_cast<float>(sum_abs / static_cast<double>(hi - lo));
    for (std::size_t i = lo; i < hi; ++i) {
      const double d = static_cast<double>(s.param[i]) - s.anchor[i];
      ASSERT_EQ(e.decoded[i], s.anchor[i] + (d < 0 ? -scale : scale)) << i;  // sign of 0 is +
      err_sq += std::pow(static_cast<double>(s.param[i]) - e.decoded[i], 2);
    }
    const double predicted = sum_sq - static_cast<double>(hi - lo) * scale * scale;
    EXPECT_NEAR(err_sq, predicted, 1e-3 * predicted) << "group " << g;
    auto error_with = [&](float f) {  // the same signs, another scale
      std::vector<std::uint32_t> other = e.scales;
      float lo_s = -scale * f, step = 2 * scale * f;
      std::memcpy(&other[2 * g], &lo_s, 4);
      std::memcpy(&other[2 * g + 1], &step, 4);
      std::vector<float> out(n);
      dequantize(Quantizer::delta, 1, e.codes.data(), other.data(), s.anchor.data(), n, out.data());
      double e2 = 0;
      for (std::size_t i = lo; i < hi; ++i) e2 += std::pow(static_cast<double>(s.param[i]) - out[i], 2);
      return e2;
    };
    EXPECT_GT(error_with(1.05f), err_sq) << "group " << g;
    EXPECT_GT(error_with(0.95f), err_sq) << "group " << g;
  }
}

// Every quantizer and width: the reader's decode of the codes is the writer's, bit for bit;
// every value is within the returned bound, which is the largest error (so it is tight);
// linear levels are within half a level of the value; zeros of v decode to exactly 0; more
// bits never give a larger bound.
TEST(BitDelta, RoundTripsWithinTheStatedBoundAtEveryWidth) {
  const std::size_t n = 1001;
  const Values s = values(n);
  struct Case {
    Quantizer q;
    const std::vector<float>* x;
    int min_bits;
  };
  for (const Case& c : {Case{Quantizer::delta, &s.param, 1}, Case{Quantizer::linear, &s.m, 2},
                        Case{Quantizer::log, &s.v, 2}}) {
    float previous = INFINITY;
    for (int bits = c.min_bits; bits <= 8; ++bits) {
      SCOPED_TRACE("quantizer " + std::to_string(static_cast<int>(c.q)) + ", " +
                   std::to_string(bits) + " bits");
      const std::vector<float>& x = *c.x;
      const Encoded e = encode(c.q, bits, x, s.anchor);
      std::vector<float> out(n);
      dequantize(c.q, bits, e.codes.data(), e.scales.data(), s.anchor.data(), n, out.data());
      ASSERT_EQ(std::memcmp(out.data(), e.decoded.data(), n * 4), 0);
      double worst = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double err = std::fabs(static_cast<double>(out[i]) - x[i]);
        const double rel = c.q == Quantizer::log ? (x[i] > 0 ? err / x[i] : 0) : err;
        if (c.q == Quantizer::log && x[i] == 0) ASSERT_EQ(out[i], 0.0f) << i;
        if (c.q == Quantizer::log && x[i] > 0) ASSERT_GT(out[i], 0.0f) << i;
        ASSERT_LE(rel, e.bound) << i;
        worst = std::max(worst, rel);
        if (bits >= 2 && c.q != Quantizer::log) {  // half a level of the value's group
          float step;
          std::memcpy(&step, &e.scales[2 * (i / kQuantGroup) + 1], 4);
          const double y = c.q == Quantizer::delta ? static_cast<double>(x[i]) - s.anchor[i] : x[i];
          const double level_err = std::fabs(static_cast<double>(out[i]) -
                                             (c.q == Quantizer::delta ? s.anchor[i] : 0.0) - y);
          ASSERT_LE(level_err, 0.5 * step * (1 + 1e-6) + 1e-12) << i;
        }
      }
      EXPECT_LE(e.bound, std::nextafter(static_cast<float>(worst), INFINITY));
      EXPECT_GT(e.bound, 0.0f);
      EXPECT_LE(e.bound, previous);
      previous = e.bound;
    }
  }
  // The widths that make checkpoints small are also accurate: 4-bit parameter deltas within
  // half a level (1/30 of a group's range of deltas ~ 7e-3), 8-bit v within half a level of
  // its bit pattern (a group here spans ~26 octaves: 0.05 octave, 5 %).
  EXPECT_LT(encode(Quantizer::delta, 4, s.param, s.anchor).bound, 3e-4f);
  EXPECT_LT(encode(Quantizer::log, 8, s.v, s.anchor).bound, 0.06f);
}

// Values a quantizer cannot represent are an error, not a silent wrong checkpoint.
TEST(BitDelta, RefusesValuesItCannotRepresent) {
  std::vector<float> x{1.0f, -1e-9f, 2.0f}, ref(3, 0.0f);
  EXPECT_THROW(encode(Quantizer::log, 8, x, ref), Error);  // a negative second moment
  x[1] = NAN;
  EXPECT_THROW(encode(Quantizer::linear, 8, x, ref), Error);
  EXPECT_THROW(encode(Quantizer::delta, 4, x, ref), Error);
}

}  // namespace
}  // namespace pdtrain::ckpt::test
