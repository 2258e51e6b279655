#include "pdtrain/pd/wire_codec.hpp"

#include <lz4.h>
#include <zstd.h>

#include <cstring>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/core/error.hpp"

namespace pdtrain {

std::optional<WireCodec> wire_codec_from_string(const std::string& name) {
  if (name == "raw") return WireCodec::raw;
  if (name == "bf16") return WireCodec::bf16;
  if (name == "lz4") return WireCodec::lz4;
  if (name == "zstd") return WireCodec::zstd;
  return std::nullopt;
}

const char* to_string(WireCodec c) {
  switch (c) {
    case WireCodec::raw: return "raw";
    case WireCodec::bf16: return "bf16";
    case WireCodec::lz4: return "lz4";
    case WireCodec::zstd: return "zstd";
  }
  return "?";
}

std::size_t wire_encode(WireCodec c, const float* in, std::int64_t n, std::vector<char>& out) {
  const std::size_t start = out.size(), raw = static_cast<std::size_t>(n) * 4;
  switch (c) {
    case WireCodec::raw:
      out.resize(start + raw);
      std::memcpy(out.data() + start, in, raw);
      break;
    case WireCodec::bf16: {
      out.resize(start + static_cast<std::size_t>(n) * 2);
      for (std::int64_t i = 0; i < n; ++i) {
        const bf16 h = to_bf16(in[i]);
        std::memcpy(out.data() + start + 2 * i, &h, 2);
      }
      break;
    }
    case WireCodec::lz4: {
      const int bound = LZ4_compressBound(static_cast<int>(raw));
      out.resize(start + static_cast<std::size_t>(bound));
      const int got = LZ4_compress_default(reinterpret_cast<const char*>(in), out.data() + start,
                                           static_cast<int>(raw), bound);
      PDT_CHECK(got > 0, "lz4 compression failed");
      out.resize(start + static_cast<std::size_t>(got));
      break;
    }
    case WireCodec::zstd: {
      const std::size_t bound = ZSTD_compressBound(raw);
      out.resize(start + bound);
      // Level 1: gradients barely compress; the fastest level keeps the push off the critical path.
      const std::size_t got = ZSTD_compress(out.data() + start, bound, in, raw, 1);
      PDT_CHECK(!ZSTD_isError(got), std::string("zstd compression failed: ") + ZSTD_getErrorName(got));
      out.resize(start + got);
      break;
    }
  }
  return out.size() - start;
}

bool wire_decode(WireCodec c, const char* in, std::size_t bytes, float* out, std::int64_t n) {
  const std::size_t raw = static_cast<std::size_t>(n) * 4;
  switch (c) {
    case WireCodec::raw:
      if (bytes != raw) return false;
      std::memcpy(out, in, raw);
      return true;
    case WireCodec::bf16:
      if (bytes != static_cast<std::size_t>(n) * 2) return false;
      for (std::int64_t i = 0; i < n; ++i) {
        bf16 h;
        std::memcpy(&h, in + 2 * i, 2);
        out[i] = to_float(h);
      }
      return true;
    case WireCodec::lz4:
      return LZ4_decompress_safe(in, reinterpret_cast<char*>(out), static_cast<int>(bytes),
                                 static_cast<int>(raw)) == static_cast<int>(raw);
    case WireCodec::zstd: {
      const std::size_t got = ZSTD_decompress(out, raw, in, bytes);
      return !ZSTD_isError(got) && got == raw;
    }
  }
  return false;
}

}  // namespace pdtrain
